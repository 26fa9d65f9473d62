import BusKit
import BusProtocol
import Contracts
import Foundation
import Kernel
import SwitchboardTestSupport
import Synchronization
import Testing

/// A compare-and-set's outcome as a racer sees it: the revision it made, or the revision
/// the key was at when it lost.
enum RaceOutcome: Equatable {
    case won(UInt64)
    case lost(at: UInt64)
}

/// Writes `value` to `key` if it is at `revision`; -32004 is a lost race, anything else fails the test.
func compareAndSet(_ client: BusClient, _ key: String, _ value: JSONValue, at revision: UInt64) async throws -> RaceOutcome {
    do {
        return .won(try await client.publish(key: key, value: value, revision: revision))
    } catch .remote(_, let error) where error.code == JSONRPCError.conflictCode {
        guard case .int(let now)? = error.data?["revision"] else { throw BusError.remote(service: "kernel", error) }
        return .lost(at: UInt64(now))
    }
}

/// One round of two clients writing `key` at the revision `read`, at once: exactly one must
/// win and the other be told the winner's revision. Returns the winner's revision.
func raceRound(_ clients: [BusClient], _ key: String, round: Int, at read: UInt64) async throws -> [UInt64] {
    async let first = compareAndSet(clients[0], key, ["by": 0, "round": .int(Int64(round))], at: read)
    async let second = compareAndSet(clients[1], key, ["by": 1, "round": .int(Int64(round))], at: read)
    let outcomes = try await [first, second]
    let won = outcomes.compactMap { if case .won(let revision) = $0 { revision } else { nil } }
    #expect(won.count == 1, "round \(round): \(outcomes)")
    #expect(outcomes.contains(.lost(at: won.first ?? 0)), "round \(round): \(outcomes)")
    return won
}

/// The revision `key` is at (0: absent).
func revision(of key: String, _ client: BusClient) async throws -> UInt64 {
    let page = try await client.call(KernelAPI.stateGet, .init(prefix: key, limit: 1))
    return page.entries.first { $0.key == key }?.sequence ?? 0
}

@Suite("State revisions through the bus: racing compare-and-sets, history, resuming a subscription")
struct StateRevisionBusTests {
    @Test("two clients racing a compare-and-set on one key: exactly one wins each round, the other is told the winner's revision")
    func race() async throws {
        let kernel = try await TestKernel.start()
        let clients = [try await BusClient(brokers: [kernel.endpoints.broker]), try await BusClient(brokers: [kernel.endpoints.broker])]
        let key = "/client/race/route"
        var winners: [UInt64] = []
        for round in 0..<50 {
            winners += try await raceRound(clients, key, round: round, at: try await revision(of: key, clients[0]))
        }
        // The key's history holds the last winners' revisions, in order (16 per key by default).
        let history = try await clients[0].call(KernelAPI.stateHistory, .init(key: key))
        #expect(history.revisions.map(\.sequence) == Array(winners.suffix(16)))
        let stats = try await clients[0].call(KernelAPI.stats)
        #expect(stats.state.refusedConflict == 50)
        for client in clients { await client.close() }
        await kernel.stop()
    }

    @Test("a subscription opened with the sequence a reader stopped at gets exactly the changes since, deletions included; past the history, a reset and the snapshot")
    func resume() async throws {
        let kernel = try await TestKernel.start { $0.stateHistoryChanges = 20 }
        let endpoints = kernel.endpoints
        let client = try await BusClient(brokers: [endpoints.broker],
                                         state: [kernel.stateEndpoints])
        try await client.publish(key: "/client/r/a", value: 1)
        let stoppedAt = try await client.publish(key: "/client/r/b", value: 2)
        // What happened while the reader was away.
        let c = try await client.publish(key: "/client/r/c", value: 3)
        let deleteA = try await client.publish(key: "/client/r/a", value: nil)
        let b = try await client.publish(key: "/client/r/b", value: 20)
        try await client.publish(key: "/client/other", value: 0)

        func opening(since: UInt64) async throws -> [SubscriptionEvent] {
            let subscription = try await Subscription.open(snapshot: kernel.endpoints.snapshot, publisher: kernel.endpoints.publisher,
                                                           prefixes: ["/client/r/"], since: since)
            let events = try await within(10, "the opening") {
                var events: [SubscriptionEvent] = []
                for try await event in subscription {
                    events.append(event)
                    if case .synced = event { break }
                }
                return events
            }
            await subscription.cancel()
            return events
        }
        let resumed = try await opening(since: stoppedAt)
        #expect(resumed == [
            .update(StateUpdate(key: "/client/r/c", sequence: c, value: Frame("3"), fromSnapshot: false)),
            .update(StateUpdate(key: "/client/r/a", sequence: deleteA, value: Frame(), fromSnapshot: false)),
            .update(StateUpdate(key: "/client/r/b", sequence: b, value: Frame("20"), fromSnapshot: false)),
            .synced(sequence: resumed.last.flatMap { if case .synced(let sequence) = $0 { sequence } else { nil } } ?? 0),
        ])

        // 20 more changes: the kernel no longer holds those after `stoppedAt`.
        var firstOfTwenty: UInt64 = 0
        for n in 0..<20 {
            let written = try await client.publish(key: "/client/r/n", value: .int(Int64(n)))
            if n == 0 { firstOfTwenty = written }
        }
        let reset = try await opening(since: stoppedAt)
        guard case .reset(since: stoppedAt, let reason) = reset.first else { Issue.record("expected a reset first: \(reset)"); return }
        #expect(reason == "the kernel no longer holds every change after sequence \(stoppedAt)")
        #expect(Set(reset.compactMap(\.update).map(\.key)) == ["/client/r/b", "/client/r/c", "/client/r/n"])
        #expect(reset.compactMap(\.update).allSatisfy { $0.fromSnapshot })
        // The changes alone, as the gateway asks: none held after `stoppedAt`, so nil and no snapshot.
        let unheld = try await client.changes(under: ["/client/r/"], since: stoppedAt)
        #expect(unheld == nil)
        let held = try await client.changes(under: ["/client/r/"], since: firstOfTwenty)
        #expect(held?.changes.map(\.key) == Array(repeating: "/client/r/n", count: 19))
        let stats = try await client.call(KernelAPI.stats)
        #expect(stats.state.history.changes == 20 && stats.state.history.resumes == 2 && stats.state.history.resumesRefused == 2)
        // A sequence this kernel has not reached (another bus's): a reset that says so, not
        // that history was lost.
        let head = try await client.publish(key: "/client/r/n", value: 20)
        let ahead = try await opening(since: head + 1_000)
        guard case .reset(since: head + 1_000, let aheadReason) = ahead.first else { Issue.record("expected a reset first: \(ahead)"); return }
        #expect(aheadReason == "the kernel is at sequence \(head), before \(head + 1_000): it has not reached that sequence")
        await client.close()
        await kernel.stop()
    }
}
