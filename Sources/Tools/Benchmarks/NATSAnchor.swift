import ArgumentParser
import Foundation
import SwitchboardTestSupport

/// What a team would run instead of the bus, measured beside it in the same run: nats-server
/// (Debian's) with a C requester and responder on libnats (`nats-baseline`, which
/// `Scripts/bench` installs and compiles; `Sources/Tools/NATSBaseline`), at the full stack's
/// shapes. Each shape is measured with every answer sent at once and with libnats's flusher
/// gathering them, and the better one is NATS's figure: the anchor is NATS at its best.
struct NATSAnchor {
    struct Figures {
        /// Requests a second, pipelined with `KernelBenchmark`'s window, and with the full
        /// stack's requests in flight.
        var pipelined: Double
        var atFullStackShape: Double
        /// One request at a time (`natsConnection_Request`): the rate and the median round trip.
        var sync: Double
        var syncP50Microseconds: Double
    }

    static let serverCandidates = ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
    static var baseline: URL { productsDirectory().appendingPathComponent("nats-baseline") }

    /// Whether nats-server and `nats-baseline` are there (`Scripts/bench` puts them there).
    static var available: Bool {
        serverCandidates.contains { FileManager.default.isExecutableFile(atPath: $0) }
            && FileManager.default.isExecutableFile(atPath: baseline.path)
    }

    /// Medians of `runs` measurements of each shape, against a nats-server of its own.
    static func measure(runs: Int, requests: Int, window: Int, inFlight: Int, roundTrips: Int) async throws -> Figures {
        guard let server = serverCandidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            throw ValidationError("no nats-server: Scripts/bench installs it")
        }
        let port = freePort()
        let url = "nats://127.0.0.1:\(port)"
        let nats = try ChildProcess(URL(fileURLWithPath: server), ["-a", "127.0.0.1", "-p", String(port)])
        defer { nats.stop() }
        try await nats.waitForOutput(containing: "Server is ready")
        let responders = try ["asap", "buffered"].map { mode in try ChildProcess(baseline, ["responder", url, "echo.\(mode)", mode]) }
        defer { for responder in responders { responder.stop() } }

        /// "RATE P50_US" of one requester run.
        func requester(_ mode: String, count: Int, window: Int) async throws -> (rate: Double, p50: Double) {
            let result = try await runCommand(baseline, ["requester", url, "echo.\(mode)", String(count), String(window), mode], seconds: 120)
            let fields = result.stdout.split(separator: " ").compactMap { Double($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
            guard result.status == 0, fields.count == 2 else { throw TimedOut(what: "nats-baseline requester: \(result)") }
            return (fields[0], fields[1])
        }
        func best(count: Int, window: Int) async throws -> Double {
            max(try await requester("asap", count: count, window: window).rate, try await requester("buffered", count: count, window: window).rate)
        }
        var pipelined: [Double] = [], atShape: [Double] = [], sync: [Double] = [], p50: [Double] = []
        for _ in 0..<runs {
            pipelined.append(try await best(count: requests, window: window))
            atShape.append(try await best(count: requests / 2, window: inFlight))
            // natsConnection_Request flushes at once whatever the setting; the answer is sent at once.
            let oneAtATime = try await requester("asap", count: roundTrips / 4, window: 1)
            sync.append(oneAtATime.rate)
            p50.append(oneAtATime.p50)
        }
        return Figures(pipelined: median(pipelined), atFullStackShape: median(atShape), sync: median(sync), syncP50Microseconds: median(p50))
    }
}
