import BusProtocol
import ZeroMQ

/// What the broker counts per service, for `kernel` `stats` and `metrics`.
struct ServiceStats {
    /// Requests received for the service.
    var requests = 0
    /// Replies relayed from a worker, and how many of them were JSON-RPC errors.
    var replies = 0, errors = 0
    /// Answered -32001 by the kernel (no worker in time, or the queue full).
    var unavailable = 0
    /// Re-sent to another worker after theirs died; answered -32006 instead (non-retriable).
    var redispatched = 0, outcomeUnknown = 0
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
        let index = Self.bounds.firstIndex { micros <= $0 } ?? Self.bounds.count
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

extension JSONRPCResponse {
    /// How many JSON-RPC error responses `bytes` holds (one response or a batch), found by
    /// scanning for a non-null top-level "error" member without decoding anything, so the
    /// broker can count errors on every reply cheaply: a single response stops at "result".
    static func errorCount(in bytes: UnsafeRawBufferPointer) -> Int {
        var index = 0, errors = 0
        var containers: [Bool] = []  // true: an object
        var expectingKey = false
        let n = bytes.count
        func skipSpace() { while index < n, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 } }
        skipSpace()
        // Responses are members of the top object, or of objects in a top array (a batch).
        let responseDepth = index < n && bytes[index] == UInt8(ascii: "[") ? 2 : 1
        while index < n {
            switch bytes[index] {
            case UInt8(ascii: "\""):
                let start = index + 1
                index += 1
                while index < n, bytes[index] != UInt8(ascii: "\"") {
                    index += bytes[index] == UInt8(ascii: "\\") ? 2 : 1
                }
                let isKey = expectingKey && containers.count == responseDepth
                expectingKey = false
                // One response with a "result" member is a success: stop before its value,
                // so a large result is not scanned (ours put "result" after jsonrpc and id).
                if isKey, responseDepth == 1, index - start == 6, Array(bytes[start..<index]) == Array("result".utf8) {
                    return errors
                }
                if isKey, index - start == 5, Array(bytes[start..<index]) == Array("error".utf8) {
                    index += 1
                    skipSpace()
                    if index < n, bytes[index] == UInt8(ascii: ":") { index += 1 }
                    skipSpace()
                    if !(index < n && bytes[index] == UInt8(ascii: "n")) { errors += 1 }
                    continue
                }
            case UInt8(ascii: "{"): containers.append(true); expectingKey = true
            case UInt8(ascii: "["): containers.append(false); expectingKey = false
            case UInt8(ascii: "}"), UInt8(ascii: "]"): _ = containers.popLast(); expectingKey = false
            case UInt8(ascii: ","): expectingKey = containers.last == true
            default: break
            }
            index += 1
        }
        return errors
    }

    static func errorCount(in frames: [Frame]) -> Int {
        frames.reduce(0) { total, frame in total + frame.withUnsafeBytes { errorCount(in: $0) } }
    }
}
