import Foundation
import SwitchboardTestSupport
import Testing

/// What a request and a state update cost, counted where counts do not wobble: heap
/// allocations per message (a rate on a shared machine moves by a fifth from run to run; an
/// allocation count by less than one), measured by `switchboard-costs` in a process of its
/// own. A change that adds an allocation per message fails here; one that removes some
/// should lower the bound with it. Retains are counted with `perf probe`
/// (docs/PERFORMANCE.md): the Swift 6.3 runtime's hooks for them fault on Linux.
///
/// The bounds are for the debug build the test command runs (a release build allocates less).
@Suite("Hot paths: heap allocations per message")
struct HotPathCostTests {
    /// The kernel's loop thread, per request (a raw client and worker, one request at a
    /// time). It counts the same to a hundredth from run to run: the bound is half an
    /// allocation above.
    static let kernelRequest = 45.5
    /// The kernel's loop thread, per CHP update to one subscriber.
    static let kernelUpdate = 16.5
    /// The whole process, per `BusClient.call` to a hosted echo method, one at a time. Threads
    /// meet differently from call to call (a reply that comes before its caller waits needs
    /// no continuation), more so on a loaded machine: 164.5-165.6 counted on an idle one, 167.8
    /// beside a compile. So this bound catches a handful more a call, not one; the kernel's
    /// catch one.
    static let fullStackCall = 175.0

    struct Figures: Decodable {
        let kernelRequest: Double
        let kernelUpdate: Double
        let fullStackCall: Double
    }

    @Test("requests and state updates through the kernel, and calls through the full stack, allocate no more than their bounds")
    func allocationsPerMessage() async throws {
        let costs = switchboardExecutable().deletingLastPathComponent().appendingPathComponent("switchboard-costs")
        let result = try await runCommand(costs, [], seconds: 120)
        #expect(result.status == 0, "\(result)")
        let figures = try JSONDecoder().decode(Figures.self, from: Data(result.stdout.utf8))
        #expect(figures.kernelRequest <= Self.kernelRequest, "the kernel's loop allocates \(figures.kernelRequest) times a request; the bound is \(Self.kernelRequest)")
        #expect(figures.kernelUpdate <= Self.kernelUpdate, "the kernel's loop allocates \(figures.kernelUpdate) times an update; the bound is \(Self.kernelUpdate)")
        #expect(figures.fullStackCall <= Self.fullStackCall, "the full stack allocates \(figures.fullStackCall) times a call; the bound is \(Self.fullStackCall)")
    }
}
