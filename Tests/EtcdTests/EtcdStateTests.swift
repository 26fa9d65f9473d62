import BusKit
import BusProtocol
import Contracts
import Etcd
import Foundation
@testable import Kernel
import SwitchboardConfig
import SwitchboardTestSupport
import Synchronization
import Testing
import ZeroMQ

/// The kernel's state kept in a real etcd (`kernel.state.backend: etcd`), started by each test.
@Suite(.serialized, .enabled(if: TestEtcd.available, "needs etcd-server (Scripts/bootstrap --tests installs it)"))
struct EtcdStateTests {
    /// Where the tests keep the state under etcd's keys.
    static let prefix = "/sb-test/state"

    /// A kernel on `cluster`'s etcd, on fixed ports so it can be restarted where it was.
    static func kernel(on cluster: TestEtcd, _ configure: (inout KernelConfiguration) -> Void = { _ in }) async throws -> TestKernel {
        try await TestKernel.start(fixedPorts: true) { configuration in
            var settings = EtcdStateSettings(endpoints: cluster.clientURLs)
            settings.prefix = prefix
            configuration.stateEtcd = settings
            configure(&configuration)
        }
    }

    /// Runs `body` with an etcd member, a kernel on it, a client of each; stops all however it ends.
    func withKernelOnEtcd(_ body: (TestEtcd, TestKernel, BusClient, EtcdClient) async throws -> Void) async throws {
        let cluster = try await TestEtcd.start()
        let etcd = try EtcdClient(endpoints: cluster.clientURLs)
        var kernel: TestKernel?
        var bus: BusClient?
        do {
            kernel = try await Self.kernel(on: cluster)
            bus = try await BusClient(brokers: [kernel!.endpoints.broker], timeout: .seconds(20))
            try await body(cluster, kernel!, bus!, etcd)
        } catch {
            await bus?.close()
            await kernel?.stop()
            await etcd.close()
            cluster.stop()
            throw error
        }
        await bus?.close()
        await kernel?.stop()
        await etcd.close()
        cluster.stop()
    }

    func set(_ bus: BusClient, _ key: String, _ value: JSONValue, revision: UInt64? = nil) async throws -> UInt64 {
        try await bus.call(KernelAPI.stateSet, .init(key: key, value: value, revision: revision)).sequence
    }

    func entries(_ bus: BusClient, _ prefix: String) async throws -> [String: KernelAPI.StateEntries.Entry] {
        let page = try await bus.call(KernelAPI.stateGet, .init(prefix: prefix))
        return Dictionary(uniqueKeysWithValues: page.entries.map { ($0.key, $0) })
    }

    /// The etcd key of state key `key`, and what etcd holds there.
    func kept(_ etcd: EtcdClient, _ key: String) async throws -> EtcdKeyValue? {
        try await etcd.range(Array((Self.prefix + key).utf8)).keyValues.first
    }

    @Test("state.set is kept in etcd: the sequence is its revision, compare-and-set is etcd's, a delete deletes; the kernel's own keys hang on its lease")
    func writesAreEtcdWrites() async throws {
        try await withKernelOnEtcd { _, _, bus, etcd in
            let first = try await set(bus, "/pricing/route", ["from": "LHR", "to": "JFK"])
            let stored = try #require(try await kept(etcd, "/pricing/route"))
            // Its revision, and its place in its transaction (which may carry the kernel's own keys too).
            let header = try JSONValue(parsing: Array(stored.valueString.split(separator: "\n").first.map(String.init)!.utf8))
            let place = try #require(header["i"]?.intValue)
            #expect(first == UInt64(stored.modRevision) * 1_000 + UInt64(place))
            // A header line, then the value exactly as written.
            #expect(stored.valueString.split(separator: "\n").last == #"{"from":"LHR","to":"JFK"}"#)
            // Read back from the kernel's copy, at once (the write was answered once the copy had it).
            #expect(try await entries(bus, "/pricing/")["/pricing/route"]?.sequence == first)
            #expect(try await entries(bus, "/pricing/")["/pricing/route"]?.value == ["from": "LHR", "to": "JFK"])

            // Compare-and-set: at the revision read it wins, at an older one it is -32004 naming the key's.
            let second = try await set(bus, "/pricing/route", ["from": "CDG", "to": "SFO"], revision: first)
            #expect(second > first)
            let conflict = await #expect(throws: BusError.self) { _ = try await set(bus, "/pricing/route", "lost", revision: first) }
            guard case .remote(_, let error)? = conflict else { Issue.record("expected -32004"); return }
            #expect(error.code == JSONRPCError.conflictCode)
            #expect(error.data?["revision"]?.intValue == Int64(second))
            #expect(try await kept(etcd, "/pricing/route")?.valueString.hasSuffix(#"{"from":"CDG","to":"SFO"}"#) == true)
            // Create only: once.
            _ = try await set(bus, "/pricing/new", 1, revision: 0)
            await #expect(throws: BusError.self) { _ = try await set(bus, "/pricing/new", 2, revision: 0) }

            // A delete deletes in etcd; deleting what is not there changes nothing.
            _ = try await set(bus, "/pricing/route", .null)
            #expect(try await kept(etcd, "/pricing/route") == nil)
            #expect(try await entries(bus, "/pricing/")["/pricing/route"] == nil)
            _ = try await set(bus, "/pricing/route", .null)

            // The kernel's instance key is attached to a lease: it goes when the kernel does.
            let instance = try #require(try await kept(etcd, KernelAPI.StateKeys.instance))
            #expect(instance.lease != 0)

            // What the kernel says of its etcd: where, how far its copy is, its lease.
            let stats = try #require(try await bus.call(KernelAPI.stats).state.etcd)
            #expect(stats.prefix == Self.prefix)
            #expect(stats.revision >= stored.modRevision)
            #expect(stats.lease == String(instance.lease, radix: 16))
            #expect(stats.transactions >= 5)
            #expect(stats.failedWrites == 0)
            let metrics = try await bus.call(KernelAPI.metrics).text
            for family in ["revision", "lag_revisions", "transactions_total", "failed_writes_total", "dropped_writes_total", "queued_writes"] {
                #expect(metrics.contains("\nswitchboard_state_etcd_\(family) "), "\(family)")
            }
        }
    }

    @Test("a new kernel on the same etcd serves the same state with the same sequence numbers")
    func restartKeepsEverything() async throws {
        try await withKernelOnEtcd { cluster, kernel, bus, _ in
            var written: [String: UInt64] = [:]
            for n in 1...10 { written["/orders/\(n)"] = try await set(bus, "/orders/\(n)", .int(Int64(n))) }
            // A subscriber stopped here, before the last ten writes and the restart.
            let stoppedAt = written["/orders/10"]!
            for n in 11...20 { written["/orders/\(n)"] = try await set(bus, "/orders/\(n)", .int(Int64(n))) }
            _ = try await set(bus, "/orders/3", .null)
            let before = try await entries(bus, "/orders/")
            await bus.close()
            await kernel.stop()

            let again = try await kernel.restarted()
            let client = try await BusClient(brokers: [again.endpoints.broker], timeout: .seconds(20))
            let after = try await entries(client, "/orders/")
            #expect(after.count == 19)
            for (key, sequence) in written where key != "/orders/3" {
                #expect(after[key]?.sequence == sequence, "\(key)")
                #expect(after[key]?.value == before[key]?.value)
            }
            // It resumes from where it stopped, without a reset: the changes since, the deletion included.
            let state = again.stateEndpoints
            let follower = try await BusClient(brokers: [again.endpoints.broker], state: [state])
            let changes = try #require(try await follower.changes(under: ["/orders/"], since: stoppedAt), "a reset: the new kernel does not hold the changes")
            #expect(changes.changes.map(\.key) == (11...20).map { "/orders/\($0)" } + ["/orders/3"])
            #expect(changes.changes.map(\.sequence) == (11...20).map { written["/orders/\($0)"]! } + [changes.changes.last!.sequence])
            #expect(changes.changes.last?.value.isEmpty == true)
            await follower.close()
            // Writes go on after the last revision, so subscribers' sequences keep growing.
            #expect(try await set(client, "/orders/21", 21) > written.values.max()!)
            await client.close()
            await again.stop()
            _ = cluster
        }
    }

    @Test("a subscriber resuming from before the kernel's history gets the changes since from etcd's revisions, not a reset; when they hold more than the history may, or etcd compacted them, the whole snapshot")
    func resumeBeforeHistory() async throws {
        let cluster = try await TestEtcd.start()
        let etcd = try EtcdClient(endpoints: cluster.clientURLs)
        var kernel: TestKernel?
        var bus: BusClient?
        var follower: BusClient?
        func stopAll() async {
            await follower?.close()
            await bus?.close()
            await kernel?.stop()
            await etcd.close()
            cluster.stop()
        }
        do {
            kernel = try await Self.kernel(on: cluster) { configuration in
                configuration.stateHistoryChanges = 4
                configuration.stateHistoryBytes = 16 * 1024
            }
            bus = try await BusClient(brokers: [kernel!.endpoints.broker], timeout: .seconds(20))
            var written: [UInt64] = []
            for n in 1...12 {
                written.append(try await set(bus!, "/orders/\(n)", .int(Int64(n))))
                // Changes under another subtree, which the resume leaves out.
                if n % 4 == 0 { _ = try await set(bus!, "/other/\(n)", .int(Int64(n))) }
            }
            _ = try await set(bus!, "/orders/2", .null)
            let endpoints = kernel!.endpoints
            follower = try await BusClient(brokers: [endpoints.broker],
                                           state: [kernel!.stateEndpoints])
            // Nine changes back, the kernel holding the last four: read from etcd.
            let changes = try #require(try await follower!.changes(under: ["/orders/"], since: written[2]), "a reset: the changes were not read from etcd")
            #expect(changes.changes.map(\.key) == (4...12).map { "/orders/\($0)" } + ["/orders/2"])
            #expect(Array(changes.changes.map(\.sequence).dropLast()) == Array(written[3...]))
            #expect(changes.changes.last?.value.isEmpty == true && changes.changes.last!.sequence > written.last!)
            #expect(changes.changes.map(\.value).dropLast() == (4...12).map { Frame("\($0)") })
            // Changes that hold more than the kernel's own history may (state_history_bytes):
            // the whole snapshot, not a read that size.
            let beforeBig = try await set(bus!, "/big/0", 0)
            for n in 1...6 { _ = try await set(bus!, "/big/\(n)", .string(String(repeating: "v", count: 4_000))) }
            for n in 1...4 { _ = try await set(bus!, "/other/after/\(n)", .int(Int64(n))) }
            #expect(try await follower!.changes(under: ["/big/"], since: beforeBig) == nil)
            // Compacted in etcd: the whole snapshot (a changes-only resume gets nothing).
            try await etcd.compact(to: try await etcd.put(Array("/sb-test/elsewhere".utf8), Array("1".utf8)))
            #expect(try await follower!.changes(under: ["/orders/"], since: written[2]) == nil)
        } catch {
            await stopAll()
            throw error
        }
        await stopAll()
    }

    @Test("collector KVSETs on etcd: batched into transactions, each published once in order")
    func collectorWritesAreBatched() async throws {
        try await withKernelOnEtcd { _, kernel, _, etcd in
            let count = 500
            let context = try ZMQContext()
            let collector = try ZMQSocket(context, .pub)
            defer { collector.close() }
            try collector.connect(kernel.endpoints.collector)
            // Sent until the kernel has one (a PUB drops what it sends before it is connected).
            var connected = false
            for round in 0..<100 where !connected {
                try collector.send(CHP.kv(KVEntry(key: "/client/probe", value: Frame("\(round)"))))
                connected = (try? await kernel.state("/client/probe", within: 0.5, "the collector connected") { !$0.isEmpty }) != nil
            }
            try #require(connected)
            for n in 0..<count { try collector.send(CHP.kv(KVEntry(key: "/client/k\(n)", value: Frame("\(n)")))) }
            let state = try await kernel.state("/client/k", within: 60, "every KVSET applied") { $0.count == count }
            #expect(state["/client/k\(count - 1)"] == .int(Int64(count - 1)))
            let stored = try await etcd.range(prefix: Array((Self.prefix + "/client/k").utf8))
            #expect(stored.keyValues.count == count)
            // Fewer transactions than writes: what arrived together went together.
            let revisions = Set(stored.keyValues.map(\.modRevision))
            #expect(revisions.count < count / 2, "\(revisions.count) transactions for \(count) writes")

            // Transactions go a few at once, but one key's writes are made in the order they came.
            for n in 0..<300 {
                try collector.send(CHP.kv(KVEntry(key: "/client/same", value: Frame("\(n)"))))
                try collector.send(CHP.kv(KVEntry(key: "/client/k\(n)", value: Frame("\(n + 1_000)"))))
            }
            try await kernel.state("/client/", within: 60, "the last writes applied") { $0["/client/k299"] == 1_299 && $0["/client/same"] != nil }
            #expect(try await kept(etcd, "/client/same")?.valueString.hasSuffix("\n299") == true)
            let final = try await kernel.state("/client/same", "the key's last value") { !$0.isEmpty }
            #expect(final["/client/same"] == 299)
        }
    }

    @Test("a client's quota holds on etcd though its writes come faster than etcd takes them: writes in flight count")
    func quotaCountsWritesInFlight() async throws {
        let cluster = try await TestEtcd.start()
        defer { cluster.stop() }
        let kernel = try await Self.kernel(on: cluster) { $0.clientStateMaxKeys = 3 }
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(20))
        let etcd = try EtcdClient(endpoints: cluster.clientURLs)
        // Ten writes at once: the kernel admits them all before etcd has answered one.
        func tenAtOnce(_ key: @escaping @Sendable (Int) -> String) async -> Int {
            await withTaskGroup(of: Bool.self) { group in
                for n in 0..<10 { group.addTask { (try? await bus.publish(key: key(n), value: .int(Int64(n)))) != nil } }
                return await group.reduce(into: 0) { $0 += $1 ? 1 : 0 }
            }
        }
        // One new key written ten times is one key.
        #expect(await tenAtOnce { _ in "/client/quota/same" } == 10)
        #expect(await tenAtOnce { "/client/quota/\($0)" } == 2)
        #expect(try await etcd.range(prefix: Array((Self.prefix + "/client/quota/").utf8)).keyValues.count == 3)
        #expect(try await bus.call(KernelAPI.stats).state.refusedOverLimit == 8)
        await etcd.close()
        await bus.close()
        await kernel.stop()
    }

    @Test("a kernel on etcd stopped with state writes still queued for it: each is answered or fails, none runs against the stopped kernel (which would end the process)")
    func stopsWithWritesQueued() async throws {
        let cluster = try await TestEtcd.start()
        defer { cluster.stop() }
        let kernel = try await Self.kernel(on: cluster)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(20))
        _ = try await set(bus, "/first", 0)
        // Far more writes than etcd answers at once, so many still wait for their turn on
        // the kernel when it stops.
        let writes = Task {
            await withTaskGroup(of: Void.self) { group in
                for n in 0..<300 { group.addTask { _ = try? await bus.call(KernelAPI.stateSet, .init(key: "/stopping/\(n)", value: .int(Int64(n)))) } }
            }
        }
        try await cluster.values(under: Self.prefix + "/stopping/", "writes reached etcd") { !$0.isEmpty }
        await kernel.stop()
        await bus.close()
        try await within(30, "every write answered or failed") { await writes.value }
    }

    @Test("a large batch of state.get on etcd holds nobody up: a ping sent after it, on the same connection, is answered first")
    func readsTakeTurns() async throws {
        try await withKernelOnEtcd { _, kernel, bus, _ in
            let value = JSONValue.string(String(repeating: "t", count: 600_000))
            for index in 0..<2 { _ = try await set(bus, "/client/turns/\(index)", value) }
            try await kernel.state("/client/turns/", within: 30, "the copy holds both") { $0.count == 2 }
            // Here the batch and the ping are each answered by a task of their own, whose
            // requests take turns on the kernel: the ping needs a few hops, the batch two per
            // page. Thirty-two pages of 600 kB keep the batch under way far longer than a busy
            // machine delays the ping's task (with eight it once finished first).
            let pages = 32
            let batch = (0..<pages).map { JSONRPCRequest(id: .number(Int64(100 + $0)), method: "state.get", params: ["prefix": "/client/turns/", "limit": 1]).jsonBytes }
            let replies = try repliesToBatchThenPing(batch, broker: kernel.endpoints.broker)
            #expect(replies[0].map(\.id) == [.number(1)], "the ping waited for the batch: \(replies[0].map(\.id))")
            #expect(replies[1].map(\.id) == (0..<pages).map { .number(Int64(100 + $0)) })
        }
    }

    @Test("a TTL on etcd is a lease: the key goes when it runs out, and the deletion is published")
    func ttlIsALease() async throws {
        try await withKernelOnEtcd { _, kernel, bus, etcd in
            _ = try await bus.call(KernelAPI.stateSet, .init(key: "/pricing/quote", value: "soon gone", ttl: 2))
            #expect(try await kept(etcd, "/pricing/quote").map { $0.lease != 0 } == true)
            try await kernel.state("/pricing/quote", within: 30, "the key expired") { $0.isEmpty }
            #expect(try await kept(etcd, "/pricing/quote") == nil)
        }
    }

    @Test("etcd gone: a write is answered with an error naming etcd, never left waiting; etcd back: writes and the copy go on")
    func etcdGoesAndComesBack() async throws {
        try await withKernelOnEtcd { cluster, kernel, bus, _ in
            let before = try await set(bus, "/pricing/before", 1)
            cluster.kill(0)
            let refused = await #expect(throws: BusError.self) { _ = try await set(bus, "/pricing/during", 2) }
            guard case .remote(_, let error)? = refused else { Issue.record("expected an error from the kernel, got \(String(describing: refused))"); return }
            #expect([JSONRPCError.storageFailedCode, JSONRPCError.outcomeUnknownCode].contains(error.code), "\(error)")
            #expect(error.message.contains("etcd"), "\(error)")
            // Reads go on from the kernel's copy.
            #expect(try await entries(bus, "/pricing/")["/pricing/before"]?.sequence == before)

            try await cluster.restart(0)
            let after = try await within(60, "a write once etcd is back") {
                while true {
                    if let sequence = try? await set(bus, "/pricing/after", 3) { return sequence }
                }
            }
            #expect(after > before)
            // The copy follows again: the write came back through the watch.
            try await kernel.state("/pricing/after", "the write in the copy") { $0["/pricing/after"] == 3 }
        }
    }

    @Test("one writer per state: a second kernel on the same etcd waits for the first to go, then serves the same state; a client given both moves across")
    func oneWriter() async throws {
        let cluster = try await TestEtcd.start()
        defer { cluster.stop() }
        let first = try await Self.kernel(on: cluster)
        // The second kernel's endpoints, known before it binds them.
        let ports = (0..<4).map { _ in "tcp://127.0.0.1:\(freePort())" }
        let bus = try await BusClient(brokers: [first.endpoints.broker, ports[0]], timeout: .seconds(30))
        let written = try await set(bus, "/pricing/route", "LHR-JFK")
        let secondStarted = Mutex(false)
        let second = Task {
            let kernel = try await Self.kernel(on: cluster) { configuration in
                (configuration.brokerEndpoint, configuration.snapshotEndpoint) = (ports[0], ports[1])
                (configuration.publisherEndpoint, configuration.collectorEndpoint) = (ports[2], ports[3])
            }
            secondStarted.withLock { $0 = true }
            return kernel
        }
        // The first still writes, and holds the election, while the second waits.
        let moved = try await set(bus, "/pricing/route", "CDG-SFO", revision: written)
        #expect(moved > written)
        let etcd = try EtcdClient(endpoints: cluster.clientURLs)
        // The election key names the holder and the broker a waiting kernel asks it at.
        @Sendable func holder() async throws -> JSONValue? {
            try await etcd.range(Array((Self.prefix + ".active").utf8)).keyValues.first.map { try JSONValue(parsing: $0.value) }
        }
        #expect(try await holder() == ["instance": .string(first.kernel.instance), "broker": .string(first.endpoints.broker)])
        #expect(secondStarted.withLock { $0 } == false)
        await first.stop()

        // Stopped, the first let its election go: the second takes it at once, and the
        // client's next write reaches it.
        #expect(try await set(bus, "/pricing/route", "AMS-NRT", revision: moved) > moved)
        let taken = try await within(30, "the second kernel started") { try await second.value }
        #expect(try await entries(bus, "/pricing/")["/pricing/route"]?.value == "AMS-NRT")
        #expect(try await holder()?["instance"]?.stringValue == taken.kernel.instance)
        await bus.close()
        await taken.stop()
        await etcd.close()
    }

    @Test("fenced: a kernel whose election another took writes and reads nothing more, and answers -32008")
    func fenced() async throws {
        try await withKernelOnEtcd { _, kernel, bus, etcd in
            _ = try await set(bus, "/pricing/before", 1)
            // Another kernel takes the election (as one would once this one's lease ran out
            // while it was cut off): the key made again, under its lease.
            let election = Array((Self.prefix + ".active").utf8)
            let intruder = try await etcd.grantLease(ttl: 30)
            _ = try await etcd.delete(election)
            _ = try await etcd.put(election, Array("another kernel".utf8), lease: intruder.id)

            // A client keeps asking a kernel that answers -32008 (its pair's other may take over)
            // until its deadline, then gives up saying why.
            let impatient = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(2))
            for attempt in 0..<2 {
                let refused = await #expect(throws: BusError.self) { _ = try await set(impatient, "/pricing/zombie", .int(Int64(attempt))) }
                guard case .unavailable(_, let message)? = refused else { Issue.record("expected not active, got \(String(describing: refused))"); return }
                #expect(message.contains("Not active: this kernel no longer writes the state"), "\(message)")
            }
            #expect(try await kept(etcd, "/pricing/zombie") == nil)
            // Nor does it answer reads: its copy no longer follows the state another writes.
            let read = await #expect(throws: BusError.self) { _ = try await impatient.call(KernelAPI.stateGet, .init(prefix: "/pricing/")) }
            guard case .unavailable(_, let message)? = read else { Issue.record("expected not active, got \(String(describing: read))"); return }
            #expect(message.contains("Not active: this kernel no longer writes the state"), "\(message)")
            await impatient.close()
        }
    }

    @Test("cut off from etcd while the revisions it missed were compacted: back, the kernel's copy catches up and its subscribers see it; writes go on")
    func catchesUpPastCompaction() async throws {
        let cluster = try await TestEtcd.start(members: 3)
        defer { cluster.stop() }
        // The kernel knows one member, not the leader: that member gone, it is cut off, and
        // the others go on without choosing a leader.
        let leader = try await leader(of: cluster), cutOff = (leader + 1) % 3
        let kernel = try await Self.kernel(on: cluster) { $0.stateEtcd?.endpoints = [cluster.clientURLs[cutOff]] }
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(30))
        let state = kernel.stateEndpoints
        let follower = try await BusClient(brokers: [kernel.endpoints.broker], state: [state])
        _ = try await set(bus, "/pricing/kept", 1)
        _ = try await set(bus, "/pricing/gone", 2)
        let subscription = try await follower.subscribe(prefixes: ["/pricing/"])

        cluster.kill(cutOff)
        let others = try EtcdClient(endpoints: cluster.clientURLs.enumerated().filter { $0.offset != cutOff }.map(\.element))
        _ = try await others.put(Array((Self.prefix + "/pricing/new").utf8), Array("3".utf8))
        _ = try await others.delete(Array((Self.prefix + "/pricing/gone").utf8))
        try await others.compact(to: try await others.put(Array((Self.prefix + "/pricing/last").utf8), Array("4".utf8)))
        try await cluster.restart(cutOff)

        let seen = try await within(60, "the subscriber saw the copy catch up") {
            var view: [String: JSONValue] = [:]
            for try await event in subscription {
                guard case .update(let update) = event else { continue }
                if update.isDelete { view[update.key] = nil } else { view[update.key] = update.json ?? .null }
                if view["/pricing/last"] == 4, view["/pricing/new"] == 3, view["/pricing/gone"] == nil, !update.fromSnapshot { break }
            }
            return view
        }
        #expect(seen == ["/pricing/kept": 1, "/pricing/new": 3, "/pricing/last": 4])
        #expect(try await entries(bus, "/pricing/").keys.sorted() == ["/pricing/kept", "/pricing/last", "/pricing/new"])
        #expect(try await set(bus, "/pricing/after", 5) > 0)
        await subscription.cancel()
        await others.close()
        await follower.close()
        await bus.close()
        await kernel.stop()
    }

    @Test("a kernel whose etcd cannot be reached does not start, and says which etcd, with its setting; switchboard kernel exits 1 saying so")
    func unreachableEtcd() async throws {
        let nowhere = "http://127.0.0.1:\(freePort())"
        var settings = EtcdStateSettings(endpoints: [nowhere])
        settings.prefix = Self.prefix
        let started = await #expect(throws: KernelRefusal.self) {
            _ = try await TestKernel.start { $0.stateEtcd = settings }
        }
        #expect(started?.description.hasPrefix("the state on etcd (kernel.state.etcd): etcd ") == true && started?.description.contains(nowhere) == true,
                "\(String(describing: started))")
        let folder = try temporaryDirectory("etcd-unreachable")
        let config = folder.appendingPathComponent("switchboard.yaml")
        let ports = (0..<4).map { _ in freePort() }
        try Data((kernelSection(ports, "state: {backend: etcd, etcd: {endpoints: [\(nowhere)]}}") + "\nsecurity: {curve: false}\n").utf8).write(to: config)
        let kernel = try await runCommand(switchboardExecutable(), ["kernel", "--config", config.path], seconds: 60)
        #expect(kernel.status == 1 && kernel.stderr.contains("switchboard: kernel: the state on etcd (kernel.state.etcd): etcd ") && kernel.stderr.contains(nowhere)
                 && !kernel.stderr.contains("Error:"), "\(kernel)")
    }

    @Test("kernel.state: etcd needs endpoints, and refuses a value limit over what one etcd request carries and a lease shorter than etcd grants")
    func configuration() throws {
        let etcd: [String: Any] = ["backend": "etcd", "etcd": ["endpoints": ["http://10.0.0.1:2379"], "prefix": "/bus", "lease_seconds": 3]]
        let read = try KernelConfiguration(reading: ConfigSection(path: "kernel", values: ["state": etcd]))
        #expect(read.stateEtcd?.endpoints == ["http://10.0.0.1:2379"])
        #expect(read.stateEtcd?.prefix == "/bus")
        #expect(read.stateEtcd?.leaseSeconds == 3)
        let shortLease = #expect(throws: ConfigError.self) {
            try KernelConfiguration(reading: ConfigSection(path: "kernel", values: ["state": ["backend": "etcd", "etcd": ["endpoints": ["http://10.0.0.1:2379"], "lease_seconds": 1]]]))
        }
        #expect(shortLease?.path == "kernel.state.etcd.lease_seconds" && shortLease?.problem.contains("at least 2") == true, "\(String(describing: shortLease))")
        #expect(try KernelConfiguration(reading: ConfigSection(path: "kernel", values: [:])).stateEtcd == nil)
        #expect(throws: ConfigError.self) { try KernelConfiguration(reading: ConfigSection(path: "kernel", values: ["state": ["backend": "etcd"]])) }
        let tooLarge = #expect(throws: ConfigError.self) {
            try KernelConfiguration(reading: ConfigSection(path: "kernel", values: ["state": etcd, "state_max_value_bytes": 2_000_000]))
        }
        #expect(tooLarge?.description.contains("etcd") == true)
    }
}

extension EtcdStateTests {
    @Test("a kernel started at the broker the election's holder names, where nothing listens, takes the election at once: the holder was an earlier run of it, not one to wait a lease for")
    func earlierRunTakenAtOnce() async throws {
        let etcd = try await TestEtcd.start()
        defer { etcd.stop() }
        let broker = "tcp://127.0.0.1:\(freePort())"
        // What a kernel killed there leaves behind: its election key under a lease of a minute.
        let client = try EtcdClient(endpoints: etcd.clientURLs)
        let lease = try await client.grantLease(ttl: 60).id
        _ = try await client.put(EtcdStateLink.electionKey(Array(Self.prefix.utf8), cell: nil),
                                 ElectionValue(instance: "earlier", broker: broker).bytes, lease: lease)
        await client.close()
        let started = ContinuousClock.now
        let kernel = try await Self.kernel(on: etcd) { $0.brokerEndpoint = broker }
        #expect(ContinuousClock.now - started < .seconds(30), "waited for the earlier run's lease")
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(10))
        #expect(try await set(bus, "/pricing/after", 1) > 0)
        await bus.close()
        await kernel.stop()
    }

    @Test("kernel.cell: a name, the directory's etcd (prefix /switchboard/cells by default), a window; a bad name, a missing name or etcd, a window of 0 are refused naming the key")
    func cellConfiguration() throws {
        func read(_ cell: [String: Any]) throws -> KernelConfiguration {
            try KernelConfiguration(reading: ConfigSection(path: "kernel", values: ["cell": cell]))
        }
        let etcd: [String: Any] = ["endpoints": ["http://10.0.0.1:2379"]]
        let cell = try #require(try read(["name": "a", "etcd": etcd, "window": 8, "advertise": "tcp://10.0.0.1:5555"]).cell)
        #expect(cell.name == "a" && cell.window == 8 && cell.advertise == "tcp://10.0.0.1:5555")
        #expect(cell.etcd.endpoints == ["http://10.0.0.1:2379"] && cell.etcd.prefix == "/switchboard/cells")
        #expect(try KernelConfiguration(reading: ConfigSection(path: "kernel", values: [:])).cell == nil)
        for (bad, path) in [(["etcd": etcd], "kernel.cell.name"), (["name": "a b", "etcd": etcd], "kernel.cell.name"),
                            (["name": "a"], "kernel.cell.etcd.endpoints"), (["name": "a", "etcd": etcd, "window": 0], "kernel.cell.window")] as [([String: Any], String)] {
            let refused = #expect(throws: ConfigError.self) { try read(bad) }
            #expect(refused?.path == path, "\(bad): \(String(describing: refused))")
        }
        // Another cell must be able to reach the broker the record names.
        #expect(throws: (any Error).self) { try Kernel.advertised(CellConfiguration(name: "a", etcd: EtcdStateSettings(endpoints: [])), bound: "tcp://0.0.0.0:5555") }
        #expect(try Kernel.advertised(CellConfiguration(name: "a", etcd: EtcdStateSettings(endpoints: [])), bound: "tcp://10.0.0.1:5555") == "tcp://10.0.0.1:5555")
    }
}

/// Which member of `cluster` leads (`etcdctl endpoint status`): its index in the members.
func leader(of cluster: TestEtcd) async throws -> Int {
    let status = try await runCommand(URL(fileURLWithPath: "/usr/bin/etcdctl"),
                                      ["endpoint", "status", "-w", "json", "--endpoints", cluster.clientURLs.joined(separator: ",")],
                                      environment: ["ETCDCTL_API": "3"])
    let members = try JSONValue(parsing: Array(status.stdout.utf8)).arrayValue ?? []
    let index = members.firstIndex { $0["Status"]?["header"]?["member_id"] == $0["Status"]?["leader"] }
    return try #require(index, "no leader in \(status)")
}
