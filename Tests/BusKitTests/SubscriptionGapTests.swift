import BusKit
import BusProtocol
import Foundation
import Kernel
import SwitchboardTestSupport
import Testing
import ZeroMQ

@Suite("Subscriptions never lose updates in silence")
struct SubscriptionGapTests {
    /// What a reader of the events sees, applied in order.
    struct View: Sendable {
        var state: [String: Int64] = [:]
        var missed: [UInt64?] = []
        var resynced = 0
        /// Between a `missed` and the `resynced` that ends the repair (one may cover several gaps).
        var resyncing = false
        var synced = 0
        /// A live update that skipped a value of its key, not yet followed by a `missed`.
        var unexplainedSkip: String?
        var skips = 0

        mutating func apply(_ event: SubscriptionEvent) {
            switch event {
            case .update(let update):
                let n = update.json?["n"]?.intValue
                if !update.fromSnapshot, let n, let last = state[update.key], n != last + 1 {
                    skips += 1
                    unexplainedSkip = unexplainedSkip ?? "\(update.key): \(last) then \(n)"
                }
                state[update.key] = update.isDelete ? nil : n
            case .missed(let count, _, _):
                missed.append(count)
                unexplainedSkip = nil
                resyncing = true
            case .resynced:
                resynced += 1
                resyncing = false
            case .reset:
                Issue.record("a subscription opened without a sequence was reset")
            case .synced:
                synced += 1
            }
        }
    }

    /// A stand-in kernel's publisher (an XPUB) and snapshot socket (a ROUTER) over inproc://,
    /// each receive bounded to 10 s, and a subscription to `/probe/` on them whose silence
    /// timeout (an hour) runs on `clock`.
    func standInKernel(_ name: String, clock: ManualClock) async throws -> (publisher: ZMQSocket, snapshots: ZMQSocket, subscription: Subscription) {
        let context = try ZMQContext()
        let name = "\(name)-\(UInt64.random(in: 0...UInt64.max))"
        let publisher = try ZMQSocket(context, .xpub)
        try publisher.set(.receiveTimeout, Int32(10_000))
        _ = try publisher.bind("inproc://\(name)-publisher")
        let snapshots = try ZMQSocket(context, .router)
        try snapshots.set(.receiveTimeout, Int32(10_000))
        _ = try snapshots.bind("inproc://\(name)-snapshot")
        let subscription = try await Subscription.open(snapshot: "inproc://\(name)-snapshot", publisher: "inproc://\(name)-publisher",
                                                       prefixes: ["/probe/"], context: context, silenceTimeout: .seconds(3_600), clock: clock)
        return (publisher, snapshots, subscription)
    }

    @Test("a kernel gone silent: by the subscription's own clock, past its silence timeout (an hour here) it says so and resyncs at the next HUGZ")
    func silentKernel() async throws {
        // A stand-in kernel that speaks CHP once, then says nothing: the test's clock, not
        // the wall's, decides when that silence is too long.
        let clock = ManualClock()
        let (publisher, snapshots, subscription) = try await standInKernel("silent", clock: clock)
        /// Greets the subscription with a HUGZ and answers the snapshot it then asks for.
        func serveSnapshot(sequence: UInt64) throws {
            try publisher.send(CHP.hugz())
            let (client, subtree, _, _) = try CHP.decodeSnapshotRequest(try snapshots.receive())
            #expect(subtree == "/probe/")
            try snapshots.send(CHP.kthxbai(sequence: sequence, subtree: subtree, to: client))
        }
        // The HUGZ goes out once the XPUB holds the subscription to it.
        while try publisher.receive()[0].bytes != [1] + Array(CHP.hugzCommand.utf8) {}
        try serveSnapshot(sequence: 7)
        #expect(try await within(10, "the first snapshot") { try await subscription.next() } == .synced(sequence: 7))

        clock.advance(.seconds(3_601))
        let missed = try await within(10, "the silence said") { try await subscription.next() }
        guard case .missed(nil, 7, let reason)? = missed else { Issue.record("expected a missed event, got \(String(describing: missed))"); return }
        #expect(reason.contains("silent"), "\(reason)")
        try serveSnapshot(sequence: 7)
        #expect(try await within(10, "the resync") { try await subscription.next() } == .resynced(sequence: 7, changed: 0))
        await subscription.cancel()
        publisher.close()
        snapshots.close()
    }

    @Test("a snapshot request its kernel never answers: asked again once the silence timeout passes by the subscription's clock, with no new HUGZ needed")
    func unansweredSnapshot() async throws {
        let clock = ManualClock()
        let (publisher, snapshots, subscription) = try await standInKernel("unanswered", clock: clock)
        while try publisher.receive()[0].bytes != [1] + Array(CHP.hugzCommand.utf8) {}
        try publisher.send(CHP.hugz())
        _ = try CHP.decodeSnapshotRequest(try snapshots.receive())
        // The request is dropped unanswered; nothing more comes from the kernel.
        clock.advance(.seconds(3_601))
        let (client, subtree, _, _) = try CHP.decodeSnapshotRequest(try snapshots.receive())
        try snapshots.send(CHP.kthxbai(sequence: 7, subtree: subtree, to: client))
        #expect(try await within(10, "the snapshot asked again") { try await subscription.next() } == .synced(sequence: 7))
        await subscription.cancel()
        publisher.close()
        snapshots.close()
    }

    /// A stand-in kernel over TCP (connection events are TCP's): its publisher (an XPUB) and
    /// snapshot socket (a ROUTER), each receive bounded to 10 s.
    struct StandIn {
        let publisher: ZMQSocket
        let snapshots: ZMQSocket
        let endpoints: (snapshot: String, publisher: String)

        init(_ context: ZMQContext) throws {
            publisher = try ZMQSocket(context, .xpub)
            snapshots = try ZMQSocket(context, .router)
            for socket in [publisher, snapshots] {
                try socket.set(.receiveTimeout, Int32(10_000))
                try socket.set(.linger, Int32(0))
            }
            endpoints = (try snapshots.bind("tcp://127.0.0.1:*"), try publisher.bind("tcp://127.0.0.1:*"))
        }

        func publish(_ key: String, _ sequence: UInt64) throws {
            try publisher.send(CHP.kv(KVEntry(key: key, sequence: sequence, value: Frame("\(sequence)"))))
        }

        /// The next snapshot request: who asked, and after which sequence.
        func snapshotRequest() throws -> (client: Frame, since: UInt64?) {
            let (client, _, since, _) = try CHP.decodeSnapshotRequest(try snapshots.receive())
            return (client, since)
        }

        func close() {
            publisher.close()
            snapshots.close()
        }
    }

    /// Two stand-in kernels of a pair and a subscription to `/probe/` on both, which has
    /// reached both; its clock never moves, so no timeout can be what asks again.
    func standInPair() async throws -> (first: StandIn, second: StandIn, subscription: Subscription) {
        let context = try ZMQContext()
        let first = try StandIn(context), second = try StandIn(context)
        let subscription = try await Subscription.open(kernels: [first.endpoints, second.endpoints], prefixes: ["/probe/"], context: context,
                                                       silenceTimeout: .seconds(3_600), clock: ManualClock())
        for kernel in [first, second] {
            while try kernel.publisher.receive()[0].bytes != [1] + Array(CHP.hugzCommand.utf8) {}
        }
        return (first, second, subscription)
    }

    @Test("the kernel asked for the snapshot goes before it answers, the other kernel of the pair still up: the snapshot is asked of the other at once, not after a silence")
    func snapshotKernelGoes() async throws {
        let (first, second, subscription) = try await standInPair()
        try first.publisher.send(CHP.hugz())
        _ = try first.snapshotRequest()
        // The other kernel greets the subscription, as a kernel does when it reaches it.
        try second.publisher.send(CHP.hugz())
        first.close()
        let (client, _) = try second.snapshotRequest()
        try second.snapshots.send(CHP.kthxbai(sequence: 9, subtree: "/probe/", to: client))
        #expect(try await within(10, "the snapshot of the other kernel") { try await subscription.next() } == .synced(sequence: 9))
        await subscription.cancel()
        second.close()
    }

    @Test("the kernels of a pair publish out of step and the other reached the subscription after a change: changes come in order from the kernel followed; when it goes, the other is asked for those after the last delivered, and followed, with nothing said")
    func kernelsOutOfStep() async throws {
        let (first, second, subscription) = try await standInPair()
        func next(_ what: String) async throws -> SubscriptionEvent? { try await within(10, what) { try await subscription.next() } }
        try first.publisher.send(CHP.hugz())
        let (client, _) = try first.snapshotRequest()
        try first.snapshots.send(CHP.kthxbai(sequence: 7, subtree: "/probe/", to: client))
        #expect(try await next("the snapshot") == .synced(sequence: 7))
        try second.publisher.send(CHP.hugz())
        // A passive kernel publishes each change before the active one, which waits for its
        // copy; this one's publisher reached the subscription after change 8.
        for sequence: UInt64 in 9...10 { try second.publish("/probe/t", sequence) }
        // Time for them to arrive first: the subscription must set them aside, which no
        // event tells (taken as they come, 9 would be delivered before 8 and 8 lost).
        try await Task.sleep(for: .milliseconds(300))
        for sequence: UInt64 in 8...10 { try first.publish("/probe/t", sequence) }
        for sequence: UInt64 in 8...10 { #expect(try await next("change \(sequence)") == .update(.init(key: "/probe/t", sequence: sequence, value: Frame("\(sequence)"), fromSnapshot: false))) }

        // The other publishes 11; the one followed goes before it does.
        try second.publish("/probe/t", 11)
        first.close()
        let (again, since) = try second.snapshotRequest()
        #expect(since == 10)
        try second.snapshots.send(CHP.kvsync(KVEntry(key: "/probe/t", sequence: 11, value: Frame("11")), to: again))
        try second.snapshots.send(CHP.kthxbai(sequence: 11, subtree: "/probe/", since: 10, to: again))
        #expect(try await next("change 11, asked of the other") == .update(.init(key: "/probe/t", sequence: 11, value: Frame("11"), fromSnapshot: false)))
        try second.publish("/probe/t", 12)
        #expect(try await next("change 12, from the other") == .update(.init(key: "/probe/t", sequence: 12, value: Frame("12"), fromSnapshot: false)))
        #expect(await subscription.resyncCount() == 0)
        await subscription.cancel()
        second.close()
    }

    @Test("the kernel followed goes and the other no longer holds every change after the last delivered: said, the other's snapshot, resynced")
    func otherKernelWithoutTheChanges() async throws {
        let (first, second, subscription) = try await standInPair()
        func next(_ what: String) async throws -> SubscriptionEvent? { try await within(10, what) { try await subscription.next() } }
        try first.publisher.send(CHP.hugz())
        try second.publisher.send(CHP.hugz())
        let (client, _) = try first.snapshotRequest()
        try first.snapshots.send(CHP.kvsync(KVEntry(key: "/probe/a", sequence: 5, value: Frame("5")), to: client))
        try first.snapshots.send(CHP.kthxbai(sequence: 7, subtree: "/probe/", to: client))
        #expect(try await next("the snapshot")?.update?.key == "/probe/a")
        #expect(try await next("synced") == .synced(sequence: 7))
        first.close()
        let (again, since) = try second.snapshotRequest()
        #expect(since == 7)
        try second.snapshots.send(CHP.kvsync(KVEntry(key: "/probe/b", sequence: 20, value: Frame("20")), to: again))
        try second.snapshots.send(CHP.kthxbai(sequence: 20, subtree: "/probe/", to: again))
        guard case .missed(nil, 7, let reason)? = try await next("the move said") else { Issue.record("expected a missed event"); return }
        #expect(reason.contains("no longer holds"), "\(reason)")
        #expect(try await next("b") == .update(.init(key: "/probe/b", sequence: 20, value: Frame("20"), fromSnapshot: true)))
        #expect(try await next("a, gone") == .update(.init(key: "/probe/a", sequence: 20, value: Frame(), fromSnapshot: true)))
        #expect(try await next("resynced") == .resynced(sequence: 20, changed: 2))
        await subscription.cancel()
        second.close()
    }

    @Test("a change below the last sequence delivered that the view never had (the kernels' histories parted): said, and resynced from a whole snapshot; the other kernel's copies and what the sync covered are not")
    func partedHistories() async throws {
        let (publisher, snapshots, subscription) = try await standInKernel("parted", clock: ManualClock())
        func publish(_ key: String, _ sequence: UInt64) throws {
            try publisher.send(CHP.kv(KVEntry(key: key, sequence: sequence, value: Frame("\(sequence)"))))
        }
        func next(_ what: String) async throws -> SubscriptionEvent? { try await within(10, what) { try await subscription.next() } }
        while try publisher.receive()[0].bytes != [1] + Array(CHP.hugzCommand.utf8) {}
        try publisher.send(CHP.hugz())
        let (first, subtree, _, _) = try CHP.decodeSnapshotRequest(try snapshots.receive())
        try snapshots.send(CHP.kthxbai(sequence: 7, subtree: subtree, to: first))
        #expect(try await next("the first snapshot") == .synced(sequence: 7))

        try publish("/probe/a", 100)
        #expect(try await next("a change")?.update?.sequence == 100)
        // The other kernel's copy of it, and a change the sync covered: nothing.
        try publish("/probe/a", 100)
        try publish("/probe/b", 5)
        try publish("/probe/c", 101)
        #expect(try await next("the next change")?.update?.sequence == 101)
        // A change between the sync and the last one delivered that was never delivered.
        try publish("/probe/b", 50)
        let missed = try await next("the parting said")
        guard case .missed(nil, 101, let reason)? = missed else { Issue.record("expected a missed event, got \(String(describing: missed))"); return }
        #expect(reason.contains("parted"), "\(reason)")
        let (client, _, since, _) = try CHP.decodeSnapshotRequest(try snapshots.receive())
        #expect(since == nil, "a whole snapshot is asked for")
        try snapshots.send(CHP.kvsync(KVEntry(key: "/probe/b", sequence: 50, value: Frame("50")), to: client))
        try snapshots.send(CHP.kthxbai(sequence: 60, subtree: subtree, to: client))
        var events: [SubscriptionEvent] = []
        while events.last.map({ if case .resynced = $0 { false } else { true } }) ?? true { events.append(try #require(try await next("the resync"))) }
        #expect(events.compactMap(\.update).map { "\($0.key) \($0.isDelete ? "deleted" : "set")" } == ["/probe/b set", "/probe/a deleted", "/probe/c deleted"])
        #expect(events.last == .resynced(sequence: 60, changed: 3))
        // The view follows the kernel it resynced from, from its sequence on.
        try publish("/probe/d", 61)
        #expect(try await next("a change after the resync")?.update?.sequence == 61)
        await subscription.cancel()
        publisher.close()
        snapshots.close()
    }

    @Test("a paused subscriber under 50,000 writes: every gap signalled with its count, then resynced to the kernel's state")
    func pausedSubscriber() async throws {
        // A small backlog per subscriber, so the kernel's XPUB drops for the paused one; over
        // inproc://, where nothing else buffers (TCP's socket buffers could hold all 50,000).
        let name = "gap-\(UInt64.random(in: 0...UInt64.max))"
        let kernel = try await TestKernel.start {
            $0.subscriberBacklog = 200
            $0.inprocName = name
            // The writes go in batches of 1,000 (the default limit is 100): fewer round trips.
            $0.maxBatchItems = 1_000
        }
        defer { Task { await kernel.stop() } }
        let client = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(30), maxBatchItems: 1_000)
        let publisher = StatePublisher(client: client)
        let subscription = try await Subscription.open(snapshot: "inproc://\(name)-snapshot", publisher: "inproc://\(name)-publisher",
                                                       prefixes: ["/store/probe/"], context: kernel.kernel.loop.context,
                                                       silenceTimeout: .seconds(60), bufferSize: 100)
        var view = View()
        // Live: the first write arrives.
        try await publisher.set("/store/probe/k0", ["n": 0])
        view = try await within(10, "the subscription is live") { [view] in
            var view = view
            while let event = try await subscription.next() {
                view.apply(event)
                if view.state["/store/probe/k0"] == 0 { break }
            }
            return view
        }

        // 50,000 writes over 500 keys while nobody reads; the last 50 keys are deleted.
        let keys = 500, writes = 50_000
        for batch in stride(from: 1, to: writes + 1, by: 1_000) {
            let entries = (batch..<min(batch + 1_000, writes + 1)).map { i -> (key: String, value: JSONValue?) in
                ("/store/probe/k\(i % keys)", ["n": .int(Int64(i / keys))])
            }
            for outcome in await publisher.set(many: entries) { _ = try outcome.get() }
        }
        for i in 0..<50 { try await publisher.set("/store/probe/k\(i)", nil) }
        let final = try await client.request(service: "kernel", method: "state.get", params: ["prefix": "/store/probe/"])
        var expected: [String: Int64] = [:]
        for entry in final["entries"]?.arrayValue ?? [] {
            expected[entry["key"]?.stringValue ?? ""] = entry["value"]?["n"]?.intValue
        }
        #expect(expected.count == keys - 50)

        // Now read: the gaps are said, with counts, and the view ends equal to the kernel's.
        view = try await within(60, "the view converges on the kernel's state") { [view, expected] in
            var view = view
            while view.state != expected || view.resyncing {
                guard let event = try await subscription.next() else { break }
                view.apply(event)
            }
            return view
        }
        #expect(!view.missed.isEmpty, "the kernel dropped updates for the paused subscriber, and it said so")
        #expect(view.missed.allSatisfy { ($0 ?? 0) > 0 }, "each gap came with how many were missed")
        #expect(view.unexplainedSkip == nil, "a skipped update was never followed by a missed event")
        #expect(await subscription.resyncCount() >= view.missed.count, "each missed is a resync (another may have begun since)")
        await subscription.cancel()
        await client.close()
    }

    @Test("overlapping prefixes opened while writers race: each change once, in order (none replayed from before the snapshot)")
    func overlappingPrefixesUnderWrites() async throws {
        let kernel = try await TestKernel.start()
        defer { Task { await kernel.stop() } }
        let client = try await BusClient(brokers: [kernel.endpoints.broker])
        let publisher = StatePublisher(client: client)
        let writer = Task {
            var n: Int64 = 0
            while !Task.isCancelled {
                n += 1
                _ = await publisher.set(many: [("/store/a/x", ["n": .int(n)]), ("/store/b/y", ["n": .int(n)])])
            }
        }
        defer { writer.cancel() }
        for _ in 0..<5 {
            let subscription = try await Subscription.open(snapshot: kernel.endpoints.snapshot, publisher: kernel.endpoints.publisher,
                                                           prefixes: ["/store/a/", "/store/"])
            let view = try await within(20, "updates after the snapshot") { () -> View in
                var view = View()
                var live = 0
                while live < 200, let event = try await subscription.next() {
                    view.apply(event)
                    if event.update?.fromSnapshot == false { live += 1 }
                }
                return view
            }
            #expect(view.skips == 0 && view.missed.isEmpty, "skip: \(view.unexplainedSkip ?? "none"), missed: \(view.missed)")
            await subscription.cancel()
        }
        writer.cancel()
        await client.close()
    }

    @Test("a prefix that can match no key (no leading '/') is refused, not followed in silence: Subscription.open, BusClient.subscribe and changes(under:)")
    func pathlessPrefix() async throws {
        let kernel = try await TestKernel.start()
        defer { Task { await kernel.stop() } }
        let client = try await BusClient(brokers: [kernel.endpoints.broker])
        let refusal = BusError.invalidArgument("prefix 'pricing/' matches no key: keys are paths starting with '/' (as /pricing/)")
        await #expect(throws: refusal) {
            _ = try await Subscription.open(snapshot: kernel.endpoints.snapshot, publisher: kernel.endpoints.publisher, prefixes: ["/store/", "pricing/"])
        }
        await #expect(throws: refusal) { _ = try await client.subscribe(prefixes: ["pricing/"]) }
        await #expect(throws: refusal) { _ = try await client.changes(under: ["pricing/"], since: 0) }
        #expect(refusal.code == JSONRPCError.invalidParamsCode)
        // "" is every key, and a path prefix is followed.
        let everything = try await client.subscribe(prefixes: [""])
        await everything.cancel()
        await client.close()
    }

    @Test("a subscriber that keeps up sees no gap and no notice")
    func keepingUp() async throws {
        let kernel = try await TestKernel.start { $0.hugzInterval = .milliseconds(100) }
        defer { Task { await kernel.stop() } }
        let client = try await BusClient(brokers: [kernel.endpoints.broker])
        let publisher = StatePublisher(client: client)
        let subscription = try await Subscription.open(snapshot: kernel.endpoints.snapshot, publisher: kernel.endpoints.publisher,
                                                       prefixes: ["/store/a/", "/store/"])
        var view = View()
        try await publisher.set("/store/a/start", ["n": 0])
        view = try await within(10, "live") { [view] in
            var view = view
            while let event = try await subscription.next() {
                view.apply(event)
                if view.state["/store/a/start"] != nil { break }
            }
            return view
        }
        for i in 1...2_000 { try await publisher.set(i % 2 == 0 ? "/store/a/x" : "/store/b/y", ["n": .int(Int64((i + 1) / 2))]) }
        // The writes take several HUGZ intervals: each HUGZ is checked against what arrived.
        try await publisher.set("/store/a/end", ["n": 1])
        view = try await within(10, "every update") { [view] in
            var view = view
            while view.state["/store/a/end"] != 1 {
                guard let event = try await subscription.next() else { break }
                view.apply(event)
            }
            return view
        }
        #expect(view.missed.isEmpty && view.resynced == 0 && view.skips == 0, "\(view.unexplainedSkip ?? "")")
        #expect(view.synced == 1, "the first snapshot is marked once")
        #expect(view.state["/store/a/x"] == 1_000 && view.state["/store/b/y"] == 1_000)
        await subscription.cancel()
        await client.close()
    }
}
