import Foundation
import SwitchboardTestSupport
import Testing

/// What a request and a state update cost, counted where counts do not wobble: heap
/// allocations, retains, releases and dynamic exclusivity checks per message (a rate on a
/// shared machine moves by a fifth from run to run; these counts by a percent or two),
/// measured by `switchboard-costs` in a process of its own. A change that adds an
/// allocation, or a handful of retains or checks, per message fails here; one that removes
/// some should lower the bound with it.
///
/// The bounds are for the debug build the test command runs (a release build counts far
/// fewer: its optimizer removes most retains and checks).
@Suite("Hot paths: allocations, retains and exclusivity checks per message")
struct HotPathCostTests {
    struct Counts: Decodable, CustomStringConvertible {
        let allocations: Double
        let retains: Double
        let releases: Double
        let accessChecks: Double

        var description: String { "\(allocations) allocations, \(retains) retains, \(releases) releases, \(accessChecks) exclusivity checks" }
    }

    struct Figures: Decodable {
        let kernelRequest: Counts
        let kernelUpdate: Counts
        let clientCall: Counts
        let hostCall: Counts
    }

    /// The kernel's loop thread, per request (a raw client and worker, one request at a
    /// time): 44.9 allocations, 364 retains, 405 releases, 285 checks counted on one machine
    /// (the least of eight short windows, the one the loop's timers touched least). One
    /// allocation and 3% of the others above.
    static let kernelRequest = Counts(allocations: 45.9, retains: 375, releases: 418, accessChecks: 294)
    /// The kernel's loop thread, per CHP update to one subscriber (16.0, 196, 212, 127).
    static let kernelUpdate = Counts(allocations: 16.5, retains: 202, releases: 219, accessChecks: 131)
    /// Per `BusClient.call` to a hosted echo method, one at a time, the client's process and
    /// the host's, each counted whole (the kernel in a third), the least of the windows.
    /// Threads meet differently from call to call (a reply that comes before its caller waits
    /// needs no continuation): the client 42.2-42.9 allocations, 218-220 retains, 247-251
    /// releases, 115-118 checks counted on an idle machine; the host 54.0-54.7, 315-317,
    /// 350-353, 132-134. More on a busy machine (up to 45.2 and 55.8 allocations with three
    /// busy threads beside them on two cores), so `Scripts/test` runs this test alone. These
    /// bounds catch a few more a call, not one; the kernel's catch one.
    static let clientCall = Counts(allocations: 45.5, retains: 232, releases: 264, accessChecks: 124)
    static let hostCall = Counts(allocations: 59, retains: 330, releases: 370, accessChecks: 145)

    @Test("requests and state updates through the kernel, and calls from a client to a hosted service, cost no more than their bounds")
    func costsPerMessage() async throws {
        let costs = switchboardExecutable().deletingLastPathComponent().appendingPathComponent("switchboard-costs")
        let result = try await runCommand(costs, [], seconds: 120)
        #expect(result.status == 0, "\(result)")
        let figures = try JSONDecoder().decode(Figures.self, from: Data(result.stdout.utf8))
        for (path, counted, bound) in [("the kernel's loop, a request", figures.kernelRequest, Self.kernelRequest),
                                       ("the kernel's loop, an update", figures.kernelUpdate, Self.kernelUpdate),
                                       ("the client's process, a call", figures.clientCall, Self.clientCall),
                                       ("the host's process, a call", figures.hostCall, Self.hostCall)] {
            #expect(counted.allocations <= bound.allocations && counted.retains <= bound.retains && counted.releases <= bound.releases
                && counted.accessChecks <= bound.accessChecks, "\(path): counted \(counted); the bounds are \(bound)")
        }
    }
}
