import Foundation
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// The built `switchboard-soak` executable.
func soakExecutable() -> URL {
    switchboardExecutable().deletingLastPathComponent().appendingPathComponent("switchboard-soak")
}

/// Whether `pid` is a live process (not gone, not a zombie left for its parent to reap).
func isRunning(_ pid: Int32) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else { return false }
    return stat[stat.index(after: close)...].split(separator: " ").first != "Z"
}

/// Whether a kernel could bind `port` on loopback now.
func portIsFree(_ port: Int) throws -> Bool {
    let socket = try ZMQSocket(try ZMQContext(), .router)
    defer { socket.close() }
    return (try? socket.bind("tcp://127.0.0.1:\(port)")) != nil
}

@Suite("An interrupted soak leaves nothing behind", .serialized)
struct InterruptedSoakTests {
    @Test("SIGTERM or SIGKILL to a soak once its bus is up: no process of that bus is left and its ports are free",
          arguments: [SIGTERM, SIGKILL])
    func interrupted(signal: Int32) async throws {
        // No kills during the test's few seconds: the bus is as the soak started it.
        let soak = try ChildProcess(soakExecutable(), ["--duration", "300", "--clients", "2", "--subscribers", "1",
                                                       "--kill-min", "250", "--kill-max", "250"])
        defer { soak.stop() }
        let output = try await soak.waitForOutput(containing: "soak: the bus is up: ", within: 180)
        try await soak.waitForOutput(containing: "\n", within: 5)
        let upLine = try #require(output.split(separator: "\n").first { $0.hasPrefix("soak: the bus is up: ") })
        var pids: [String: Int32] = [:]
        for piece in upLine.dropFirst("soak: the bus is up: ".count).split(separator: ",") {
            let words = piece.split(separator: " ")
            if words.count == 2, let pid = Int32(words[1]) { pids[String(words[0])] = pid }
        }
        #expect(Set(pids.keys) == ["up", "kernel", "echo", "store", "streams", "fetcher", "search", "pricing", "gateway"], "\(upLine)")
        let portsLine = try #require(output.split(separator: "\n").first { $0.contains("; ports ") })
        // The kernel's four endpoints and the gateway's.
        let ports = (portsLine.components(separatedBy: "; ports ").last ?? "").split(separator: ",")
            .compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        #expect(ports.count == 5, "\(portsLine)")
        let folder = try #require(portsLine.components(separatedBy: "working folder ").last?.components(separatedBy: ";").first)

        soak.signal(signal)
        #expect(await soak.exit(within: 60), "the soak ended")
        if signal == SIGTERM { #expect(soak.terminationStatus == 128 + SIGTERM, "\(soak.readOutput().suffix(1_000))") }
        let bus = pids
        try await eventually(60, "every process of the bus ended: \(bus)") { bus.values.allSatisfy { !isRunning($0) } }
        for port in ports { #expect(try portIsFree(port), "port \(port) is free") }
        // Its working folder: removed by the soak on SIGTERM; after SIGKILL nothing could, but the test.
        if signal == SIGTERM { #expect(!FileManager.default.fileExists(atPath: folder), "\(folder) removed") }
        try? FileManager.default.removeItem(atPath: folder)
    }
}
