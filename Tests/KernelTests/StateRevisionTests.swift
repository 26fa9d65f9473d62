import BusProtocol
import Contracts
@testable import Kernel
import Logging
import Testing
import ZeroMQ

private let quiet = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

/// Revisions of the kernel's state, on a state server alone (no sockets, the test's clock):
/// compare-and-set, the history and its bounds, resuming from a sequence.
@Suite("State revisions: compare-and-set, history, resume")
struct StateRevisionTests {
    func server(changes: Int = 100, bytes: Int = 1 << 20, perKey: Int = 4) -> StateServer {
        var configuration = KernelConfiguration()
        configuration.stateHistoryChanges = changes
        configuration.stateHistoryBytes = bytes
        configuration.stateHistoryPerKey = perKey
        return StateServer(configuration: configuration, logger: quiet)
    }

    func write(_ state: inout StateServer, _ key: String, _ value: String?, expected: UInt64? = nil, uuid: Frame = Frame(), now: UInt64 = 0)
        -> Result<UInt64, JSONRPCError>
    {
        state.write(key, value: value.map { Frame($0) } ?? Frame(), ttl: nil, expected: expected, uuid: uuid, by: .unauthenticated, now: now).map { $0.sequence! }
    }

    @Test("on etcd, a compare-and-set naming a revision the copy has not reached (a change made through another kernel) goes to etcd, whose compare decides; one the copy has passed is refused here")
    func compareAndSetAheadOfTheCopy() throws {
        var configuration = KernelConfiguration()
        configuration.stateEtcd = EtcdStateSettings(endpoints: ["http://127.0.0.1:2379"])
        var state = StateServer(configuration: configuration, logger: quiet)
        state.install([], sequence: EtcdSequence.end(of: 10), now: 0)
        let ahead = EtcdSequence.of(revision: 12, place: 0)
        let written = state.write("/client/cas", value: Frame("2"), ttl: nil, expected: ahead, by: .unauthenticated, now: 0)
        guard case .success(.toCommit(let write)) = written else { Issue.record("refused by a copy behind etcd: \(written)"); return }
        #expect(write.expected == ahead)
        let behind = EtcdSequence.of(revision: 5, place: 0)
        guard case .failure(let conflict) = state.write("/client/cas", value: Frame("3"), ttl: nil, expected: behind, by: .unauthenticated, now: 0) else {
            Issue.record("a revision the copy has passed was not refused"); return
        }
        #expect(conflict.code == JSONRPCError.conflictCode && conflict.data?["revision"] == 0)
    }

    @Test("create only if absent, update only at the revision read; a mismatch is -32004 with the key's revision, and changes nothing")
    func compareAndSet() throws {
        var state = server()
        let created = try write(&state, "/client/route", #""LHR-JFK""#, expected: 0).get()
        // Created already: a second create is refused, naming the revision it is at.
        guard case .failure(let error) = write(&state, "/client/route", #""CDG-SFO""#, expected: 0) else { Issue.record("a second create won"); return }
        #expect(error.code == JSONRPCError.conflictCode)
        #expect(error.data?["revision"] == .int(Int64(created)))
        #expect(error.data?["expected"] == 0)
        #expect(state.entries[Frame("/client/route")]?.value == Frame(#""LHR-JFK""#))
        // Two writers read `created`; the first to write wins, the second is told.
        let updated = try write(&state, "/client/route", #""CDG-SFO""#, expected: created).get()
        #expect(updated > created)
        guard case .failure(let stale) = write(&state, "/client/route", #""AMS-BOS""#, expected: created) else { Issue.record("a stale write won"); return }
        #expect(stale.data?["revision"] == .int(Int64(updated)))
        #expect(state.refusedConflict == 2)
        // A deletion is a revision too; the key is then absent (0), so it can be created again.
        _ = try write(&state, "/client/route", nil, expected: updated).get()
        #expect(state.entries[Frame("/client/route")] == nil)
        guard case .failure = write(&state, "/client/route", #""x""#, expected: updated) else { Issue.record("wrote a deleted key at its old revision"); return }
        #expect(try write(&state, "/client/route", #""again""#, expected: 0).get() > updated)
    }

    @Test("a kernel that installs a copy of its peer's state tells its subscribers: each counted topic's count moves on, so the next HUGZ shows changes it never published")
    func installCounted() throws {
        var passive = server()
        passive.install([], sequence: 10, now: 0)
        passive.subscriptionChanged(Message([Frame([1] + Array("/probe/".utf8))]), now: 0)
        _ = passive.publisher.take()
        // Copied again: /probe/a changed (at 15) while this kernel published nothing.
        passive.install([ReplicatedEntry(key: Frame("/probe/a"), sequence: 15, uuid: Frame(), properties: Frame(), value: Frame("1"),
                                         quotaOwner: nil, expiresIn: nil)], sequence: 20, now: 0)
        passive.tick(now: 1)
        let hugz = passive.publisher.take().compactMap { try? CHP.decodeUpdate($0) }
        #expect(hugz == [.hugz(published: ["/probe/": 1])])
    }

    @Test("the same compare-and-set sent again (its reply lost in a failover) is answered with the revision it made, on the peer too")
    func sentAgain() throws {
        var active = server()
        let request = Kernel.digest(RequestKey(client: "c1", id: .number(7)))
        #expect(request.count == 16)
        let first = try write(&active, "/client/k", "1", expected: 0, uuid: request).get()
        // The same request again: the revision it made, and no second change.
        #expect(try write(&active, "/client/k", "1", expected: 0, uuid: request).get() == first)
        #expect(active.sequence == first)
        // Another request with the same expectation is refused.
        guard case .failure = write(&active, "/client/k", "2", expected: 0, uuid: Kernel.digest(RequestKey(client: "c2", id: .number(7)))) else {
            Issue.record("another client's create won")
            return
        }

        // The passive peer applies the active one's changes (as the pair replicates them) and
        // holds the same revisions; asked the same request after a failover, it answers the same.
        var passive = server()
        passive.install([], sequence: first - 1, now: 0)
        let published = active.publisher.take().filter { $0[0] == Frame("/client/k") }
        for message in published {
            let item = ReplicatedEntry(key: message[0], sequence: UInt64(bigEndianBytes: message[1]), uuid: message[2], properties: message[3],
                                       value: message[4], quotaOwner: nil, expiresIn: nil)
            let applied = passive.applyReplicated(item, now: 0)
            #expect(applied)
        }
        #expect(passive.entries[Frame("/client/k")]?.sequence == first)
        #expect(passive.revisions(of: Frame("/client/k")).map(\.sequence) == active.revisions(of: Frame("/client/k")).map(\.sequence))
        #expect(try write(&passive, "/client/k", "1", expected: 0, uuid: request).get() == first)
    }

    @Test("a key's revisions among many keys' changes: through a deletion and a re-creation, cut where the log was trimmed, none after a copy of the peer's state")
    func revisionChains() throws {
        var state = server(changes: 40, perKey: 16)
        func revisions(_ key: String) -> [UInt64] { state.revisions(of: Frame(key)).map(\.sequence) }
        var mine: [UInt64] = []
        for round in 0..<4 {
            for other in 0..<3 { _ = try write(&state, "/client/other\(other)", "\(round)").get() }
            mine.append(try write(&state, "/client/mine", "\(round)").get())
        }
        #expect(revisions("/client/mine") == mine)
        // Deleted, then made again: one chain.
        mine.append(try write(&state, "/client/mine", nil).get())
        _ = try write(&state, "/client/other0", "x").get()
        #expect(revisions("/client/mine") == mine, "a deleted key's revisions end with its deletion")
        // Deleting it again (or a key never set) changes nothing: the answer is the sequence
        // as it stands, no revision is taken, nothing enters the history.
        let (sequence, changes) = (state.sequence, state.history.changes.count)
        #expect(try write(&state, "/client/mine", nil).get() == sequence)
        #expect(try write(&state, "/client/never", nil).get() == sequence)
        state.set("/kernel/never", value: Frame(), now: 0)
        #expect(state.sequence == sequence && state.history.changes.count == changes)
        mine.append(try write(&state, "/client/mine", "again").get())
        #expect(revisions("/client/mine") == mine)
        #expect(state.revisions(of: Frame("/client/mine")).map(\.value.isEmpty) == [false, false, false, false, true, false])
        #expect(revisions("/client/never").isEmpty)
        // 40 changes kept: after 30 more of other keys the first of mine are gone, the rest remain.
        for index in 0..<30 { _ = try write(&state, "/client/other\(index % 3)", "\(index)").get() }
        let kept = revisions("/client/mine")
        #expect(!kept.isEmpty && kept.count < mine.count && kept == Array(mine.suffix(kept.count)))
        #expect(kept.allSatisfy { $0 > state.history.start })
        // A deletion trimmed off the log: the key has no revisions left, and a new one starts afresh.
        _ = try write(&state, "/client/gone", "1").get()
        let gone = try write(&state, "/client/gone", nil).get()
        #expect(revisions("/client/gone").last == gone)
        for index in 0..<40 { _ = try write(&state, "/client/other\(index % 3)", "\(index)").get() }
        #expect(revisions("/client/gone").isEmpty)
        let reborn = try write(&state, "/client/gone", "2").get()
        #expect(revisions("/client/gone") == [reborn])
        // A copy of the peer's state installed: the log starts after it, and so do the chains.
        state.install([], sequence: state.sequence + 10, now: 0)
        #expect(revisions("/client/gone").isEmpty)
    }

    @Test("the history keeps each key's last revisions (per_key), the log its last changes by count and bytes; deletions and TTL expiry included")
    func historyBounds() throws {
        var state = server(changes: 6, bytes: 1 << 20, perKey: 3)
        var sequences: [UInt64] = []
        for value in 1...5 { sequences.append(try write(&state, "/client/a", "\(value)").get()) }
        // Five revisions of /client/a; the key keeps its last three.
        #expect(state.revisions(of: Frame("/client/a")).map(\.sequence) == Array(sequences.suffix(3)))
        // A deletion, and a key that expires: both revisions.
        let deleted = try write(&state, "/client/a", nil).get()
        state.set("/client/t", value: Frame("1"), ttl: TimeToLive(seconds: 1), now: 0)
        state.tick(now: 1_000_000_000)
        let expiry = state.revisions(of: Frame("/client/t"))
        #expect(expiry.count == 2 && expiry[1].value.isEmpty)
        #expect(state.revisions(of: Frame("/client/a")).last?.sequence == deleted)
        #expect(state.revisions(of: Frame("/client/a")).last?.value.isEmpty == true)
        // Six changes at most: 8 were made, so the first two are gone and the log starts after them.
        #expect(state.history.changes.count == 6)
        #expect(state.history.start == sequences[1])
        // The keys with revisions held, counted again whenever the log changed.
        #expect(state.history.keys == 2)
        _ = try write(&state, "/client/c", "1").get()
        #expect(state.history.keys == 3)
        for value in 1...6 { _ = try write(&state, "/client/d", "\(value)").get() }
        #expect(state.history.keys == 1)

        // Bytes: each change counts the memory it holds, its record in the log too, so a bound
        // for two small changes keeps the last two, however small they are.
        let record = MemoryLayout<StateHistory.Change>.stride
        var small = server(changes: 100, bytes: 2 * record + record / 2, perKey: 16)
        for value in 1...10 { _ = try write(&small, "/client/b", "\(value)").get() }
        #expect(small.history.bytes == 2 * record)
        #expect(small.history.changes.count == 2)
        // A value over 32 bytes is held in a buffer of its own: its bytes and the buffer's count.
        var large = server(changes: 100, bytes: 1 << 20, perKey: 16)
        let text = "\"" + String(repeating: "v", count: 98) + "\""
        _ = try write(&large, "/client/v", text).get()
        #expect(large.history.bytes == record + Frame(text).heldBytes)
        #expect(Frame(text).heldBytes > 100 && Frame("1").heldBytes == 0)
        // A smaller bound by a reload trims at once.
        small.configuration.stateHistoryChanges = 1
        #expect(small.history.changes.count == 1)
    }

    @Test("ICANHAZ? with a sequence gets exactly the changes after it, deletions included, in order; one the history no longer covers gets the snapshot")
    func resume() throws {
        var state = server(changes: 4)
        let client = Frame("sub")
        func ask(_ since: UInt64?, changesOnly: Bool = false) throws -> (entries: [KVEntry], done: SnapshotReply) {
            state.snapshot(Message([client] + CHP.icanhaz(subtree: "/client/", since: since, changesOnly: changesOnly).frames))
            let replies = try state.snapshots.take().map { try CHP.decodeSnapshotReply(Message(Array($0.frames.dropFirst()))) }
            let entries = replies.compactMap { if case .entry(let entry) = $0 { entry } else { nil } }
            return (entries, replies.last!)
        }
        let a = try write(&state, "/client/a", "1").get()
        _ = try write(&state, "/client/b", "2").get()
        let deleteA = try write(&state, "/client/a", nil).get()
        state.set("/other/x", value: Frame("3"), now: 0)
        let resumed = try ask(a)
        #expect(resumed.entries.map(\.key) == ["/client/b", "/client/a"])
        #expect(resumed.entries.last?.sequence == deleteA && resumed.entries.last?.isDelete == true)
        #expect(resumed.done == .done(sequence: state.sequence, subtree: "/client/", since: a))
        // Nothing since the head: no entries, still a resume.
        #expect(try ask(state.sequence).entries.isEmpty)
        #expect(state.resumes == 2)
        // The log holds 4 changes: asked from before them, the whole subtree, and no since.
        _ = try write(&state, "/client/c", "4").get()
        let whole = try ask(a - 1)
        #expect(Set(whole.entries.map(\.key)) == ["/client/b", "/client/c"])
        #expect(whole.done == .done(sequence: state.sequence, subtree: "/client/", since: nil))
        // A sequence this kernel never reached: the snapshot.
        #expect(try ask(state.sequence + 10).done == .done(sequence: state.sequence, subtree: "/client/", since: nil))
        #expect(state.resumesRefused == 2)
        // Asked for the changes or nothing: held, the same changes; not held, a bare KTHXBAI.
        #expect(try ask(deleteA, changesOnly: true).entries.map(\.key) == ["/client/c"])
        let nothing = try ask(a - 1, changesOnly: true)
        #expect(nothing.entries.isEmpty && nothing.done == .done(sequence: state.sequence, subtree: "/client/", since: nil))
        #expect(state.resumesRefused == 3)
    }

    @Test("each client key's quota follows its writes, deletions and keys another client takes over; its limit holds; a peer's copy counts the same")
    func quotas() throws {
        var configuration = KernelConfiguration()
        configuration.clientStateMaxKeys = 3
        var state = StateServer(configuration: configuration, logger: quiet)
        let a = Peer.client(key: "A"), b = Peer.client(key: "B")
        func set(_ key: String, _ value: String?, by peer: Peer) -> Result<UInt64, JSONRPCError> {
            state.write(key, value: value.map { Frame($0) } ?? Frame(), ttl: nil, by: peer, now: 0).map { $0.sequence! }
        }
        func usage(_ owner: String) -> [Int]? { state.quotas[owner].map { [$0.keys, $0.bytes] } }
        let size = { (key: String, value: String) in key.utf8.count + value.utf8.count }

        _ = try set("/client/1", "1", by: a).get()
        _ = try set("/client/2", "22", by: a).get()
        #expect(usage("A") == [2, size("/client/1", "1") + size("/client/2", "22")])
        // Rewritten by its owner: the same key, the new size.
        _ = try set("/client/2", "2222", by: a).get()
        #expect(usage("A") == [2, size("/client/1", "1") + size("/client/2", "2222")])
        // Taken over by another client: it counts against that one's quota from then on.
        _ = try set("/client/1", "b", by: b).get()
        #expect(usage("A") == [1, size("/client/2", "2222")] && usage("B") == [1, size("/client/1", "b")])
        // A quota goes with its last key.
        _ = try set("/client/2", nil, by: a).get()
        #expect(usage("A") == nil && state.quotas.count == 1)
        // Three keys, then the fourth is refused (-32010) and counts nowhere; B's is untouched.
        for key in ["/client/3", "/client/4", "/client/5"] { _ = try set(key, "x", by: a).get() }
        guard case .failure(let refused) = set("/client/6", "x", by: a) else { Issue.record("a fourth key was kept"); return }
        #expect(refused.code == JSONRPCError.tooLargeCode && refused.message.contains("kernel.client_state_max_keys"))
        #expect(usage("A") == [3, 3 * size("/client/3", "x")] && usage("B") == [1, size("/client/1", "b")])
        // Deleting one makes room again.
        _ = try set("/client/3", nil, by: a).get()
        _ = try set("/client/6", "x", by: a).get()
        #expect(usage("A") == [3, 3 * size("/client/3", "x")])
        #expect(state.totalBytes == usage("A")![1] + usage("B")![1])

        // The passive peer's copy of the whole state counts the same.
        var passive = StateServer(configuration: configuration, logger: quiet)
        passive.install(state.replicatedSnapshot(now: 0), sequence: state.sequence, now: 0)
        #expect(passive.quotas.mapValues { [$0.keys, $0.bytes] } == state.quotas.mapValues { [$0.keys, $0.bytes] })
        #expect(passive.totalBytes == state.totalBytes)
    }
}

extension UInt64 {
    init(bigEndianBytes frame: Frame) {
        self = frame.bytes.reduce(0) { $0 << 8 | UInt64($1) }
    }
}
