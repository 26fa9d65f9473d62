public import BusProtocol
import Foundation
public import ZeroMQ

/// One change of the kernel's state, as a ``Subscription`` delivers it.
public struct StateUpdate: Sendable, Equatable, CustomStringConvertible {
    public var key: String
    public var sequence: UInt64
    /// The value's bytes; empty for a deletion.
    public var value: Frame
    /// Whether this entry came from the snapshot rather than a live update.
    public var fromSnapshot: Bool

    public var isDelete: Bool { value.isEmpty }
    /// The value parsed as JSON, when it is JSON.
    public var json: JSONValue? { value.isEmpty ? nil : try? JSONValue(parsing: value.bytes) }

    public var description: String { "\(key)@\(sequence)=\(value)" }
}

/// A view of the kernel's state under some key prefixes (12/CHP): first a consistent
/// snapshot, then every later update, with no gap and no duplicate.
///
/// It waits for the kernel's first HUGZ before asking for the snapshot (the kernel greets
/// every new subscription with one), so no update can fall between the two. When the
/// connection drops, the kernel goes silent, or the reader falls more than `bufferSize`
/// updates behind, it resynchronises by itself: it asks for a new snapshot and delivers
/// the entries that changed. Keys deleted while it was out of touch are not reported.
///
/// ```swift
/// let updates = try await Subscription.open(snapshot: "tcp://127.0.0.1:5556",
///                                           publisher: "tcp://127.0.0.1:5557", prefixes: ["/catalog/"])
/// for try await update in updates { print(update.key, update.json ?? "deleted") }
/// ```
public final class Subscription: AsyncSequence, Sendable {
    public typealias Element = StateUpdate

    let loop: SocketLoop
    private let ownsLoop: Bool
    private let buffer: BoundedBuffer<StateUpdate>
    private let core: SubscriptionCore

    /// Opens a subscription.
    /// - Parameters:
    ///   - prefixes: key prefixes to follow; `""` follows everything.
    ///   - includeSnapshot: deliver the current entries first (otherwise only later updates).
    ///   - silenceTimeout: resynchronise when nothing (not even HUGZ) arrives for this long.
    ///   - curve: keys for a CURVE-secured kernel (nil: plain text).
    public static func open(snapshot: String, publisher: String, prefixes: [String] = [""], includeSnapshot: Bool = true,
                            context: ZMQContext? = nil, loop: SocketLoop? = nil,
                            silenceTimeout: Duration = .seconds(5), bufferSize: Int = 10_000,
                            curve: CurveClientKeys? = nil) async throws -> Subscription {
        let ownsLoop = loop == nil
        let loop = try loop ?? SocketLoop(context: try context ?? ZMQContext(), name: "subscription")
        let buffer = BoundedBuffer<StateUpdate>(capacity: bufferSize, whenFull: .refuse)
        let prefixes = prefixes.isEmpty ? [""] : prefixes
        let core = SubscriptionCore(loop: loop, buffer: buffer, prefixes: prefixes, includeSnapshot: includeSnapshot,
                                    snapshotEndpoint: snapshot, publisherEndpoint: publisher, silenceTimeout: silenceTimeout,
                                    curve: curve)
        try await core.start()
        return Subscription(loop: loop, ownsLoop: ownsLoop, buffer: buffer, core: core)
    }

    private init(loop: SocketLoop, ownsLoop: Bool, buffer: BoundedBuffer<StateUpdate>, core: SubscriptionCore) {
        self.loop = loop
        self.ownsLoop = ownsLoop
        self.buffer = buffer
        self.core = core
    }

    /// Waits for the next update; nil once the subscription is cancelled.
    public func next() async throws -> StateUpdate? { try await buffer.next() }

    /// How many times the subscription resynchronised (after a kernel restart, say).
    public func resyncCount() async -> Int { await core.resyncs }

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
        let buffer: BoundedBuffer<StateUpdate>
        public mutating func next() async throws -> StateUpdate? { try await buffer.next() }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(buffer: buffer) }
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
    }

    nonisolated let loop: SocketLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    let buffer: BoundedBuffer<StateUpdate>
    let prefixes: [String]
    let includeSnapshot: Bool
    let snapshotEndpoint: String
    let publisherEndpoint: String
    let silenceTimeout: Duration
    let curve: CurveClientKeys?

    private var subscriber: SocketRegistration?
    private var snapshotSocket: SocketRegistration?
    private var monitor: SocketRegistration?
    private var timer: LoopTimer?
    private var phase = Phase.awaitingHello
    private var firstSync = true
    private var snapshotSequences: [UInt64] = []
    private var snapshotEntries: [String: StateUpdate] = [:]
    private var pendingLive: [KVEntry] = []
    private var known: [String: Frame] = [:]
    private var lastSequence: UInt64 = 0
    private var lastHeard = monotonicNanoseconds()
    private var disconnected = false
    private(set) var resyncs = 0

    init(loop: SocketLoop, buffer: BoundedBuffer<StateUpdate>, prefixes: [String], includeSnapshot: Bool,
         snapshotEndpoint: String, publisherEndpoint: String, silenceTimeout: Duration, curve: CurveClientKeys?) {
        self.loop = loop
        self.buffer = buffer
        self.prefixes = prefixes
        self.includeSnapshot = includeSnapshot
        self.snapshotEndpoint = snapshotEndpoint
        self.publisherEndpoint = publisherEndpoint
        self.silenceTimeout = silenceTimeout
        self.curve = curve
    }

    func start() throws {
        let context = loop.context
        let sub = try ZMQSocket(context, .sub)
        try sub.secure(curve)
        try sub.set(.receiveHighWaterMark, 100_000)
        for prefix in prefixes { try sub.subscribe(prefix) }
        if !prefixes.contains("") { try sub.subscribe(CHP.hugzCommand) }
        // Connection events tell a kernel restart apart from a quiet kernel.
        let pair = try connectionEvents(of: sub, in: context)
        monitor = loop.register(pair) { [weak self] message in self?.assumeIsolated { $0.connectionEvent(message) } }
        try sub.connect(publisherEndpoint)
        subscriber = loop.register(sub) { [weak self] message in self?.assumeIsolated { $0.published(message) } }
        try openSnapshotSocket()
        timer = loop.scheduleRepeating(every: .milliseconds(250)) { [weak self] in self?.assumeIsolated { $0.checkSilence() } }
    }

    private func openSnapshotSocket() throws {
        snapshotSocket?.close()
        let dealer = try ZMQSocket(loop.context, .dealer)
        try dealer.secure(curve)
        try dealer.set(.receiveHighWaterMark, 0)
        try dealer.connect(snapshotEndpoint)
        snapshotSocket = loop.register(dealer) { [weak self] message in self?.assumeIsolated { $0.snapshotReply(message) } }
    }

    // MARK: Publisher

    private func published(_ message: Message) {
        lastHeard = monotonicNanoseconds()
        guard let update = try? CHP.decodeUpdate(message) else { return }
        switch update {
        case .hugz:
            if phase == .awaitingHello { requestSnapshot(0) }
        case .entry(let entry):
            guard prefixes.contains(where: { entry.key.hasPrefix($0) }) else { return }
            switch phase {
            case .awaitingHello: break
            case .snapshotting: pendingLive.append(entry)
            case .live: apply(entry)
            }
        }
    }

    private func apply(_ entry: KVEntry) {
        guard entry.sequence > lastSequence else { return }  // a duplicate or a stale update
        lastSequence = entry.sequence
        known[entry.key] = entry.isDelete ? nil : entry.value
        deliver(StateUpdate(key: entry.key, sequence: entry.sequence, value: entry.value, fromSnapshot: false))
    }

    private func deliver(_ update: StateUpdate) {
        if buffer.push(update) == .refused {
            // The reader fell too far behind: start over from a snapshot instead of
            // growing without bound or silently skipping updates.
            buffer.clear()
            resync(reason: "reader fell behind")
        }
    }

    // MARK: Snapshot

    private func requestSnapshot(_ index: Int) {
        if index == 0 {
            snapshotSequences = []
            snapshotEntries = [:]
            pendingLive = []
        }
        phase = .snapshotting(index: index)
        let prefix = prefixes[index]
        // A CHP subtree is empty or ends in '/'; other prefixes ask for all and filter.
        let subtree = CHP.isValidSubtree(prefix) ? prefix : ""
        snapshotSocket?.send(CHP.icanhaz(subtree: subtree))
    }

    private func snapshotReply(_ message: Message) {
        guard case .snapshotting(let index) = phase, let reply = try? CHP.decodeSnapshotReply(message) else { return }
        switch reply {
        case .entry(let entry):
            guard entry.key.hasPrefix(prefixes[index]) else { return }
            snapshotEntries[entry.key] = StateUpdate(key: entry.key, sequence: entry.sequence, value: entry.value, fromSnapshot: true)
        case .done(let sequence, _):
            snapshotSequences.append(sequence)
            if index + 1 < prefixes.count {
                requestSnapshot(index + 1)
            } else {
                goLive()
            }
        }
    }

    private func goLive() {
        // Snapshot entries, sorted by key; after a resync only those that changed.
        for key in snapshotEntries.keys.sorted() {
            let update = snapshotEntries[key]!
            let changed = known[key] != update.value
            known[key] = update.value
            if (firstSync && includeSnapshot) || (!firstSync && changed) { deliver(update) }
        }
        lastSequence = snapshotSequences.min() ?? 0
        let sequences = snapshotSequences
        phase = .live
        firstSync = false
        // Updates that arrived during the snapshot: keep those newer than the snapshot
        // of their own prefix.
        for entry in pendingLive.sorted(by: { $0.sequence < $1.sequence }) {
            guard let index = prefixes.firstIndex(where: { entry.key.hasPrefix($0) }), entry.sequence > sequences[index] else { continue }
            apply(entry)
        }
        lastSequence = max(lastSequence, sequences.max() ?? 0)
        pendingLive = []
        snapshotEntries = [:]
    }

    // MARK: Resynchronising

    private func connectionEvent(_ message: Message) {
        guard let event = SocketEvent(message) else { return }
        if event.event.contains(.disconnected) {
            disconnected = true
        } else if event.event.contains(.connected), disconnected {
            disconnected = false
            resync(reason: "reconnected to the kernel")
        }
    }

    private func checkSilence() {
        if monotonicNanoseconds() &- lastHeard > silenceTimeout.nanoseconds {
            lastHeard = monotonicNanoseconds()
            resync(reason: "the kernel was silent for \(silenceTimeout.formatted)")
        }
    }

    private func resync(reason: String) {
        resyncs += 1
        // A new snapshot socket drops any half-received snapshot of the old kernel.
        try? openSnapshotSocket()
        phase = .awaitingHello
        // The kernel greets re-subscriptions with HUGZ, and sends one every second anyway.
    }

    func stop() {
        timer?.cancel()
        subscriber?.close()
        snapshotSocket?.close()
        monitor?.close()
        buffer.finish()
    }
}
