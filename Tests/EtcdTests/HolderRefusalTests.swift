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

        let frozen = try SilentListener()
        #expect(await !Kernel.refusesConnection(frozen.endpoint))
        withExtendedLifetime(frozen) {}

        let folder = try temporaryDirectory("holder-refusal")
        defer { try? FileManager.default.removeItem(at: folder) }
        // Not asked over ipc: a holder there is left to its lease.
        #expect(await !Kernel.refusesConnection("ipc://" + folder.appendingPathComponent("kernel.sock").path))
        #expect(await !Kernel.refusesConnection("not an endpoint"))
    }

    @Test("a holder whose connection drops is in doubt at once: its machine is asked whether anything listens at its broker")
    func inDoubtWhenTheConnectionDrops() async throws {
        let holder = try await TestKernel.start()
        let waiting = try await TestKernel.start()
        let (answered, inDoubt) = try await waiting.kernel.probe(holder, within: .seconds(20))
        await waiting.stop()
        #expect(answered, "the holder never answered the probe")
        #expect(inDoubt, "the holder's connection dropped and the probe said nothing")
    }
}

extension Kernel {
    /// As a kernel waiting for the election does: asks `holder` at its broker until it
    /// answered, stops it, and says whether the probe was then in doubt of it, each within
    /// `wait` (a stream iterated from a task that is cancelled ends: the probe's is read once).
    func probe(_ holder: TestKernel, within wait: Duration) async throws -> (answered: Bool, inDoubt: Bool) {
        let probe = try HolderProbe(endpoint: holder.endpoints.broker, loop: loop, security: nil, every: .milliseconds(50))
        defer { probe.stop() }
        let (answers, answer) = AsyncStream.makeStream(of: Void.self)
        probe.onFirstAnswer = { answer.yield() }
        let answered = await Self.first(of: answers, within: wait)
        await holder.stop()
        return (answered, answered ? await Self.first(of: probe.inDoubt, within: wait) : false)
    }

    /// Whether `stream` yields within `wait`.
    static func first(of stream: AsyncStream<Void>, within wait: Duration) async -> Bool {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                var iterator = stream.makeAsyncIterator()
                return await iterator.next() != nil
            }
            group.addTask {
                try? await Task.sleep(for: wait)
                return false
            }
            defer { group.cancelAll() }
            return await group.next() ?? false
        }
    }
}
