import BusProtocol
import Contracts
import Foundation
import HeapModule
import Logging
import ZeroMQ

/// A change admitted in durable mode, on its way to etcd: made in the state when etcd's watch
/// brings it back.
struct DurableWrite: Sendable {
    var key: Frame
    /// Empty: the key is deleted.
    var value: Frame
    var ttl: TimeToLive?
    /// Compare-and-set: the sequence the key must be at (0: absent).
    var expected: UInt64?
    /// The request's digest (``Kernel/digest(_:)``), kept with the change.
    var uuid: Frame
    /// Whose quota it counts against (a client's write under the writable prefixes).
    var owner: String?
    /// One of the kernel's own keys (`/kernel/`): kept only as long as the kernel is there.
    var kernelOwn: Bool
    /// What it counts against the limits until etcd has answered (``StateServer/settled(_:)``):
    /// a key (when it was not held) and its bytes.
    var countedKeys = 0
    var countedBytes = 0
}

/// The Clustered Hashmap server (12/CHP): a sequenced key-value map with snapshots,
/// published updates, TTL expiry and a collector for clients' writes.
///
/// A noncopyable value ``KernelParts`` owns on the loop, like the broker: a copy could make a
/// change the kernel never publishes. The publisher is an XPUB: when a subscription arrives it
/// publishes a HUGZ at once, so a subscriber can wait for its first HUGZ to know its
/// subscription is live before it asks for the snapshot (no update can fall between the
/// two). Every HUGZ counts the updates published under each topic, so a subscriber for
/// which the XPUB dropped some (it fell behind) knows how many. Sequence numbers start from the wall clock in microseconds, so they keep growing
/// across kernel restarts as long as fewer than a million updates a second are published.
struct StateServer: ~Copyable {
    struct Entry {
        var sequence: UInt64
        var value: Frame
        var expiresAt: UInt64?
        /// For a key under the writable prefixes, the quota it counts against.
        var quota: Quota?
        /// Bytes it counts against the limits: its key and value.
        var size: Int
        /// Whether the value is JSON text (`state.set`'s always is; a plain CHP client's KVSET
        /// may carry any bytes): `state.get` splices it in as it is, checked once here.
        var isJSON: Bool
    }

    static func isJSON(_ value: Frame) -> Bool { value.withUnsafeBytes { JSONValue.isValidText($0, maxDepth: JSONRPC.maxDepth) } }

    /// Keys and bytes held by one client key under the writable prefixes. An entry refers to
    /// its quota, so a write counts without looking its owner up by name (a hash of the key
    /// each time).
    final class Quota {
        let owner: String
        var keys = 0
        var bytes = 0
        init(owner: String) { self.owner = owner }
    }

    /// Its limits and allowed keys may change while it serves (``KernelParts/reconfigure(_:)``).
    var configuration: KernelConfiguration {
        didSet {
            history.limits = Self.historyLimits(configuration)
            history.trim()
        }
    }
    let logger: Logger
    /// Refused writes and dropped ones, one per message a peer sends, bounded in the log.
    let peerLog: PeerEventLog
    /// Messages for the snapshot ROUTER and for the publisher XPUB: taken after each call.
    var snapshots = Outbox()
    var publisher = Outbox()

    /// Keyed by the key's bytes, as the KVSET carried them: no string is built per update.
    private(set) var entries: [Frame: Entry] = [:]
    private(set) var sequence: UInt64
    /// Malformed KVSETs.
    private(set) var rejectedWrites = 0
    /// Snapshot requests answered with the changes since the sequence they gave, and those
    /// answered with the whole snapshot because the changes were no longer all held.
    private(set) var resumes = 0
    private(set) var resumesRefused = 0
    /// Writes refused by ``StateAccess`` (-32011), by the key and byte limits (-32010), and
    /// compare-and-sets whose key had moved on (-32004).
    private(set) var refusedForbidden = 0
    private(set) var refusedConflict = 0
    private(set) var refusedOverLimit = 0
    /// Bytes of keys and values held.
    private(set) var totalBytes = 0
    /// The recent changes: resumes from a sequence, and `state.history`.
    private(set) var history: StateHistory
    /// The quotas holding a key; one is dropped when its last key goes.
    private(set) var quotas: [String: Quota] = [:]
    /// The quota last written under: writes come in runs from one client, whose quota is then
    /// found by comparing its key, not hashing it.
    private var lastQuota: Quota?
    private let access: StateAccess
    private var lastHugz: UInt64 = 0
    private var expiring = 0
    /// Each topic subscribed on the publisher, with how many updates were published under
    /// it since: every HUGZ carries these counts, so a subscriber whose updates were dropped
    /// (the XPUB drops for a subscriber that falls behind) learns how many it missed.
    private var topics: [(prefix: Frame, published: UInt64, sent: UInt64)] = []
    /// Topics beyond this many, or longer than `maxCountedTopicBytes`, are not counted:
    /// each costs a prefix comparison per update and room in every HUGZ.
    static let maxCountedTopics = 512
    static let maxCountedTopicBytes = 256
    /// Something was published since the last HUGZ: send one at the next tick.
    private var countsDue = false
    /// The kernel's pair, if it has one: changes go to the peer before they are published,
    /// and only the active kernel changes the state itself. The link is this server's, and
    /// what it asks of the state this server does (``pairReceived(_:now:)``).
    var pair: PairLink?
    /// Whether the kernel is one of a pair: the paths of every request and change ask this,
    /// not ``pair``, which is a larger value to look into.
    let isPaired: Bool

    /// Whether this kernel makes changes (alone, or as the active one of its pair); a
    /// passive one only applies its peer's.
    private var authoritative: Bool { !isPaired || pair?.isActive == true }
    /// Whether the state held is whole: a kernel of a pair that is still waiting, or copying
    /// its peer's state, neither greets subscribers nor answers snapshots (its peer does).
    private var holdsState: Bool { !isPaired || pair?.holdsState == true }

    /// Whether etcd keeps the state (``KernelConfiguration/stateEtcd``): then a change this
    /// kernel admits is not made here but handed over (``durableWrites``, or returned to the
    /// caller), and made here when etcd's watch brings it back (``applyCommitted(_:)``), so
    /// every kernel on that etcd holds the same changes with the same sequence numbers.
    let durable: Bool
    /// Durable mode: the changes admitted with no one waiting for an answer (the collector's,
    /// the kernel's own keys), taken after each call as the outboxes are.
    var durableWrites: [DurableWrite] = []
    /// Durable mode: what the writes admitted and not yet answered by etcd count against the
    /// limits, as if made (a key not held as a new one, its bytes added), so that writing
    /// faster than etcd takes the writes does not pass a limit.
    private var pending = (keys: 0, bytes: 0)
    private var pendingByOwner: [String: (keys: Int, bytes: Int)] = [:]
    /// Writes pending per key: a key not held counts once however many writes it waits for.
    private var pendingPerKey: [Frame: Int] = [:]

    /// `pair`: the kernel's link to its peer, when `configuration` names one.
    init(configuration: KernelConfiguration, logger: Logger, pair: PairLink? = nil) {
        precondition((configuration.pair == nil) == (pair == nil), "a state server has a pair link exactly when its kernel is one of a pair")
        self.configuration = configuration
        self.logger = logger
        peerLog = PeerEventLog(logger: logger)
        self.pair = pair
        durable = configuration.stateEtcd != nil
        isPaired = pair != nil
        access = StateAccess(configuration: configuration)
        sequence = UInt64(Date().timeIntervalSince1970 * 1_000_000)
        history = StateHistory(start: sequence, limits: Self.historyLimits(configuration))
    }

    private static func historyLimits(_ configuration: KernelConfiguration) -> StateHistory.Limits {
        .init(changes: configuration.stateHistoryChanges, bytes: configuration.stateHistoryBytes, perKey: configuration.stateHistoryPerKey)
    }

    // MARK: Writes

    /// Sets (or, with an empty value, deletes) `key` for the kernel itself, publishes the
    /// change and returns its sequence number. A `ttl` in seconds deletes the key when it
    /// runs out.
    @discardableResult
    mutating func set(_ key: String, value: Frame, ttl: TimeToLive? = nil, now: UInt64) -> UInt64 {
        set(Frame(key), value: value, ttl: ttl, now: now)
    }

    @discardableResult
    private mutating func set(_ key: Frame, value: Frame, ttl: TimeToLive?, now: UInt64) -> UInt64 {
        // A passive kernel's own keys are its active peer's to set.
        guard authoritative else { return sequence }
        if durable {
            durableWrites.append(DurableWrite(key: key, value: value, ttl: ttl, expected: nil, uuid: Frame(), owner: nil, kernelOwn: true))
            return sequence
        }
        return apply(key, at: entries.index(forKey: key), value: value, isJSON: true, ttl: ttl, uuid: Frame(),
                     properties: Frame(ttl?.property ?? ""), quota: nil, now: now)
    }

    /// What a write admitted came to: made here (its sequence number), or, in durable mode,
    /// to be written to etcd and answered once it is back.
    enum Written {
        case made(UInt64)
        case toCommit(DurableWrite)

        /// The answer when the state is in memory: every change is made here at once.
        func made() -> KernelAPI.StateWritten {
            guard case .made(let sequence) = self else { preconditionFailure("a change in memory is made at once") }
            return KernelAPI.StateWritten(sequence: sequence)
        }

        /// The sequence number, when the change was made here.
        var sequence: UInt64? {
            if case .made(let sequence) = self { sequence } else { nil }
        }
    }

    /// What ``admit(_:at:size:by:collector:)`` decided.
    private enum Admission {
        /// Allowed, counting against this quota (nil: none).
        case allowed(quota: Quota?)
        case refused(JSONRPCError)
    }

    /// A peer's `state.set` (or, `asClient`, its `state.publish`, under the collector's rule):
    /// applied when ``StateAccess`` lets `peer` write `key`, the limits have room and, given
    /// an `expected` revision, the key is at it (0: absent); otherwise the error to answer
    /// with (-32011, -32010, or -32004 with the key's revision). `uuid`: the request's
    /// digest, kept with the change, so the same compare-and-set sent again after a failover
    /// is answered with the revision it made, not refused.
    mutating func write(_ key: String, value: Frame, ttl: TimeToLive?, expected: UInt64? = nil, uuid: Frame = Frame(), by peer: Peer,
               asClient: Bool = false, now: UInt64) -> Result<Written, JSONRPCError> {
        let key = Frame(key)
        let index = entries.index(forKey: key)
        switch admit(key, at: index, size: value.isEmpty ? nil : key.count + value.count, by: peer, collector: asClient) {
        case .refused(let error): return .failure(error)
        case .allowed(let quota):
            if let expected {
                let revision = index.map { entries.values[$0].sequence } ?? 0
                // On etcd, a copy that has not reached `expected` cannot tell (a change made
                // through another kernel, not yet brought by the watch): etcd's compare decides.
                if revision != expected, !(durable && expected > sequence) {
                    if !uuid.isEmpty, let made = revisions(of: key).last(where: { $0.sequence > expected && $0.uuid == uuid }) {
                        return .success(.made(made.sequence))
                    }
                    refusedConflict += 1
                    return .failure(Self.conflict(key.string ?? "", revision: revision, expected: expected))
                }
            }
            if durable {
                return .success(.toCommit(counted(DurableWrite(key: key, value: value, ttl: ttl, expected: expected, uuid: uuid, owner: quota?.owner, kernelOwn: false),
                                                  new: index == nil)))
            }
            return .success(.made(apply(key, at: index, value: value, isJSON: true, ttl: ttl, uuid: uuid,
                                        properties: Frame(ttl?.property ?? ""), quota: quota, now: now)))
        }
    }

    /// Durable mode: the changes held so far no longer follow one another without a gap (the
    /// copy caught up with etcd past compacted revisions): the history starts again here.
    mutating func restartHistory() { history.restart(after: sequence) }

    /// Durable mode: a compare-and-set etcd refused (the key had moved on there).
    mutating func countConflict() { refusedConflict += 1 }

    /// Durable mode: `write` counted against the limits from now until it is settled.
    private mutating func counted(_ write: DurableWrite, new: Bool) -> DurableWrite {
        var write = write
        guard !write.value.isEmpty else { return write }
        let waiting = pendingPerKey[write.key, default: 0]
        pendingPerKey[write.key] = waiting + 1
        (write.countedKeys, write.countedBytes) = (new && waiting == 0 ? 1 : 0, write.key.count + write.value.count)
        pending.keys += write.countedKeys
        pending.bytes += write.countedBytes
        if let owner = write.owner {
            let held = pendingByOwner[owner] ?? (0, 0)
            pendingByOwner[owner] = (held.keys + write.countedKeys, held.bytes + write.countedBytes)
        }
        return write
    }

    /// Durable mode: etcd answered `write` (made or not), or it was dropped: it no longer
    /// counts as pending (made, it counts as held once the watch brings it).
    mutating func settled(_ write: DurableWrite) {
        guard write.countedKeys + write.countedBytes > 0 else { return }
        if let waiting = pendingPerKey[write.key] { pendingPerKey[write.key] = waiting > 1 ? waiting - 1 : nil }
        pending.keys -= write.countedKeys
        pending.bytes -= write.countedBytes
        if let owner = write.owner, let held = pendingByOwner[owner] {
            let left = (held.keys - write.countedKeys, held.bytes - write.countedBytes)
            pendingByOwner[owner] = left.0 == 0 && left.1 == 0 ? nil : left
        }
    }

    /// -32004: the key is not at the revision the writer read.
    static func conflict(_ key: String, revision: UInt64, expected: UInt64) -> JSONRPCError {
        let now = revision == 0 ? "absent" : "at revision \(revision)"
        let asked = expected == 0 ? "absent (create only)" : "at revision \(expected)"
        return JSONRPCError(code: JSONRPCError.conflictCode, message: "Conflict: \(key) is \(now), not \(asked); read it again and decide",
                            data: ["key": .string(key), "revision": .int(Int64(clamping: revision)), "expected": .int(Int64(clamping: expected))])
    }

    /// Whether `peer` may write `key` (held at `index`, if it is) with a value of `size`
    /// bytes (nil: a deletion, which only needs the right to write), and if so the quota it
    /// counts against.
    private mutating func admit(_ key: Frame, at index: Dictionary<Frame, Entry>.Index?, size: Int?, by peer: Peer, collector: Bool) -> Admission {
        let quota: Quota?
        switch access.verdict(key, by: peer, collector: collector) {
        case .refused(let error):
            refusedForbidden += 1
            return .refused(error)
        case .clientWritable: quota = self.quota(of: peer.quotaOwner)
        case .allowed: quota = nil
        }
        guard let size else { return .allowed(quota: quota) }
        // The held entry's size and quota only, read in place: a copy of the entry retains its frames.
        let held = index.map { readInPlace($0) { ($0.size, $0.quota) } }
        let oldSize = held?.0, oldQuota = held?.1
        // In memory nothing is pending: the counts are not read at all there.
        let waiting = durable ? pending : (keys: 0, bytes: 0)
        let keys = entries.count + waiting.keys + (oldSize == nil ? 1 : 0), bytes = totalBytes + waiting.bytes - (oldSize ?? 0) + size
        var refusal: String?
        if size > configuration.stateMaxValueBytes {
            refusal = "the key and value are \(size) bytes, over the limit (kernel.state_max_value_bytes) of \(configuration.stateMaxValueBytes)"
        } else if keys > configuration.stateMaxKeys {
            refusal = "the state holds \(entries.count) keys, the limit (kernel.state_max_keys)"
        } else if bytes > configuration.stateMaxBytes {
            refusal = "the state would hold \(bytes) bytes, over the limit (kernel.state_max_bytes) of \(configuration.stateMaxBytes)"
        } else if let quota {
            let same = oldQuota === quota
            let owed = durable ? pendingByOwner[quota.owner] ?? (0, 0) : (0, 0)
            let ownerKeys = quota.keys + owed.0 + (same ? 0 : 1), ownerBytes = quota.bytes + owed.1 + size - (same ? oldSize! : 0)
            if ownerKeys > configuration.clientStateMaxKeys {
                refusal = "this client holds \(quota.keys) keys under \(access.writablePrefixes.joined(separator: ", ")), the limit (kernel.client_state_max_keys)"
            } else if ownerBytes > configuration.clientStateMaxBytes {
                refusal = "this client would hold \(ownerBytes) bytes under \(access.writablePrefixes.joined(separator: ", ")), over the limit (kernel.client_state_max_bytes) of \(configuration.clientStateMaxBytes)"
            }
        }
        guard let refusal else { return .allowed(quota: quota) }
        refusedOverLimit += 1
        return .refused(JSONRPCError(code: JSONRPCError.tooLargeCode, message: "Too large: \(refusal)"))
    }

    /// The quota of `owner`'s writes: the last one written under, the one held, or a new one
    /// (kept once it holds a key, ``account(replacing:withSize:quota:)``).
    private mutating func quota(of owner: String) -> Quota {
        if let lastQuota, lastQuota.owner == owner { return lastQuota }
        let quota = quotas[owner] ?? Quota(owner: owner)
        lastQuota = quota
        return quota
    }

    /// Reads the entry at `index` in place: a read through the map (its getter) copies the
    /// whole entry, retaining its value and owner, for every field read.
    private mutating func readInPlace<R>(_ index: Dictionary<Frame, Entry>.Index, _ read: (inout Entry) -> R) -> R {
        read(&entries.values[index])
    }

    /// Makes the change, keeps the counts, and publishes it with the frames at hand (a
    /// KVSET's own key, UUID, properties and value frames go out as they came, uncopied).
    /// `index`: where `key` is held now (nil: it is not), found once by the caller.
    /// Deleting a key that is not held changes nothing: no revision is taken and nothing is
    /// published (so a clean-up that deletes what may be gone neither wakes subscribers nor
    /// pushes real changes out of the history), as etcd, the durable backend, answers it.
    private mutating func apply(_ key: Frame, at index: Dictionary<Frame, Entry>.Index?, value: Frame, isJSON: Bool, ttl: TimeToLive?,
                       uuid: Frame, properties: Frame, quota: Quota?, now: UInt64) -> UInt64 {
        if value.isEmpty, index == nil { return sequence }
        sequence += 1
        store(key, at: index, value: value, isJSON: isJSON, expiresAt: ttl.map { now + $0.nanoseconds }, quota: quota, uuid: uuid)
        if isPaired {
            pair?.replicate(ReplicatedEntry(key: key, sequence: sequence, uuid: uuid, properties: properties, value: value,
                                            quotaOwner: quota?.owner, expiresIn: ttl?.nanoseconds))
            let update = Message(CHP.KVPub(key: key, sequence: sequence, uuid: uuid, properties: properties, value: value))
            if pair?.hold(.publish(update, key: key), until: sequence) != true { emit(update, key: key) }
        } else {
            publisher.send(CHP.KVPub(key: key, sequence: sequence, uuid: uuid, properties: properties, value: value))
            published(key)
        }
        return sequence
    }

    /// Publishes an update and counts it under its topics (for the next HUGZ).
    mutating func emit(_ update: Message, key: Frame) {
        publisher.send(update)
        published(key)
    }

    /// Counts an update of `key` published under each topic it falls under.
    private mutating func published(_ key: Frame) {
        for index in topics.indices where key.hasPrefix(topics[index].prefix) { topics[index].published &+= 1 }
        countsDue = true
    }

    // MARK: Replication (a kernel pair)

    /// A message from the peer, on the pair's ROUTER: the link takes it, and this server
    /// does what it asks of the state. `connection`: the TCP connection it came on.
    mutating func pairReceived(_ message: Message, now: UInt64, connection: () -> TCPConnection? = { nil }) {
        guard let replication = pair?.received(message, now: now, sequence: sequence, connection: connection) else { return }
        switch replication {
        case .sendSnapshot:
            let snapshot = replicatedSnapshot(now: now)
            pair?.sendSnapshot(snapshot, sequence: sequence)
        case .install(let snapshot, let snapshotSequence):
            install(snapshot, sequence: snapshotSequence, now: now)
        case .apply(let entry):
            let follows = applyReplicated(entry, now: now)
            pair?.applied(entry, follows: follows, sequence: sequence)
        }
    }

    /// The pair's heartbeat.
    mutating func pairTick(now: UInt64) {
        pair?.tick(now: now, sequence: sequence)
    }

    /// A client's request that only the active kernel of a pair serves arrived: nil when this
    /// kernel serves it (alone: always; of a pair: see ``PairLink/admitsClient(now:sequence:)``,
    /// which may take over now), else why it does not.
    mutating func pairRefusal(now: UInt64) -> String? {
        guard isPaired, pair?.admitsClient(now: now, sequence: sequence) == false else { return nil }
        return pair?.refusal()
    }

    /// The whole state as the peer copies it.
    func replicatedSnapshot(now: UInt64) -> [ReplicatedEntry] {
        entries.map { key, entry in
            ReplicatedEntry(key: key, sequence: entry.sequence, uuid: Frame(), properties: Frame(), value: entry.value,
                            quotaOwner: entry.quota?.owner, expiresIn: entry.expiresAt.map { $0 > now ? $0 - now : 0 })
        }
    }

    /// Replaces the whole state with the active peer's copy (nothing is published: the
    /// active one published every entry already). The changes between the copy held before
    /// and this one were never published here: every topic's count moves on by one, so a
    /// subscriber following this kernel finds the gap at the next HUGZ and resyncs.
    mutating func install(_ snapshot: [ReplicatedEntry], sequence: UInt64, now: UInt64) {
        for index in topics.indices { topics[index].published &+= 1 }
        countsDue = true
        entries = [:]
        quotas = [:]
        lastQuota = nil
        totalBytes = 0
        expiring = 0
        for item in snapshot {
            let owner: Quota? = if let name = item.quotaOwner { quota(of: name) } else { nil }
            let entry = Entry(sequence: item.sequence, value: item.value.keepable(), expiresAt: item.expiresIn.map { now + $0 },
                              quota: owner, size: item.key.count + item.value.count, isJSON: Self.isJSON(item.value))
            entries[item.key.keepable()] = entry
            if entry.expiresAt != nil { expiring += 1 }
            account(replacing: nil, withSize: entry.size, quota: entry.quota)
        }
        self.sequence = sequence
        history.restart(after: sequence)
    }

    /// Applies one of the active peer's changes and publishes it with its sequence; false
    /// when it does not follow the last one applied (then nothing changes).
    mutating func applyReplicated(_ item: ReplicatedEntry, now: UInt64) -> Bool {
        guard item.sequence == sequence + 1 else { return false }
        applyMadeElsewhere(item, now: now)
        return true
    }

    /// Durable mode: applies a change etcd committed (its watch brought it) and publishes it
    /// with its sequence; false, changing nothing, when it is not after the last one applied
    /// (etcd's revisions only grow: that would be a change seen twice).
    mutating func applyCommitted(_ item: ReplicatedEntry, now: UInt64) -> Bool {
        guard item.sequence > sequence else { return false }
        applyMadeElsewhere(item, now: now)
        return true
    }

    /// Stores and publishes a change whose sequence was given where it was made (the active
    /// peer, or etcd).
    private mutating func applyMadeElsewhere(_ item: ReplicatedEntry, now: UInt64) {
        sequence = item.sequence
        let owner: Quota? = if let name = item.quotaOwner { quota(of: name) } else { nil }
        store(item.key, at: entries.index(forKey: item.key), value: item.value, isJSON: Self.isJSON(item.value),
              expiresAt: item.expiresIn.map { now + $0 }, quota: owner, uuid: item.uuid)
        publisher.send(CHP.KVPub(key: item.key, sequence: item.sequence, uuid: item.uuid, properties: item.properties, value: item.value))
        published(item.key)
    }

    /// Makes the change numbered `sequence` in the state and its history (held at `index`, if
    /// it is): the one place both this kernel's changes and its peer's are stored.
    private mutating func store(_ key: Frame, at index: Dictionary<Frame, Entry>.Index?, value: Frame, isJSON: Bool, expiresAt: UInt64?,
                       quota: Quota?, uuid: Frame) {
        // Kept with bytes of their own, not a share of the buffer libzmq read them in with
        // other messages (which one kept frame would keep whole); published as they came.
        // The state and the history share them.
        let keptKey = index.map { entries.keys[$0] } ?? key.keepable()
        let keptValue = value.isEmpty ? Frame() : value.keepable()
        let size = key.count + value.count
        // The entry replaced is moved out of the map, not copied: a copy retains its value and
        // its owner, and every read of a field through the map copies the whole entry.
        var old: Entry?
        if value.isEmpty {
            if let index { old = entries.remove(at: index).value }
        } else {
            if expiresAt != nil { expiring += 1 }
            var entry = Entry(sequence: sequence, value: keptValue, expiresAt: expiresAt, quota: quota, size: size, isJSON: isJSON)
            if let index {
                swap(&entry, &entries.values[index])
                old = entry
            } else {
                entries[keptKey] = entry
            }
        }
        if old?.expiresAt != nil { expiring -= 1 }
        account(replacing: old, withSize: value.isEmpty ? nil : size, quota: quota)
        let previous = old?.sequence ?? history.takeLastDeletion(of: keptKey)
        history.record(.init(sequence: sequence, key: keptKey, value: keptValue, uuid: uuid.isEmpty ? uuid : uuid.keepable(),
                             previous: previous))
    }

    /// The revisions of `key` the history holds, oldest first (``StateHistory/revisions(of:last:)``).
    func revisions(of key: Frame) -> [StateHistory.Change] {
        history.revisions(of: key, last: entries[key]?.sequence)
    }

    /// Keeps the byte total and the quotas when `old` (nil: none held) is replaced by an entry
    /// of `newSize` bytes counted against `quota` (nil size: deleted). A quota is held while
    /// it counts a key, and let go with its last.
    private mutating func account(replacing old: Entry?, withSize newSize: Int?, quota: Quota?) {
        totalBytes += (newSize ?? 0) - (old?.size ?? 0)
        if let newSize, let old, let quota, quota === old.quota {
            quota.bytes += newSize - old.size
            return
        }
        if let old, let held = old.quota {
            held.keys -= 1
            held.bytes -= old.size
            if held.keys == 0 { quotas[held.owner] = nil }
        }
        if let newSize, let quota {
            if quota.keys == 0 { quotas[quota.owner] = quota }
            quota.keys += 1
            quota.bytes += newSize
        }
    }

    private static let pathStart = Frame("/")

    /// A KVSET from the collector: applied under the same rules and limits as `state.set`
    /// (refusals are counted and logged, as a KVSET has no reply).
    mutating func collect(_ parts: ReceivedParts, now: UInt64) {
        // A passive kernel leaves clients' writes to the active one, which replicates them.
        guard authoritative else { return }
        let ttl: TimeToLive?
        do {
            ttl = try CHP.checkKVSet(parts)
        } catch {
            rejectedWrites += 1
            logger.debug("dropped malformed KVSET", metadata: ["problem": "\(error)"])
            return
        }
        // The key and the value with bytes of their own, as the state keeps them (a frame
        // sharing libzmq's receive buffer would be copied again to be kept).
        let key = parts.keepableFrame(0), value = parts.keepableFrame(4)
        // Keys are paths, as state.set requires: a key without the leading '/' would be held
        // where no subscriber's prefix (each a path) could ever reach it.
        guard key.count > 1, key.hasPrefix(Self.pathStart) else {
            rejectedWrites += 1
            logger.debug("dropped a KVSET whose key is not a path", metadata: ["key": "\(key)"])
            return
        }
        if configuration.security?.wasRemoved(parts.peerUserID) == true {
            refusedForbidden += 1
            peerLog.warning("refused KVSET from a key a reload took out", metadata: ["key": "\(key)"])
            return
        }
        let peer = Peer(userID: parts.peerUserID, security: configuration.security)
        let index = entries.index(forKey: key)
        switch admit(key, at: index, size: value.isEmpty ? nil : key.count + value.count, by: peer, collector: true) {
        case .refused(let error):
            peerLog.warning("refused KVSET", metadata: ["key": "\(key)", "reason": "\(error.message)",
                                                        "refused": "\(refusedForbidden + refusedOverLimit)"])
        case .allowed(let quota):
            if durable {
                durableWrites.append(counted(DurableWrite(key: key, value: value, ttl: ttl, expected: nil, uuid: parts.keepableFrame(2), owner: quota?.owner,
                                                          kernelOwn: false), new: index == nil))
                return
            }
            _ = apply(key, at: index, value: value, isJSON: Self.isJSON(value), ttl: ttl, uuid: parts.frame(2), properties: parts.frame(3),
                      quota: quota, now: now)
        }
    }

    // MARK: Reads

    /// Durable mode: resumes from before the history held, to be answered from etcd's
    /// revisions (``answer(_:changes:through:)``), taken after each call as the outboxes are.
    var resumesFromEtcd: [(request: CHP.SnapshotRequest, through: UInt64)] = []

    /// Answers ICANHAZ? with every entry of the subtree, then KTHXBAI with the current
    /// sequence: updates after it are exactly those still to come on the publisher. Asked
    /// with the sequence the client is at, and holding every change since, it sends those
    /// changes instead (deletions as empty values), in order, and says so in the KTHXBAI.
    /// In durable mode a resume from before the history, to a copy that holds changes since
    /// it started, waits for etcd's revisions (``resumesFromEtcd``).
    mutating func snapshot(_ message: Message) {
        guard holdsState else { return }
        let request: CHP.SnapshotRequest
        do {
            request = try CHP.decodeSnapshotRequest(message)
        } catch {
            logger.debug("dropped malformed snapshot request", metadata: ["problem": "\(error)"])
            return
        }
        if durable, let since = request.since, since < history.start, EtcdSequence.revision(of: since) > 0, let last = history.changes.last {
            resumesFromEtcd.append((request, last.sequence))
            return
        }
        answer(request)
    }

    /// Answers `request` from what this server holds: the changes since its sequence when
    /// the history holds them, else the whole snapshot (or, changes only, nothing).
    mutating func answer(_ request: CHP.SnapshotRequest) {
        let subtree = Frame(request.subtree)
        if let since = request.since, let changes = history.changes(after: since, head: sequence) {
            resumes += 1
            for change in changes where change.key.hasPrefix(subtree) { sync(change.key, change.sequence, change.value, to: request.client) }
            snapshots.send(CHP.kthxbai(sequence: sequence, subtree: request.subtree, since: since, to: request.client))
            return
        }
        if request.since != nil { resumesRefused += 1 }
        if request.changesOnly {
            // Not held, and the client wants the changes or nothing: no snapshot.
            snapshots.send(CHP.kthxbai(sequence: sequence, subtree: request.subtree, to: request.client))
            return
        }
        for (key, entry) in entries where key.hasPrefix(subtree) { sync(key, entry.sequence, entry.value, to: request.client) }
        snapshots.send(CHP.kthxbai(sequence: sequence, subtree: request.subtree, to: request.client))
    }

    /// Durable mode: answers a resume from before the history with `changes`, what etcd
    /// holds after its sequence through `through` (a change this server held when it was
    /// asked; the caller gives no others), and the history's changes since; the whole
    /// snapshot when etcd no longer holds them (nil), or the history moved past `through`
    /// meanwhile.
    mutating func answer(_ request: CHP.SnapshotRequest, changes: [ReplicatedEntry]?, through: UInt64) {
        guard let since = request.since, let changes, let later = history.changes(after: through, head: sequence) else { return answer(request) }
        resumes += 1
        let subtree = Frame(request.subtree)
        for change in changes where change.key.hasPrefix(subtree) { sync(change.key, change.sequence, change.value, to: request.client) }
        for change in later where change.key.hasPrefix(subtree) { sync(change.key, change.sequence, change.value, to: request.client) }
        snapshots.send(CHP.kthxbai(sequence: sequence, subtree: request.subtree, since: since, to: request.client))
    }

    /// One entry of a snapshot, or one change of a resume (a deletion: an empty value), to `client`.
    private mutating func sync(_ key: Frame, _ sequence: UInt64, _ value: Frame, to client: Frame) {
        snapshots.send(CHP.kvsync(KVEntry(key: key.string ?? "", sequence: sequence, value: value), to: client))
    }

    /// One page of the entries under `prefix` whose keys sort after `after` (by bytes): at
    /// most `limit` of them, and no more once their keys and values pass `maxBytes` (at least
    /// one); `more` when keys follow. One pass over the state that keeps the `limit` smallest
    /// keys in a heap, so a page costs the same whatever the client asks for.
    func page(under prefix: String, after: String?, limit: Int, maxBytes: Int) -> (entries: [(key: Frame, entry: Entry)], more: Bool) {
        let prefix = Frame(prefix), after = after.map { Frame($0) }
        var smallest = Heap<PageKey>()
        var candidates = 0
        for key in entries.keys where key.hasPrefix(prefix) {
            if let after, !after.precedes(key) { continue }
            candidates += 1
            smallest.insert(PageKey(key: key))
            if smallest.count > limit { _ = smallest.removeMax() }
        }
        var page: [(key: Frame, entry: Entry)] = []
        var bytes = 0
        while let next = smallest.popMin() {
            let entry = entries[next.key]!
            if !page.isEmpty, bytes + entry.size > maxBytes { break }
            bytes += entry.size
            page.append((next.key, entry))
        }
        return (page, candidates > page.count)
    }

    /// A key in byte order, for the page heap.
    private struct PageKey: Comparable {
        let key: Frame
        static func < (lhs: PageKey, rhs: PageKey) -> Bool { lhs.key.precedes(rhs.key) }
    }

    // MARK: Publisher events and time

    /// A subscription or unsubscription reached the XPUB (verbose for subscriptions: each
    /// one arrives; an unsubscription only when the topic's last subscriber left): keep the
    /// topic's count, and greet subscribers with a HUGZ.
    mutating func subscriptionChanged(_ message: Message, now: UInt64) {
        guard let first = message.first, first.count >= 1 else { return }
        let topic = Frame(first.bytes.dropFirst())
        let index = topics.firstIndex { $0.prefix == topic }
        switch first.withUnsafeBytes({ $0[0] }) {
        case 1:
            if index == nil, topic.count <= Self.maxCountedTopicBytes, topic.isUTF8, !topic.equals(CHP.hugzCommand),
               topics.count < Self.maxCountedTopics {
                topics.append((topic, 0, 0))
            }
            sendHugz(now: now, every: true)
        case 0:
            if let index { topics.remove(at: index) }
        default:
            break
        }
    }

    /// A HUGZ with the counts of the topics subscribed: `every` one (a greeting, or the
    /// keep-alive when nothing was published for an interval), else those that changed
    /// since the last HUGZ (a subscriber keeps its checkpoint for a topic left out).
    private mutating func sendHugz(now: UInt64, every: Bool) {
        guard holdsState else { return }
        var published: [String: UInt64] = [:]
        for index in topics.indices where every || topics[index].published != topics[index].sent {
            published[topics[index].prefix.string ?? ""] = topics[index].published
            topics[index].sent = topics[index].published
        }
        publisher.send(CHP.hugz(published: published))
        lastHugz = now
        countsDue = false
    }

    /// Expires TTL entries; sends HUGZ when something was published since the last (so a
    /// gap is known within a tick) or nothing was for an interval.
    mutating func tick(now: UInt64) {
        if expiring > 0, authoritative {
            let expired = entries.compactMap { key, entry in (entry.expiresAt ?? .max) <= now ? key : nil }
            for key in expired.sorted(by: { $0.bytes.lexicographicallyPrecedes($1.bytes) }) { set(key, value: Frame(), ttl: nil, now: now) }
        }
        if now &- lastHugz >= configuration.hugzInterval.nanoseconds {
            sendHugz(now: now, every: true)
        } else if countsDue {
            sendHugz(now: now, every: false)
        }
    }
}
