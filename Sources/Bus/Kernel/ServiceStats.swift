import BusProtocol
import ZeroMQ

/// What the broker counts per service, for `kernel` `stats` and `metrics`.
struct ServiceStats {
    /// Requests received for the service.
    var requests = 0
    /// Replies relayed from a worker, and how many of them were JSON-RPC errors: a count
    /// the workers report in their heartbeats (the kernel never reads a body).
    var replies = 0, errors = 0
    /// Answered -32001 by the kernel (no worker in time, or the queue full).
    var unavailable = 0
    /// Re-sent to another worker after theirs died; answered -32006 instead (non-retriable).
    var redispatched = 0, outcomeUnknown = 0
    /// Requests answered -32012: each worker they were handed to died with them.
    var handlerDied = 0
    /// Time from the request's arrival to its reply, for replies from workers.
    var latency = LatencyHistogram()
}

/// Request latencies in fixed buckets (the Prometheus histogram's `le` bounds), so the
/// kernel keeps a few integers per service however many requests it sees.
struct LatencyHistogram {
    /// Upper bounds in microseconds; a last, unbounded bucket follows.
    static let bounds: [UInt64] = [50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000,
                                   100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000]
    private(set) var counts = [Int](repeating: 0, count: bounds.count + 1)
    private(set) var count = 0
    private(set) var sumNanoseconds: UInt64 = 0

    mutating func record(nanoseconds: UInt64) {
        let micros = nanoseconds / 1_000
        // By index, not `firstIndex(where:)`: in a debug build that allocates for each bound
        // it reads, and what a request costs (counted by the test command) would grow with
        // its latency.
        let bounds = Self.bounds
        var index = 0
        while index < bounds.count && micros > bounds[index] { index += 1 }
        counts[index] += 1
        count += 1
        sumNanoseconds &+= nanoseconds
    }

    /// The bucket bound below which `quantile` of the requests fell (an upper estimate), in
    /// microseconds; nil with no requests or in the unbounded bucket.
    func quantileMicroseconds(_ quantile: Double) -> UInt64? {
        guard count > 0 else { return nil }
        let rank = Int((Double(count) * quantile).rounded(.up))
        var seen = 0
        for (index, bucket) in counts.enumerated() {
            seen += bucket
            if seen >= max(rank, 1) { return index < Self.bounds.count ? Self.bounds[index] : nil }
        }
        return nil
    }

    var meanMicroseconds: Double { count > 0 ? Double(sumNanoseconds) / Double(count) / 1_000 : 0 }
}
