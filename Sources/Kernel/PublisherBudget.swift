import DequeModule

/// Bounds in bytes what the publisher may queue for one subscriber that does not read.
///
/// libzmq bounds a subscriber's queue by messages only (its send high-water mark), and a
/// stuck subscriber's queue holds the updates published after it stopped reading, whatever
/// their size. So the kernel sets the mark from the bytes it allows
/// (`kernel.subscriber_backlog_bytes`) and the largest update among the last
/// `subscriber_backlog` published: `bytes / largest`, at most `subscriber_backlog`, at
/// least 1. Small updates keep the whole count; while large values flow a stuck subscriber
/// holds at most about `bytes` of them, and misses the rest (it is told, and resyncs).
/// libzmq applies a changed mark to the subscribers already connected.
struct PublisherBudget {
    let maxMessages: Int
    let maxBytes: Int
    /// The mark in force.
    private(set) var highWaterMark: Int
    /// Sizes that can still be the largest of the window, each with its position: a
    /// decreasing run, so the front is the window's largest.
    private var candidates: Deque<(position: Int, size: Int)> = []
    private var position = 0

    init(maxMessages: Int, maxBytes: Int) {
        self.maxMessages = max(1, maxMessages)
        self.maxBytes = max(1, maxBytes)
        highWaterMark = self.maxMessages
    }

    /// Counts a published update of `size` bytes; returns the new mark when it changed.
    mutating func published(size: Int) -> Int? {
        position &+= 1
        while let last = candidates.last, last.size <= size { candidates.removeLast() }
        candidates.append((position, size))
        while let first = candidates.first, position &- first.position >= maxMessages { candidates.removeFirst() }
        let largest = max(1, candidates.first?.size ?? 1)
        let mark = max(1, min(maxMessages, maxBytes / largest))
        guard mark != highWaterMark else { return nil }
        highWaterMark = mark
        return mark
    }
}
