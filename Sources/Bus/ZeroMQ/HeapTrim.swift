internal import CZeroMQ
#if canImport(Glibc)
import Glibc
#endif

/// Gives memory back to the system after a flood.
///
/// glibc keeps freed memory in its arenas for reuse, so after a peer that flooded the
/// kernel leaves (its libzmq pipe and queued messages freed) the process would stay at its
/// peak size. Once a second the kernel (and the gateway, after a burst to its streams) asks
/// how much of its resident memory the heap does not use, and when that grew since the last
/// trim has glibc return the free pages (`malloc_trim`).
///
/// Resident and unused, not merely free: pages a trim returned that a later flood used and
/// freed again count as free both times, but only as resident once they came back; and pages
/// freed after a trim in the middle of a flood are resident although the process shrank.
public struct HeapTrim: Sendable {
    /// Growth of the resident-but-unused memory that makes a trim worth its cost (it walks
    /// the free pages).
    static let threshold = 16 * 1024 * 1024
    /// Resident memory the heap did not use just after the last trim (code, stacks, what a
    /// trim cannot return), or the least since.
    private var unusedAtLastTrim: Int

    /// Also has glibc serve blocks of 64 KiB and more (state values, replies, event bodies)
    /// from mappings of their own, returned to the system the moment they are freed. By
    /// default glibc raises that threshold after the first large block is freed and serves
    /// later ones from the heap, where after a flood of large values they stay behind as
    /// fragments no trim can return.
    public init() {
        #if os(Linux)
        mallopt(M_MMAP_THRESHOLD, Self.largeBlock)
        #endif
        unusedAtLastTrim = Self.residentUnusedBytes()
    }
    static let largeBlock: Int32 = 64 * 1024

    /// Trims when the resident memory the heap does not use grew by `threshold` since the
    /// last trim; returns whether it did.
    @discardableResult
    public mutating func releaseIfWorthIt() -> Bool {
        #if os(Linux)
        let unused = Self.residentUnusedBytes()
        unusedAtLastTrim = min(unusedAtLastTrim, unused)
        guard unused >= unusedAtLastTrim + Self.threshold else { return false }
        malloc_trim(0)
        unusedAtLastTrim = Self.residentUnusedBytes()
        return true
        #else
        return false
        #endif
    }

    /// The resident size less what the heap holds in use (its blocks and its own mappings).
    static func residentUnusedBytes() -> Int {
        #if os(Linux)
        let heap = mallinfo2()
        return residentBytes() - Int(heap.uordblks) - Int(heap.hblkhd)
        #else
        return 0
        #endif
    }

    /// The process's resident size (`/proc/self/statm`'s second field, in pages); 0 where
    /// there is no such file.
    static func residentBytes() -> Int {
        #if os(Linux)
        let file = open("/proc/self/statm", O_RDONLY)
        guard file >= 0 else { return 0 }
        defer { close(file) }
        var text = [UInt8](repeating: 0, count: 128)
        let count = read(file, &text, text.count)
        guard count > 0 else { return 0 }
        let fields = text[..<count].split(separator: UInt8(ascii: " "))
        guard fields.count > 1, let pages = Int(String(decoding: fields[1], as: UTF8.self)) else { return 0 }
        return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
        #else
        return 0
        #endif
    }
}
