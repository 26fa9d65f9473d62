package import Contracts

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
