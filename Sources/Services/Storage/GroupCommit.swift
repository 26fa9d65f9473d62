/// Group commit: what arrives while a batch is being written waits, and is written together
/// as the next batch (up to its bound), by the first of it to have come. Alone, an item is written at once, in a
/// batch of its own; under load, each batch costs one transaction (one `fsync`, one lock
/// taken) for everything that came meanwhile.
///
/// Owned by one actor and used in its isolation only: ``submit(_:isolation:write:)`` runs on
/// its caller's actor, which is what keeps the waiting list consistent across the suspensions.
package final class GroupCommit<Item: Sendable, Outcome: Sendable> {
    /// What a waiting item is woken with: its outcome, or that it is to write the next batch.
    private enum Turn {
        case written(Result<Outcome, any Error>)
        case writeNext
    }

    /// The items that came while a batch was being written, in the order they came; the
    /// first is the one that found no batch being written (no one to wake) or the one woken
    /// to write this batch.
    private var waiting: [(item: Item, turn: CheckedContinuation<Turn, Never>?)] = []
    private var writing = false
    /// The most items one batch takes; the rest wait for the next.
    private let maxBatch: Int

    /// `maxBatch`: the most items one batch takes (what one transaction's statements hold).
    package init(maxBatch: Int = .max) {
        precondition(maxBatch > 0, "a group commit's batch holds at least one item")
        self.maxBatch = maxBatch
    }

    /// `item`'s outcome, from the batch it was written in. `write` is handed a batch's items in
    /// the order they came and answers one outcome for each, in that order.
    package func submit(_ item: Item, isolation: isolated (any Actor) = #isolation, write: ([Item]) async -> [Result<Outcome, any Error>]) async throws -> Outcome {
        if writing {
            let turn = await withCheckedContinuation { waiting.append((item, $0)) }
            if case .written(let outcome) = turn { return try outcome.get() }
        } else {
            writing = true
            waiting.append((item, nil))
        }
        let batch = Array(waiting.prefix(maxBatch))
        waiting.removeFirst(batch.count)
        let outcomes = await write(batch.map(\.item))
        precondition(outcomes.count == batch.count, "a group commit's write answered \(outcomes.count) outcomes for \(batch.count) items")
        if let next = waiting.first {
            waiting[0].turn = nil
            next.turn?.resume(returning: .writeNext)
        } else {
            writing = false
        }
        for (waiter, outcome) in zip(batch.dropFirst(), outcomes.dropFirst()) { waiter.turn?.resume(returning: .written(outcome)) }
        return try outcomes[0].get()
    }
}
