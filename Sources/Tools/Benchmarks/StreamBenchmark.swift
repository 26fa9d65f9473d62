import ArgumentParser
import BusKit
import BusProtocol
import ContractKit
import Contracts
import Foundation
import SwitchboardTestSupport

/// Replies in parts (18/MDP): the time to the first part and parts per second of one
/// stream, through the kernel (`switchboard kernel` as its own process) beside raw libzmq in
/// C doing the same frames with no broker, in the same rounds.
struct StreamBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stream",
        abstract: "Replies in parts: time to the first part and parts per second, raw C beside the kernel and the full stack."
    )

    @Option(help: "Parts in each stream.")
    var parts = 10_000
    @Option(help: "Bytes of each part.")
    var size = 256
    @Option(help: "Streams per measurement (one at a time).")
    var streams = 20
    @Option(help: "Rounds of measurements; the median is reported.")
    var runs = 3

    func run() async throws { printTable(try await measure()) }

    func measure() async throws -> [Row] {
        let baseline = productsDirectory().appendingPathComponent("zmq-baseline")
        guard FileManager.default.isExecutableFile(atPath: baseline.path) else {
            throw ValidationError("no zmq-baseline at \(baseline.path): swift build -c release --product zmq-baseline")
        }
        let ports = (0..<5).map { _ in "tcp://127.0.0.1:\(freePort())" }
        let counts = [String(parts), String(size)]
        // Each watches its standard input, a pipe this process holds: they end with it.
        let processes = [
            try ChildProcess(baseline, ["stream-server", ports[0]] + counts),
            try ChildProcess(switchboardExecutable(), ["kernel", "--log-level", "error", "--broker", ports[1], "--snapshot", ports[2],
                                                       "--publisher", ports[3], "--collector", ports[4]]),
            try ChildProcess(baseline, ["mdp02-stream-worker", ports[1], "cstream"] + counts),
        ]
        defer { for process in processes.reversed() { process.stop(grace: 2) } }
        let options = ServiceHost<PartsBench>.Options(brokers: [ports[1]], connections: 1)
        let host = try ServiceHost(service: PartsBench(), options: options)
        try await host.start()
        let bus = try await BusClient(brokers: [ports[1]], timeout: .seconds(30))
        try await eventually(10, "the stream workers registered") {
            let c = try await bus.hasWorkers("cstream"), swift = try await bus.hasWorkers(PartsBench.name)
            return c && swift
        }
        progress("Stream benchmark: \(parts) parts of \(size) bytes a stream, \(streams) streams one at a time, \(runs) rounds")
        var raw: [(Double, Double)] = [], kernel = raw, stack = raw
        for round in 1...runs {
            progress("round \(round) of \(runs)")
            raw.append(try await cClient(baseline, ports[0], service: "-"))
            kernel.append(try await cClient(baseline, ports[1], service: "cstream"))
            stack.append(try await fullStack(bus))
        }
        await bus.close()
        await host.stop()
        func figures(_ runs: [(Double, Double)]) -> (first: Double, rate: Double) { (median(runs.map(\.0)), median(runs.map(\.1))) }
        let metal = figures(raw), brokered = figures(kernel), full = figures(stack)
        func note(_ value: (first: Double, rate: Double), versus: (first: Double, rate: Double), _ name: String) -> String {
            String(format: "first part %.0f µs (%.2fx %@); parts/s %.2fx %@", value.first, value.first / versus.first, name, value.rate / versus.rate, name)
        }
        return [
            Row("raw libzmq (C): DEALER-ROUTER, no broker", rate: metal.rate, note: String(format: "first part %.0f µs", metal.first)),
            Row("kernel, 18/MDP: C client and C worker", rate: brokered.rate, note: note(brokered, versus: metal, "raw C")),
            Row("full stack: BusClient.stream from a hosted service", rate: full.rate, note: note(full, versus: brokered, "the C peers through the kernel")),
        ]
    }

    /// The C client's median time to the first part (µs) and its parts per second.
    private func cClient(_ baseline: URL, _ endpoint: String, service: String) async throws -> (Double, Double) {
        let result = try await runCommand(baseline, ["stream-client", endpoint, service, String(streams)], seconds: 300)
        let figures = result.stdout.split(separator: " ").compactMap { Double($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        guard result.status == 0, figures.count == 2 else { throw ValidationError("zmq-baseline stream-client: \(result)") }
        return (figures[0], figures[1])
    }

    /// The same through BusClient and ServiceHost: typed parts, JSON both ways.
    private func fullStack(_ bus: BusClient) async throws -> (Double, Double) {
        var firsts: [Double] = [], received = 0
        let started = ContinuousClock.now
        for _ in 0..<streams {
            let start = ContinuousClock.now
            let stream = bus.stream(PartsBench.partsMethod, .init(parts: parts, size: size))
            var first = true
            for try await _ in stream {
                if first {
                    firsts.append(Double((ContinuousClock.now - start) / .nanoseconds(1)) / 1_000)
                    first = false
                }
                received += 1
            }
            _ = try await stream.end()
        }
        let seconds = Double((ContinuousClock.now - started) / .nanoseconds(1)) / 1e9
        return (median(firsts), Double(received) / seconds)
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
