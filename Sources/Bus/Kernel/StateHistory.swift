import DequeModule
import BusProtocol

/// The state's recent changes in sequence order: what a subscriber that knows where it
/// stopped resumes from (`ICANHAZ?` with a sequence), and each key's recent revisions
/// (`state.history`, at most `limits.perKey` of a key). Bounded by changes and bytes; the
/// oldest go first.
/// A deletion (or a TTL running out) is a change like any other, with an empty value.
///
/// A key's revisions are chained: each change names the key's change before it, so they are
/// found from the key's last change (its entry's sequence, or its deletion's) by a few binary
/// searches of the log, with no lookup by key when a change is recorded
/// and no reading of the whole log when asked (any client may ask).
struct StateHistory {
    struct Change {
        let sequence: UInt64
        let key: Frame
        /// Empty: the key was deleted.
        let value: Frame
        /// The CHP UUID the change carried: for a `state.set`, a digest of its request (client
        /// and id), so the same request sent again after a failover is known as the same.
        let uuid: Frame
        /// The sequence of the key's change before this one; 0: none.
        let previous: UInt64
        /// Bytes it counts against the byte bound: the memory it holds, its record in the
        /// log as well as its key, value and UUID (and a deletion's place in ``deletions``),
        /// so that small changes are not free. Counted once, as it is recorded.
        let size: Int

        init(sequence: UInt64, key: Frame, value: Frame, uuid: Frame, previous: UInt64) {
            (self.sequence, self.key, self.value, self.uuid, self.previous) = (sequence, key, value, uuid, previous)
            size = MemoryLayout<Change>.stride + key.heldBytes + value.heldBytes + uuid.heldBytes + (value.isEmpty ? Self.deletionBytes : 0)
        }
        /// A key and sequence in a dictionary, with its share of the table, near enough.
        static let deletionBytes = 96
    }

    struct Limits: Equatable {
        /// Changes the log keeps.
        var changes: Int
        var bytes: Int
        /// Revisions `state.history` gives of one key.
        var perKey: Int
    }

    var limits: Limits
    private(set) var changes: Deque<Change> = []
    private(set) var bytes = 0
    /// Every change after this sequence is held.
    private(set) var start: UInt64

    init(start: UInt64, limits: Limits) {
        self.start = start
        self.limits = limits
    }

    /// Keys with revisions held, counted over the log when asked (`kernel stats`) and kept
    /// until the log changes: any client may ask for the stats, and asking again and again
    /// must not make the kernel hash the whole log each time.
    var keys: Int {
        guard limits.perKey > 0 else { return 0 }
        let version = (last: changes.last?.sequence ?? start, count: changes.count)
        if let counted = keyCount.counted, counted.version == version { return counted.keys }
        let keys = Set(changes.lazy.map(\.key)).count
        keyCount.counted = (version, keys)
        return keys
    }

    /// The last count of ``keys``, and the log it was counted over (its last sequence and
    /// length: the log only grows at its end and shrinks at its start).
    private final class KeyCount {
        var counted: (version: (last: UInt64, count: Int), keys: Int)?
    }
    private let keyCount = KeyCount()

    /// The last change of each key that is not in the state, a deletion or expiry the log
    /// holds: where its chain of revisions starts. Looked up only for a key the state does
    /// not hold (a new key, or one deleted again), and changed only by deletions.
    private var deletions: [Frame: UInt64] = [:]

    /// The last change of `key`, which the state does not hold, for the change that follows
    /// it (0: none the log holds); it is no longer the key's last.
    mutating func takeLastDeletion(of key: Frame) -> UInt64 {
        guard !deletions.isEmpty else { return 0 }
        return deletions.removeValue(forKey: key) ?? 0
    }

    mutating func record(_ change: Change) {
        if change.value.isEmpty { deletions[change.key] = change.sequence }
        changes.append(change)
        bytes += change.size
        trim()
    }

    /// Drops the oldest changes until the log is within its bounds (after a reload too).
    mutating func trim() {
        while changes.count > limits.changes || bytes > limits.bytes, let oldest = changes.popFirst() {
            start = oldest.sequence
            bytes -= oldest.size
            if oldest.value.isEmpty, deletions[oldest.key] == oldest.sequence { deletions[oldest.key] = nil }
        }
    }

    /// Forgets everything: the log starts again after `sequence` (a copy of the peer's state
    /// was installed).
    mutating func restart(after sequence: UInt64) {
        changes = []
        deletions = [:]
        bytes = 0
        start = sequence
    }

    /// The changes after `since` (nil when the log no longer holds them all, or `since` is
    /// past `head`, the last sequence).
    func changes(after since: UInt64, head: UInt64) -> Deque<Change>.SubSequence? {
        guard since >= start, since <= head else { return nil }
        return changes[position(after: since)...]
    }

    /// The revisions of `key` held, oldest first: its latest `limits.perKey` changes in the
    /// log, followed back from `last`, its last change's sequence when the state holds it.
    func revisions(of key: Frame, last: UInt64?) -> [Change] {
        var sequence = last ?? deletions[key] ?? 0
        var found: [Change] = []
        while sequence > start, found.count < limits.perKey {
            let index = position(after: sequence - 1)
            guard index < changes.endIndex, changes[index].sequence == sequence, changes[index].key == key else { break }
            found.append(changes[index])
            sequence = changes[index].previous
        }
        return found.reversed()
    }

    /// The index of the first change with a sequence after `sequence`.
    private func position(after sequence: UInt64) -> Int {
        var low = changes.startIndex, high = changes.endIndex
        while low < high {
            let middle = (low + high) / 2
            if changes[middle].sequence <= sequence { low = middle + 1 } else { high = middle }
        }
        return low
    }
}
