public import BusKit
import BusProtocol
public import Histogram
import Synchronization
import ZeroMQ

/// Publish/subscribe load through the kernel's state server: one client publishes `count`
/// updates (acknowledged `state.publish`, `window` in flight) under a prefix of its own, and
/// each subscriber (a connection of its own, 12/CHP) counts what reaches it, the gaps the
/// subscription reports, and each update's delay from publish to delivery.
///
/// The updates cycle through `keys` keys, so that a client's state quota is not spent, and
/// the keys are deleted afterwards.
public struct PublishBench: Sendable {
    /// Where the updates go: a prefix no one else writes (`/client/bench/...`).
    public var prefix: String
    public var count: Int
    public var keys: Int
    /// Bytes of each update's value (at least what its timestamp takes).
    public var valueBytes: Int
    public var window: Int
    /// How long a subscriber may go without an update, once everything is published, before
    /// what has not reached it counts as lost.
    public var quietAfterPublishing: Duration
    /// How long a subscriber may take to read the (empty) snapshot and go live.
    public var syncTimeout: Duration = .seconds(10)

    public init(prefix: String, count: Int, keys: Int = 100, valueBytes: Int = 64, window: Int = 64,
                quietAfterPublishing: Duration = .seconds(2)) {
        precondition(prefix.hasPrefix("/") && count > 0 && keys > 0 && window > 0)
        (self.prefix, self.count, self.keys, self.valueBytes, self.window) = (prefix, count, keys, valueBytes, window)
        self.quietAfterPublishing = quietAfterPublishing
    }

    /// Publishes with `publisher` while `subscribers` follow (each subscribes here, under the
    /// prefix); counts each delivery into `progress`.
    public func run(publisher: BusClient, subscribers: [BusClient], progress: BenchProgress = BenchProgress()) async throws -> PublishBenchResult {
        var opened: [Subscription] = []
        for client in subscribers {
            let subscription = try await client.subscribe(prefixes: [prefix], includeSnapshot: true, silenceTimeout: .seconds(30))
            opened.append(subscription)
            // Publish only once every subscriber is live: a CHP subscriber joining late would
            // miss the first updates by design, not by loss.
            let synced = try await withDeadline(syncTimeout, expired: { BenchError.notSynced(after: syncTimeout) }) {
                while let event = try await subscription.next() {
                    if case .synced = event { return true }
                }
                return false
            }
            guard synced else { throw BenchError.notSynced(after: syncTimeout) }
        }
        let subscriptions = opened
        let clock = SystemClock()
        let started = clock.now
        let marks = subscriptions.map { _ in DeliveryMark() }
        var published = (acknowledged: 0, refused: 0, firstRefusal: String?.none)
        var publishSeconds = 0.0
        var tallies = [DeliveryTally](repeating: DeliveryTally(), count: subscriptions.count)
        await withTaskGroup(of: Outcome.self) { group in
            for (index, subscription) in subscriptions.enumerated() {
                group.addTask { .delivered(index, await follow(subscription, mark: marks[index], clock: clock, progress: progress)) }
            }
            group.addTask {
                let outcome = await publish(with: publisher, clock: clock)
                let seconds = Double(clock.now - started) / 1e9
                await endFollowing(subscriptions, marks: marks, acknowledged: outcome.acknowledged, clock: clock)
                return .published(outcome, seconds: seconds)
            }
            for await outcome in group {
                switch outcome {
                case .delivered(let index, let tally): tallies[index] = tally
                case .published(let outcome, let seconds): (published, publishSeconds) = (outcome, seconds)
                }
            }
        }
        // Leave no bench keys behind.
        for key in 0..<min(keys, count) { _ = try? await publisher.publish(key: keyName(key), value: nil) }

        var latencies = latencyHistogram()
        for tally in tallies { latencies.add(tally.latencies) }
        return PublishBenchResult(
            published: published.acknowledged, refused: published.refused, publishSeconds: publishSeconds,
            subscribers: tallies.map { tally in
                SubscriberFigures(received: tally.received, gaps: tally.gaps, lost: max(0, published.acknowledged - tally.received),
                                  seconds: Double(tally.lastAt.map { $0 - started } ?? 0) / 1e9)
            },
            deliveryLatencies: latencies, firstRefusal: published.firstRefusal)
    }

    private func keyName(_ index: Int) -> String { "\(prefix)\(index)" }

    /// Sends the updates, `window` at a time; each value carries when it was sent.
    private func publish(with client: BusClient, clock: SystemClock) async -> (acknowledged: Int, refused: Int, firstRefusal: String?) {
        let tickets = Tickets()
        let padding = String(repeating: "x", count: max(0, valueBytes - 32))
        let outcome = Shared((acknowledged: 0, refused: 0, firstRefusal: String?.none))
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<window {
                group.addTask {
                    while true {
                        let index = tickets.take()
                        guard index < count else { return }
                        let value: JSONValue = ["sent": .int(Int64(clock.now)), "pad": .string(padding)]
                        do {
                            try await client.publish(key: keyName(index % keys), value: value)
                            outcome.with { $0.acknowledged += 1 }
                        } catch {
                            outcome.with {
                                $0.refused += 1
                                $0.firstRefusal = $0.firstRefusal ?? "\(error)"
                            }
                        }
                    }
                }
            }
        }
        return outcome.with { $0 }
    }

    /// Counts what reaches one subscriber, until its subscription is cancelled.
    private func follow(_ subscription: Subscription, mark: DeliveryMark, clock: SystemClock, progress: BenchProgress) async -> DeliveryTally {
        var tally = DeliveryTally()
        while let event = try? await subscription.next() {
            switch event {
            case .update(let update) where !update.isDelete && !update.fromSnapshot:
                let now = clock.now
                tally.received += 1
                mark.delivered(at: now)
                if let sent = update.json?["sent"]?.intValue, sent > 0, UInt64(sent) <= now {
                    _ = tally.latencies.record(min(now - UInt64(sent), 60_000_000_000))
                }
                progress.add(1)
            case .missed(let count, _, _):
                // The count comes from the kernel: clamped and added without overflow.
                let (sum, overflow) = tally.gaps.addingReportingOverflow(Int(clamping: count ?? 1))
                tally.gaps = overflow ? .max : sum
            default:
                break
            }
        }
        tally.lastAt = mark.last
        return tally
    }

    /// Once everything is published: each subscription is cancelled when it has had every
    /// update, or when none has reached it for ``quietAfterPublishing`` (the rest is lost).
    private func endFollowing(_ subscriptions: [Subscription], marks: [DeliveryMark], acknowledged: Int, clock: SystemClock) async {
        var open = Array(subscriptions.indices)
        let quiet = quietAfterPublishing.nanoseconds, since = clock.now
        while !open.isEmpty {
            var still: [Int] = []
            for index in open {
                let mark = marks[index], now = clock.now
                if mark.count >= acknowledged || now - max(mark.last ?? since, since) > quiet {
                    await subscriptions[index].cancel()
                } else {
                    still.append(index)
                }
            }
            open = still
            if !open.isEmpty { try? await Task.sleep(for: .milliseconds(20)) }
        }
    }

    private enum Outcome: Sendable {
        case delivered(Int, DeliveryTally)
        case published((acknowledged: Int, refused: Int, firstRefusal: String?), seconds: Double)
    }
}

/// What has reached one subscriber so far, for the task that decides when it is done.
private final class DeliveryMark: Sendable {
    private let received = Atomic<Int>(0)
    private let lastAt = Atomic<UInt64>(0)
    var count: Int { received.load(ordering: .relaxed) }
    var last: UInt64? { let value = lastAt.load(ordering: .relaxed); return value == 0 ? nil : value }
    func delivered(at now: UInt64) {
        received.add(1, ordering: .relaxed)
        lastAt.store(now, ordering: .relaxed)
    }
}

public enum BenchError: Error, CustomStringConvertible {
    case notSynced(after: Duration)

    public var description: String {
        switch self {
        case .notSynced(let after): "a subscriber did not receive the state's snapshot within \(after.formatted)"
        }
    }
}

/// What a ``PublishBench`` measured.
public struct PublishBenchResult: Sendable {
    /// Updates the kernel acknowledged, and refused (with the first refusal's words).
    public var published: Int
    public var refused: Int
    public var publishSeconds: Double
    public var subscribers: [SubscriberFigures]
    /// From publish to delivery, in nanoseconds, over every subscriber.
    public var deliveryLatencies: Histogram<UInt64>
    public var firstRefusal: String?

    public var publishRate: Double { publishSeconds > 0 ? Double(published) / publishSeconds : 0 }
    public var gaps: Int { subscribers.map(\.gaps).reduce(0, +) }
    public var lost: Int { subscribers.map(\.lost).reduce(0, +) }
}

/// One subscriber's share.
public struct SubscriberFigures: Sendable {
    public var received: Int
    /// Updates the subscription said it missed (a gap it then resynced over).
    public var gaps: Int
    /// Acknowledged updates that never reached it.
    public var lost: Int
    /// From the first publish to its last delivery.
    public var seconds: Double

    public var rate: Double { seconds > 0 ? Double(received) / seconds : 0 }
}

private struct DeliveryTally: Sendable {
    var received = 0
    var gaps = 0
    var lastAt: UInt64?
    var latencies = latencyHistogram()
}
