import BusProtocol
import DequeModule
import Etcd
import Foundation
import Logging

// The state kept in etcd (`kernel.state.backend: etcd`).
//
// The rules:
// - a change is made in etcd first and in the kernel's copy only when etcd's watch brings it
//   back, so every kernel on the same etcd holds the same changes in the same order;
// - a change's CHP sequence number is its etcd revision and its place in that revision's
//   transaction (``EtcdSequence``): etcd numbers transactions, CHP numbers each change;
// - a write is answered once the copy holds it: a client that reads after its write, from
//   the same kernel, sees it;
// - compare-and-set is etcd's transaction on the key's `mod_revision`; a TTL is a lease; the
//   kernel's own keys (`/kernel/`) hang on the kernel's lease and go when it does;
// - one kernel writes a prefix's state: the one that holds its election key (`PREFIX.active`,
//   under its lease). Every transaction it sends requires the key still to be the one it
//   created, so a kernel that lost it (its lease ran out while it was cut off, or another took
//   it) writes nothing: it answers -32008 from then on;
// - of a bus in several cells, one kernel a cell: each cell has an election key of its own
//   (`PREFIX.active.CELL`), and the cells' kernels write the one state side by side. etcd
//   orders their writes, a compare-and-set compares with whatever any of them wrote, and each
//   copy is fed by the same watch, so every cell numbers every change alike.

/// CHP sequence numbers of changes kept in etcd: the revision times ``perRevision`` plus the
/// change's place among those of its transaction. Any kernel watching the same etcd gives a
/// change the same number, and the numbers only grow.
enum EtcdSequence {
    /// Room for the changes of one transaction (a batch holds at most
    /// ``EtcdStateLink/maxBatchOperations``; etcd's own bound, `--max-txn-ops`, is 128).
    static let perRevision: UInt64 = 1_000

    /// The revisions that have numbers (etcd's stay far below: a write a nanosecond for
    /// 500 years); what an answer from the wire says beyond them is held to them, not trapped on.
    static let revisions: ClosedRange<Int64> = 0...Int64(UInt64.max / perRevision - 1)

    static func of(revision: Int64, place: Int) -> UInt64 {
        UInt64(min(max(revision, revisions.lowerBound), revisions.upperBound)) * perRevision + UInt64(min(max(place, 0), Int(perRevision) - 1))
    }
    static func revision(of sequence: UInt64) -> Int64 { Int64(sequence / perRevision) }
    /// The last sequence number `revision` can hold: a copy read at `revision` is at it.
    static func end(of revision: Int64) -> UInt64 { of(revision: revision, place: Int(perRevision) - 1) }
}

/// A state entry as etcd keeps it: a one-line JSON header (its place in its transaction, the
/// request's digest, whose quota it counts against, its TTL), a newline, then the value's
/// bytes exactly as they were written, so `etcdctl get` shows both.
struct EtcdStateRecord {
    var place: Int
    var uuid: Frame
    var owner: String?
    var ttlSeconds: Int64?
    var value: Frame

    init(place: Int, uuid: Frame, owner: String?, ttlSeconds: Int64?, value: Frame) {
        (self.place, self.uuid, self.owner, self.ttlSeconds, self.value) = (place, uuid, owner, ttlSeconds, value)
    }

    func encoded() -> [UInt8] {
        var header: [String: JSONValue] = ["i": .int(Int64(place))]
        if !uuid.isEmpty { header["uuid"] = .string(uuid.bytes.map { String(format: "%02x", $0) }.joined()) }
        if let owner { header["owner"] = .string(owner) }
        if let ttlSeconds { header["ttl"] = .int(ttlSeconds) }
        var bytes = JSONValue.object(header).jsonBytes
        bytes.append(UInt8(ascii: "\n"))
        value.withUnsafeBytes { bytes += $0 }
        return bytes
    }

    /// What etcd holds at a key: a record, or a value written there by something else (then
    /// all of it is the value, at `place`).
    init(decoding bytes: [UInt8], place: Int) {
        self.init(place: place, uuid: Frame(), owner: nil, ttlSeconds: nil, value: Frame(bytes))
        guard let newline = bytes.firstIndex(of: UInt8(ascii: "\n")),
              case .object(let header)? = try? JSONValue(parsing: Array(bytes[..<newline])),
              let index = header["i"]?.intValue, (0..<Int64(EtcdSequence.perRevision)).contains(index) else { return }
        self.place = Int(index)
        if let hex = header["uuid"]?.stringValue { uuid = Frame(Self.bytes(hex: hex)) }
        owner = header["owner"]?.stringValue
        ttlSeconds = header["ttl"]?.intValue
        value = Frame(bytes[(newline + 1)...])
    }

    /// The CHP properties frame (`ttl=SECONDS`), as the change was published where it was made.
    var properties: Frame { Frame(ttlSeconds.flatMap { TimeToLive(seconds: Double($0)) }?.property ?? "") }

    private static func bytes(hex: String) -> [UInt8] {
        var bytes: [UInt8] = [], digits = Array(hex.utf8)
        guard digits.count.isMultiple(of: 2) else { return [] }
        for index in stride(from: 0, to: digits.count, by: 2) {
            guard let byte = UInt8(String(decoding: digits[index..<index + 2], as: UTF8.self), radix: 16) else { return [] }
            bytes.append(byte)
        }
        return bytes
    }
}

/// The kernel's link to the etcd that keeps its state: the writes on their way, the answers
/// waiting for the watch, the kernel's lease. Confined to the kernel's loop, as its parts are.
final class EtcdStateLink {
    /// Changes one transaction carries at most, and the bytes of their keys and values (a
    /// larger write goes alone): within etcd's defaults (128 operations, 1.5 MiB a request).
    static let maxBatchOperations = 128
    static let maxBatchBytes = 1_024 * 1_024
    /// Transactions in flight at once: etcd commits those that come together with one write
    /// to its log, so a few at once take many more changes a second than one at a time.
    static let maxTransactionsInFlight = 4
    /// Writes waiting for etcd, at most, and their bytes: beyond them a collector write is
    /// dropped (counted) and a `state.set` refused with -32001, so a flood faster than etcd
    /// takes it does not grow the kernel.
    static let maxQueued = 50_000
    static let maxQueuedBytes = 64 * 1_024 * 1_024

    struct Pending: Sendable {
        var write: DurableWrite
        /// Whom to answer with the change's sequence number (nil: nobody waits, as for the
        /// collector's writes).
        var done: CheckedContinuation<UInt64, any Error>?
    }

    /// What the link's work answers in a task of its own: a request for the `kernel` service
    /// (a state write waits for etcd there), or a subscriber's resume from before the copy's
    /// history (read from etcd's revisions).
    enum Request: Sendable {
        case kernel(caller: Broker.Caller, body: [UInt8], peer: String?)
        case resume(CHP.SnapshotRequest, through: UInt64)
    }

    /// At most this many resumes read etcd's revisions at once (each a watch, and what it
    /// brings held until it is answered); more get what the copy holds.
    static let maxResumesReading = 4
    var resumesReading = 0

    /// A change written at a revision the copy does not hold yet.
    struct Awaited: Hashable {
        var revision: Int64
        var key: [UInt8]
    }

    let client: EtcdClient
    /// Where the state lives under etcd's keys (``EtcdStateSettings/prefix``): a state key
    /// `/a` at `PREFIX/a`.
    let prefix: [UInt8]
    var statePrefix: [UInt8] { prefix + [UInt8(ascii: "/")] }
    /// The key whose holder writes the state: `PREFIX.active`, the holder's instance under its
    /// lease (``Kernel/connectState(_:)``). A bus of several cells has one per cell,
    /// `PREFIX.active.CELL`: each cell's kernel writes the one state, one kernel a cell.
    static func electionKey(_ prefix: [UInt8], cell: String?) -> [UInt8] {
        prefix + Array(".active".utf8) + (cell.map { Array(".\($0)".utf8) } ?? [])
    }
    let electionKey: [UInt8]
    /// The revision that created the election key this kernel holds: every transaction
    /// requires it still (a key created again has another).
    let elected: Int64
    /// The kernel's lease: its election and its own keys outlive the kernel by at most its
    /// time to live (`kernel.state.etcd.lease_seconds`).
    let lease: Int64
    let leaseSeconds: Int
    /// When the kernel's lease may have run out in etcd, unless renewed before: a renewal
    /// counts from when it was sent, since etcd counts from when it got it, which is later.
    /// Past it another kernel may hold the election, so this one serves the state no more
    /// (``leaseLapsed``) even if no etcd member it reaches can tell it so (cut off from
    /// etcd's majority), until a renewal says the lease is still its own.
    var leaseHeldUntil: ContinuousClock.Instant
    /// Past ``leaseHeldUntil`` with no renewal since: the state's methods are answered
    /// -32008. A renewal that succeeds ends it (etcd without a leader for a moment extends
    /// every lease); one that finds the lease gone ends the election.
    var leaseLapsed = false
    /// Admitted, not yet sent, in order.
    private(set) var queue = Deque<Pending>()
    private var queuedBytes = 0
    /// Rung when something is queued: the writer takes the queue until it is empty.
    let doorbell: (stream: AsyncStream<Void>, continuation: AsyncStream<Void>.Continuation)
    /// The `kernel` service's requests and the resumes read from etcd, each answered in a
    /// child task of the link's work.
    let requests: (stream: AsyncStream<Request>, continuation: AsyncStream<Request>.Continuation)
    /// Why the kernel lost the state's election, once it has (``Kernel/run()`` ends then).
    let lost: (stream: AsyncStream<String>, continuation: AsyncStream<String>.Continuation)
    /// The link's work: one task for the kernel's life (``Kernel/followState(_:)``), its
    /// children the watch, the lease's renewal, the writer and the requests under way.
    var work: Task<Void, Never>?
    /// The keys of the transactions in flight (etcd's keys), with what the watch brought for
    /// them meanwhile (revision, sequence): the watch's event can come before the
    /// transaction's answer. A key in flight waits for its transaction before it goes again.
    var inFlight: [[UInt8]: [(revision: Int64, sequence: UInt64)]] = [:]
    /// Transactions sent and not answered yet.
    var transactionsInFlight = 0
    /// Answers waiting for the watch to bring their change.
    var awaited: [Awaited: Pending] = [:]
    /// Compare-and-sets etcd refused, by etcd's key, each waiting for the copy to hold the
    /// change etcd found there (its revision; 0: the key was gone): answered before, the
    /// refusal would name a revision a read from the copy does not show yet.
    var refusals: [[UInt8]: [(revision: Int64, pending: Pending, refusal: JSONRPCError)]] = [:]
    /// The kernel's parts, whose state server's limits count the writes until they are
    /// settled (``StateServer/settled(_:)``): made, answered otherwise, or dropped.
    weak var parts: KernelParts?
    /// The revision of the last change applied, and how many of its changes were: the place
    /// of the next one of the same revision.
    var lastRevision: Int64
    var placesApplied = 0
    /// The latest revision etcd reported to the watch: the copy's lag is this less `lastRevision`.
    var reportedRevision: Int64
    private(set) var transactions = 0
    private(set) var failedWrites = 0
    private(set) var droppedWrites = 0
    /// Ended (``failAll(_:)``): nothing more is written, and a wait that comes after is
    /// answered at once.
    private(set) var closedWith: JSONRPCError?

    /// `granted`: when the lease's grant was sent.
    init(client: EtcdClient, prefix: [UInt8], electionKey: [UInt8], lease: Int64, leaseSeconds: Int, granted: ContinuousClock.Instant, elected revision: Int64) {
        (self.client, self.prefix, self.electionKey, self.lease, self.leaseSeconds, self.elected) = (client, prefix, electionKey, lease, leaseSeconds, revision)
        leaseHeldUntil = granted + .seconds(leaseSeconds)
        lastRevision = revision
        reportedRevision = revision
        doorbell = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        requests = AsyncStream.makeStream(of: Request.self)
        lost = AsyncStream.makeStream(of: String.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// The state's entry that etcd's `kv` holds (its key without the prefix), numbered by its
    /// revision and its place there: the one its record says, or `place` when the watch
    /// counted it (a value etcd holds that is not a record has no place of its own).
    func entry(_ kv: EtcdKeyValue, place: Int? = nil) -> ReplicatedEntry {
        let record = EtcdStateRecord(decoding: kv.value, place: place ?? 0)
        return ReplicatedEntry(key: Frame(kv.key.dropFirst(prefix.count)), sequence: EtcdSequence.of(revision: kv.modRevision, place: place ?? record.place),
                               uuid: record.uuid, properties: record.properties, value: record.value, quotaOwner: record.owner, expiresIn: nil)
    }

    /// Where the numbering of the state's changes is: the revision of the last one numbered,
    /// and how many of that revision's changes were (the place of the next one).
    struct Numbering {
        var revision: Int64
        var places: Int
    }

    /// The state's changes among `events` (writes to etcd that are not the state's, the
    /// election key, have none), each with its sequence number: its revision and its place
    /// among that revision's changes, counted on from `numbering`.
    func changes(in events: [EtcdEvent], numbering: inout Numbering) -> [(key: [UInt8], revision: Int64, entry: ReplicatedEntry)] {
        events.filter { $0.keyValue.key.starts(with: statePrefix) }.map { event in
            let revision = event.keyValue.modRevision
            if revision != numbering.revision { numbering = Numbering(revision: revision, places: 0) }
            let place = numbering.places
            numbering.places += 1
            let entry = switch event.kind {
            case .put: self.entry(event.keyValue, place: place)
            case .delete: ReplicatedEntry.deletion(of: Frame(event.keyValue.key.dropFirst(prefix.count)), sequence: EtcdSequence.of(revision: revision, place: place))
            }
            return (event.keyValue.key, revision, entry)
        }
    }

    /// The state's changes, and the election's, from `revision` on.
    func watch(from revision: Int64) -> EtcdWatch {
        client.watch(prefix, end: EtcdClient.prefixEnd(statePrefix), from: revision)
    }

    /// The next transaction's writes, marked in flight: from the front of the queue, in
    /// order, up to the bounds; each key once (etcd refuses a key twice in one transaction) and
    /// none in flight already (a key's changes are made in the order they came); a
    /// compare-and-set alone (its comparison decides the whole transaction). Nil when nothing
    /// can go now.
    func takeBatch() -> [Pending]? {
        guard transactionsInFlight < Self.maxTransactionsInFlight else { return nil }
        var batch: [Pending] = [], bytes = 0
        while let next = queue.first, batch.count < Self.maxBatchOperations {
            let key = prefix + next.write.key.bytes
            let size = next.write.key.count + next.write.value.count
            let alone = next.write.expected != nil
            if inFlight[key] != nil || (!batch.isEmpty && (alone || batch[0].write.expected != nil || bytes + size > Self.maxBatchBytes)) { break }
            batch.append(queue.removeFirst())
            inFlight[key] = []
            bytes += size
        }
        guard !batch.isEmpty else { return nil }
        queuedBytes -= bytes
        transactionsInFlight += 1
        return batch
    }

    /// `batch`'s transaction was answered: its keys may go again.
    func finished(_ batch: [Pending]) {
        for pending in batch { inFlight[prefix + pending.write.key.bytes] = nil }
        transactionsInFlight -= 1
    }

    /// Queues `pending` unless the queue is full (the kernel's own keys are always taken:
    /// they are few); false when it was not.
    func enqueue(_ pending: Pending) -> Bool {
        guard closedWith == nil else { return false }
        let size = pending.write.key.count + pending.write.value.count
        guard pending.write.kernelOwn || (queue.count < Self.maxQueued && queuedBytes + size <= Self.maxQueuedBytes) else {
            if pending.done == nil { droppedWrites += 1 }
            return false
        }
        queue.append(pending)
        queuedBytes += size
        return true
    }

    /// A change of `key` (etcd's key) the watch applied as `sequence`: answers whoever waits
    /// for it.
    func applied(_ key: [UInt8], revision: Int64, sequence: UInt64) {
        if !refusals.isEmpty, let waiting = refusals[key] {
            for waiter in waiting where waiter.revision <= revision { settle(waiter.pending, waiter.refusal) }
            let rest = waiting.filter { $0.revision > revision }
            refusals[key] = rest.isEmpty ? nil : rest
        }
        if !awaited.isEmpty, let pending = awaited.removeValue(forKey: Awaited(revision: revision, key: key)) {
            settle(pending, sequence: sequence)
        } else if inFlight[key] != nil {
            inFlight[key]?.append((revision, sequence))
        }
    }

    /// Settles `pending`, committed at `revision` as a change to `key`, and answers it with the
    /// change's sequence: now if the watch brought it already, else when it does (until then
    /// it counts against the limits).
    func answer(_ pending: Pending, key: [UInt8], revision: Int64) {
        if let closedWith {
            settle(pending, closedWith)
        } else if let seen = inFlight[key]?.first(where: { $0.revision == revision }) {
            settle(pending, sequence: seen.sequence)
        } else {
            awaited[Awaited(revision: revision, key: key)] = pending
        }
    }

    /// Refuses `pending`, a compare-and-set etcd found `key` (etcd's key) at `revision` for
    /// (0: gone), once the copy holds that change: now if it does (`held`: the revision of the
    /// copy's change of the key, 0 when it has none), else when the watch brings it.
    func refuse(_ pending: Pending, _ refusal: JSONRPCError, key: [UInt8], at revision: Int64, held: Int64) {
        let seen = inFlight[key]?.contains { $0.revision >= revision } ?? false
        if closedWith != nil || seen || (revision == 0 ? held == 0 : held >= revision) {
            settle(pending, closedWith ?? refusal)
        } else {
            // A key gone waits for the copy's next change of it: its deletion.
            refusals[key, default: []].append((revision == 0 ? held + 1 : revision, pending, refusal))
        }
    }

    /// Settles `pending` with `error`: it counts no more, and whoever waits is told.
    func settle(_ pending: Pending, _ error: any Error) {
        parts?.state.settled(pending.write)
        pending.done?.resume(throwing: error)
    }

    /// Settles `pending`, answered with the sequence the copy holds its change at (or is at).
    func settle(_ pending: Pending, sequence: UInt64) {
        parts?.state.settled(pending.write)
        pending.done?.resume(returning: sequence)
    }

    func committed() { transactions += 1 }
    func failed(_ count: Int) { failedWrites += count }

    /// Settles every write waiting with `error` (the kernel stops, or lost its election).
    func failAll(_ error: JSONRPCError) {
        closedWith = error
        for pending in queue { settle(pending, error) }
        queue.removeAll()
        queuedBytes = 0
        for pending in awaited.values { settle(pending, error) }
        awaited.removeAll()
        for waiting in refusals.values { for waiter in waiting { settle(waiter.pending, error) } }
        refusals.removeAll()
    }
}

extension EtcdClient.Settings {
    init(_ settings: EtcdStateSettings) {
        self.init(endpoints: settings.endpoints)
        (username, password) = (settings.username, settings.password)
        (caFile, certificateFile, keyFile) = (settings.caFile, settings.certificateFile, settings.keyFile)
    }
}

extension Kernel {
    /// Reads the state into `parts`' state server up to the revision of the kernel's election
    /// (the mark: every change before it is in etcd): as it was `kernel.state_history_changes`
    /// revisions before, then every change since, so the copy's history holds the recent
    /// changes and a subscriber that followed an earlier kernel resumes without a reset. When
    /// etcd no longer holds those revisions (compacted), as it is at the mark, history empty.
    func readState(into parts: KernelParts, from link: EtcdStateLink) async throws {
        let mark = link.lastRevision
        let from = max(mark - Int64(configuration.stateHistoryChanges), 0)
        func load(at revision: Int64) async throws {
            let range = revision == 0 ? nil : try await link.client.range(prefix: link.statePrefix, revision: revision)
            parts.state.install((range?.keyValues ?? []).map { link.entry($0) }, sequence: EtcdSequence.end(of: revision), now: clock.now)
            (link.lastRevision, link.placesApplied) = (revision, 0)
        }
        do {
            try await load(at: from)
        } catch let error as EtcdError where error.kind == .compacted {
            try await load(at: mark)
        }
        if from < mark {
            replay: for try await update in link.watch(from: from + 1) {
                switch update {
                case .events(let events, _):
                    apply(events, from: link, to: parts)
                    // The mark itself is no change of the state's: reaching it is the end.
                    if let last = events.last?.keyValue.modRevision, last >= mark { break replay }
                case .progress(let revision):
                    if revision >= mark { break replay }
                case .compacted:
                    try await load(at: mark)
                    break replay
                }
            }
        }
        // Nobody subscribes yet: what the replay published goes nowhere.
        while parts.state.publisher.takeBatch() != nil {}
        logger.info("state read from etcd", metadata: ["keys": "\(parts.state.entries.count)", "revision": "\(max(link.lastRevision, mark))", "history": "\(parts.state.history.changes.count)",
                                                       "endpoints": "\(link.client.settings.endpoints.joined(separator: ","))", "prefix": "\(String(decoding: link.prefix, as: UTF8.self))"])
    }

    /// Starts the link's work, which lasts until ``closeState(_:)``: the watch that feeds the
    /// copy, the lease's renewal, the writer, and each `kernel` request (``EtcdStateLink/requests``).
    func followState(_ link: EtcdStateLink) {
        let requests = link.requests.stream, doorbell = link.doorbell.stream
        link.work = Task {
            await withDiscardingTaskGroup { group in
                group.addTask { await self.followEtcd() }
                group.addTask { await self.keepLeaseAlive() }
                group.addTask { await self.expireLease() }
                group.addTask { await self.watchElection() }
                group.addTask { await self.writeQueued(doorbell) }
                for await request in requests {
                    switch request {
                    case .kernel(let caller, let body, let peer): group.addTask { await self.answer(caller, body: body, peer: peer) }
                    case .resume(let resume, let through): group.addTask { await self.resume(resume, through: through) }
                    }
                }
                group.cancelAll()
            }
        }
    }

    /// Answers a `kernel` request; one that writes the state, once etcd has the change.
    private func answer(_ caller: Broker.Caller, body: [UInt8], peer: String?) async {
        // Taken up after the kernel stopped: there is no socket to answer on.
        guard let table = methodTable, parts != nil else { return }
        let reply = await Self.$requestPeer.withValue(peer) { await table.answer(body: body, on: self).reply }
        guard let parts else { return }
        parts.reply(to: caller, reply)
        parts.flush()
    }

    /// Applies every change etcd's watch brings, from the revision after the one read, for as
    /// long as the kernel serves: a watch that fails (no member answered for a while) is made
    /// again from where the copy is, and one whose revisions were compacted away first makes
    /// the copy catch up (``catchUp(_:)``).
    private func followEtcd() async {
        guard let link = parts?.etcd else { return }
        while !Task.isCancelled, parts?.etcd === link {
            do {
                for try await update in link.watch(from: link.lastRevision + 1) {
                    guard let parts, parts.etcd === link else { return }
                    switch update {
                    case .events(let events, let revision):
                        apply(events, from: link, to: parts)
                        link.reportedRevision = max(link.reportedRevision, revision)
                        parts.flush()
                    case .progress(let revision):
                        link.reportedRevision = max(link.reportedRevision, revision)
                    case .compacted(let revision):
                        logger.warning("etcd compacted revisions the kernel's copy of the state had not read: it reads the state as it is",
                                       metadata: ["from": "\(link.lastRevision + 1)", "compacted": "\(revision)"])
                        try await catchUp(link)
                    }
                }
            } catch {
                if Task.isCancelled { return }
                logger.error("the watch of the state in etcd failed: watching again", metadata: ["error": "\(error)"])
                try? await Task.sleep(for: .seconds(1))
            }
        }
    }

    /// Makes the copy what etcd holds now, when the changes since the copy's revision are no
    /// longer in etcd: each key changed meanwhile is applied with its sequence, and each key
    /// gone is deleted (numbered at the end of the revision read, after its changes), all
    /// published, so subscribers following this kernel see the state as it is. The history
    /// starts again: a subscriber resuming from before gets the whole snapshot.
    private func catchUp(_ link: EtcdStateLink) async throws {
        let range = try await link.client.range(prefix: link.statePrefix)
        guard let parts, parts.etcd === link else { return }
        let now = clock.now
        let current = Dictionary(range.keyValues.map { let entry = link.entry($0); return (entry.key, entry) }, uniquingKeysWith: { $1 })
        let changed = current.values.filter { parts.state.entries[$0.key]?.sequence != $0.sequence }.sorted { $0.sequence < $1.sequence }
        let gone = parts.state.entries.keys.filter { current[$0] == nil }.sorted { $0.precedes($1) }
        // The deletions take the numbers at the end of the revision read, which its own changes
        // (at most a batch) never reach.
        let room = Int(EtcdSequence.perRevision) - EtcdStateLink.maxBatchOperations
        if gone.count <= room {
            for entry in changed { _ = parts.state.applyCommitted(entry, now: now) }
            let firstDeletion = EtcdSequence.end(of: range.revision) + 1 - UInt64(gone.count)
            for (index, key) in gone.enumerated() {
                _ = parts.state.applyCommitted(.deletion(of: key, sequence: firstDeletion + UInt64(index)), now: now)
            }
            parts.state.restartHistory()
        } else {
            logger.error("more keys went meanwhile than can be numbered: the copy is replaced without publishing; subscribers of this kernel must resubscribe",
                         metadata: ["gone": "\(gone.count)"])
            parts.state.install(Array(current.values), sequence: EtcdSequence.end(of: range.revision), now: now)
        }
        (link.lastRevision, link.placesApplied) = (range.revision, Int(EtcdSequence.perRevision))
        link.reportedRevision = max(link.reportedRevision, range.revision)
        // Refusals made before the state read: the copy holds what they saw, or later.
        for waiting in link.refusals.values { for waiter in waiting { link.settle(waiter.pending, waiter.refusal) } }
        link.refusals.removeAll()
        // Writes committed in the revisions compacted away: the watch will not bring them.
        for (awaited, pending) in link.awaited where awaited.revision <= range.revision {
            link.awaited[awaited] = nil
            link.settle(pending, sequence: parts.state.entries[Frame(awaited.key.dropFirst(link.prefix.count))]?.sequence ?? parts.state.sequence)
        }
        parts.flush()
    }

    /// Makes the state's changes the watch brought in `parts`' state, each with its sequence
    /// number (``EtcdStateLink/changes(in:numbering:)``).
    private func apply(_ events: [EtcdEvent], from link: EtcdStateLink, to parts: KernelParts) {
        let now = clock.now
        var numbering = EtcdStateLink.Numbering(revision: link.lastRevision, places: link.placesApplied)
        for change in link.changes(in: events, numbering: &numbering) {
            if parts.state.applyCommitted(change.entry, now: now) { link.applied(change.key, revision: change.revision, sequence: change.entry.sequence) }
        }
        (link.lastRevision, link.placesApplied) = (numbering.revision, numbering.places)
    }

    /// Answers a subscriber's resume from before the copy's history with the changes etcd
    /// holds after its sequence, through `through` (a change the copy held when it was
    /// asked), read by a watch from its revision; the whole snapshot when etcd compacted
    /// them, did not give them within twice its request timeout, or they hold more than the
    /// kernel's own history may (`kernel.state_history_bytes`: one resume holds no more).
    private func resume(_ request: CHP.SnapshotRequest, through: UInt64) async {
        guard let link = parts?.etcd, let since = request.since else { return }
        defer { link.resumesReading -= 1 }
        let wait = link.client.settings.requestTimeout * 2
        let changes = await withTaskGroup(of: [ReplicatedEntry]?.self) { group in
            group.addTask { try? await self.changesInEtcd(after: since, through: through) }
            group.addTask {
                try? await Task.sleep(for: wait)
                return nil
            }
            defer { group.cancelAll() }
            return await group.next() ?? nil
        }
        guard let parts, parts.etcd === link else { return }
        if changes == nil { logger.notice("a resume from before the kernel's history got the whole snapshot: etcd no longer holds those revisions, did not answer, or they are more than kernel.state_history_bytes",
                                          metadata: ["since": "\(since)"]) }
        parts.state.answer(request, changes: changes, through: through)
        parts.flush()
    }

    /// The state's changes after sequence `since` through `through`, as etcd's watch gives
    /// them from the revision of `since`; nil when etcd compacted them, or once they hold more
    /// than `kernel.state_history_bytes` (counted as the history counts a change: its key,
    /// its value and its record).
    private func changesInEtcd(after since: UInt64, through: UInt64) async throws -> [ReplicatedEntry]? {
        guard let parts, let link = parts.etcd else { return nil }
        let (first, last) = (EtcdSequence.revision(of: since), EtcdSequence.revision(of: through))
        let maxBytes = parts.state.configuration.stateHistoryBytes
        var numbering = EtcdStateLink.Numbering(revision: 0, places: 0)
        var found: [ReplicatedEntry] = []
        var bytes = 0
        for try await update in link.watch(from: first) {
            switch update {
            case .events(let events, _):
                for change in link.changes(in: events, numbering: &numbering) where change.entry.sequence > since && change.entry.sequence <= through {
                    bytes += MemoryLayout<ReplicatedEntry>.stride + change.entry.key.count + change.entry.value.count
                    if bytes > maxBytes { return nil }
                    found.append(change.entry)
                }
                if let reached = events.last?.keyValue.modRevision, reached >= last { return found }
            case .progress(let revision):
                if revision >= last { return found }
            case .compacted:
                return nil
            }
        }
        return nil
    }

    /// Watches the kernel's own election key: once it is gone or made again by another (a
    /// waiting kernel took it from this one, thought gone), this kernel has lost the election
    /// at once, rather than at its next write (which the fence would refuse anyway).
    private func watchElection() async {
        guard let link = parts?.etcd else { return }
        var from = link.elected + 1
        while !Task.isCancelled, link.closedWith == nil, parts?.etcd === link {
            do {
                for try await update in link.client.watch(link.electionKey, from: from) {
                    switch update {
                    case .events(let events, _):
                        if events.contains(where: { $0.kind == .delete }) {
                            return lostElection(link, why: "its election key was deleted (its lease ran out, or a kernel waiting for it found it gone)")
                        }
                        if events.contains(where: { $0.keyValue.createRevision != link.elected }) {
                            return lostElection(link, why: "another kernel took its election key")
                        }
                    case .progress:
                        break
                    case .compacted:
                        // What happened meanwhile is gone (and the watch ends): the key as it
                        // is now says.
                        let now = try await link.client.range(link.electionKey)
                        guard now.keyValues.first?.createRevision == link.elected else {
                            return lostElection(link, why: "another kernel took its election key")
                        }
                        from = now.revision + 1
                    }
                }
            } catch {
                // etcd unreachable: the lease's renewal and the fenced writes say what that costs.
                try? await Task.sleep(for: .seconds(1))
            }
        }
    }

    /// Renews the kernel's lease. When it ran out (the kernel was cut off from etcd for
    /// longer than it), so did its election: it writes no more.
    private func keepLeaseAlive() async {
        guard let link = parts?.etcd else { return }
        while !Task.isCancelled, link.closedWith == nil {
            // Three renewals a lease: one late or lost still leaves time for the next.
            try? await Task.sleep(for: .seconds(link.leaseSeconds) / 3)
            guard parts?.etcd === link, !Task.isCancelled else { return }
            let sent = ContinuousClock.now
            do {
                let seconds = try await link.client.keepAlive(link.lease)
                if seconds <= 0 { return lostElection(link, why: "its lease in etcd ran out") }
                // etcd's answer, held to the lease granted: a larger figure from the wire
                // would only let the kernel serve longer than it may.
                link.leaseHeldUntil = max(link.leaseHeldUntil, sent + .seconds(min(seconds, Int64(link.leaseSeconds))))
                if link.leaseLapsed, ContinuousClock.now < link.leaseHeldUntil {
                    link.leaseLapsed = false
                    logger.notice("the kernel's lease in etcd is renewed: it serves the state again")
                }
            } catch {
                logger.warning("cannot renew the kernel's lease in etcd", metadata: ["error": "\(error)"])
            }
        }
    }

    /// Stops serving the state once the lease may have run out without a renewal (cut off
    /// from etcd's majority, the kernel hears from nobody that another kernel took over): it
    /// must not answer from its copy past the time another kernel may write the state.
    private func expireLease() async {
        guard let link = parts?.etcd else { return }
        while !Task.isCancelled, link.closedWith == nil, parts?.etcd === link {
            let until = link.leaseHeldUntil
            if ContinuousClock.now >= until, !link.leaseLapsed {
                link.leaseLapsed = true
                logger.warning("cannot renew the kernel's lease in etcd for \(link.leaseSeconds) s (no majority of etcd's members answered): it serves the state no more until it does")
            }
            // Lapsed, the renewal ends it; the lease's end is looked at again shortly.
            try? await Task.sleep(until: max(until, .now + .milliseconds(100)), clock: .continuous)
        }
    }

    /// This kernel no longer holds the state's election: every write from now on is answered
    /// -32008. Run as a process (``Kernel/run()``) it then ends, so that its supervisor starts
    /// it again and it stands for the election again (waiting while another kernel holds it).
    private func lostElection(_ link: EtcdStateLink, why: String) {
        guard link.closedWith == nil else { return }
        let election = String(decoding: link.electionKey, as: UTF8.self)
        logger.critical("this kernel no longer writes the state: \(why); started again, it stands for \(election) again")
        link.failAll(JSONRPCError(code: JSONRPCError.notActiveCode,
                                  message: "Not active: this kernel no longer writes the state (\(why)); another kernel may hold \(election)"))
        link.lost.continuation.yield(why)
    }

    /// A write admitted by the state server, made in etcd; its sequence number once the copy
    /// holds it.
    func commitToEtcd(_ write: DurableWrite) async throws -> UInt64 {
        guard let parts, let link = parts.etcd else { throw Self.stopping }
        return try await withCheckedThrowingContinuation { done in
            guard link.enqueue(EtcdStateLink.Pending(write: write, done: done)) else {
                parts.state.settled(write)
                if let closed = link.closedWith { return done.resume(throwing: closed) }
                return done.resume(throwing: JSONRPCError(code: JSONRPCError.serviceUnavailableCode,
                                                          message: "Unavailable: \(link.queue.count) state writes are waiting for etcd, the most the kernel keeps; try again"))
            }
            startWritingState()
        }
    }

    /// Wakes the writer: something is queued.
    func startWritingState() {
        parts?.etcd?.doorbell.continuation.yield()
    }

    /// Sends what is queued whenever the doorbell rings, a few transactions at once
    /// (``EtcdStateLink/takeBatch()`` says which writes can go), each in a child task that
    /// rings again when it is answered.
    private func writeQueued(_ doorbell: AsyncStream<Void>) async {
        await withDiscardingTaskGroup { group in
            for await _ in doorbell {
                while let batch = parts?.etcd?.takeBatch() {
                    group.addTask {
                        await self.write(batch)
                        await self.startWritingState()
                    }
                }
            }
        }
    }

    /// One transaction: the batch's puts (with their places) then its deletes, so the watch's
    /// events come in the places the records say.
    private func write(_ batch: [EtcdStateLink.Pending]) async {
        guard let link = parts?.etcd else {
            for pending in batch { pending.done?.resume(throwing: JSONRPCError(code: JSONRPCError.notActiveCode, message: "Not active: the kernel is stopping")) }
            return
        }
        defer { link.finished(batch) }
        var puts: [(pending: EtcdStateLink.Pending, key: [UInt8])] = [], deletes: [(pending: EtcdStateLink.Pending, key: [UInt8])] = []
        var operations: [EtcdOperation] = []
        var failed: [(EtcdStateLink.Pending, any Error)] = []
        for pending in batch {
            let key = link.prefix + pending.write.key.bytes
            if pending.write.value.isEmpty {
                deletes.append((pending, key))
                continue
            }
            var lease = pending.write.kernelOwn ? link.lease : 0
            var ttlSeconds: Int64?
            if let ttl = pending.write.ttl {
                // etcd's leases count whole seconds (and round a very short one up to its minimum).
                ttlSeconds = max(1, Int64(ttl.seconds.rounded(.up)))
                do {
                    lease = try await link.client.grantLease(ttl: ttlSeconds!).id
                } catch {
                    failed.append((pending, error))
                    continue
                }
            }
            let record = EtcdStateRecord(place: puts.count, uuid: pending.write.uuid, owner: pending.write.owner, ttlSeconds: ttlSeconds, value: pending.write.value)
            operations.append(.put(key: key, value: record.encoded(), lease: lease))
            puts.append((pending, key))
        }
        operations += deletes.map { .delete(key: $0.key) }
        // Fenced: only while the election key is still the one this kernel created.
        var compare = [EtcdCompare(key: link.electionKey, .equal, .createRevision(link.elected))]
        var otherwise: [EtcdOperation] = [.range(key: link.electionKey)]
        if let cas = batch.first, let expected = cas.write.expected {
            let key = link.prefix + cas.write.key.bytes
            compare.append(expected == 0 ? .absent(key) : EtcdCompare(key: key, .equal, .modRevision(EtcdSequence.revision(of: expected))))
            otherwise.append(.range(key: key))
        }
        do {
            guard !operations.isEmpty else { throw failed.first?.1 ?? JSONRPCError.internalError("nothing to write") }
            let transaction = try await link.client.transaction(when: compare, then: operations, else: otherwise)
            link.committed()
            guard transaction.succeeded else {
                guard transaction.ranges.first?.keyValues.first?.createRevision == link.elected else {
                    lostElection(link, why: "another kernel took its election key")
                    throw link.closedWith!
                }
                // The key moved on since the copy this kernel checked against was made.
                let current = transaction.ranges.dropFirst().first?.keyValues.first
                let revision = current.map { link.entry($0).sequence } ?? 0
                parts?.state.countConflict()
                let write = batch[0].write
                let held = parts?.state.entries[write.key].map { EtcdSequence.revision(of: $0.sequence) } ?? 0
                link.refuse(batch[0], StateServer.conflict(write.key.string ?? "", revision: revision, expected: write.expected ?? 0),
                            key: link.prefix + write.key.bytes, at: current?.modRevision ?? 0, held: held)
                return
            }
            for (pending, key) in puts { link.answer(pending, key: key, revision: transaction.revision) }
            for (index, (pending, key)) in deletes.enumerated() {
                if index < transaction.deleted.count, transaction.deleted[index] == 0 {
                    // Nothing to delete: nothing changed, the copy is where it is.
                    link.settle(pending, sequence: parts?.state.sequence ?? 0)
                } else {
                    link.answer(pending, key: key, revision: transaction.revision)
                }
            }
        } catch {
            failed = batch.map { ($0, error) }
        }
        guard !failed.isEmpty else { return }
        link.failed(failed.count)
        logger.warning("a state write to etcd failed", metadata: ["writes": "\(failed.count)", "error": "\(failed[0].1)"])
        for (pending, error) in failed { link.settle(pending, Self.writeFailure(error)) }
    }

    /// What a client is told of a write etcd did not take: nothing written when no member
    /// could be reached; else the outcome is unknown (it may have been committed).
    static func writeFailure(_ error: any Error) -> JSONRPCError {
        if let error = error as? JSONRPCError { return error }
        guard let error = error as? EtcdError else { return .internalError("\(error)") }
        switch error.kind {
        case .unreachable:
            return JSONRPCError(code: JSONRPCError.storageFailedCode, message: "Storage failed: nothing written, \(error)")
        case .refused(let code) where code == 3 && error.message.contains("too large"):
            return JSONRPCError(code: JSONRPCError.tooLargeCode, message: "Too large: \(error)")
        default:
            return JSONRPCError(code: JSONRPCError.outcomeUnknownCode, message: "Outcome unknown: the write may have been kept; read the key (\(error))")
        }
    }

    /// Ends the link: the waits (answered -32008), the kernel's lease (its own keys go at
    /// once), the connections, and its work, awaited.
    func closeState(_ link: EtcdStateLink) async {
        link.requests.continuation.finish()
        link.lost.continuation.finish()
        link.doorbell.continuation.finish()
        link.work?.cancel()
        link.failAll(JSONRPCError(code: JSONRPCError.notActiveCode, message: "Not active: the kernel is stopping"))
        try? await link.client.revoke(link.lease)
        await link.client.close()
        await link.work?.value
    }
}
