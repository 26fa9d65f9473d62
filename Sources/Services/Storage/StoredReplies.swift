package import Contracts
import Foundation
import ZeroMQ

/// A durable service's ``ReplyMemory``: its results are written by the effect's own
/// transaction (``SQLiteWriter``, or the store's PostgreSQL backend), so remembering has
/// nothing left to do, and recalling reads them back.
package struct StoredReplies: ReplyMemory {
    /// The result written for a request (by ``RequestKey``'s text), if any.
    let recall: @Sendable (String) async throws -> [UInt8]?

    package init(recall: @escaping @Sendable (String) async throws -> [UInt8]?) {
        self.recall = recall
    }

    package func recall(_ key: RequestKey) async throws -> [UInt8]? { try await recall(key.description) }
    package func remember(_ key: RequestKey, result: [UInt8]) async {}
}

/// The ``ReplyMemory`` of a service whose every state-changing method writes through a
/// ``SQLiteWriter`` or a ``PostgresWriter`` named by its request: the write itself answers a
/// request written before with the result it had (SQLite looks it up in its transaction;
/// PostgreSQL finds it when its key refuses the second copy), so nothing is recalled first, a
/// read and its thread hops fewer per request.
package struct RepliesCheckedByWrites: ReplyMemory {
    package init() {}
    package func recall(_ key: RequestKey) async throws -> [UInt8]? { nil }
    package func remember(_ key: RequestKey, result: [UInt8]) async {}
}

/// When a writer deletes the results it remembers past its reply window (`remember_seconds`):
/// at a write, once the window has passed since it last did, and at least once a minute, so
/// the table holds about a window of results and the deleting rides on a write now and then.
struct ReplyPruning: Sendable {
    let window: Duration
    private var lastPruned = ContinuousClock.now

    init(window: Duration) { self.window = window }

    /// The time (seconds since 1970) before which this write forgets results; nil: not yet.
    mutating func forgetBefore() -> Double? {
        guard ContinuousClock.now - lastPruned >= min(window, .seconds(60)) else { return nil }
        lastPruned = .now
        return Date().timeIntervalSince1970 - window.seconds
    }
}
