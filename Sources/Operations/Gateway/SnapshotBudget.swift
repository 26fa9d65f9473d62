import Foundation
import Synchronization

/// How many bytes of opening snapshots one caller (an address) may be sent: a token bucket of
/// `bytesPerMinute`, refilled continuously. A stream that opens with a snapshot (a first
/// connection, or a resume from further back than the changes kept) is let in while the
/// caller's bucket is not empty, and its snapshot's bytes are then taken from it (the bucket
/// may go below zero: a snapshot larger than a minute's worth still gets through once the
/// bucket is full). Without it a 200-byte request could make the gateway send the whole
/// state, again and again, to anyone who asks.
final class SnapshotBudget: Sendable {
    let bytesPerMinute: Int
    /// Callers tracked at most; past it, those whose bucket is full again are forgotten, and
    /// if that is not enough (callers from that many addresses at once), those closest to full
    /// until half are left: memory stays bounded, at the cost of a fresh budget for them.
    static let maxCallers = 100_000
    private struct Bucket {
        var bytes: Double
        var at: ContinuousClock.Instant
    }
    private let buckets = Mutex<[String: Bucket]>([:])

    /// `bytesPerMinute` 0: no bound.
    init(bytesPerMinute: Int) {
        self.bytesPerMinute = bytesPerMinute
    }

    /// Callers tracked now.
    var callers: Int { buckets.withLock { $0.count } }

    private var perSecond: Double { Double(bytesPerMinute) / 60 }

    /// nil when `caller` may open a stream with a snapshot now; else the whole seconds until it may.
    func waitBeforeSnapshot(for caller: String, now: ContinuousClock.Instant = .now) -> Int? {
        guard bytesPerMinute > 0 else { return nil }
        let bytes = buckets.withLock { $0[caller].map { refilled($0, now: now) } ?? Double(bytesPerMinute) }
        guard bytes <= 0 else { return nil }
        return Int((-bytes / perSecond).rounded(.up)) + 1
    }

    /// Takes `bytes` of a snapshot sent to `caller` from its bucket.
    func charge(_ bytes: Int, to caller: String, now: ContinuousClock.Instant = .now) {
        guard bytesPerMinute > 0, bytes > 0 else { return }
        buckets.withLock { buckets in
            let left = buckets[caller].map { refilled($0, now: now) } ?? Double(bytesPerMinute)
            buckets[caller] = Bucket(bytes: left - Double(bytes), at: now)
            guard buckets.count > Self.maxCallers else { return }
            buckets = buckets.filter { refilled($0.value, now: now) < Double(bytesPerMinute) }
            if buckets.count > Self.maxCallers {
                let kept = buckets.sorted { refilled($0.value, now: now) < refilled($1.value, now: now) }.prefix(Self.maxCallers / 2)
                buckets = Dictionary(uniqueKeysWithValues: kept.map { ($0.key, $0.value) })
            }
        }
    }

    private func refilled(_ bucket: Bucket, now: ContinuousClock.Instant) -> Double {
        let seconds = Double((now - bucket.at) / .milliseconds(1)) / 1_000
        return min(Double(bytesPerMinute), bucket.bytes + seconds * perSecond)
    }
}
