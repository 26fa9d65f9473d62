import BusKit
import BusProtocol
import DequeModule
import Foundation
import Logging
import NIOCore
import Synchronization

/// One Server-Sent Event, as the gateway writes it: encoded once, the same bytes written
/// to every stream. A class, so a stream's backlog holds a reference per event, not a copy.
final class StreamEvent: Sendable {
    /// `snapshot`, `synced`, `update`, `reset`, `missed`, `resynced`; nil: a comment line.
    let name: String?
    /// The CHP sequence it brings the reader to (its `id:`); nil: no id, the reader's last
    /// event id stays where it was.
    let id: UInt64?
    /// JSON text (for a comment, the comment).
    let data: String
    /// The state key it concerns, for filtering by prefix (nil: every stream gets it).
    let key: String?
    /// The event as it goes on the wire.
    let encoded: ByteBuffer
    var size: Int { encoded.readableBytes }

    init(name: String?, id: UInt64?, data: String, key: String?) {
        self.name = name
        self.id = id
        self.data = data
        self.key = key
        let text = name.map { "event: \($0)\n" + (id.map { "id: \($0)\n" } ?? "") + "data: \(data)\n\n" } ?? ": \(data)\n\n"
        encoded = ByteBuffer(string: text)
    }

    /// An entry's event, its value spliced in as the kernel holds it (JSON text as it is, any
    /// other bytes as a string, a deletion as null): no parse, no second encoding.
    static func entry(_ name: String, key: String, sequence: UInt64, value: Frame, id: Bool = true) -> StreamEvent {
        var data = #"{"key":"# + JSONValue.string(key).jsonString + #","sequence":\#(sequence),"value":"#
        value.withUnsafeBytes { bytes in
            if bytes.isEmpty {
                data += "null"
            } else if !bytes.contains(0x0A), !bytes.contains(0x0D), JSONValue.isValidText(bytes, maxDepth: JSONRPC.maxDepth) {
                data += String(decoding: bytes, as: UTF8.self)
            } else if let value = try? JSONValue(parsing: bytes, maxDepth: JSONRPC.maxDepth) {
                // JSON over several lines (a plain CHP client's): one line, as an event's data must be.
                data += value.jsonString
            } else {
                data += JSONValue.string(String(decoding: bytes, as: UTF8.self)).jsonString
            }
        }
        return StreamEvent(name: name, id: id ? sequence : nil, data: data + "}", key: key)
    }

    static func notice(_ name: String, id: UInt64? = nil, _ fields: [String: JSONValue]) -> StreamEvent {
        StreamEvent(name: name, id: id, data: JSONValue.object(fields).jsonString, key: nil)
    }
}

/// Bytes of events handed to one stream and not yet written by it: what its buffer holds.
final class StreamBacklog: Sendable {
    private let bytes = Atomic<Int>(0)
    /// Adds `count` (negative: written); returns the new total.
    @discardableResult
    func add(_ count: Int) -> Int { bytes.add(count, ordering: .relaxed).newValue }
    /// The bytes waiting now (right after ``StateFeed/attach(prefixes:since:)``: the opening events').
    var waiting: Int { bytes.load(ordering: .relaxed) }
}

/// Where the changes after a sequence come from when this gateway did not see them all
/// (it restarted, or the browser comes from another gateway): the kernel's own history.
protocol ChangeLog: Sendable {
    func changes(under prefixes: [String], since: UInt64, timeout: Duration) async throws -> StateChanges?
}

extension BusClient: ChangeLog {}

/// The gateway's one kernel subscription, fanned out to every browser: the current state
/// under the configured prefixes, and the latest changes (`history` of them), so that a
/// stream that reconnects with `Last-Event-ID` gets exactly what changed since: from this
/// gateway's memory, or else from the kernel's history, so a browser moved to another
/// gateway, or to a restarted one, resumes exactly too.
///
/// Event ids are CHP sequence numbers. A snapshot is sent in sequence order, so wherever a
/// stream breaks off, its last id is a point from which the changes after it complete it.
actor StateFeed {
    struct Entry {
        var sequence: UInt64
        /// As the kernel holds it (JSON text, from services and clients alike).
        var value: Frame
        /// Its `snapshot` event, made for the first stream that opens with it and shared by
        /// every later one (a stream's opening holds references, not copies).
        var snapshotEvent: StreamEvent?
    }

    struct Change {
        var sequence: UInt64
        var key: String
        /// Empty for a deletion.
        var value: Frame
        /// Bytes it counts against the history's byte bound: the memory it holds, its record
        /// in the log as well as its key and value, so that small changes are not free.
        var size: Int

        init(sequence: UInt64, key: String, value: Frame) {
            (self.sequence, self.key, self.value) = (sequence, key, value)
            // A String of up to 15 UTF-8 bytes is held inside it; a longer one in a buffer of
            // its own with a 32-byte header.
            let keyBytes = key.utf8.count > 15 ? key.utf8.count + 32 : 0
            size = MemoryLayout<Change>.stride + keyBytes + value.heldBytes
        }
    }

    /// Reads of the kernel's history at once: each answer may be as large as the kernel's
    /// history (`kernel.state_history_bytes`, 8 MiB by default) while it is joined, and any
    /// HTTP caller can ask for one with an old `Last-Event-ID`; beyond these, a resume gets
    /// a reset and the snapshot from this gateway's memory.
    static let kernelResumesAtOnce = 4
    private var kernelResumesUnderWay = 0

    /// What `/metrics` shows of the streams.
    struct Counters: Sendable {
        var open = 0
        var opened = 0
        var resumes = 0
        /// Resumed from the kernel's history (this gateway had not seen every change since).
        var kernelResumes = 0
        /// Resumes that could have asked the kernel's history but found ``StateFeed/kernelResumesAtOnce``
        /// under way: reset to the snapshot instead.
        var kernelResumesDeclined = 0
        var resets = 0
        var overflows = 0
        var missed = 0
    }

    private struct Listener {
        let prefixes: [String]
        let continuation: AsyncStream<StreamEvent>.Continuation
        let backlog: StreamBacklog
        /// The bytes its backlog may reach: its opening events, and the stream backlog beyond.
        let limit: Int
        /// Events up to this sequence reached the browser already (it resumed from a later
        /// sequence than this gateway had seen): they are not sent again.
        let seenThrough: UInt64
    }

    let prefixes: [String]
    /// The changes kept, at most: this many, and this many bytes (the oldest go first).
    let history: Int
    let historyBytes: Int
    /// Bytes of events a stream may have waiting beyond its opening ones before it is cut.
    let streamBacklogBytes: Int
    private var logBytes = 0
    private let logger: Logger
    /// The kernel's history, for resumes this gateway cannot serve from its own.
    private let changeLog: (any ChangeLog)?
    private var entries: [String: Entry] = [:]
    private var log: Deque<Change> = []
    /// The log holds every change after this sequence.
    private var logStart: UInt64 = 0
    /// The sequence the state is at.
    private var head: UInt64 = 0
    /// The first snapshot is in.
    private var synced = false
    private var syncWaiters: [CheckedContinuation<Void, Never>] = []
    /// Between `missed` and `resynced`: the state and the log are being repaired, so a
    /// stream that resumes now gets a reset.
    private var repairing = false
    private var listeners: [UUID: Listener] = [:]
    /// The gateway is stopping (``closeAll()``).
    private(set) var closed = false
    private(set) var counters = Counters()
    /// Events written to streams, counted as each is written by the stream's own task: a
    /// browser's stream ends by disconnecting, and what it was sent counts all the same.
    nonisolated let eventsSent = Atomic<Int>(0)
    /// Events a stream may have waiting beyond its opening ones before it is cut (the
    /// browser reconnects and resumes from its last id).
    static let streamBacklog = 10_000

    init(prefixes: [String], history: Int, historyBytes: Int = 8 << 20, streamBacklogBytes: Int = 4 << 20, changeLog: (any ChangeLog)? = nil,
         logger: Logger) {
        self.prefixes = prefixes
        self.changeLog = changeLog
        self.history = history
        self.historyBytes = historyBytes
        self.streamBacklogBytes = streamBacklogBytes
        self.logger = logger
    }

    /// Follows `subscription` until it ends or the task is cancelled (the gateway stopping:
    /// no problem to warn of).
    func follow(_ subscription: Subscription) async {
        do {
            for try await event in subscription { receive(event) }
        } catch where !Task.isCancelled {
            logger.warning("the gateway's subscription ended", metadata: ["problem": "\(error)"])
        } catch {}
        for listener in listeners.values { listener.continuation.finish() }
        listeners.removeAll()
    }

    /// Waits until the first snapshot is in, or the feed is closed (the gateway stopping
    /// before any kernel answered must not wait for one).
    func waitUntilSynced() async {
        if synced || closed { return }
        await withCheckedContinuation { syncWaiters.append($0) }
    }

    func receive(_ event: SubscriptionEvent) {
        switch event {
        case .update(let update):
            // Kept for the history and the snapshot: bytes of its own, not a share of libzmq's
            // receive buffer (a history of small changes would keep every buffer alive).
            let value = update.value.keepable()
            if update.isDelete { entries[update.key] = nil } else { entries[update.key] = Entry(sequence: update.sequence, value: value) }
            guard synced else { return }
            if repairing {
                // A key the resync found changed, or an update that came during its snapshot: no id;
                // `resynced` carries the sequence the stream is at then.
                broadcast(.entry("update", key: update.key, sequence: update.sequence, value: value, id: false))
                return
            }
            let change = Change(sequence: update.sequence, key: update.key, value: value)
            log.append(change)
            logBytes += change.size
            while log.count > history || logBytes > historyBytes, let dropped = log.popFirst() {
                logStart = dropped.sequence
                logBytes -= dropped.size
            }
            head = max(head, update.sequence)
            broadcast(.entry("update", key: update.key, sequence: update.sequence, value: value))
        case .synced(let sequence):
            head = sequence
            logStart = sequence
            synced = true
            releaseSyncWaiters()
        case .missed(let count, let after, let reason):
            repairing = true
            counters.missed += 1
            logger.warning("the gateway's subscription missed updates; resyncing", metadata: ["count": "\(count.map(String.init) ?? "unknown")", "reason": "\(reason)"])
            broadcast(.notice("missed", ["count": count.map { .int(Int64(clamping: $0)) } ?? .null,
                                         "afterSequence": .int(Int64(clamping: after)), "reason": .string(reason)]))
        case .reset:
            break  // The feed's subscription is opened without a sequence to resume after.
        case .resynced(let sequence, let changed):
            repairing = false
            log.removeAll()
            logBytes = 0
            logStart = sequence
            head = sequence
            broadcast(.notice("resynced", id: sequence, ["sequence": .int(Int64(clamping: sequence)), "changed": .int(Int64(changed))]))
        }
    }

    /// Whether `prefix` lies within what the gateway follows.
    func covers(_ prefix: String) -> Bool { prefixes.contains { prefix.hasPrefix($0) } }

    /// Opens a stream of the keys under `prefixes`: after `since` (a sequence any gateway of
    /// this kernel sent) exactly the changes since, from this gateway's memory or the kernel's
    /// history; else (when neither holds them all) a `reset` and the snapshot; then `synced`,
    /// then live changes. The caller detaches the stream when it stops reading it (``detach(_:)``).
    func attach(prefixes: [String], since: UInt64?) async -> (id: UUID, events: AsyncStream<StreamEvent>, backlog: StreamBacklog) {
        var opening: [StreamEvent] = []
        let matches = { (key: String) in prefixes.contains { key.hasPrefix($0) } }
        var resumed = false
        if let since, let changes = changes(after: since, matching: matches) {
            counters.resumes += 1
            opening = changes
            resumed = true
        } else if let since, let changes = await kernelChanges(under: prefixes, after: since, matching: matches) {
            // (The state may have moved on during that wait: what was fetched is joined to this
            // gateway's own log at the head it has now, and the stream is attached with no
            // wait between.)
            counters.kernelResumes += 1
            opening = changes
            resumed = true
        }
        if !resumed {
            if let since {
                counters.resets += 1
                let reason = repairing ? "the gateway is resyncing with the kernel" : "the changes since \(since) are no longer all kept"
                opening.append(.notice("reset", ["since": .int(Int64(clamping: since)), "reason": .string(reason)]))
            }
            for (key, entry) in entries.filter({ matches($0.key) }).sorted(by: { $0.value.sequence < $1.value.sequence }) {
                if let shared = entry.snapshotEvent {
                    opening.append(shared)
                } else {
                    let event = StreamEvent.entry("snapshot", key: key, sequence: entry.sequence, value: entry.value)
                    entries[key]?.snapshotEvent = event
                    opening.append(event)
                }
            }
        }
        // A browser that resumed from further than this gateway has seen is at its own sequence.
        let seenThrough = resumed ? since ?? 0 : 0, position = max(head, seenThrough)
        opening.append(.notice("synced", id: position, ["sequence": .int(Int64(clamping: position))]))
        let id = UUID()
        let (events, continuation) = AsyncStream<StreamEvent>.makeStream(bufferingPolicy: .bufferingOldest(opening.count + Self.streamBacklog))
        let backlog = StreamBacklog()
        var openingBytes = 0
        for event in opening {
            openingBytes += event.size
            continuation.yield(event)
        }
        backlog.add(openingBytes)
        if closed {
            continuation.finish()
            return (id, events, backlog)
        }
        listeners[id] = Listener(prefixes: prefixes, continuation: continuation, backlog: backlog, limit: openingBytes + streamBacklogBytes,
                                 seenThrough: seenThrough)
        counters.open = listeners.count
        counters.opened += 1
        return (id, events, backlog)
    }

    /// Ends every stream (shutdown); streams opened later end at once.
    func closeAll() {
        closed = true
        for listener in listeners.values { listener.continuation.finish() }
        listeners.removeAll()
        counters.open = 0
        releaseSyncWaiters()
    }

    private func releaseSyncWaiters() {
        for waiter in syncWaiters { waiter.resume() }
        syncWaiters.removeAll()
    }

    func detach(_ id: UUID) {
        listeners.removeValue(forKey: id)?.continuation.finish()
        counters.open = listeners.count
    }


    /// A comment on every stream, so proxies keep idle connections.
    func heartbeat() {
        broadcast(StreamEvent(name: nil, id: nil, data: "keep-alive \(head)", key: nil))
    }

    /// This gateway's own log of the changes after `since` (nil when it does not hold them all).
    private func changes(after since: UInt64, matching matches: (String) -> Bool) -> [StreamEvent]? {
        guard !repairing, since >= logStart, since <= head else { return nil }
        // The log is in sequence order: start after `since`.
        var low = 0, high = log.count
        while low < high {
            let middle = (low + high) / 2
            if log[middle].sequence <= since { low = middle + 1 } else { high = middle }
        }
        return log[low...].filter { matches($0.key) }.map { .entry("update", key: $0.key, sequence: $0.sequence, value: $0.value) }
    }

    /// The changes after `since` from the kernel's history, up to this gateway's head (its own
    /// log covers the rest; nil when neither covers them). Beyond its head they come live.
    private func kernelChanges(under prefixes: [String], after since: UInt64, matching matches: (String) -> Bool) async -> [StreamEvent]? {
        guard let changeLog, !repairing else { return nil }
        guard kernelResumesUnderWay < Self.kernelResumesAtOnce else {
            counters.kernelResumesDeclined += 1
            return nil
        }
        kernelResumesUnderWay += 1
        defer { kernelResumesUnderWay -= 1 }
        let fetched: StateChanges?
        do {
            fetched = try await changeLog.changes(under: prefixes, since: since, timeout: .seconds(5))
        } catch {
            logger.warning("could not read the kernel's history for a resume", metadata: ["since": "\(since)", "problem": "\(error)"])
            return nil
        }
        guard let fetched, !repairing else { return nil }
        let upTo = min(fetched.sequence, head)
        var events = fetched.changes.filter { $0.sequence <= upTo }.map {
            StreamEvent.entry("update", key: $0.key, sequence: $0.sequence, value: $0.value.keepable())
        }
        if upTo < head {
            // The kernel answered before this gateway's latest changes: its own log has them.
            guard upTo >= logStart, let rest = changes(after: max(upTo, since), matching: matches) else { return nil }
            events += rest
        }
        return events
    }

    private func broadcast(_ event: StreamEvent) {
        for (id, listener) in listeners {
            if let key = event.key, !listener.prefixes.contains(where: { key.hasPrefix($0) }) { continue }
            if let sequence = event.id, sequence <= listener.seenThrough { continue }
            // The browser reads too slowly (its events wait, by count or by bytes): end its
            // stream; it reconnects and resumes from its last id, missing nothing.
            if listener.backlog.add(event.size) > listener.limit {
                counters.overflows += 1
                detach(id)
            } else if case .dropped = listener.continuation.yield(event) {
                counters.overflows += 1
                detach(id)
            }
        }
    }
}
