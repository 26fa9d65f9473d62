import ArgumentParser
import BusKit
import BusProtocol
import Contracts
import EchoService
import Foundation
import SwitchboardTestSupport

/// Replies in parts (18/MDP): the time to the first part and parts per second of one
/// stream, and a request to every one of 8 workers (`all:SERVICE`), through the kernel
/// (`switchboard kernel` as its own process) beside raw libzmq in C doing the same frames
/// with no broker, in the same rounds.
struct StreamBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stream",
        abstract: "Replies in parts and requests to every worker: raw C beside the kernel and the full stack."
    )

    @Option(help: "Parts in each stream.")
    var parts = 10_000
    @Option(help: "Bytes of each part.")
    var size = 256
    @Option(help: "Streams per measurement (one at a time).")
    var streams = 20
    @Option(help: "Workers a request to every worker goes to.")
    var gatherWorkers = 8
    @Option(help: "Requests to every worker per measurement (one at a time).")
    var gathers = 200
    @Option(help: "Rounds of measurements; the median is reported.")
    var runs = 3

    func run() async throws { printTable(try await measure()) }

    func measure() async throws -> [Row] {
        let baseline = productsDirectory().appendingPathComponent("zmq-baseline")
        guard FileManager.default.isExecutableFile(atPath: baseline.path) else {
            throw ValidationError("no zmq-baseline at \(baseline.path): swift build -c release --product zmq-baseline")
        }
        let ports = (0..<5).map { _ in "tcp://127.0.0.1:\(freePort())" }
        let gatherPorts = (0..<gatherWorkers).map { _ in "tcp://127.0.0.1:\(freePort())" }
        let counts = [String(parts), String(size)]
        // Each watches its standard input, a pipe this process holds: they end with it.
        var processes = [
            try ChildProcess(baseline, ["stream-server", ports[0]] + counts),
            try ChildProcess(switchboardExecutable(), ["kernel", "--log-level", "error", "--broker", ports[1], "--snapshot", ports[2],
                                                       "--publisher", ports[3], "--collector", ports[4]]),
            try ChildProcess(baseline, ["mdp02-stream-worker", ports[1], "cstream"] + counts),
        ]
        // For requests to every worker: servers that answer at once, raw and as 18/MDP workers.
        for port in gatherPorts {
            processes.append(try ChildProcess(baseline, ["stream-server", port, "0", "64"]))
            processes.append(try ChildProcess(baseline, ["mdp02-stream-worker", ports[1], "cgather", "0", "64"]))
        }
        defer { for process in processes.reversed() { process.stop(grace: 2) } }
        let host = try ServiceHost(service: PartsBench(), options: .init(brokers: [ports[1]], connections: 1))
        try await host.start()
        var echoes: [ServiceHost<EchoService>] = []
        for index in 0..<gatherWorkers {
            let echo = try ServiceHost(service: EchoService(instance: "echo-\(index)"), options: .init(brokers: [ports[1]], connections: 1))
            try await echo.start()
            echoes.append(echo)
        }
        let bus = try await BusClient(brokers: [ports[1]], timeout: .seconds(30))
        let expected = ["cstream": 1, PartsBench.name: 1, "cgather": gatherWorkers, EchoAPI.service: gatherWorkers]
        try await eventually(10, "the workers registered") {
            let services = try await bus.call(KernelAPI.servicesList).services
            return expected.allSatisfy { entry in services.first { $0.name == entry.key }?.workers == entry.value }
        }
        progress("Stream benchmark: \(parts) parts of \(size) bytes a stream, \(streams) streams one at a time; \(gathers) requests to every one of \(gatherWorkers) workers; \(runs) rounds")
        var raw: [(Double, Double)] = [], kernel = raw, stack = raw
        var gatherRaw: [Double] = [], gatherKernel = gatherRaw, gatherStack = gatherRaw
        for round in 1...runs {
            progress("round \(round) of \(runs)")
            raw.append(try await cClient(baseline, ports[0], service: "-", rounds: streams).stream)
            kernel.append(try await cClient(baseline, ports[1], service: "cstream", rounds: streams).stream)
            stack.append(try await fullStack(bus))
            gatherRaw.append(try await rawGather(baseline, gatherPorts))
            gatherKernel.append(try await cClient(baseline, ports[1], service: "all:cgather", rounds: gathers).end)
            gatherStack.append(try await fullStackGather(bus))
        }
        await bus.close()
        await host.stop()
        for echo in echoes { await echo.stop() }
        func figures(_ runs: [(Double, Double)]) -> (first: Double, rate: Double) { (median(runs.map(\.0)), median(runs.map(\.1))) }
        let metal = figures(raw), brokered = figures(kernel), full = figures(stack)
        func note(_ value: (first: Double, rate: Double), versus: (first: Double, rate: Double), _ name: String) -> String {
            String(format: "first part %.0f µs (%.2fx %@); parts/s %.2fx %@", value.first, value.first / versus.first, name, value.rate / versus.rate, name)
        }
        let gatherMetal = median(gatherRaw), gatherBrokered = median(gatherKernel), gatherFull = median(gatherStack)
        let workers = "\(gatherWorkers) workers"
        return [
            Row("raw libzmq (C): DEALER-ROUTER, no broker", rate: metal.rate, note: String(format: "first part %.0f µs", metal.first)),
            Row("kernel, 18/MDP: C client and C worker", rate: brokered.rate, note: note(brokered, versus: metal, "raw C")),
            Row("full stack: BusClient.stream from a hosted service", rate: full.rate, note: note(full, versus: brokered, "the C peers through the kernel")),
            Row("to every one of \(workers), raw libzmq (C): a ROUTER to each", note: String(format: "%.0f µs a round, p50", gatherMetal)),
            Row("to every one of \(workers) through the kernel (all:), C 18/MDP peers",
                note: String(format: "%.0f µs a round, p50: %.2fx raw C", gatherBrokered, gatherBrokered / gatherMetal)),
            Row("to every one of \(workers), full stack: BusClient.gather, ServiceHosts",
                note: String(format: "%.0f µs a round, p50: %.2fx the C peers through the kernel", gatherFull, gatherFull / gatherBrokered)),
        ]
    }

    /// The C client's median time to the first part (µs) with its parts per second, and its
    /// median time to the end (µs).
    private func cClient(_ baseline: URL, _ endpoint: String, service: String, rounds: Int) async throws -> (stream: (Double, Double), end: Double) {
        let result = try await runCommand(baseline, ["stream-client", endpoint, service, String(rounds)], seconds: 300)
        let figures = result.stdout.split(separator: " ").compactMap { Double($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        guard result.status == 0, figures.count == 3 else { throw ValidationError("zmq-baseline stream-client: \(result)") }
        return ((figures[0], figures[1]), figures[2])
    }

    /// The raw C round to every server: one request each, every answer back (µs, p50).
    private func rawGather(_ baseline: URL, _ endpoints: [String]) async throws -> Double {
        let result = try await runCommand(baseline, ["gather-client", endpoints.joined(separator: ","), String(gathers)], seconds: 300)
        guard result.status == 0, let figure = Double(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw ValidationError("zmq-baseline gather-client: \(result)")
        }
        return figure
    }

    /// The same stream through BusClient and ServiceHost: typed parts, JSON both ways.
    private func fullStack(_ bus: BusClient) async throws -> (Double, Double) {
        var firsts: [Double] = [], received = 0
        let started = ContinuousClock.now
        for _ in 0..<streams {
            let start = ContinuousClock.now
            let stream = bus.stream(PartsBench.partsMethod, .init(parts: parts, size: size))
            var first = true
            for try await _ in stream {
                if first {
                    firsts.append(microseconds(since: start))
                    first = false
                }
                received += 1
            }
            _ = try await stream.end()
        }
        return (median(firsts), Double(received) / (microseconds(since: started) / 1e6))
    }

    /// `whoami` to every echo worker through BusClient.gather, to the summary (µs, p50).
    private func fullStackGather(_ bus: BusClient) async throws -> Double {
        var rounds: [Double] = []
        for _ in 0..<gathers {
            let start = ContinuousClock.now
            let summary = try await bus.gather(EchoAPI.whoami).end()
            guard summary.answered == gatherWorkers else { throw ValidationError("a request to every worker: \(summary)") }
            rounds.append(microseconds(since: start))
        }
        return median(rounds)
    }

    private func microseconds(since start: ContinuousClock.Instant) -> Double {
        Double((ContinuousClock.now - start) / .nanoseconds(1)) / 1_000
    }
}

/// The service the full-stack row streams from: `parts` strings of `size` bytes.
actor PartsBench: BusService {
    static let name = "bench-parts"
    struct Ask: Codable, Sendable {
        var parts: Int
        var size: Int
    }
    struct Done: Codable, Sendable { var parts: Int }
    static let partsMethod = StreamMethod(Method<Ask, Done>(name, "parts", "Strings of the given size, as parts."), part: String.self) { end, _ in end }

    nonisolated func methods(_ table: inout MethodTable<PartsBench>) {
        table.onStream(Self.partsMethod) { _, ask, parts in
            let part = String(repeating: "Z", count: ask.size)
            for _ in 0..<ask.parts { try await parts.send(part) }
            return Done(parts: ask.parts)
        }
    }
}
