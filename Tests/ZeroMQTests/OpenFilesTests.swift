#if canImport(Glibc)
import Glibc
#endif
import Testing
@testable import ZeroMQ

@Suite("Open files: how many this process holds, and how many it may")
struct OpenFilesTests {
    @Test("the count agrees with a listing of /proc/self/fd (how a system older than Linux 6.2 counts), which follows files opened and closed")
    func count() throws {
        // Other tests of this process open and close files meanwhile: near, not equal.
        let counted = try #require(OpenFiles.count), listed = try #require(OpenFiles.listedCount())
        #expect(abs(counted - listed) <= 5, "counted \(counted), listed \(listed)")
        let opened = (0..<20).map { _ in open("/dev/null", O_RDONLY | O_CLOEXEC) }
        #expect(opened.allSatisfy { $0 >= 0 })
        let listedOpen = try #require(OpenFiles.listedCount())
        for descriptor in opened { close(descriptor) }
        let listedClosed = try #require(OpenFiles.listedCount())
        #expect(abs(listedOpen - listed - 20) <= 5 && abs(listedOpen - listedClosed - 20) <= 5, "\(listed) → \(listedOpen) → \(listedClosed)")
        #expect(try #require(OpenFiles.limit) >= listedOpen)
    }
}
