import Foundation
import SwitchboardTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// The process tree of one `switchboard up`: the supervisor and its children, found in
/// /proc by parent pid and told apart by their command lines (`kernel`, `serve NAME`,
/// `gateway`).
struct BusProcesses {
    let upPid: Int32

    /// The current pid of each piece (`kernel`, `store`, ...), by name.
    func pieces() -> [String: Int32] {
        var found: [String: Int32] = [:]
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        for entry in entries {
            guard let pid = Int32(entry), parent(of: pid) == upPid, let piece = pieceName(of: pid) else { continue }
            found[piece] = pid
        }
        return found
    }

    /// Stops the bus as a user would: SIGTERM to `up`, which stops the services, then the
    /// kernel. Whatever is left after `grace` seconds is killed (SIGKILL), `up` and every
    /// piece. Returns whether it ended within the grace period.
    @discardableResult
    func stop(_ up: ChildProcess, grace: Double) -> Bool {
        let pieces = pieces()
        up.signal(SIGTERM)
        let deadline = Date().addingTimeInterval(grace)
        while up.isRunning && Date() < deadline { usleep(20_000) }
        let stopped = !up.isRunning
        if !stopped {
            for pid in Array(self.pieces().values) + Array(pieces.values) { kill(pid, SIGKILL) }
            up.stop(grace: 0)
        }
        return stopped
    }

    /// Resident memory in MiB of `up` and each piece, by name.
    func memory() -> [String: Double] {
        var sizes: [String: Double] = [:]
        for (name, pid) in pieces().merging(["up": upPid], uniquingKeysWith: { $1 }) {
            if let bytes = residentBytes(of: pid) { sizes[name] = Double(bytes) / 1_048_576 }
        }
        return sizes
    }

    private func parent(of pid: Int32) -> Int32? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return nil }
        // "pid (comm) state ppid …": comm may hold spaces, so count from its closing paren.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        return fields.count > 1 ? Int32(fields[1]) : nil
    }

    private func pieceName(of pid: Int32) -> String? {
        guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return nil }
        let arguments = data.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        guard arguments.count >= 2 else { return nil }
        if arguments[1] == "kernel" || arguments[1] == "gateway" { return arguments[1] }
        if arguments[1] == "serve", arguments.count >= 3 { return arguments[2] }
        return nil
    }
}

/// The whole bus on free loopback ports in `folder` with the bundled datasets, fast
/// heartbeats, and a supervisor that restarts quickly and never gives up. With `pair`, two
/// configurations (`primary.yaml`, `backup.yaml`) sharing the folder's keys, datasets and
/// store database, ports five per side: `linked`, of a kernel pair with 200 ms heartbeats;
/// else two buses whose kernels another setting joins (the state in one etcd).
func writeSoakConfiguration(in folder: URL, pair: Bool = false, linked: Bool = true) throws -> [(config: URL, ports: [Int])] {
    func write(_ ports: [Int]? = nil, fileName: String = "switchboard.yaml", extra: String = "") throws -> (config: URL, ports: [Int]) {
        try writeBusConfiguration(in: folder, logLevel: "warning", heartbeatMs: 250, liveness: 4, services: """
            echo: {workers: 2}
              store: {workers: 4}
              fetcher: {workers: 2}
              search: {workers: 4}
              pricing: {workers: 2}
              streams: {workers: 2}
            """, supervisor: """
            restart_backoff_ms: 100
              restart_backoff_max_ms: 1000
              restart_limit: 1000000
              restart_window_seconds: 1
              stop_timeout_seconds: 20
            """, extra: extra, ports: ports, fileName: fileName)
    }
    guard pair else { return [try write()] }
    let ports = (0..<2).map { _ in (0..<5).map { _ in freePort() } }, links = [freePort(), freePort()]
    return try ["primary", "backup"].enumerated().map { index, role in
        guard linked else { return try write(ports[index], fileName: "\(role).yaml") }
        return try write(ports[index], fileName: "\(role).yaml", extra: """
            pair:
              role: \(role)
              listen: tcp://127.0.0.1:\(links[index])
              peer: tcp://127.0.0.1:\(links[1 - index])
              peer_broker: tcp://127.0.0.1:\(ports[1 - index][0])
              peer_state: tcp://127.0.0.1:\(ports[1 - index][1]),tcp://127.0.0.1:\(ports[1 - index][2]),tcp://127.0.0.1:\(ports[1 - index][3])
              heartbeat_ms: 200
            """)
    }
}
