public import BusProtocol
import Foundation
import Synchronization
public import ZeroMQ

/// One change of the kernel's state, as a ``Subscription`` delivers it.
public struct StateUpdate: Sendable, Equatable, CustomStringConvertible {
    public var key: String
    public var sequence: UInt64
    /// The value's bytes; empty for a deletion.
    public var value: Frame
    /// Whether this entry came from the snapshot rather than a live update.
    public var fromSnapshot: Bool

    public init(key: String, sequence: UInt64, value: Frame, fromSnapshot: Bool) {
        self.key = key
        self.sequence = sequence
        self.value = value
        self.fromSnapshot = fromSnapshot
    }

    public var isDelete: Bool { value.isEmpty }
    /// The value parsed as JSON, when it is JSON.
    public var json: JSONValue? { value.isEmpty ? nil : try? JSONValue(parsing: value.bytes) }

    public var description: String { "\(key)@\(sequence)=\(value)" }
}

/// The changes after a sequence, as ``BusClient/changes(under:since:timeout:)`` gives them.
public struct StateChanges: Sendable, Equatable {
    /// In sequence order; a deletion has an empty value.
    public var changes: [StateUpdate]
    /// The sequence they bring a view to.
    public var sequence: UInt64
    public init(changes: [StateUpdate], sequence: UInt64) { (self.changes, self.sequence) = (changes, sequence) }
}

/// What a ``Subscription`` delivers: the state's changes, and word when some were lost.
public enum SubscriptionEvent: Sendable, Equatable, CustomStringConvertible {
    /// One change (or, first, one entry of the snapshot).
    case update(StateUpdate)
    /// The first snapshot is delivered, with the updates that came while it was read: the
    /// view is the kernel's as of `sequence`; every later update is newer.
    case synced(sequence: UInt64)
    /// Updates were lost on the way: the kernel dropped them because this subscription fell
    /// behind (`count` says how many), or the connection to the kernel dropped or went
    /// silent (`count` nil: unknown). A resync from a snapshot has begun.
    case missed(count: UInt64?, afterSequence: UInt64, reason: String)
    /// The resync is done: the updates since ``missed(count:afterSequence:reason:)`` were
    /// the keys that changed (`changed`, deletions included); the view equals the kernel's
    /// as of `sequence` again.
    case resynced(sequence: UInt64, changed: Int)
    /// A subscription opened to resume after `since` cannot: the kernel no longer holds
    /// every change after it (or never made it). What follows is the whole snapshot, then
    /// ``synced(sequence:)``: drop what was held before.
    case reset(since: UInt64, reason: String)

    /// The update, when this is one.
    public var update: StateUpdate? {
        if case .update(let update) = self { update } else { nil }
    }

    public var description: String {
        switch self {
        case .update(let update): "\(update)"
        case .synced(let sequence): "synced at sequence \(sequence)"
        case .missed(let count?, let after, let reason): "missed \(count) updates after sequence \(after) (\(reason)); resyncing"
        case .missed(nil, let after, let reason): "may have missed updates after sequence \(after) (\(reason)); resyncing"
        case .resynced(let sequence, let changed): "resynced at sequence \(sequence): \(changed) keys changed"
        case .reset(let since, let reason): "cannot resume after sequence \(since) (\(reason)); the whole snapshot follows"
        }
    }
}

/// A view of the kernel's state under some key prefixes (12/CHP): first a consistent
/// snapshot, then every later update, with no gap and no duplicate; and when updates are
/// lost anyway, never in silence.
///
/// It waits for the kernel's first HUGZ before asking for the snapshot (the kernel greets
/// every new subscription with one), so no update can fall between the two. A reader that
/// stops taking events makes it stop reading its socket once `bufferSize` events wait;
/// the kernel then drops this subscriber's updates, and says so: every HUGZ carries how
/// many updates it published under each topic, so the subscription counts what it missed.
/// On such a gap, a reconnect to the kernel, or a silent kernel it delivers
/// ``SubscriptionEvent/missed(count:afterSequence:reason:)``, asks for a new snapshot,
/// delivers the keys that changed (deletions included) and then
/// ``SubscriptionEvent/resynced(sequence:changed:)``.
///
/// ```swift
/// let subscription = try await Subscription.open(snapshot: "tcp://127.0.0.1:5556",
///                                                publisher: "tcp://127.0.0.1:5557", prefixes: ["/catalog/"])
/// for try await event in subscription {
///     if let update = event.update { print(update.key, update.json ?? "deleted") } else { print(event) }
/// }
/// ```
public final class Subscription: AsyncSequence, Sendable {
    public typealias Element = SubscriptionEvent

    let loop: SocketLoop
    private let ownsLoop: Bool
    private let buffer: BoundedBuffer<SubscriptionEvent>
    private let core: SubscriptionCore

    /// Opens a subscription.
    /// - Parameters:
    ///   - prefixes: key prefixes to follow; `""` follows everything. Keys are paths: a
    ///     prefix without the leading '/' could match nothing and is refused
    ///     (``BusError/invalidArgument(_:)``).
    ///   - includeSnapshot: deliver the current entries first (otherwise only later updates).
    ///   - since: resume where a reader stopped: the sequence of the last change it saw (or
    ///     of its last `synced`/`resynced`). It gets exactly the changes after it, deletions
    ///     included, then ``SubscriptionEvent/synced(sequence:)``, while the kernel still holds
    ///     them (`kernel.state_history_*`); otherwise ``SubscriptionEvent/reset(since:reason:)``
    ///     and the whole snapshot.
    ///   - silenceTimeout: resynchronise when nothing (not even HUGZ) arrives for this long;
    ///     a snapshot the kernel asked does not answer for this long is asked again.
    ///   - bufferSize: events waiting for the reader before the subscription stops reading.
    ///   - curve: keys for a CURVE-secured kernel (nil: plain text).
    ///   - clock: what the silence is timed by (a test moves its own).
    public static func open(snapshot: String, publisher: String, prefixes: [String] = [""], includeSnapshot: Bool = true,
                            since: UInt64? = nil, context: ZMQContext? = nil, loop: SocketLoop? = nil,
                            silenceTimeout: Duration = .seconds(5), bufferSize: Int = 10_000,
                            curve: CurveClientKeys? = nil, clock: any NanosecondClock = SystemClock()) async throws -> Subscription {
        try await open(kernels: [(snapshot, publisher)], prefixes: prefixes, includeSnapshot: includeSnapshot, since: since, context: context,
                       loop: loop, silenceTimeout: silenceTimeout, bufferSize: bufferSize, curve: curve, clock: clock)
    }

    /// Opens a subscription to the two kernels of a pair at once (each kernel's snapshot and
    /// publisher endpoints): both publish every change with the same sequence number. It
    /// follows one (the first to greet it), and when that one goes it follows the other from
    /// the last change delivered, which it asks of it: the loss of one kernel costs no update
    /// and no resync while the other still holds those changes. `changesOnly` (with `since`):
    /// when the kernel no longer holds the changes, ``SubscriptionEvent/reset(since:reason:)``
    /// and `synced` come without the snapshot (for a caller that wants the changes or
    /// nothing, and closes it after).
    public static func open(kernels: [(snapshot: String, publisher: String)], prefixes: [String] = [""], includeSnapshot: Bool = true,
                            since: UInt64? = nil, changesOnly: Bool = false, context: ZMQContext? = nil, loop: SocketLoop? = nil,
                            silenceTimeout: Duration = .seconds(5), bufferSize: Int = 10_000,
                            curve: CurveClientKeys? = nil, clock: any NanosecondClock = SystemClock()) async throws -> Subscription {
        precondition(!kernels.isEmpty, "a subscription needs a kernel")
        // A SUB socket has no way to answer a prefix that matches nothing: refused here.
        if let prefix = prefixes.first(where: { !CHP.isKeyPrefix($0) }) {
            throw BusError.invalidArgument("prefix '\(prefix)' matches no key: keys are paths starting with '/' (as /\(prefix))")
        }
        let ownsLoop = loop == nil
        let loop = try loop ?? SocketLoop(context: try context ?? ZMQContext(), name: "subscription")
        let prefixes = prefixes.isEmpty ? [""] : prefixes
        // The core is made after the buffer, whose resume call needs it: a box bridges the two.
        let resumeTarget = WeakCore()
        let buffer = BoundedBuffer<SubscriptionEvent>(capacity: bufferSize, whenFull: .pauseProducer(resume: {
            resumeTarget.resumeReading()
        }))
        let core = SubscriptionCore(loop: loop, buffer: buffer, prefixes: prefixes, includeSnapshot: includeSnapshot, since: since,
                                    changesOnly: changesOnly, kernels: kernels, silenceTimeout: silenceTimeout,
                                    receiveHighWaterMark: Swift.max(1_000, bufferSize), curve: curve, clock: clock)
        resumeTarget.core.withLock { $0.core = core }
        try await core.start()
        return Subscription(loop: loop, ownsLoop: ownsLoop, buffer: buffer, core: core)
    }

    private init(loop: SocketLoop, ownsLoop: Bool, buffer: BoundedBuffer<SubscriptionEvent>, core: SubscriptionCore) {
        self.loop = loop
        self.ownsLoop = ownsLoop
        self.buffer = buffer
        self.core = core
    }

    /// Waits for the next event; nil once the subscription is cancelled.
    public func next() async throws -> SubscriptionEvent? { try await buffer.next() }

    /// The next event if one is waiting, without waiting (for a reader that takes what has
    /// arrived together in one go).
    public func nextIfReady() -> SubscriptionEvent? { buffer.tryNext() }

    /// How many times the subscription resynchronised (after a kernel restart, say).
    public func resyncCount() async -> Int { await core.resyncs }

    /// How many of its kernels (one, or the two of a pair) it is connected to now.
    public func connectedKernels() async -> Int { await core.connectedKernels }

    deinit {
        buffer.finish()
        if ownsLoop { loop.beginShutdown() }
    }

    /// Stops the subscription: its sockets close and iteration ends.
    public func cancel() async {
        await core.stop()
        buffer.finish()
        if ownsLoop { await loop.shutdown() }
    }

    public struct AsyncIterator: AsyncIteratorProtocol {
        let buffer: BoundedBuffer<SubscriptionEvent>
        public mutating func next() async throws -> SubscriptionEvent? { try await buffer.next() }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(buffer: buffer) }
}

/// The buffer's way back to the core, which is made after it (and holds the buffer, so
/// this reference is weak): the reader took the buffer down to half, so the core reads its
/// socket again (on its loop thread).
private final class WeakCore: Sendable {
    struct Reference { weak var core: SubscriptionCore? }
    let core = Mutex(Reference())

    func resumeReading() {
        guard let core = core.withLock({ $0.core }) else { return }
        core.loop.execute { core.assumeIsolated { $0.resumeReading() } }
    }
}

/// The subscription's protocol state: an actor on its loop's thread (the loop is its
/// executor), so its sockets' handlers and timers reach it with `assumeIsolated`.
actor SubscriptionCore {
    enum Phase: Equatable {
        /// Subscribed; waiting for the first HUGZ, which proves the subscription is live.
        case awaitingHello
        /// Receiving the snapshot of `prefixes[index]`.
        case snapshotting(index: Int)
        case live
        case stopped
    }

    /// One kernel the subscription follows (two for a pair), with its own HUGZ counts.
    struct Source {
        let snapshotEndpoint: String
        let publisherEndpoint: String
        var subscriber: SocketRegistration?
        var monitor: SocketRegistration?
        /// Not connected, before its first connection too: a kernel never reached (one
        /// standing by for the state's election binds nothing until it takes over) brings
        /// no update, so losing the others is losing every kernel.
        var disconnected = true
        /// The kernel's count per counted prefix at its last HUGZ, and the updates received
        /// from it under that prefix since (nil until a HUGZ of this kernel's has come).
        var checkpoint: [String: UInt64] = [:]
        var receivedSinceCheckpoint: [String: UInt64] = [:]
        /// A HUGZ came since it (re)connected: its counts can be compared.
        var counting = false
        /// When a message last came from it (by the subscription's clock).
        var heardAt: UInt64 = 0
    }

    nonisolated let loop: SocketLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    let buffer: BoundedBuffer<SubscriptionEvent>
    let prefixes: [String]
    /// The prefixes counted against the kernel's HUGZ counts: those no other prefix of
    /// this subscription covers, so no update is counted twice.
    let countedPrefixes: [String]
    let includeSnapshot: Bool
    let silenceTimeout: Duration
    let receiveHighWaterMark: Int
    let curve: CurveClientKeys?

    private var sources: [Source]
    /// The kernel followed: the snapshot is read from it, and only its updates are applied.
    /// The other kernel of a pair publishes the same changes, but not in step: the passive
    /// one publishes each before the active one does (which waits for its copy), and a
    /// connection made to it after a change brings the next without that one. Taking each
    /// change from whichever kernel brings it first would skip that change. When the kernel
    /// followed goes, the other is followed from the last change delivered (``followAnother()``).
    private var followed = 0
    private var snapshotSocket: SocketRegistration?
    private var timer: LoopTimer?
    private var phase = Phase.awaitingHello
    private var firstSync = true
    /// The sequence the subscription was opened to resume after (until its first sync).
    private var resumeFrom: UInt64?
    /// Its first sync wants the changes after `resumeFrom` or nothing, never a snapshot.
    private let changesOnly: Bool
    /// The sequence this round of snapshot requests asked to resume after (nil: a whole snapshot).
    private var asked: UInt64?
    private var snapshotSequences: [UInt64] = []
    private var snapshotEntries: [String: StateUpdate] = [:]
    /// What the snapshot connection brought for the prefix being read, before its KTHXBAI
    /// says whether it is the changes since `asked` or the whole subtree.
    private var received: [KVEntry] = []
    /// The changes since `asked`, of every prefix read so far.
    private var changesSince: [KVEntry] = []
    /// Updates before the last one delivered may be missing (the kernel dropped some, or went
    /// silent): the next round reads whole subtrees, not only the changes after that one. A
    /// lost connection alone loses only what came after it, so then the changes are asked for.
    private var needsWholeSnapshot = false
    /// Prefixes of this round that came whole (their changes were no longer all held), and
    /// that came as the changes since `asked`.
    private var cameWhole = 0
    private var cameAsChanges = 0
    private var pendingLive: [KVEntry] = []
    private var known: [String: Frame] = [:]
    private var lastSequence: UInt64 = 0
    /// The sequence the last sync covered: an update at or below it is in the view already.
    private var syncedSequence: UInt64 = 0
    /// The sequences delivered live since the last sync, the latest few, in order: an update
    /// below the last one delivered is the other kernel's copy of one of these, or a change
    /// this view never had (``apply(_:)``).
    private var recentSequences = RecentSequences()
    private let clock: any NanosecondClock
    private var lastHeard: UInt64
    /// When the snapshot being read was asked for, or its last message came.
    private var snapshotHeard: UInt64
    /// Every kernel's connection dropped at some point since the last sync: updates may
    /// have been missed, so the next connection resyncs.
    private var lostEveryKernel = false
    /// The reader fell `bufferSize` events behind: the socket is not read until it catches up.
    private var readingPaused = false
    /// A gap was announced: the next snapshot's end is announced as `resynced`.
    private var announceResync = false
    private(set) var resyncs = 0
    var connectedKernels: Int { sources.filter { !$0.disconnected }.count }

    init(loop: SocketLoop, buffer: BoundedBuffer<SubscriptionEvent>, prefixes: [String], includeSnapshot: Bool, since: UInt64?, changesOnly: Bool,
         kernels: [(snapshot: String, publisher: String)], silenceTimeout: Duration, receiveHighWaterMark: Int,
         curve: CurveClientKeys?, clock: any NanosecondClock) {
        self.loop = loop
        self.clock = clock
        lastHeard = clock.now
        snapshotHeard = clock.now
        self.buffer = buffer
        self.prefixes = prefixes
        countedPrefixes = Array(Set(prefixes.filter { prefix in !prefixes.contains { $0 != prefix && prefix.hasPrefix($0) } }))
        self.includeSnapshot = includeSnapshot
        resumeFrom = since
        self.changesOnly = changesOnly
        sources = kernels.map { Source(snapshotEndpoint: $0.snapshot, publisherEndpoint: $0.publisher) }
        self.silenceTimeout = silenceTimeout
        self.receiveHighWaterMark = receiveHighWaterMark
        self.curve = curve
    }

    func start() throws {
        guard phase == .awaitingHello, sources.allSatisfy({ $0.subscriber == nil }) else { return }
        let context = loop.context
        for index in sources.indices {
            let sub = try ZMQSocket(context, .sub)
            try sub.secure(curve)
            try sub.set(.receiveHighWaterMark, Int32(clamping: receiveHighWaterMark))
            // The prefixes before HUGZ: a HUGZ's counts then always cover topics already live.
            for prefix in prefixes { try sub.subscribe(prefix) }
            if !prefixes.contains("") { try sub.subscribe(CHP.hugzCommand) }
            // Connection events tell a kernel restart apart from a quiet kernel.
            let pair = try connectionEvents(of: sub, in: context)
            sources[index].monitor = loop.register(receivingOnly: pair) { [weak self] message in self?.assumeIsolated { $0.connectionEvent(message, from: index) } }
            try sub.connect(sources[index].publisherEndpoint)
            sources[index].subscriber = loop.register(sub) { [weak self] message in self?.assumeIsolated { $0.published(message, from: index) } }
        }
        try openSnapshotSocket()
        timer = loop.scheduleRepeating(every: .milliseconds(250)) { [weak self] in self?.assumeIsolated { $0.checkSilence() } }
    }

    private func openSnapshotSocket() throws {
        snapshotSocket?.close()
        let dealer = try ZMQSocket(loop.context, .dealer)
        try dealer.secure(curve)
        try dealer.set(.receiveHighWaterMark, 0)
        try dealer.connect(sources[followed].snapshotEndpoint)
        snapshotSocket = loop.register(dealer) { [weak self] message in self?.assumeIsolated { $0.snapshotReply(message) } }
    }

    // MARK: Publisher

    private func published(_ message: Message, from source: Int) {
        // Silence is the followed kernel's: another's updates do not keep the view fresh.
        if source == followed || phase == .awaitingHello { lastHeard = clock.now }
        sources[source].heardAt = clock.now
        guard let update = try? CHP.decodeUpdate(message) else { return }
        switch update {
        case .hugz(let published):
            switch phase {
            case .awaitingHello:
                // This kernel proved the subscription live: its snapshot is read.
                takeCheckpoint(published, source: source)
                if followed != source {
                    followed = source
                    try? openSnapshotSocket()
                }
                requestSnapshot(0)
            case .snapshotting, .live:
                if sources[source].counting {
                    checkForGap(published, source: source)
                } else {
                    takeCheckpoint(published, source: source)
                }
            case .stopped:
                break
            }
        case .entry(let entry):
            guard prefixes.contains(where: { entry.key.hasPrefix($0) }), phase != .awaitingHello, phase != .stopped else { return }
            for prefix in countedPrefixes where entry.key.hasPrefix(prefix) { sources[source].receivedSinceCheckpoint[prefix, default: 0] += 1 }
            guard source == followed else { return }
            if case .snapshotting = phase { pendingLive.append(entry) } else { apply(entry) }
        }
    }

    /// Starts counting afresh from a kernel's counts in this HUGZ.
    private func takeCheckpoint(_ published: [String: UInt64], source: Int) {
        sources[source].checkpoint = published.filter { countedPrefixes.contains($0.key) }
        sources[source].receivedSinceCheckpoint = [:]
        sources[source].counting = true
    }

    /// Compares what a kernel published under each prefix since its checkpoint with what
    /// arrived from it: fewer arrived, so the kernel dropped some for this subscriber (or has
    /// a hole in what it published: a passive kernel that copied its peer's state again). A
    /// HUGZ leaves out topics whose count did not change since the previous one: their
    /// checkpoints stand (and keep counting), so a dropped HUGZ costs only time. A gap in a
    /// kernel not followed costs nothing: should it be followed, it is from the last change
    /// delivered, asked of it.
    private func checkForGap(_ published: [String: UInt64], source: Int) {
        var missed: UInt64 = 0
        for prefix in countedPrefixes {
            guard let now = published[prefix] else { continue }
            if let then = sources[source].checkpoint[prefix], now >= then {
                let received = sources[source].receivedSinceCheckpoint[prefix] ?? 0
                if now - then > received { missed += now - then - received }
            }
            sources[source].checkpoint[prefix] = now
            sources[source].receivedSinceCheckpoint[prefix] = 0
        }
        guard missed > 0, source == followed else { return }
        needsWholeSnapshot = true
        resync(missed: missed, reason: "the kernel dropped updates while this subscriber was behind", subscriptionIsLive: true)
    }

    private func apply(_ entry: KVEntry) {
        guard entry.sequence > lastSequence else {
            // Below the last one delivered: one the last sync covered or one delivered
            // already, unless it is a change this view never had. Kernels publish their
            // changes in order, so such a change means the kernels' histories parted (two
            // actives, and the one this view followed gave way) or a restarted kernel numbers
            // from behind the old one's clock: only a whole snapshot repairs the view.
            if entry.sequence > syncedSequence, recentSequences.covers(entry.sequence), !recentSequences.contains(entry.sequence) {
                needsWholeSnapshot = true
                resync(missed: nil, reason: "a kernel published a change at sequence \(entry.sequence), before the last one this view has (\(lastSequence)), that it never had: the kernels' histories parted",
                       subscriptionIsLive: true)
            }
            return
        }
        lastSequence = entry.sequence
        recentSequences.append(entry.sequence)
        known[entry.key] = entry.isDelete ? nil : entry.value
        deliver(.update(StateUpdate(key: entry.key, sequence: entry.sequence, value: entry.value, fromSnapshot: false)))
    }

    /// Hands an event to the reader; when that fills the buffer, stops reading the sockets
    /// until the reader has taken it down to half (the kernel then drops, and counts).
    private func deliver(_ event: SubscriptionEvent) {
        if buffer.push(event) == .full, !readingPaused {
            readingPaused = true
            for source in sources { source.subscriber?.pauseReading() }
        }
    }

    func resumeReading() {
        guard readingPaused, phase != .stopped else { return }
        readingPaused = false
        lastHeard = clock.now
        for source in sources { source.subscriber?.resumeReading() }
    }

    // MARK: Snapshot

    /// Asks for the snapshot of `prefixes[index]`: from the first, each in turn. The kernel is
    /// asked for only the changes after the sequence the view is at (the one the subscription
    /// was opened to resume after, or after a gap the last one delivered); it sends the whole
    /// subtree when it no longer holds them all. `whole`: ask for whole subtrees only.
    private func requestSnapshot(_ index: Int, whole: Bool = false) {
        if index == 0 {
            snapshotSequences = []
            snapshotEntries = [:]
            changesSince = []
            (cameWhole, cameAsChanges) = (0, 0)
            pendingLive = []
            asked = whole ? nil : firstSync ? resumeFrom : !needsWholeSnapshot && lastSequence > 0 ? lastSequence : nil
        }
        received = []
        phase = .snapshotting(index: index)
        snapshotHeard = clock.now
        let prefix = prefixes[index]
        // A CHP subtree is empty or ends in '/'; other prefixes ask for all and filter.
        let subtree = CHP.isValidSubtree(prefix) ? prefix : ""
        snapshotSocket?.send(CHP.icanhaz(subtree: subtree, since: asked, changesOnly: firstSync && changesOnly))
    }

    private func snapshotReply(_ message: Message) {
        guard case .snapshotting(let index) = phase, let reply = try? CHP.decodeSnapshotReply(message) else { return }
        snapshotHeard = clock.now
        switch reply {
        case .entry(let entry):
            guard entry.key.hasPrefix(prefixes[index]) else { return }
            received.append(entry)
        case .done(let sequence, _, let since):
            if since != nil, since == asked {
                cameAsChanges += 1
                changesSince += received
            } else {
                cameWhole += 1
                for entry in received {
                    snapshotEntries[entry.key] = StateUpdate(key: entry.key, sequence: entry.sequence, value: entry.value, fromSnapshot: true)
                }
            }
            received = []
            snapshotSequences.append(sequence)
            if index + 1 < prefixes.count {
                requestSnapshot(index + 1)
            } else if cameWhole > 0, cameAsChanges > 0, !(firstSync && changesOnly) {
                // Some prefixes came as changes, some whole: read them all whole (rare: the
                // history was trimmed between two requests of one round).
                requestSnapshot(0, whole: true)
            } else {
                goLive()
            }
        }
    }

    private func goLive() {
        if cameWhole == 0 {
            goLiveWithChanges()
            return
        }
        let snapshotSequence = snapshotSequences.max() ?? 0
        if firstSync, let since = resumeFrom {
            // A sequence past the kernel's own was not given by it (another bus's, or its pair
            // partner's not yet passed on): said so, as no history could have held those changes.
            let reason = since > snapshotSequence
                ? "the kernel is at sequence \(snapshotSequence), before \(since): it has not reached that sequence"
                : "the kernel no longer holds every change after sequence \(since)"
            deliver(.reset(since: since, reason: reason))
        } else if !firstSync, !announceResync {
            // Another kernel followed from the last change delivered no longer holds them all.
            resyncs += 1
            deliver(.missed(count: nil, afterSequence: lastSequence,
                            reason: "the kernel followed now no longer holds every change after sequence \(lastSequence)"))
            announceResync = true
        }
        // Snapshot entries, sorted by key; after a resync only those that changed, and
        // a deletion for each key known before that the snapshot no longer has.
        var changed = 0
        for key in snapshotEntries.keys.sorted() {
            let update = snapshotEntries[key]!
            let isChange = known[key] != update.value
            known[key] = update.value
            if (firstSync && (includeSnapshot || resumeFrom != nil)) || (!firstSync && isChange) {
                deliver(.update(update))
                if isChange { changed += 1 }
            }
        }
        if !firstSync {
            for key in known.keys.sorted() where snapshotEntries[key] == nil {
                known[key] = nil
                changed += 1
                deliver(.update(StateUpdate(key: key, sequence: snapshotSequence, value: Frame(), fromSnapshot: true)))
            }
        }
        finishSync(changed: changed)
    }

    /// The kernel sent the changes since `asked` for every prefix: each once (prefixes may
    /// overlap), in order, deletions included.
    private func goLiveWithChanges() {
        var last: UInt64 = 0
        for entry in changesSince.sorted(by: { $0.sequence < $1.sequence }) where entry.sequence != last {
            last = entry.sequence
            known[entry.key] = entry.isDelete ? nil : entry.value
            deliver(.update(StateUpdate(key: entry.key, sequence: entry.sequence, value: entry.value, fromSnapshot: false)))
        }
        let changed = Set(changesSince.map(\.key)).count
        changesSince = []
        finishSync(changed: changed)
    }

    /// The round's snapshots are delivered: the updates that came meanwhile follow, then
    /// word that the view is the kernel's.
    private func finishSync(changed: Int) {
        if cameWhole > 0 { needsWholeSnapshot = false }
        let snapshotSequence = snapshotSequences.max() ?? 0
        lastSequence = snapshotSequences.min() ?? 0
        syncedSequence = snapshotSequence
        if cameWhole > 0 { recentSequences = RecentSequences() }
        let sequences = snapshotSequences
        phase = .live
        let wasFirstSync = firstSync
        firstSync = false
        resumeFrom = nil
        // Updates that arrived during the snapshot: keep those newer than the snapshot its
        // key was last read in (with overlapping prefixes, the latest of theirs).
        for entry in pendingLive.sorted(by: { $0.sequence < $1.sequence }) {
            let covered = prefixes.indices.filter { entry.key.hasPrefix(prefixes[$0]) }.map { sequences[$0] }.max()
            guard let covered, entry.sequence > covered else { continue }
            apply(entry)
        }
        lastSequence = max(lastSequence, snapshotSequence)
        pendingLive = []
        snapshotEntries = [:]
        // Said once the updates that arrived meanwhile are in too: the view is the kernel's
        // as of `lastSequence`, and every later update is newer.
        if wasFirstSync {
            deliver(.synced(sequence: lastSequence))
        } else if announceResync {
            announceResync = false
            deliver(.resynced(sequence: lastSequence, changed: changed))
        }
    }

    // MARK: Resynchronising

    /// A kernel's connection dropped or came back. Losing the kernel followed while another
    /// stays connected moves to that one (``followAnother()``), and a snapshot being read from
    /// it is asked again of that one: the one asked will not answer. Losing them all calls for
    /// a resync once one is back: nothing tells what was published meanwhile.
    private func connectionEvent(_ message: Message, from source: Int) {
        guard let event = SocketEvent(message) else { return }
        if event.event.contains(.disconnected) {
            sources[source].disconnected = true
            sources[source].counting = false
            if sources.allSatisfy(\.disconnected) {
                lostEveryKernel = true
            } else if source == followed {
                switch phase {
                case .snapshotting: askSnapshotAgain()
                case .live: followAnother()
                case .awaitingHello, .stopped: break
                }
            }
        } else if event.event.contains(.connected), sources[source].disconnected {
            sources[source].disconnected = false
            if lostEveryKernel {
                lostEveryKernel = false
                followed = source
                resync(missed: nil, reason: "reconnected to the kernel", subscriptionIsLive: false)
            } else if case .snapshotting = phase, sources[followed].disconnected {
                askSnapshotAgain()
            }
        }
    }

    /// Asks this round's snapshots again from the first prefix, of another connected kernel
    /// when there is one (a new socket, so nothing half-received from the old one mixes in).
    private func askSnapshotAgain() {
        if let other = connectedOther() { followed = other }
        readSnapshotOnceLive()
    }

    /// The kernel followed went, or fell silent, while another is connected: that one is
    /// followed from the last change delivered, asked of it as a resume is, so a change it
    /// published before this subscription reached it is not skipped. Nothing is said unless it
    /// no longer holds every change since (then its whole snapshot comes, said as a resync).
    private func followAnother() {
        guard let other = connectedOther() else { return }
        followed = other
        lastHeard = clock.now
        readSnapshotOnceLive()
    }

    private func connectedOther() -> Int? {
        sources.indices.first { $0 != followed && !sources[$0].disconnected }
    }

    /// Asks the kernel followed for this round's snapshots, on a new socket: at once when a
    /// HUGZ since its connection proved that the subscription reaches it, else at its next
    /// HUGZ (a change published before would be in neither the snapshot nor the updates).
    private func readSnapshotOnceLive() {
        try? openSnapshotSocket()
        if sources[followed].counting {
            requestSnapshot(0)
        } else {
            phase = .awaitingHello
        }
    }

    private func checkSilence() {
        // A paused socket is silent by choice: the reader is behind, not the kernel.
        guard !readingPaused, phase != .stopped else { return }
        if case .snapshotting = phase {
            // Reading a snapshot, the kernel asked is heard only when it answers: the other
            // kernel's HUGZ say nothing of it. Silent this long, it went or lost the request.
            if clock.now &- snapshotHeard > silenceTimeout.nanoseconds { askSnapshotAgain() }
            return
        }
        if clock.now &- lastHeard > silenceTimeout.nanoseconds {
            lastHeard = clock.now
            // Another kernel that is heard is followed instead, from the last change delivered.
            if phase == .live, let other = connectedOther(), sources[other].counting,
               clock.now &- sources[other].heardAt <= silenceTimeout.nanoseconds {
                followAnother()
                return
            }
            needsWholeSnapshot = true
            resync(missed: nil, reason: "the kernel was silent for \(silenceTimeout.formatted)", subscriptionIsLive: false)
        }
    }

    /// Says what was missed and starts over from a snapshot. `subscriptionIsLive`: the
    /// subscription is known to reach the kernel (a HUGZ just came), so the snapshot is
    /// asked for at once; otherwise after the next HUGZ proves it.
    private func resync(missed: UInt64?, reason: String, subscriptionIsLive: Bool) {
        resyncs += 1
        if !firstSync {
            deliver(.missed(count: missed, afterSequence: lastSequence, reason: reason))
            announceResync = true
        }
        // A new snapshot socket drops any half-received snapshot of the old kernel.
        try? openSnapshotSocket()
        if subscriptionIsLive {
            requestSnapshot(0)
        } else {
            phase = .awaitingHello
            // The kernel greets re-subscriptions with HUGZ, and sends one every second anyway.
        }
    }

    func stop() {
        phase = .stopped
        timer?.cancel()
        for source in sources {
            source.subscriber?.close()
            source.monitor?.close()
        }
        snapshotSocket?.close()
        buffer.finish()
    }
}

/// The latest sequences a subscription delivered, in increasing order, at most `capacity`
/// of them: whether one was delivered, for an update below the last.
struct RecentSequences {
    private var sequences: [UInt64] = []
    /// Where the oldest is once the ring is full.
    private var start = 0
    static let capacity = 4_096

    mutating func append(_ sequence: UInt64) {
        if sequences.count < Self.capacity {
            sequences.append(sequence)
        } else {
            sequences[start] = sequence
            start = (start + 1) % Self.capacity
        }
    }

    /// Whether what is kept tells of `sequence`: every sequence delivered since the ring was
    /// made, until it is full; then those from the oldest kept on.
    func covers(_ sequence: UInt64) -> Bool {
        sequences.count < Self.capacity || sequence >= sequences[start]
    }

    /// Whether `sequence` was delivered, among those kept (a binary search of the ring).
    func contains(_ sequence: UInt64) -> Bool {
        var low = 0, high = sequences.count
        while low < high {
            let middle = (low + high) / 2
            let value = sequences[(start + middle) % sequences.count]
            if value == sequence { return true }
            if value < sequence { low = middle + 1 } else { high = middle }
        }
        return false
    }
}
