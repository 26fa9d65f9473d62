import Foundation
import Testing
@testable import ZeroMQ

/// The kernel's and the gateway's rule for giving memory back after a flood.
@Suite struct HeapTrimTests {
    /// Floods of small blocks (as a peer's queued messages are), freed: the next check after
    /// each returns the free pages, the second flood's too, although it reused the first's
    /// (the free heap is no larger than after the first).
    @Test func returnsEachFloodsPages() {
        var heap = HeapTrim()
        for _ in 0..<2 {
            let pin = flood(48 << 20)
            let flooded = HeapTrim.residentBytes()
            let trimmed = heap.releaseIfWorthIt()
            #expect(trimmed)
            #expect(HeapTrim.residentBytes() < flooded - HeapTrim.threshold)
            // Nothing grew since: no second trim.
            let trimmedAgain = heap.releaseIfWorthIt()
            #expect(!trimmedAgain)
            free(pin)
        }
    }

    /// A trim in the middle of a flood (half of it freed), then the rest freed: the next
    /// check returns those pages too, although the process did not grow since the first trim.
    @Test func returnsWhatIsFreedAfterATrim() {
        var heap = HeapTrim()
        var blocks = allocate(64 << 20)
        for index in stride(from: 0, to: blocks.count, by: 2) { free(blocks[index]) }
        let trimmed = heap.releaseIfWorthIt()
        #expect(trimmed)
        let pin = blocks.removeLast()
        let halfway = HeapTrim.residentBytes()
        for index in stride(from: 1, to: blocks.count, by: 2) { free(blocks[index]) }
        let trimmedAgain = heap.releaseIfWorthIt()
        #expect(trimmedAgain)
        #expect(HeapTrim.residentBytes() < halfway - HeapTrim.threshold)
        free(pin)
    }

    /// `bytes` in touched blocks below the mmap threshold (they come from the heap, where a
    /// trim is needed).
    private func allocate(_ bytes: Int) -> [UnsafeMutableRawPointer] {
        (0..<bytes / 4096).map { _ in
            let block = malloc(4000)!
            memset(block, 1, 4000)
            return block
        }
    }

    /// Allocates `bytes`, then frees all but the newest block, which it returns: held, it
    /// keeps glibc from giving the pages back by itself (shrinking the heap's top), as after a
    /// flood it seldom can.
    private func flood(_ bytes: Int) -> UnsafeMutableRawPointer {
        var blocks = allocate(bytes)
        let pin = blocks.removeLast()
        for block in blocks { free(block) }
        return pin
    }
}
