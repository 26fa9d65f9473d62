import Foundation
@testable import Kernel
import SwitchboardTestSupport
import Testing

/// What lets a kernel waiting for the state's election take it before the holder's lease runs
/// out: the holder's machine refusing a connection to its broker (up, nothing listening). A
/// holder whose machine accepts the connection (a frozen or busy kernel) or never answers (a
/// machine gone or cut off) may still serve clients it reaches, so its lease decides.
@Suite("a silent holder of the state's election: refused at its broker, or not")
struct HolderRefusalTests {
    @Test("a port nobody listens on refuses; a listening socket that never accepts (a frozen kernel) does not; an ipc endpoint is not asked")
    func refusal() async throws {
        let port = freePort()
        #expect(await Kernel.refusesConnection("tcp://127.0.0.1:\(port)"))

        let frozen = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(frozen) }
        try #require(bindLoopback(frozen, port: port) && listen(frozen, 16) == 0)
        #expect(await !Kernel.refusesConnection("tcp://127.0.0.1:\(port)"))

        let folder = try temporaryDirectory("holder-refusal")
        defer { try? FileManager.default.removeItem(at: folder) }
        // Not asked over ipc: a holder there is left to its lease.
        #expect(await !Kernel.refusesConnection("ipc://" + folder.appendingPathComponent("kernel.sock").path))
        #expect(await !Kernel.refusesConnection("not an endpoint"))
    }
}
