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
    /// time): 13.0 allocations, 376-385 retains, 410-421 releases, 281-289 checks counted on
    /// one machine, idle and beside three busy threads (the least of eight short windows, the
    /// one the loop's timers touched least). Half an allocation and 3% of the others above.
    /// A message's count must not depend on how many turns of the loop it took or how long it
    /// waited: in a debug build each element a generic iterator reads is an allocation, so
    /// the loop's turn and the kernel's per-request code walk their arrays by index.
    static let kernelRequest = Counts(allocations: 13.5, retains: 391, releases: 430, accessChecks: 297)
    /// The kernel's loop thread, per CHP update to one subscriber (5.05, 199-204, 212-218, 120-126).
    static let kernelUpdate = Counts(allocations: 5.5, retains: 207, releases: 222, accessChecks: 129)
    /// Per `BusClient.call` to a hosted echo method, one at a time, the client's process and
    /// the host's, each counted whole (the kernel in a third), the least of the windows.
    /// Threads meet differently from call to call (a reply that comes before its caller waits
    /// needs no continuation): the client 31.8-32.0 allocations, 220-228 retains, 246-256
    /// releases, 111-118 checks counted idle and beside three busy threads on two cores; the
    /// host 41.0, 324-333, 354-364, 126-134 (more the busier the machine, so `Scripts/test`
    /// runs this test alone). The client's bounds catch a few more a call, not one; the host's
    /// and the kernel's catch one.
    static let clientCall = Counts(allocations: 33.5, retains: 236, releases: 266, accessChecks: 124)
    static let hostCall = Counts(allocations: 42, retains: 340, releases: 377, accessChecks: 140)

    @Test("requests and state updates through the kernel, and calls from a client to a hosted service, cost no more than their bounds")
    func costsPerMessage() async throws {
        let costs = switchboardExecutable().deletingLastPathComponent().appendingPathComponent("switchboard-costs")
        let result = try await runCommand(costs, [], seconds: 120)
        #expect(result.status == 0, "\(result)")
        let figures = try JSONDecoder().decode(Figures.self, from: Data(result.stdout.utf8))
        // Printed whether or not they pass: how close a machine's counts come to the bounds.
        print("switchboard-costs: \(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines))")
        for (path, counted, bound) in [("the kernel's loop, a request", figures.kernelRequest, Self.kernelRequest),
                                       ("the kernel's loop, an update", figures.kernelUpdate, Self.kernelUpdate),
                                       ("the client's process, a call", figures.clientCall, Self.clientCall),
                                       ("the host's process, a call", figures.hostCall, Self.hostCall)] {
            #expect(counted.allocations <= bound.allocations && counted.retains <= bound.retains && counted.releases <= bound.releases
                && counted.accessChecks <= bound.accessChecks, "\(path): counted \(counted); the bounds are \(bound)")
        }
    }
}
