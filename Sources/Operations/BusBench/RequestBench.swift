public import BusKit
import BusProtocol
public import Histogram
import Synchronization
import ZeroMQ

/// Request/reply load against a bus, after `nats bench`: each client (a connection of its
/// own) keeps `window` requests in flight, each answered before the next is sent in its slot;
/// a window of 1 is synchronous. Every round trip's latency goes into an HDR histogram.
///
/// `sb bench request` runs it against a live bus; `switchboard-bench kernel` runs the same
/// code against a kernel in its own process, so the two report the same figures.
public struct RequestBench: Sendable {
    public enum Stop: Sendable, Equatable {
        /// This many requests in all, shared out among the clients as they go.
        case count(Int)
        /// As many as fit in this time.
        case duration(Duration)
    }

    public var service: String
    public var method: String
    /// The params as JSON text (nil: none), sent as they are with every request.
    public var paramsText: [UInt8]?
    /// Requests in flight per client (1: synchronous).
    public var window: Int
    public var stop: Stop
    /// Requests each client sends before the clock starts (connections warmed, not measured).
    public var warmup: Int
    /// Keep every request's latency in ``RequestBenchResult/samples`` (for a CSV file), up to
    /// ``maxSamples``: a long timed run must not hold gigabytes of them.
    public var keepSamples: Bool
    public static let maxSamples = 10_000_000

    public init(service: String, method: String, paramsText: [UInt8]?, window: Int = 1, stop: Stop = .count(10_000),
                warmup: Int = 0, keepSamples: Bool = false) {
        precondition(window > 0, "a window holds at least one request")
        (self.service, self.method, self.paramsText, self.window, self.stop) = (service, method, paramsText, window, stop)
        (self.warmup, self.keepSamples) = (warmup, keepSamples)
    }

    /// The echo service's `echo` with params of `size` bytes of JSON text (`{"text":"xx…"}`):
    /// the default load of `sb bench` and of the in-process benchmark.
    public static func echo(size: Int = 64, window: Int = 1, stop: Stop = .count(10_000), warmup: Int = 0, keepSamples: Bool = false) -> RequestBench {
        let text = JSONValue.object(["text": .string(String(repeating: "x", count: max(0, size - 11)))]).jsonBytes
        return RequestBench(service: "echo", method: "echo", paramsText: text, window: window, stop: stop, warmup: warmup, keepSamples: keepSamples)
    }

    /// Runs the load on `clients`, counting each answered request into `progress`.
    public func run(on clients: [BusClient], progress: BenchProgress = BenchProgress()) async -> RequestBenchResult {
        precondition(!clients.isEmpty, "a benchmark needs a client")
        for client in clients where warmup > 0 {
            for _ in 0..<warmup { _ = try? await client.request(service: service, method: method, paramsText: paramsText) }
        }
        let tickets = Tickets()
        let sampleTickets = Tickets()
        let failures = Shared(FailureTally())
        let clock = SystemClock()
        let started = clock.now
        let deadline: UInt64? = if case .duration(let duration) = stop { started + duration.nanoseconds } else { nil }
        let limit: Int = if case .count(let count) = stop { count } else { .max }
        // One histogram per client, shared by its slots under a lock: a histogram per slot
        // would take hundreds of kilobytes each.
        let perClient: [ClientTally] = await withTaskGroup(of: (Int, ClientTally).self) { group in
            for (index, client) in clients.enumerated() {
                group.addTask(executorPreference: client.executor) {
                    let tally = Shared(ClientTally())
                    await withTaskGroup(of: Void.self) { slots in
                        for _ in 0..<window {
                            slots.addTask {
                                var samples: [LatencySample] = []
                                while tickets.take() < limit {
                                    let sent = clock.now
                                    if let deadline, sent >= deadline { break }
                                    let outcome: BusError?
                                    do throws(BusError) {
                                        _ = try await client.request(service: service, method: method, paramsText: paramsText)
                                        outcome = nil
                                    } catch {
                                        outcome = error
                                    }
                                    let latency = clock.now - sent
                                    tally.with { $0.record(latency, ok: outcome == nil) }
                                    if let outcome { failures.with { $0.count(outcome) } }
                                    if keepSamples, sampleTickets.take() < Self.maxSamples {
                                        samples.append(LatencySample(client: index, sentAt: sent - started, latency: latency, ok: outcome == nil))
                                    }
                                    progress.add(1)
                                }
                                let kept = samples
                                if !kept.isEmpty { tally.with { $0.samples += kept } }
                            }
                        }
                    }
                    return (index, tally.with { $0 })
                }
            }
            var tallies = [ClientTally](repeating: ClientTally(), count: clients.count)
            for await (index, tally) in group { tallies[index] = tally }
            return tallies
        }
        let seconds = Double(clock.now - started) / 1e9
        var latencies = latencyHistogram()
        for tally in perClient { latencies.add(tally.latencies) }
        return RequestBenchResult(
            succeeded: perClient.map(\.succeeded).reduce(0, +), failed: perClient.map(\.failed).reduce(0, +),
            failures: failures.with { $0.kinds }, seconds: seconds, latencies: latencies,
            clientRates: perClient.map { Double($0.succeeded + $0.failed) / seconds },
            samples: perClient.flatMap(\.samples).sorted { $0.sentAt < $1.sentAt })
    }
}

/// What a ``RequestBench`` measured.
public struct RequestBenchResult: Sendable {
    public var succeeded: Int
    public var failed: Int
    /// Why requests failed, by kind ("-32001 unavailable: ..."), with how many each.
    public var failures: [String: Int]
    public var seconds: Double
    /// Round-trip latencies in nanoseconds, failed requests included.
    public var latencies: Histogram<UInt64>
    /// Each client's requests per second.
    public var clientRates: [Double]
    /// Every request, in the order sent, when the bench kept them (the first
    /// ``RequestBench/maxSamples``).
    public var samples: [LatencySample]

    public var requests: Int { succeeded + failed }
    /// Requests per second, answered or failed.
    public var rate: Double { seconds > 0 ? Double(requests) / seconds : 0 }
}

/// One request's round trip, for a CSV file of latencies.
public struct LatencySample: Sendable {
    public var client: Int
    /// When it was sent, in nanoseconds since the measurement began.
    public var sentAt: UInt64
    public var latency: UInt64
    public var ok: Bool
}

/// How far a benchmark has got, read by whoever draws a progress bar.
public final class BenchProgress: Sendable {
    private let done = Atomic<Int>(0)
    public init() {}
    public var count: Int { done.load(ordering: .relaxed) }
    func add(_ amount: Int) { done.add(amount, ordering: .relaxed) }
}

/// Hands out request numbers to a benchmark's tasks, each once.
final class Tickets: Sendable {
    private let next = Atomic<Int>(0)
    func take() -> Int { next.add(1, ordering: .relaxed).oldValue }
}

/// A value a benchmark's tasks share, behind a lock (each touches it once per request).
final class Shared<Value: Sendable>: Sendable {
    private let value: Mutex<Value>
    init(_ value: Value) { self.value = Mutex(value) }
    func with<Result: Sendable>(_ body: (inout Value) -> Result) -> Result { value.withLock { body(&$0) } }
}

/// Latencies in nanoseconds, from 1 ns to 60 s at 3 significant digits.
public func latencyHistogram() -> Histogram<UInt64> {
    Histogram<UInt64>(lowestDiscernibleValue: 1, highestTrackableValue: 60_000_000_000, numberOfSignificantValueDigits: .three)
}

private struct ClientTally: Sendable {
    var latencies = latencyHistogram()
    var succeeded = 0
    var failed = 0
    var samples: [LatencySample] = []

    mutating func record(_ latency: UInt64, ok: Bool) {
        _ = latencies.record(min(latency, 60_000_000_000))
        if ok { succeeded += 1 } else { failed += 1 }
    }
}

/// Failures by kind: the code and the first words of the message, so that many requests
/// failing one way make one line.
private struct FailureTally: Sendable {
    static let kindsKept = 20
    var kinds: [String: Int] = [:]

    mutating func count(_ error: BusError) {
        let kind: String = switch error {
        case .timedOut(let service, let method, let after): "timed out: \(service) \(method) gave no reply within \(after.formatted)"
        case .unavailable(let service, let message): "-32001 \(service): \(message)"
        case .remote(_, let rpc): "\(rpc.code) \(rpc.message)"
        default: "\(error)"
        }
        // Many distinct messages (one naming each request, say) would make a report of them.
        if kinds[kind] == nil, kinds.count >= Self.kindsKept {
            kinds["other failures", default: 0] += 1
        } else {
            kinds[kind, default: 0] += 1
        }
    }
}

/// A latency histogram's figures, in microseconds, as `sb bench` prints them.
public struct LatencySummary: Sendable, Codable, Equatable {
    public var min, p50, p90, p99, p999, max, mean: Double

    public init(_ histogram: Histogram<UInt64>) {
        func micro(_ nanoseconds: UInt64) -> Double { (Double(nanoseconds) / 10).rounded() / 100 }
        let empty = histogram.totalCount == 0
        min = empty ? 0 : micro(histogram.min)
        p50 = micro(histogram.valueAtPercentile(50))
        p90 = micro(histogram.valueAtPercentile(90))
        p99 = micro(histogram.valueAtPercentile(99))
        p999 = micro(histogram.valueAtPercentile(99.9))
        max = micro(histogram.max)
        mean = empty ? 0 : (histogram.mean / 10).rounded() / 100
    }

    enum CodingKeys: String, CodingKey {
        case min, p50, p90, p99, p999 = "p99.9", max, mean
    }
}
