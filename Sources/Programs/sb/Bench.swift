import ArgumentParser
import BusBench
import BusKit
import BusProtocol
import Contracts
import Foundation
import Histogram
import SwitchboardConfig

/// `sb bench`: load against a live bus, after `nats bench`.
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "Measure a live bus: request/reply (default), or publish/subscribe through the kernel's state.",
        discussion: """
            Latencies are HDR-histogram percentiles. A progress bar shows on a terminal; --json prints one object instead of the report.

            Examples:
              sb bench                                   10,000 echo requests, one by one
              sb bench request --clients 8 --window 16   8 connections, 16 in flight each
              sb bench request search countries.search '{"query":"par"}' --duration 10s
              sb bench request --count 50000 --csv latencies.csv
              sb bench publish --subscribers 10 --count 20000
            """,
        subcommands: [BenchRequest.self, BenchPublish.self],
        defaultSubcommand: BenchRequest.self
    )
}

struct BenchRequest: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "request",
        abstract: "Requests through the kernel to a service (the echo service by default): rate and latencies.",
        discussion: """
            Each client is a connection of its own and keeps --window requests in flight (1: synchronous). The report gives the requests per second, the latency percentiles (each request from send to answer), each client's rate, and what failed and why. Exit status 1 when any request failed, 69 when no worker offers the service.
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The service.") var service = "echo"
    @Argument(help: "The method.") var method = "echo"
    @Argument(help: "The params, as JSON (default: none; for echo echo, --size bytes of text).") var params: String?
    @Option(parsing: .unconditional, help: "Connections, each with its own window of requests (one socket thread for all).") var clients = 1
    @Option(parsing: .unconditional, help: "Requests in flight per client (1: synchronous).") var window = 1
    @Option(parsing: .unconditional, help: "Requests in all (unless --duration).") var count: Int?
    @Option(help: "Run this long instead of a count: 10s, 2m.") var duration: String?
    @Option(parsing: .unconditional, help: "Bytes of echo echo's params, when no params are given.") var size = 64
    @Option(parsing: .unconditional, help: "Requests each client sends first, not measured.") var warmup = 100
    @Option(help: "Write each request's latency to this CSV file (client, sent_us, latency_us, ok).") var csv: String?

    func validate() throws {
        guard (1...256).contains(clients) else { throw ValidationError("--clients must be 1 to 256") }
        guard (1...10_000).contains(window) else { throw ValidationError("--window must be 1 to 10000") }
        if let count, !(1...100_000_000).contains(count) { throw ValidationError("--count must be 1 to 100000000") }
        if count != nil, duration != nil { throw ValidationError("give --count or --duration, not both") }
        if let duration, ConnectionOptions.duration(duration) == nil {
            throw ValidationError("--duration: '\(duration)' is not a duration such as 10s or 2m (up to a day)")
        }
        guard (0...1_000_000).contains(size) else { throw ValidationError("--size must be 0 to 1000000 bytes") }
        if size != 64, params != nil || (service, method) != ("echo", "echo") {
            throw ValidationError("--size makes the params of echo echo; give other methods their PARAMS")
        }
        guard (0...100_000).contains(warmup) else { throw ValidationError("--warmup must be 0 to 100000") }
        // Checked before the run, not after it.
        if let csv, !FileManager.default.isWritableFile(atPath: URL(fileURLWithPath: csv).deletingLastPathComponent().path) {
            throw ValidationError("--csv: cannot write \(csv) (no such folder, or not writable)")
        }
        if let params {
            switch try parseJSON(params, "PARAMS") {
            case .object, .array: break
            default: throw ValidationError("PARAMS must be a JSON object or array (JSON-RPC params)")
            }
        }
    }

    func run() async throws {
        let stop: RequestBench.Stop = duration.flatMap(ConnectionOptions.duration).map { .duration($0) } ?? .count(count ?? 10_000)
        let bench = if params == nil, (service, method) == ("echo", "echo") {
            RequestBench.echo(size: size, window: window, stop: stop, warmup: warmup, keepSamples: csv != nil)
        } else {
            RequestBench(service: service, method: method, paramsText: try params.map { try parseJSON($0, "PARAMS").jsonBytes },
                         window: window, stop: stop, warmup: warmup, keepSamples: csv != nil)
        }
        try await withClient(connection) { first in
            if service != "kernel" {
                let offered: Bool
                do throws(BusError) { offered = try await first.hasWorkers(service) } catch {
                    throw await Failure(error, service: MMI.serviceQuery, method: service, client: first)
                }
                guard offered else {
                    throw Failure(status: ExitStatus.unavailable, message: "no worker offers '\(service)' (sb services lists those that do)")
                }
            }
            var clients = [first]
            // One socket thread for every connection, as a program with many would have: a thread
            // each (and libzmq's I/O thread each) made 8 clients slower than 1.
            for _ in 1..<self.clients { clients.append(try await connection.client(loop: first.loop)) }
            let progress = BenchProgress()
            let total: Int? = if case .count(let count) = stop { count } else { nil }
            let started = Date()
            let result = try await showingProgress(progress, total: total, duration: duration.flatMap(ConnectionOptions.duration), started: started) {
                await bench.run(on: clients, progress: progress)
            }
            for client in clients.dropFirst() { await client.close() }
            if let csv {
                try writeCSV(result.samples, to: csv)
                if result.samples.count < result.requests {
                    Output.diagnostic("the CSV holds the first \(result.samples.count) of \(result.requests) requests")
                }
            }
            report(result)
            if result.failed > 0 { throw Failure(status: ExitStatus.serviceError, message: "\(result.failed) of \(result.requests) requests failed") }
        }
    }

    private func report(_ result: RequestBenchResult) {
        let latency = LatencySummary(result.latencies)
        if output.json {
            Output.json([
                "kind": "request", "service": .string(service), "method": .string(method),
                "clients": .int(Int64(clients)), "window": .int(Int64(window)),
                "requests": .int(Int64(result.requests)), "succeeded": .int(Int64(result.succeeded)), "failed": .int(Int64(result.failed)),
                "failures": .object(result.failures.mapValues { .int(Int64($0)) }),
                "seconds": .double(rounded(result.seconds, 3)), "rate": .double(rounded(result.rate, 1)),
                "latencyMicroseconds": (try? JSONValue(encoding: latency)) ?? .null,
                "clientRates": .array(result.clientRates.map { .double(rounded($0, 1)) }),
            ], compact: true)
            return
        }
        let load = window == 1 ? "synchronous" : "\(window) in flight"
        Output.line(Output.styled("\(service) \(method): \(clients) client\(clients == 1 ? "" : "s"), \(load)", .bold))
        Output.line("  \(grouped(result.succeeded)) answered, \(grouped(result.failed)) failed in \(String(format: "%.2f", result.seconds)) s: \(Output.styled("\(grouped(Int(result.rate))) requests/s", .green))")
        Output.line("  latency  " + latencyLine(latency))
        if clients > 1 {
            let rates = result.clientRates
            Output.line("  clients  min \(grouped(Int(rates.min() ?? 0)))/s  avg \(grouped(Int(rates.reduce(0, +) / Double(rates.count))))/s  max \(grouped(Int(rates.max() ?? 0)))/s")
        }
        for (kind, count) in result.failures.sorted(by: { $0.value > $1.value }) {
            Output.line(Output.styled("  failed   \(grouped(count)) × \(kind)", .red))
        }
    }

    /// Writes the CSV a chunk at a time (ten million rows would be a 300 MB string), through
    /// the path as a shell's `>` would: a link or a device stays what it is.
    private func writeCSV(_ samples: [LatencySample], to path: String) throws {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else {
            throw Failure(status: ExitStatus.usage, message: "--csv: cannot write \(path): \(String(cString: strerror(errno)))")
        }
        let file = FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
        var chunk = "client,sent_us,latency_us,ok\n"
        do {
            for sample in samples {
                chunk += "\(sample.client),\(Double(sample.sentAt / 100) / 10),\(Double(sample.latency / 100) / 10),\(sample.ok)\n"
                if chunk.utf8.count >= 1 << 16 {
                    try file.write(contentsOf: Data(chunk.utf8))
                    chunk = ""
                }
            }
            try file.write(contentsOf: Data(chunk.utf8))
        } catch {
            throw Failure(status: ExitStatus.ioError, message: "--csv: cannot write \(path): \(systemReason(error))")
        }
    }
}

struct BenchPublish: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "publish",
        abstract: "Updates through the kernel's state server to subscribers: rate, delivery delay, gaps and losses.",
        discussion: """
            One client publishes (acknowledged state.publish, --window in flight) under a prefix of its own in /client/bench/, cycling through --keys keys, which it deletes afterwards; each subscriber is a connection of its own. Reported: updates published per second, what each subscriber received, the gaps its subscription reported, what never reached it, and the delay from publish to delivery. Exit status 1 when an update was refused or lost.
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Option(parsing: .unconditional, help: "Subscribers, each a connection of its own.") var subscribers = 1
    @Option(parsing: .unconditional, help: "Updates to publish.") var count = 10_000
    @Option(parsing: .unconditional, help: "Bytes of each update's value.") var size = 64
    @Option(parsing: .unconditional, help: "Updates in flight from the publisher.") var window = 64
    @Option(parsing: .unconditional, help: "Distinct keys the updates cycle through.") var keys = 100

    func validate() throws {
        guard (0...100).contains(subscribers) else { throw ValidationError("--subscribers must be 0 to 100") }
        guard (1...100_000_000).contains(count) else { throw ValidationError("--count must be 1 to 100000000") }
        guard (32...1_000_000).contains(size) else { throw ValidationError("--size must be 32 to 1000000 bytes (the value carries its send time)") }
        guard (1...10_000).contains(window) else { throw ValidationError("--window must be 1 to 10000") }
        guard (1...10_000).contains(keys) else { throw ValidationError("--keys must be 1 to 10000") }
    }

    func run() async throws {
        let prefix = "/client/bench/\(ProcessInfo.processInfo.hostName)-\(getpid())-\(UInt32.random(in: 0...UInt32.max))/"
        let bench = PublishBench(prefix: prefix, count: count, keys: keys, valueBytes: size, window: window)
        try await withClient(connection) { publisher in
            _ = try await call(publisher, KernelAPI.ping)
            var followers: [BusClient] = []
            for _ in 0..<subscribers { followers.append(try await connection.client()) }
            let progress = BenchProgress()
            let result: PublishBenchResult
            do {
                result = try await showingProgress(progress, total: count * max(subscribers, 1), duration: nil, started: Date()) {
                    try await bench.run(publisher: publisher, subscribers: followers, progress: progress)
                }
            } catch {
                for client in followers { await client.close() }
                throw Failure(status: ExitStatus.unavailable, message: "cannot subscribe to the kernel's state: \(error)")
            }
            for client in followers { await client.close() }
            report(result)
            if result.refused > 0 || result.lost > 0 {
                throw Failure(status: ExitStatus.serviceError, message: "\(result.refused) updates refused\(result.firstRefusal.map { " (\($0))" } ?? ""), \(result.lost) lost")
            }
        }
    }

    private func report(_ result: PublishBenchResult) {
        let delay = LatencySummary(result.deliveryLatencies)
        let rates = result.subscribers.map(\.rate)
        if output.json {
            Output.json([
                "kind": "publish", "subscribers": .int(Int64(subscribers)), "count": .int(Int64(count)),
                "valueBytes": .int(Int64(size)), "window": .int(Int64(window)),
                "published": .int(Int64(result.published)), "refused": .int(Int64(result.refused)),
                "seconds": .double(rounded(result.publishSeconds, 3)), "publishRate": .double(rounded(result.publishRate, 1)),
                "received": .array(result.subscribers.map { .int(Int64($0.received)) }),
                "subscriberRates": .array(rates.map { .double(rounded($0, 1)) }),
                "gaps": .int(Int64(result.gaps)), "lost": .int(Int64(result.lost)),
                "deliveryMicroseconds": (try? JSONValue(encoding: delay)) ?? .null,
            ], compact: true)
            return
        }
        Output.line(Output.styled("state: \(grouped(count)) updates of \(size) bytes to \(subscribers) subscriber\(subscribers == 1 ? "" : "s"), \(window) in flight", .bold))
        Output.line("  published \(grouped(result.published)) in \(String(format: "%.2f", result.publishSeconds)) s: \(Output.styled("\(grouped(Int(result.publishRate))) updates/s", .green)) (acknowledged)")
        guard subscribers > 0 else { return }
        let received = result.subscribers.map(\.received).reduce(0, +)
        Output.line("  received \(grouped(received)), \(result.gaps) in gaps, \(result.lost) lost; per subscriber min \(grouped(Int(rates.min() ?? 0)))/s  max \(grouped(Int(rates.max() ?? 0)))/s")
        Output.line("  delay    " + latencyLine(delay) + "  (publish to delivery)")
    }
}

/// Runs `work` while a progress bar on stderr (a terminal only) shows how far it is.
private func showingProgress<T: Sendable>(_ progress: BenchProgress, total: Int?, duration: Duration?, started: Date,
                                          _ work: () async throws -> T) async throws -> T {
    guard Output.stderrIsTerminal else { return try await work() }
    return try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask {
            while !Task.isCancelled {
                let done = progress.count, elapsed = Date().timeIntervalSince(started)
                let fraction = min(1, total.map { Double(done) / Double(max($0, 1)) } ?? duration.map { elapsed / $0.seconds } ?? 0)
                Output.progress("\(Output.bar(fraction)) \(Int(fraction * 100))%  \(grouped(done))\(total.map { "/\(grouped($0))" } ?? "")  \(grouped(Int(Double(done) / max(elapsed, 0.001))))/s")
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
        defer {
            group.cancelAll()
            Output.endProgress()
        }
        return try await work()
    }
}

private func latencyLine(_ summary: LatencySummary) -> String {
    func micro(_ value: Double) -> String { value >= 1_000 ? String(format: "%.2f ms", value / 1_000) : String(format: "%.1f µs", value) }
    return "min \(micro(summary.min))  p50 \(micro(summary.p50))  p90 \(micro(summary.p90))  p99 \(micro(summary.p99))  p99.9 \(micro(summary.p999))  max \(micro(summary.max))"
}

private func grouped(_ value: Int) -> String { value.formatted(.number.grouping(.automatic).locale(Locale(identifier: "en_US"))) }

private func rounded(_ value: Double, _ places: Int) -> Double {
    let scale = pow(10, Double(places))
    return (value * scale).rounded() / scale
}
