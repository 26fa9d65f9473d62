internal import CZeroMQ

/// Gives memory back to the system after a flood.
///
/// glibc keeps freed memory in its arenas for reuse, so after a peer that flooded the
/// kernel leaves (its libzmq pipe and queued messages freed) the process would stay at its
/// peak size. Once a second the kernel (and the gateway, after a burst to its streams)
/// asks how much of its heap is free and, when that is a lot more than at the last trim,
/// has glibc return the free pages (`malloc_trim`).
public struct HeapTrim: Sendable {
    /// Free heap bytes that make a trim worth its cost (it walks the free pages).
    static let threshold = 16 * 1024 * 1024
    private var freeAtLastTrim = 0

    /// Also has glibc serve blocks of 64 KiB and more (state values, replies, event bodies)
    /// from mappings of their own, returned to the system the moment they are freed. By
    /// default glibc raises that threshold after the first large block is freed and serves
    /// later ones from the heap, where after a flood of large values they stay behind as
    /// fragments no trim can return.
    public init() {
        #if os(Linux)
        mallopt(M_MMAP_THRESHOLD, Self.largeBlock)
        #endif
    }
    static let largeBlock: Int32 = 64 * 1024

    /// Trims when the free heap grew by `threshold` since the last trim; returns whether it did.
    @discardableResult
    public mutating func releaseIfWorthIt() -> Bool {
        #if os(Linux)
        let free = Int(mallinfo2().fordblks)
        defer { freeAtLastTrim = min(freeAtLastTrim, free) }
        guard free >= freeAtLastTrim + Self.threshold else { return false }
        malloc_trim(0)
        freeAtLastTrim = free
        return true
        #else
        return false
        #endif
    }
}
