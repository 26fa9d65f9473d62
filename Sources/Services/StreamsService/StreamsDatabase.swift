import BusProtocol
import Contracts
import Foundation
import Storage

/// What the streams service does in its database, one function per operation, each run in
/// one transaction (``ServiceDatabase``) at the time `now` (Unix seconds) it is handed, in SQL
/// both engines run. The service has checked the params' shapes; these check what only the
/// database knows (names taken, subjects held, what is pending).
///
/// Writers on several PostgreSQL connections change a stream's rows one at a time: each
/// write reads the stream's row first with ``SQLSession/lockingRead(of:)`` (`locking: true`), and
/// a stream's dead-letter stream after it; publishes written together lock their streams in
/// name order. Two writes that lock two streams in the other's order can deadlock: PostgreSQL
/// ends one, which ``PostgresWriter`` runs again. Adding a stream or changing its subjects,
/// which must see every other stream's, takes ``addingStreams``; publishes share it, so a
/// message goes by the subjects as they are when it is written, not as they were when it
/// began waiting for its stream.
package enum StreamsDatabase {
    typealias API = StreamsAPI
    typealias Database = any SQLSession

    /// The lock adding a stream or changing its subjects takes on PostgreSQL
    /// (``SQLSession/lockAll(_:)``); publishes share it (``SQLSession/shareLock(_:)``).
    package static let addingStreams: Int64 = 7_214_031
    /// The lock adding a consumer bound by a key's quota takes: one key's consumers are
    /// counted and added one at a time, whichever streams they are on.
    static let addingConsumers: Int64 = 7_214_032

    // MARK: Streams

    /// A stream's row.
    struct Stream {
        var name: String
        var retention: API.Retention
        var maxMessages: Int
        var maxBytes: Int
        var maxAge: Double?
        var duplicateWindow: Double
        var deadLetters: String?
        var messages: Int
        var bytes: Int
        var firstSeq: Int
        var lastSeq: Int
        /// The publishers' ids it remembers (``forgetIDs(_:_:removingAtMost:now:)``).
        var ids: Int
        var createdAt: Double
        /// Keeps the kernel's state changes under its subjects (``capture(_:_:changes:gap:maxMessageBytes:removingAtMost:now:)``).
        var captureState: Bool
        var capturedSeq: Int
        var captureGaps: Int
        /// The CURVE key that added it (nil: added without CURVE, or by the service).
        var owner: String?

        init(row: SQLRow) throws {
            name = try row.text("name")
            retention = API.Retention(rawValue: try row.text("retention")) ?? .limits
            (maxMessages, maxBytes, maxAge, duplicateWindow)
                = (try row.int("max_messages"), try row.int("max_bytes"), try row.optionalDouble("max_age"), try row.double("duplicate_window"))
            deadLetters = try row.optionalText("dead_letters")
            (messages, bytes, firstSeq, lastSeq, ids, createdAt) = (try row.int("messages"), try row.int("bytes"), try row.int("first_seq"),
                                                                    try row.int("last_seq"), try row.int("ids"), try row.double("created_at"))
            (captureState, capturedSeq, captureGaps) = (try row.int("capture_state") != 0, try row.int("captured_seq"), try row.int("capture_gaps"))
            owner = try row.optionalText("owner")
        }

        /// As `asked` changes it: its limits (those it lowers only when `lowering`), and, for the
        /// stream it names, the duplicate window (nothing is published to the dead letters
        /// with an id).
        func changed(by asked: API.StreamSettings, lowering: Bool) -> Stream {
            var changed = self
            if let maxMessages = asked.maxMessages, lowering || maxMessages > self.maxMessages { changed.maxMessages = maxMessages }
            if let maxBytes = asked.maxBytes, lowering || maxBytes > self.maxBytes { changed.maxBytes = maxBytes }
            // No age limit is the highest.
            if let maxAge = asked.maxAge.map(ageLimit), lowering || self.maxAge.map({ (maxAge ?? .infinity) > $0 }) == true {
                changed.maxAge = maxAge
            }
            if name == asked.name { changed.duplicateWindow = asked.duplicateWindow ?? duplicateWindow }
            return changed
        }

        init(_ config: Settings, deadLetters: String?, owner: String?, now: Double) {
            (name, retention, maxMessages, maxBytes, maxAge, duplicateWindow)
                = (config.name, config.retention, config.maxMessages, config.maxBytes, config.maxAge, config.duplicateWindow)
            self.deadLetters = deadLetters
            (messages, bytes, firstSeq, lastSeq, ids, createdAt) = (0, 0, 1, 0, 0, now)
            (captureState, capturedSeq, captureGaps) = (config.captureState, 0, 0)
            self.owner = owner
        }
    }

    /// A stream's settings with the defaults filled in.
    struct Settings: Equatable, Encodable {
        var name: String
        var subjects: [String]
        var retention: API.Retention
        var maxMessages: Int
        var maxBytes: Int
        var maxAge: Double?
        var duplicateWindow: Double
        var captureState = false
    }

    /// What an add asked that differs from what exists, member by member, for the conflict's
    /// message: "ackWait is 0.5, asked 10; filter is orders.eu, asked none". A member left out
    /// of a consumer's add is its default, stored as left out.
    static func differences(current: JSONValue, asked: JSONValue) -> String {
        let (current, asked) = (current.objectValue ?? [:], asked.objectValue ?? [:])
        return Set(current.keys).union(asked.keys).sorted().compactMap { member in
            let (was, now) = (current[member] ?? .null, asked[member] ?? .null)
            guard was != now else { return nil }
            func shown(_ value: JSONValue) -> String { value == .null ? "none" : value.stringValue ?? value.jsonString }
            return "\(member) is \(shown(was)), asked \(shown(now))"
        }.joined(separator: "; ")
    }

    /// The stream `name`; `locking`: in a write that changes it (other writers wait for it).
    static func stream(_ db: Database, _ name: String, locking: Bool = false) throws -> Stream {
        guard let row = try db.row("SELECT * FROM streams WHERE name = ?" + (locking ? db.lockingRead(of: "streams") : ""), [name]) else {
            throw JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: no stream \(name)", data: ["stream": .string(name)])
        }
        return try Stream(row: row)
    }

    /// The stream `name` added at `createdAt`, locked as ``stream(_:_:locking:)`` locks it; nil
    /// once it is gone, or is another one added under its name: a removal's sequences were the
    /// deleted one's.
    private static func stream(_ db: Database, _ name: String, addedAt createdAt: Double) throws -> Stream? {
        guard let row = try db.row("SELECT * FROM streams WHERE name = ?" + db.lockingRead(of: "streams"), [name]) else { return nil }
        let stream = try Stream(row: row)
        return stream.createdAt == createdAt ? stream : nil
    }

    static func subjects(_ db: Database, of name: String) throws -> [String] {
        try db.texts("SELECT prefix FROM subjects WHERE stream = ? ORDER BY prefix", [name])
    }

    /// Creates the stream and its dead-letter stream for `caller`, unless `most` streams are
    /// there already or the caller's quota is spent; the same settings again change nothing.
    static func addStream(_ db: Database, _ settings: Settings, atMost most: Int, by caller: CallerIdentity?, quota: ClientQuota,
                          now: Double) throws -> API.StreamInfo {
        // The rows of a stream of this name deleted a moment ago go before the new stream's
        // sequences start again from 1. The service removes them in steps before it asks for
        // this; what a delete since left goes here, before the lock every publish shares (as
        // nothing publishes to a stream that is gone, the others' publishes go on meanwhile).
        for name in [settings.name, API.deadLetters(of: settings.name)] {
            var removed = DeletedRowsRemoved()
            while let next = try removeDeleted(db, name, atMost: .max, after: removed) { removed = next }
        }
        try db.lockAll(addingStreams)
        if let row = try db.row("SELECT * FROM streams WHERE name = ?", [settings.name]) {
            let existing = try Stream(row: row)
            let same = Settings(name: existing.name, subjects: try subjects(db, of: existing.name), retention: existing.retention,
                                maxMessages: existing.maxMessages, maxBytes: existing.maxBytes, maxAge: existing.maxAge,
                                duplicateWindow: existing.duplicateWindow, captureState: existing.captureState)
            var asked = settings
            asked.subjects.sort()
            guard same == asked else {
                let differences = Self.differences(current: try JSONValue(encoding: same), asked: try JSONValue(encoding: asked))
                throw JSONRPCError(code: JSONRPCError.conflictCode,
                                   message: "Conflict: stream \(settings.name) exists with other settings (\(differences)): stream.update changes a stream's subjects and limits; see data.current",
                                   data: ["current": try JSONValue(encoding: try info(db, existing))])
            }
            return try info(db, existing)
        }
        let streams = try db.int("SELECT COUNT(*) FROM streams WHERE dead_letters IS NOT NULL") ?? 0
        guard streams < most else { throw tooMany("streams", limit: most, setting: "streams.max_streams", remedy: "delete one first") }
        if let key = quota.binding(caller) {
            let (count, bytes) = try held(db, by: key, besides: settings.name)
            guard count < quota.streams else {
                throw tooMany("streams", limit: quota.streams, setting: "streams.client_max_streams", remedy: "delete one first", perKey: true)
            }
            try checkBytesQuota(quota, held: bytes, streams: count, adding: settings.maxBytes)
        }
        try checkNoOtherHolds(db, settings.subjects, besides: settings.name)
        let deadLetters = API.deadLetters(of: settings.name)
        let stream = Stream(settings, deadLetters: deadLetters, owner: caller?.key, now: now)
        try insert(db, stream)
        // The dead-letter stream keeps what its stream's consumers could not have done, under
        // the same limits; nothing is published to it but by them.
        try insert(db, Stream(Settings(name: deadLetters, subjects: [], retention: .limits, maxMessages: settings.maxMessages,
                                       maxBytes: settings.maxBytes, maxAge: settings.maxAge, duplicateWindow: 0),
                              deadLetters: nil, owner: caller?.key, now: now))
        try hold(db, settings.subjects, for: settings.name)
        return try info(db, stream)
    }

    /// -32004 when a stream other than `name` holds a subject that overlaps one of `subjects`
    /// (a message published to it would belong to both). The caller holds ``addingStreams``.
    private static func checkNoOtherHolds(_ db: Database, _ subjects: [String], besides name: String) throws {
        for prefix in subjects {
            if let held = try db.row("""
                SELECT prefix, stream FROM subjects
                WHERE stream <> ? AND (substr(?, 1, length(prefix)) = prefix OR substr(prefix, 1, length(?)) = ?)
                """, [name, prefix, prefix, prefix]) {
                let (other, stream) = (try held.text("prefix"), try held.text("stream"))
                let overlap = other == prefix ? "" : "subjects \(prefix) and \(other) overlap, and "
                throw JSONRPCError(code: JSONRPCError.conflictCode, message: "Conflict: \(overlap)stream \(stream) holds \(other)",
                                   data: ["stream": .string(stream), "subject": .string(other)])
            }
        }
    }

    /// Stream `name` holds exactly `subjects` from now on.
    private static func hold(_ db: Database, _ subjects: [String], for name: String) throws {
        try db.execute("DELETE FROM subjects WHERE stream = ?", [name])
        for prefix in subjects {
            try db.execute("INSERT INTO subjects (prefix, stream) VALUES (?, ?)", [prefix, name])
        }
    }

    private static func insert(_ db: Database, _ stream: Stream) throws {
        try db.execute("""
            INSERT INTO streams (name, retention, max_messages, max_bytes, max_age, duplicate_window, dead_letters, created_at, capture_state, owner)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """, [stream.name, stream.retention.rawValue, stream.maxMessages, stream.maxBytes, stream.maxAge,
                  stream.duplicateWindow, stream.deadLetters, stream.createdAt, stream.captureState ? 1 : 0, stream.owner])
    }

    /// -32010: a count the service bounds (in all, or `perKey`) is reached.
    private static func tooMany(_ what: String, limit: Int, setting: String, remedy: String, perKey: Bool = false) -> JSONRPCError {
        JSONRPCError(code: JSONRPCError.tooLargeCode,
                     message: "Too many: \(limit) \(what) are the most \(perKey ? "one key may add" : "the service holds") (\(setting)); \(remedy)",
                     data: ["limit": .int(Int64(limit)), "setting": .string(setting)])
    }

    /// The streams `key` added but stream `name` (their dead-letter streams not counted), and
    /// the bytes their `maxBytes` come to: what the key's quota holds besides that stream.
    private static func held(_ db: Database, by key: String, besides name: String) throws -> (streams: Int, bytes: Int) {
        let own = try db.row("""
            SELECT COUNT(*) AS streams, CAST(COALESCE(SUM(max_bytes), 0) AS BIGINT) AS bytes FROM streams
            WHERE owner = ? AND dead_letters IS NOT NULL AND name <> ?
            """, [key, name])
        return (try own?.int("streams") ?? 0, try own?.int("bytes") ?? 0)
    }

    /// Refuses a stream's `maxBytes` that would take the key's streams past its quota of
    /// bytes: `held` by its other streams (`streams` of them, when counted).
    private static func checkBytesQuota(_ quota: ClientQuota, held: Int, streams: Int?, adding maxBytes: Int) throws {
        guard held + maxBytes > quota.bytes else { return }
        let room = quota.bytes - held
        let remedy = room > 0 ? "so this one's maxBytes may be \(room) at most" : "delete one first"
        let others = streams.map { "its \($0) streams" } ?? "its other streams"
        throw JSONRPCError(code: JSONRPCError.tooLargeCode,
                           message: "Too large: this key's streams may hold \(quota.bytes) bytes in all (streams.client_max_mb); \(others) take \(held) of them (their maxBytes): \(remedy)",
                           data: ["limit": .int(Int64(quota.bytes)), "setting": .string("streams.client_max_mb"), "held": .int(Int64(held))])
    }

    // MARK: Who may do what

    /// What one client key may add: streams, the bytes their `max_bytes` come to (each one's
    /// dead-letter stream, bounded alike, not counted), and consumers. Operators' and
    /// services' keys are not bound, nor is anyone without CURVE (nobody can be told apart:
    /// the service's own limits bound them all).
    struct ClientQuota: Sendable {
        var streams: Int
        var bytes: Int
        var consumers: Int

        /// The key whose additions count against the quota, when `caller` is bound by it.
        func binding(_ caller: CallerIdentity?) -> String? {
            caller?.rank == .client ? caller?.key : nil
        }
    }

    /// Deleting or purging what a key added is for that key, operators and services; a
    /// stream or consumer added without a key (without CURVE, or by the service from its
    /// configuration) for operators and services only. Without CURVE anyone may.
    static func checkMayChange(_ what: String, addedBy owner: String?, _ caller: CallerIdentity?) throws {
        guard let caller, caller.rank == .client, caller.key != owner else { return }
        throw JSONRPCError.forbidden(owner == nil
            ? "\(what) was made by the service's configuration (or without CURVE): only an operator's key or a service's may change it"
            : "\(what) was added by another key: only that key, an operator's or a service's may change it")
    }

    static func info(_ db: Database, _ stream: Stream) throws -> API.StreamInfo {
        var info = API.StreamInfo(name: stream.name, subjects: try subjects(db, of: stream.name), retention: stream.retention,
                                  maxMessages: stream.maxMessages, maxBytes: stream.maxBytes, maxAge: stream.maxAge,
                                  duplicateWindow: stream.duplicateWindow, messages: stream.messages, bytes: stream.bytes,
                                  firstSequence: stream.firstSeq, lastSequence: stream.lastSeq,
                                  consumers: try db.texts("SELECT name FROM consumers WHERE stream = ? ORDER BY name", [stream.name]),
                                  deadLetters: stream.deadLetters, created: Timestamp.format(seconds: stream.createdAt))
        if stream.captureState {
            (info.captureState, info.capturedSequence, info.captureGaps) = (true, stream.capturedSeq, stream.captureGaps)
        }
        info.addedBy = stream.owner
        return info
    }

    /// Every stream's and consumer's figures in the Prometheus text format: what a stream
    /// holds now, and what each consumer has pending and has done since it was added. Names
    /// are letters, digits, '-', '_' and '.': label values that need no escaping.
    static func metrics(_ db: Database) throws -> String {
        let streams = try db.rows("SELECT name, messages, bytes, last_seq FROM streams ORDER BY name", [])
        let captures = try db.rows("SELECT name, capture_gaps FROM streams WHERE capture_state = 1 ORDER BY name", [])
        let consumers = try db.rows("""
            SELECT c.stream, c.name, c.delivered, c.redelivered, c.acknowledged, c.dead_lettered, c.terminated, c.missed,
                (SELECT COUNT(*) FROM pending p WHERE p.stream = c.stream AND p.consumer = c.name) AS pending
            FROM consumers c ORDER BY c.stream, c.name
            """, [])
        var text = ""
        func family(_ name: String, _ type: String, _ help: String, _ rows: [SQLRow], _ column: String, consumer: Bool) throws {
            text += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
            for row in rows {
                let labels = consumer ? "stream=\"\(try row.text("stream"))\",consumer=\"\(try row.text("name"))\"" : "stream=\"\(try row.text("name"))\""
                text += "\(name){\(labels)} \(try row.int(column))\n"
            }
        }
        try family("switchboard_stream_messages", "gauge", "Messages a stream holds.", streams, "messages", consumer: false)
        try family("switchboard_stream_bytes", "gauge", "Bytes of data a stream holds.", streams, "bytes", consumer: false)
        try family("switchboard_stream_last_sequence", "gauge", "A stream's last sequence: messages ever published to it.", streams, "last_seq", consumer: false)
        try family("switchboard_stream_capture_gaps_total", "counter", "Times a stream capturing the kernel's state could not have every change (some were not kept).", captures, "capture_gaps", consumer: false)
        try family("switchboard_stream_consumer_pending", "gauge", "Messages handed out to a consumer's readers and not yet acknowledged.", consumers, "pending", consumer: true)
        try family("switchboard_stream_consumer_delivered_total", "counter", "Messages handed out to a consumer for the first time.", consumers, "delivered", consumer: true)
        try family("switchboard_stream_consumer_redelivered_total", "counter", "Messages handed out again after their ack deadline or a nak.", consumers, "redelivered", consumer: true)
        try family("switchboard_stream_consumer_acknowledged_total", "counter", "Messages acknowledged.", consumers, "acknowledged", consumer: true)
        try family("switchboard_stream_consumer_dead_lettered_total", "counter", "Messages moved to the dead-letter stream past max deliveries.", consumers, "dead_lettered", consumer: true)
        try family("switchboard_stream_consumer_terminated_total", "counter", "Messages terminated by a reader.", consumers, "terminated", consumer: true)
        try family("switchboard_stream_consumer_missed_total", "counter", "Messages the stream's limits removed before the consumer had them done.", consumers, "missed", consumer: true)
        return text
    }

    static func list(_ db: Database) throws -> API.StreamList {
        API.StreamList(streams: try db.rows("SELECT * FROM streams ORDER BY name", []).map { try info(db, try Stream(row: $0)) })
    }

    /// Deletes the stream with its consumers and its dead-letter stream (a dead-letter stream
    /// goes only with its stream). Their messages, ids and pending deliveries, as many as the
    /// stream held, are left to ``removeDeleted(_:_:atMost:after:)``: a few at a time, as one
    /// transaction for millions of them would hold every stream's writes for seconds. Until
    /// then the names are listed in `deleted_streams`; nothing reads those rows meanwhile, as
    /// every read starts from its stream's row.
    static func deleteStream(_ db: Database, _ name: String, by caller: CallerIdentity?) throws -> API.Removed {
        let stream = try stream(db, name, locking: true)
        try checkMayChange("stream \(name)", addedBy: stream.owner, caller)
        if stream.deadLetters == nil, let owner = try db.texts("SELECT name FROM streams WHERE dead_letters = ?", [name]).first {
            throw JSONRPCError.invalidParams(field: "name", "\(name) is stream \(owner)'s dead-letter stream: it goes when \(owner) is deleted")
        }
        var removed = 0
        for name in [name] + (stream.deadLetters.map { [$0] } ?? []) {
            removed += try db.int("SELECT messages FROM streams WHERE name = ?" + db.lockingRead(of: "streams"), [name]) ?? 0
            for table in ["consumers", "subjects"] {
                try db.execute("DELETE FROM \(table) WHERE stream = ?", [name])
            }
            try db.execute("DELETE FROM streams WHERE name = ?", [name])
            try db.execute("INSERT INTO deleted_streams (name) VALUES (?)", [name])
        }
        return API.Removed(messages: removed)
    }

    /// The streams deleted whose rows are still to be removed (``removeDeleted(_:_:atMost:after:)``).
    static func deletedStreams(_ db: Database) throws -> [String] {
        try db.texts("SELECT name FROM deleted_streams ORDER BY name")
    }

    /// Where a removal of a deleted stream's rows has got to: the last key it removed from each
    /// table (nil: none yet).
    struct DeletedRowsRemoved: Codable, Sendable, Equatable {
        var messages: Int?
        var ids: String?
        var pending: Int?
    }

    /// Removes up to `most` of the deleted stream `name`'s messages after those `done` says
    /// were removed, as many of its ids, and the pending deliveries of as many sequences; once
    /// none are left it is no longer listed. Returns how far it got, for the next step; nil
    /// once none are left (also when another process, or a stream added again under the name,
    /// finished it first: the listing, locked, says whose rows these still are).
    static func removeDeleted(_ db: Database, _ name: String, atMost most: Int, after done: DeletedRowsRemoved = .init()) throws -> DeletedRowsRemoved? {
        guard try db.row("SELECT name FROM deleted_streams WHERE name = ?" + db.lockingRead(of: "deleted_streams"), [name]) != nil else { return nil }
        // Each table's next `most` after the last key removed, as a range both engines delete
        // along the index (PostgreSQL plans `IN (SELECT … LIMIT n)` as a scan of every row per
        // row). Looked for after the last key removed, not from the first: removed keys stay
        // in PostgreSQL's index, dead, until its vacuum, and a look from the first would walk
        // all those removed so far at every step. Sequences go as a purge's do: the `most`
        // from the oldest left (fewer rows where some went before), without the row `most`
        // rows on, which PostgreSQL plans from statistics that lag a stream's growth and then
        // sorts all that is left to find; every consumer's deliveries of a sequence go
        // together. Ids, a stream's at most `max_messages`, go by that row. Each returns the
        // last key it removed; nil when none was left after `after`.
        func sequences(_ table: String, after: Int?) throws -> Int? {
            let (past, from): (String, [any SQLArgument]) = after.map { (" AND seq > ?", [name, $0]) } ?? ("", [name])
            guard let oldest = try db.int("SELECT MIN(seq) FROM \(table) WHERE stream = ?\(past)", from) else { return nil }
            let (sum, overflow) = oldest.addingReportingOverflow(most - 1)
            let last = overflow ? Int.max : sum
            try db.execute("DELETE FROM \(table) WHERE stream = ? AND seq >= ? AND seq <= ?", [name, oldest, last])
            return last
        }
        func ids(after: String?) throws -> String? {
            let (past, from): (String, [any SQLArgument]) = after.map { (" AND id > ?", [name, $0]) } ?? ("", [name])
            let last = try db.row("SELECT id FROM message_ids WHERE stream = ?\(past) ORDER BY id LIMIT 1 OFFSET ?", from + [most - 1])?.text("id")
            try db.execute("DELETE FROM message_ids WHERE stream = ?\(past)" + (last == nil ? "" : " AND id <= ?"), from + (last.map { [$0] } ?? []))
            return last
        }
        let messages = try sequences("messages", after: done.messages)
        let ids = try ids(after: done.ids)
        let pending = try sequences("pending", after: done.pending)
        if messages != nil || ids != nil || pending != nil {
            return DeletedRowsRemoved(messages: messages ?? done.messages, ids: ids ?? done.ids, pending: pending ?? done.pending)
        }
        // None is left after the keys removed. One before them is another stream's of the
        // name, added and deleted again since: looked for again from the first.
        for (table, key) in [("messages", "seq"), ("message_ids", "id"), ("pending", "seq")]
        where try db.row("SELECT \(key) FROM \(table) WHERE stream = ? ORDER BY \(key) LIMIT 1", [name]) != nil {
            return DeletedRowsRemoved()
        }
        try db.execute("DELETE FROM deleted_streams WHERE name = ?", [name])
        return nil
    }

    /// What a purge or a lowered limit removes, a transaction at a time (``removeSome(_:_:atMost:)``):
    /// the messages of the stream added at `createdAt` from sequence `from` up to `before`, not
    /// with it; with `subject`, those whose subject starts with it.
    struct Removal: Codable, Sendable {
        var stream: String
        var createdAt: Double
        var from: Int
        var before: Int
        var subject: String?
    }

    /// What one transaction of a ``Removal`` removed, and what is left to remove (none: nil).
    struct RemovalStep: Codable, Sendable {
        var removed: Int
        var left: Removal?
    }

    /// What a purge removes: every message, or those whose subject starts with `subject`; with
    /// `keep`, all but the last `keep` of them (none when there are no more). For the key
    /// that added the stream, an operator's and services' keys.
    static func purged(_ db: Database, _ asked: API.Purge, by caller: CallerIdentity?) throws -> [Removal] {
        let stream = try stream(db, asked.name, locking: true)
        try checkMayChange("stream \(asked.name)", addedBy: stream.owner, caller)
        var before = stream.lastSeq + 1
        if let keep = asked.keep, keep > 0 {
            let (matches, arguments) = subjectMatches(asked.subject)
            guard let kept = try db.int("SELECT seq FROM messages WHERE stream = ? AND \(matches) ORDER BY seq DESC LIMIT 1 OFFSET ?",
                                        [asked.name] + arguments + [keep - 1]) else {
                return []
            }
            before = kept
        }
        return [Removal(stream: asked.name, createdAt: stream.createdAt, from: stream.firstSeq, before: before, subject: asked.subject)]
    }

    /// Removes the oldest of those `removal` takes, at most `most` messages, each consumer
    /// counting what it missed, and says what is left. Nothing is once the stream is gone, or
    /// is another one added under its name.
    static func removeSome(_ db: Database, _ removal: Removal, atMost most: Int) throws -> RemovalStep {
        guard var stream = try stream(db, removal.stream, addedAt: removal.createdAt) else { return RemovalStep(removed: 0, left: nil) }
        // The first of this step's messages not to go. With a subject: the one after its `most`
        // oldest. Without: `most` sequences past the oldest left (fewer messages where some
        // went before), which needs no count of rows: PostgreSQL plans "the row `most` rows on"
        // from statistics that lag a bulk load, and then sorts all that is left to find it.
        let from = max(removal.from, stream.firstSeq)
        let stop: Int?
        if let subject = removal.subject {
            let (matches, arguments) = subjectMatches(subject)
            stop = try db.int("SELECT seq FROM messages WHERE stream = ? AND seq >= ? AND seq < ? AND \(matches) ORDER BY seq LIMIT 1 OFFSET ?",
                              [removal.stream, from, removal.before] + arguments + [most])
        } else {
            let oldest = try db.int("SELECT MIN(seq) FROM messages WHERE stream = ? AND seq >= ? AND seq < ?", [removal.stream, from, removal.before])
            stop = oldest.map { $0 + most }.flatMap { $0 < removal.before ? $0 : nil }
        }
        let held = stream.messages
        try removeAll(db, &stream, from: from, before: stop ?? removal.before, subject: removal.subject)
        try save(db, stream)
        var left = removal
        left.from = stop ?? removal.before
        return RemovalStep(removed: held - stream.messages, left: stop == nil ? nil : left)
    }

    /// A consumer's most pending as `consumer.add` and `consumer.update` take it: 0 is none of
    /// its own (the service's most holds it).
    static func pendingLimit(_ most: Int) -> Int? { most == 0 ? nil : most }

    /// A stream's age limit as `stream.add` and `stream.update` take it: 0 is none.
    static func ageLimit(_ seconds: Double) -> Double? { seconds == 0 ? nil : seconds }

    /// Changes the stream's subjects (checked by ``Check/subjects(_:)``; not a capturing
    /// stream's) and limits, and its dead-letter stream's limits with them (as `stream.add`
    /// made them), for the key that added it or an operator; a `maxBytes` raised, within the
    /// key's quota of bytes. Lowered, what is past the limits goes at once, the oldest first,
    /// each consumer counting what it missed, as a publish past them removes them
    /// (``updateAllButLowered(_:_:by:quota:now:)`` removed most of it before, when much goes).
    /// A `maxAge` of 0 lifts the age limit.
    static func updateStream(_ db: Database, _ asked: API.StreamSettings, by caller: CallerIdentity?, quota: ClientQuota,
                             removingAtMost most: Int, now: Double) throws -> API.StreamInfo {
        var changed = try change(db, asked, try checked(db, asked, by: caller, quota: quota), lowering: true)
        for index in changed.indices { try trim(db, &changed[index], removingAtMost: most, now: now) }
        return try info(db, changed[0])
    }

    /// Makes the changes `asked` gives to the stream and its dead-letter stream as `read`
    /// (``checked(_:_:by:quota:)``), the limits it lowers only when `lowering`, and holds its
    /// subjects; removes nothing. The two streams as changed.
    private static func change(_ db: Database, _ asked: API.StreamSettings, _ read: [Stream], lowering: Bool) throws -> [Stream] {
        let changed = read.map { $0.changed(by: asked, lowering: lowering) }
        if let subjects = asked.subjects { try hold(db, subjects, for: asked.name) }
        for stream in changed {
            try db.execute("UPDATE streams SET max_messages = ?, max_bytes = ?, max_age = ?, duplicate_window = ? WHERE name = ?",
                           [stream.maxMessages, stream.maxBytes, stream.maxAge, stream.duplicateWindow, stream.name])
        }
        return changed
    }

    /// The first of a `stream.update` that lowers limits: makes every change `asked` gives but
    /// the lowered limits (subjects, duplicate window, limits raised), checked as
    /// ``updateStream(_:_:by:quota:removingAtMost:now:)`` checks it, and says what the lowered
    /// limits remove from the stream and its dead-letter stream. The service removes that a
    /// transaction at a time, then lowers the limits, so that however much goes, no transaction
    /// removes much. All that can refuse the update (subjects another stream holds, the quota)
    /// is checked and taken here, before anything is removed: the last transaction only lowers.
    static func updateAllButLowered(_ db: Database, _ asked: API.StreamSettings, by caller: CallerIdentity?, quota: ClientQuota,
                                    now: Double) throws -> [Removal] {
        let read = try checked(db, asked, by: caller, quota: quota)
        _ = try change(db, asked, read, lowering: false)
        return try read.map { $0.changed(by: asked, lowering: true) }.compactMap { stream in
            let first = try firstWithinLimits(db, stream, now: now).first
            guard first > stream.firstSeq, stream.messages > 0 else { return nil }
            return Removal(stream: stream.name, createdAt: stream.createdAt, from: stream.firstSeq, before: first)
        }
    }

    /// The stream and its dead-letter stream (locked), once checked that `caller` may change
    /// them as `asked`, within its quota. Its subjects are checked against every other
    /// stream's, as adding a stream does, and not yet held. Lowering `maxBytes` is never
    /// refused by the quota: the key then holds less.
    private static func checked(_ db: Database, _ asked: API.StreamSettings, by caller: CallerIdentity?, quota: ClientQuota) throws -> [Stream] {
        if asked.subjects != nil { try db.lockAll(addingStreams) }
        let stream = try stream(db, asked.name, locking: true)
        try checkMayChange("stream \(asked.name)", addedBy: stream.owner, caller)
        guard let deadLetters = stream.deadLetters else {
            let owner = API.stream(ofDeadLetters: asked.name) ?? asked.name
            throw JSONRPCError.invalidParams(field: "name", "\(asked.name) is stream \(owner)'s dead-letter stream: it has \(owner)'s limits and no subjects")
        }
        if let subjects = asked.subjects {
            // Its messages are those keys' changes, and who may read them is judged by its
            // subjects (the gateway's readable prefixes): they stay what they were kept under.
            guard !stream.captureState else {
                throw JSONRPCError.invalidParams(field: "subjects", "stream \(asked.name) keeps the kernel's state under its subjects: they stay as added (add another stream to capture other keys)")
            }
            try checkNoOtherHolds(db, subjects, besides: asked.name)
        }
        if let maxBytes = asked.maxBytes, maxBytes > stream.maxBytes, let key = quota.binding(caller) {
            try checkBytesQuota(quota, held: try held(db, by: key, besides: asked.name).bytes, streams: nil, adding: maxBytes)
        }
        return [stream, try self.stream(db, deadLetters, locking: true)]
    }

    /// The first sequence the stream keeps within its limits (count, bytes, age): the oldest go
    /// while it is past any of them; past its last when none stays. What it reads grows with
    /// what goes, not with what stays. With `most`, the age is looked at in the `most`
    /// sequences after what the count leaves, no further: `complete` is false when all of those
    /// are past it (more after them may be).
    private static func firstWithinLimits(_ db: Database, _ stream: Stream, now: Double,
                                          ageLookedAt most: Int? = nil) throws -> (first: Int, complete: Bool) {
        var first = stream.firstSeq, complete = true
        if stream.messages > stream.maxMessages {
            // The oldest that stays: as many before it as are over the count.
            first = try db.int("SELECT seq FROM messages WHERE stream = ? ORDER BY seq LIMIT 1 OFFSET ?",
                               [stream.name, stream.messages - stream.maxMessages]) ?? stream.lastSeq + 1
        }
        if stream.maxAge != nil {
            // The oldest of those left that is not past its age.
            let looked = min(most.map { first + $0 } ?? .max, stream.lastSeq + 1)
            if let within = try firstWithinAge(db, stream, from: first, before: most == nil ? nil : looked, now: now) {
                first = within
            } else {
                (first, complete) = (looked, looked > stream.lastSeq)
            }
        }
        if stream.bytes > stream.maxBytes {
            // Of those left, the oldest go until the rest fit: read a few at a time from the
            // oldest, as the stream is seldom over by more than the message just published.
            var left = stream.bytes
            if first > stream.firstSeq {
                left -= try db.int("SELECT CAST(COALESCE(SUM(length(data)), 0) AS BIGINT) FROM messages WHERE stream = ? AND seq < ?",
                                   [stream.name, first]) ?? 0
            }
            var chunk = 16
            reading: while left > stream.maxBytes {
                let rows = try db.rows("SELECT seq, length(data) AS size FROM messages WHERE stream = ? AND seq >= ? ORDER BY seq LIMIT ?",
                                       [stream.name, first, chunk])
                for row in rows {
                    guard left > stream.maxBytes else { break reading }
                    left -= try row.int("size")
                    first = try row.int("seq") + 1
                }
                guard rows.count == chunk else { break }
                chunk = min(chunk * 8, 4_096)
            }
        }
        return (first, complete)
    }

    /// The first sequence from `from` (and before `before`, when given) of a message not past
    /// the stream's age; nil when there is none. What it reads is what is past the age.
    private static func firstWithinAge(_ db: Database, _ stream: Stream, from: Int, before: Int? = nil, now: Double) throws -> Int? {
        guard let maxAge = stream.maxAge else { return from }
        var arguments: [any SQLArgument] = [stream.name, from]
        if let before { arguments.append(before) }
        return try db.int("SELECT seq FROM messages WHERE stream = ? AND seq >= ? \(before == nil ? "" : "AND seq < ? ")AND published_at >= ? ORDER BY seq LIMIT 1",
                          arguments + [now - maxAge])
    }

    /// A stream whose oldest message is past its age, or oldest id past its duplicate window
    /// (``expired(_:now:by:)``): the stream added at `createdAt`, as a ``Removal`` names it.
    struct Expired: Sendable, Equatable {
        var stream: String
        var createdAt: Double
    }

    /// The streams whose oldest message is past its age, or whose oldest id is past its
    /// duplicate window, by more than `late` seconds: those nobody published to or fetched
    /// from since (each of which removes the messages past their age), or published to with
    /// ids (each of which forgets them).
    static func expired(_ db: Database, now: Double, by late: Double) throws -> [Expired] {
        try db.rows("""
            SELECT s.name, s.created_at FROM streams s WHERE
                (s.max_age IS NOT NULL AND s.messages > 0
                 AND (SELECT published_at FROM messages m WHERE m.stream = s.name AND m.seq = s.first_seq) < ? - s.max_age)
                OR (s.ids > 0 AND (SELECT MIN(published_at) FROM message_ids i WHERE i.stream = s.name) < ? - s.duplicate_window)
            ORDER BY s.name
            """, [now - late, now - late]).map { Expired(stream: try $0.text("name"), createdAt: try $0.double("created_at")) }
    }

    /// Removes the stream's oldest messages past its age, of its first `most` sequences, each
    /// consumer counting what it missed, as a publish keeps its limits (``trim(_:_:removingAtMost:now:)``),
    /// and forgets its ids past the duplicate window as a publish with ids does; says whether
    /// more of either may be (the sequences after those were not looked at). Nothing once the
    /// stream is gone or added again.
    static func removeExpired(_ db: Database, _ expired: Expired, atMost most: Int, now: Double) throws -> Bool {
        guard var stream = try stream(db, expired.stream, addedAt: expired.createdAt) else { return false }
        let idsLeft = try forgetIDs(db, &stream, removingAtMost: most, now: now)
        return try !trim(db, &stream, removingAtMost: most, now: now) || idsLeft
    }

    /// Removes every message before sequence `first` (with `subject`, those whose subject
    /// starts with it), each consumer counting those it had not had done; the stream's
    /// counters are the caller's to save. What goes is counted, not what stays: a stream cut
    /// by a little keeps most of its messages. With `from`, none before it is left to remove
    /// (an earlier step removed them): each statement starts there, not at the stream's first.
    private static func removeAll(_ db: Database, _ stream: inout Stream, from: Int? = nil, before first: Int, subject: String? = nil) throws {
        guard first > stream.firstSeq, stream.messages > 0 else { return }
        let from = max(from ?? stream.firstSeq, stream.firstSeq)
        // The messages' own condition on their subject and sequence, and a pending one's
        // through its message.
        let (matches, subjectArguments) = subjectMatches(subject)
        let chosen = "AND seq >= ? AND " + matches
        let chosenArguments: [any SQLArgument] = [from] + subjectArguments
        let pendingChosen = subject == nil ? "AND seq >= ?" : "AND seq IN (SELECT seq FROM messages WHERE stream = ? AND seq < ? \(chosen))"
        let pendingArguments: [any SQLArgument] = subject == nil ? [from] : [stream.name, first] + chosenArguments
        let gone = try db.row("""
            SELECT COUNT(*) AS messages, CAST(COALESCE(SUM(length(data)), 0) AS BIGINT) AS bytes FROM messages WHERE stream = ? AND seq < ? \(chosen)
            """, [stream.name, first] + chosenArguments)
        // Each consumer misses what it had pending among them, and those from its position on
        // that its filter takes.
        let behind = countedFromPositions(stream.name, before: first, chosen: chosen, chosenArguments)
        try db.execute("""
            \(behind.sql)
            UPDATE consumers SET missed = missed
                + (SELECT COUNT(*) FROM pending p WHERE p.stream = consumers.stream AND p.consumer = consumers.name AND p.seq < ? \(pendingChosen))
                + COALESCE((SELECT n FROM behind WHERE behind.next_seq = consumers.next_seq AND behind.prefix = COALESCE(consumers.filter, '')), 0)
            WHERE stream = ?
            """, behind.arguments + [first] + pendingArguments + [stream.name])
        try db.execute("DELETE FROM pending WHERE stream = ? AND seq < ? \(pendingChosen)", [stream.name, first] + pendingArguments)
        try db.execute("DELETE FROM messages WHERE stream = ? AND seq < ? \(chosen)", [stream.name, first] + chosenArguments)
        stream.messages -= try gone?.int("messages") ?? 0
        stream.bytes -= try gone?.int("bytes") ?? 0
        // Those left start at `first` when every one from the first on went; else (a subject
        // chosen, or some left before `from`) at the first that stayed. Looked up from there,
        // past none of the rows just deleted.
        let removedFromFirst = subject == nil && from == stream.firstSeq
        stream.firstSeq = try db.int("SELECT MIN(seq) FROM messages WHERE stream = ? AND seq >= ?", [stream.name, removedFromFirst ? first : stream.firstSeq])
            ?? stream.lastSeq + 1
    }

    /// A `WITH` ending in `behind (prefix, next_seq, n)`: for each consumer position of
    /// `stream` before `first`, under each filter there (`prefix`, "" for none, which every
    /// subject starts with), the messages from that position up to `first` that the filter
    /// takes and `chosen` (SQL on the message, starting with AND) chooses. Counted once for
    /// each filter, not once for each consumer (up to `max_consumers` of them): run by run
    /// between the positions (`upto` the next one's), then summed from the last run back.
    /// `behind` is MATERIALIZED: inlined into the lookup made for each consumer, PostgreSQL
    /// would count again for each. Without a filter, the count reads no subject: it walks the
    /// index alone (and a prefix's length is taken once).
    private static func countedFromPositions(_ stream: String, before first: Int, chosen: String = "",
                                             _ chosenArguments: [any SQLArgument] = []) -> (sql: String, arguments: [any SQLArgument]) {
        let sql = """
            WITH positions AS (
                SELECT DISTINCT COALESCE(filter, '') AS prefix, next_seq FROM consumers WHERE stream = ? AND next_seq < ?
            ), runs AS (
                SELECT prefix, length(prefix) AS size, next_seq, LEAD(next_seq, 1, ?) OVER (PARTITION BY prefix ORDER BY next_seq) AS upto FROM positions
            ), counted AS (
                SELECT prefix, next_seq, CASE WHEN prefix = ''
                    THEN (SELECT COUNT(*) FROM messages m WHERE m.stream = ? AND m.seq >= runs.next_seq AND m.seq < runs.upto \(chosen))
                    ELSE (SELECT COUNT(*) FROM messages m WHERE m.stream = ? AND m.seq >= runs.next_seq AND m.seq < runs.upto \(chosen)
                          AND substr(m.subject, 1, runs.size) = runs.prefix) END AS n FROM runs
            ), behind AS MATERIALIZED (
                SELECT prefix, next_seq, CAST(SUM(n) OVER (PARTITION BY prefix ORDER BY next_seq DESC) AS BIGINT) AS n FROM counted
            )
            """
        return (sql, [stream, first, first, stream] + chosenArguments + [stream] + chosenArguments)
    }

    // MARK: Messages

    /// A message to publish, its shape checked, and the request it answers.
    struct Publication: Sendable {
        var subject: String
        var data: [UInt8]
        var id: String?
        var request: String?
    }

    /// The most publications one transaction takes (``publish(_:_:removingAtMost:now:)``): a host may hold
    /// thousands of publishes at once, and each takes a few placeholders in each of the
    /// transaction's statements, which both engines bound (SQLite 32,766, PostgreSQL 65,535).
    static let publicationsPerTransaction = 256

    /// Keeps each message in the stream holding its subject, in order, as one transaction: a
    /// known id within the duplicate window answers the first one's sequence instead, and a
    /// message no stream holds, or over its stream's `max_bytes`, is refused (writing nothing
    /// for it). The streams are read and locked together first (in name order, as every batch
    /// takes them), the messages inserted together, and each stream's counters saved and
    /// limits kept once, after: a handful of statements for what came together, however many
    /// messages (two more for each stream given ids, and one for all their ids).
    static func publish(_ db: Database, _ publications: [Publication], removingAtMost most: Int, now: Double) throws -> [Result<API.Published, JSONRPCError>] {
        guard !publications.isEmpty else { return [] }
        // Without it, a publish could read a stream's old subjects, wait for the stream's row
        // while they change, and then keep the message there.
        try db.shareLock(addingStreams)
        var batch = try PublishBatch(db, subjects: Set(publications.map(\.subject)).sorted())
        try batch.readIDs(db, of: publications, now: now)
        var outcomes: [Result<API.Published, JSONRPCError>] = []
        for publication in publications {
            do {
                outcomes.append(.success(try publish(db, publication, in: &batch, now: now)))
            } catch let refusal as JSONRPCError {
                outcomes.append(.failure(refusal))
            }
        }
        try insert(db, batch.messages)
        if !batch.newIDs.isEmpty {
            try db.execute("INSERT INTO message_ids (stream, id, seq, published_at) VALUES " + SQLRows.placeholders(rows: batch.newIDs.count, columns: 4),
                           batch.newIDs.flatMap { new -> [any SQLArgument] in [new.stream, new.id, new.sequence, now] })
            for new in batch.newIDs { batch.streams[new.stream]!.ids += 1 }
        }
        for name in batch.knownIDs.keys.sorted() { try forgetIDs(db, &batch.streams[name]!, removingAtMost: most, now: now) }
        for name in batch.streams.keys.sorted() { try trim(db, &batch.streams[name]!, removingAtMost: most, now: now) }
        return outcomes
    }

    /// Forgets the stream's oldest ids while they are past its duplicate window or more than
    /// its `maxMessages`, about `most` a transaction at most: a client publishing unique ids
    /// makes the stream remember no more ids than it may hold messages, however long its
    /// window, and millions that passed the window while nobody published go over the next
    /// publishes with ids (and the service's look for a stream nobody publishes to,
    /// ``removeExpired(_:_:atMost:now:)``), not in one transaction past PostgreSQL's timeout.
    /// Returns whether more of them may be left. Its counters are the caller's to save.
    @discardableResult
    private static func forgetIDs(_ db: Database, _ stream: inout Stream, removingAtMost most: Int, now: Double) throws -> Bool {
        // Both are the oldest by the time each was published, so what goes is the stream's ids
        // below a time, deleted along their index: the window's start, or the time of the last
        // one over the count when that is later, or the `most`-th oldest's when that is
        // sooner. A transaction's publishes share a time: a bound taken from one of them takes
        // those published with it too, a few more than asked.
        typealias Bound = (time: Double, inclusive: Bool)
        func below(_ bound: Bound) -> String { bound.inclusive ? "published_at <= ?" : "published_at < ?" }
        /// The oldest's time below `bound` and the `rank`-th oldest's (nil when there are
        /// fewer); nil when there is none.
        func oldest(_ rank: Int, below bound: Bound) throws -> (first: Double, ranked: Double?)? {
            let row = try db.row("""
                SELECT COUNT(*) AS found, MIN(published_at) AS first, MAX(published_at) AS last FROM
                    (SELECT published_at FROM message_ids WHERE stream = ? AND \(below(bound)) ORDER BY published_at LIMIT ?) AS oldest
                """, [stream.name, bound.time, rank])
            guard let row, let first = try row.optionalDouble("first") else { return nil }
            return (first, try row.int("found") == rank ? try row.double("last") : nil)
        }
        var bound: Bound = (now - stream.duplicateWindow, false)
        let overCount = min(stream.ids - stream.maxMessages, most)
        if overCount > 0, let lastOver = try oldest(overCount, below: (.greatestFiniteMagnitude, true))?.ranked, lastOver >= bound.time {
            bound = (lastOver, true)
        }
        guard let step = try oldest(most, below: bound) else { return false }
        if let cut = step.ranked { bound = (cut, true) }
        // From the oldest left, not from the start of the stream's ids: PostgreSQL estimates
        // how many rows a range holds from statistics taken before the earlier steps removed
        // theirs, and a range open below looks to it like most of the table, which it then
        // reads whole. The range between two times the step read holds what it estimates.
        stream.ids -= try db.execute("DELETE FROM message_ids WHERE stream = ? AND published_at >= ? AND " + below(bound),
                                     [stream.name, step.first, bound.time])
        return step.ranked != nil
    }

    /// What one transaction of publishes has read and is to write.
    private struct PublishBatch {
        /// The streams holding the batch's subjects (locked), as the batch changes them, by name.
        var streams: [String: Stream] = [:]
        /// The stream holding each subject (none: no stream holds it).
        var streamOfSubject: [String: String] = [:]
        /// The sequence of each id the batch's publications give that is known within its
        /// stream's duplicate window (kept before, or earlier in the batch), by stream.
        var knownIDs: [String: [String: Int]] = [:]
        /// The ids of the messages to insert.
        var newIDs: [(stream: String, id: String, sequence: Int)] = []
        /// The messages to insert, in order.
        var messages: [Message] = []

        /// Reads, and on PostgreSQL locks, the streams holding `subjects`.
        init(_ db: Database, subjects: [String]) throws {
            let rows = try db.rows("""
                SELECT asked.column1 AS asked_subject, streams.* FROM (VALUES \(SQLRows.placeholders(rows: subjects.count, columns: 1))) AS asked
                JOIN subjects ON substr(asked.column1, 1, length(subjects.prefix)) = subjects.prefix
                JOIN streams ON streams.name = subjects.stream ORDER BY streams.name
                """ + db.lockingRead(of: "streams"), subjects)
            for row in rows {
                let stream = try Stream(row: row)
                streamOfSubject[try row.text("asked_subject")] = stream.name
                streams[stream.name] = stream
            }
        }

        /// Reads which of the ids given each stream it knows within its duplicate window, and
        /// forgets those it remembers from before the window (the rest of those are forgotten
        /// a transaction's worth at a time, after: ``forgetIDs(_:_:removingAtMost:now:)``): one
        /// statement for each stream given ids, however many, and one more when some are past it.
        mutating func readIDs(_ db: Database, of publications: [Publication], now: Double) throws {
            var asked: [String: Set<String>] = [:]
            for publication in publications {
                if let id = publication.id, let name = streamOfSubject[publication.subject] { asked[name, default: []].insert(id) }
            }
            for (name, ids) in asked.sorted(by: { $0.key < $1.key }) {
                guard let stream = streams[name] else { continue }
                var (known, past): ([String: Int], [String]) = ([:], [])
                for row in try db.rows("SELECT id, seq, published_at FROM message_ids WHERE stream = ? AND id IN " + SQLRows.placeholders(rows: 1, columns: ids.count),
                                       [name] + ids.sorted()) {
                    let id = try row.text("id")
                    if try row.double("published_at") < now - stream.duplicateWindow { past.append(id) } else { known[id] = try row.int("seq") }
                }
                // Kept anew below: the old rows go first (the table's key is the stream and id).
                if !past.isEmpty {
                    streams[name]!.ids -= try db.execute("DELETE FROM message_ids WHERE stream = ? AND id IN " + SQLRows.placeholders(rows: 1, columns: past.count),
                                                         [name] + past)
                }
                knownIDs[name] = known
            }
        }
    }

    /// One of ``publish(_:_:removingAtMost:now:)``'s messages.
    private static func publish(_ db: Database, _ publication: Publication, in batch: inout PublishBatch, now: Double) throws -> API.Published {
        let subject = publication.subject, data = publication.data
        guard let name = batch.streamOfSubject[subject], var stream = batch.streams[name] else {
            throw JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: no stream holds subject \(subject)",
                               data: ["subject": .string(subject)])
        }
        guard !stream.captureState else {
            throw JSONRPCError.invalidParams(field: "subject", "stream \(name) keeps the kernel's state under its subjects: its messages are the state's changes, set with state.set or state.publish")
        }
        if let id = publication.id, let first = batch.knownIDs[name]?[id] {
            return API.Published(stream: name, sequence: first, duplicate: true)
        }
        guard data.count <= stream.maxBytes else {
            throw JSONRPCError(code: JSONRPCError.tooLargeCode,
                               message: "Too large: the message's \(data.count) bytes are over stream \(name)'s max_bytes (\(stream.maxBytes))",
                               data: ["limit": .int(Int64(stream.maxBytes)), "bytes": .int(Int64(data.count))])
        }
        let message = next(&stream, subject: subject, data: data, deadLetter: nil, now: now)
        batch.messages.append(message)
        batch.streams[name] = stream
        if let id = publication.id {
            batch.knownIDs[name, default: [:]][id] = message.sequence
            batch.newIDs.append((name, id, message.sequence))
        }
        return API.Published(stream: name, sequence: message.sequence, duplicate: false)
    }

    /// Messages read without a consumer: from `from` (the first by default), or the last `last`
    /// of them; at most `max` and `maxBytes` of data (always one when there is one).
    static func messages(_ db: Database, _ asked: API.ReadMessages, max: Int, maxBytes: Int) throws -> API.Messages {
        let stream = try stream(db, asked.name)
        let (matches, filter) = subjectMatches(asked.filter)
        var from = asked.from ?? stream.firstSeq
        if let last = asked.last {
            from = try db.int("""
                SELECT MIN(seq) FROM (SELECT seq FROM messages WHERE stream = ? AND \(matches) ORDER BY seq DESC LIMIT ?) AS recent
                """, [asked.name] + filter + [last]) ?? stream.lastSeq + 1
        }
        let rows = try db.rows("""
            SELECT seq, subject, data, published_at, dead_letter FROM messages WHERE stream = ? AND seq >= ? AND \(matches) ORDER BY seq LIMIT ?
            """, [asked.name, from] + filter + [max])
        var out: [API.Message] = [], bytes = 0
        for row in rows {
            let data = try row.blob("data")
            guard out.isEmpty || bytes + data.count <= maxBytes else { break }
            out.append(try message(row, sequence: try row.int("seq"), data: data, deliveries: 0))
            bytes += data.count
        }
        // Read to the end: the next one is the stream's next, whatever the filter passed over.
        let next = out.count == rows.count && rows.count < max ? Swift.max(from, stream.lastSeq + 1) : (out.last.map { $0.sequence + 1 } ?? from)
        return API.Messages(messages: out, next: next)
    }

    /// A condition on a message's subject: that it starts with `filter`, when there is one
    /// (a consumer's, a reader's); with its arguments.
    private static func subjectMatches(_ filter: String?) -> (sql: String, arguments: [any SQLArgument]) {
        ("(CAST(? AS TEXT) IS NULL OR substr(subject, 1, length(?)) = ?)", [filter, filter, filter])
    }

    // MARK: State captured

    /// A change of the kernel's state as a capturing stream is handed it: `value` nil for a
    /// deletion.
    struct StateChange: Sendable {
        var key: String
        var sequence: Int
        var value: [UInt8]?
    }

    /// A stream that captures the kernel's state, and the state's sequence it holds changes to.
    struct Capture: Sendable, Equatable {
        var stream: String
        var subjects: [String]
        /// When the stream was made: a stream deleted and made again under its name is another.
        var created: Double
        var capturedSequence: Int

        /// The same stream as `other` (whatever each has captured since).
        func isTheStream(_ other: Capture) -> Bool {
            (stream, subjects, created) == (other.stream, other.subjects, other.created)
        }
    }

    static func captures(_ db: Database) throws -> [Capture] {
        try db.rows("SELECT name, created_at, captured_seq FROM streams WHERE capture_state = 1 ORDER BY name", []).map { row in
            let name = try row.text("name")
            return Capture(stream: name, subjects: try subjects(db, of: name), created: try row.double("created_at"),
                           capturedSequence: try row.int("captured_seq"))
        }
    }

    /// Keeps each change newer than the stream's captured sequence as a message (its key the
    /// subject, its data ``StreamsAPI/StateChange``), in the state's order, and moves the captured
    /// sequence past them: a change another process kept already is not kept again. `gap`: the
    /// kernel could not give every change since the last one kept (counted). `followed`: the
    /// stream the changes were followed for (deleted and made again since: -32004). Returns
    /// the captured sequence after.
    static func capture(_ db: Database, _ followed: Capture, changes: [StateChange], gap: Bool, maxMessageBytes: Int, removingAtMost most: Int,
                        now: Double) throws -> Int {
        let name = followed.stream
        var stream = try stream(db, name, locking: true)
        guard stream.captureState else {
            throw JSONRPCError.invalidParams(field: "name", "stream \(name) does not capture the kernel's state")
        }
        let subjects = try subjects(db, of: name)
        guard subjects == followed.subjects, stream.createdAt == followed.created else {
            throw JSONRPCError(code: JSONRPCError.conflictCode, message: "Conflict: stream \(name) was made again, capturing \(subjects.joined(separator: " "))")
        }
        var captured = stream.capturedSeq
        var kept: [Appended] = []
        for change in changes.sorted(by: { $0.sequence < $1.sequence }) where change.sequence > captured {
            captured = change.sequence
            guard subjects.contains(where: { change.key.hasPrefix($0) }) else { continue }
            kept.append((change.key, try stateChange(change, limit: min(stream.maxBytes, maxMessageBytes)), nil))
        }
        try append(db, &stream, kept, removingAtMost: most, now: now)
        try db.execute("UPDATE streams SET captured_seq = ?, capture_gaps = capture_gaps + ? WHERE name = ?", [captured, gap ? 1 : 0, name])
        return captured
    }

    /// A change's message data: its value when it is JSON and fits within `limit` bytes, else
    /// only its size.
    private static func stateChange(_ change: StateChange, limit: Int) throws -> [UInt8] {
        var kept = API.StateChange(sequence: change.sequence, value: nil)
        if let value = change.value {
            if let json = try? JSONValue(parsing: value) { kept.value = json } else { kept.valueBytes = value.count }
        }
        var data = try JSONValue(encoding: kept).jsonBytes
        if data.count > limit, let value = change.value {
            data = try JSONValue(encoding: API.StateChange(sequence: change.sequence, value: nil, valueBytes: value.count)).jsonBytes
        }
        return data
    }

    /// A message to append: its subject, data and why it is a dead letter (nil: it is not).
    private typealias Appended = (subject: String, data: [UInt8], deadLetter: String?)

    /// Adds `messages` at the stream's next sequences, in order, then removes the oldest past
    /// its limits and saves its counters: a few statements however many (a sync of the state
    /// captured brings every key under the stream's subjects at once).
    private static func append(_ db: Database, _ stream: inout Stream, _ messages: [Appended], removingAtMost most: Int, now: Double) throws {
        guard !messages.isEmpty else { return }
        var made: [Message] = []
        made.reserveCapacity(messages.count)
        for message in messages { made.append(next(&stream, subject: message.subject, data: message.data, deadLetter: message.deadLetter, now: now)) }
        try insert(db, made)
        try trim(db, &stream, removingAtMost: most, now: now)
    }

    /// A message to insert.
    private struct Message {
        var stream: String
        var sequence: Int
        var subject: String
        var data: [UInt8]
        var publishedAt: Double
        var deadLetter: String?
    }

    /// The stream's next message, counted in `stream` (its counters saved by ``trim(_:_:removingAtMost:now:)``).
    private static func next(_ stream: inout Stream, subject: String, data: [UInt8], deadLetter: String?, now: Double) -> Message {
        let sequence = stream.lastSeq + 1
        if stream.messages == 0 { stream.firstSeq = sequence }
        stream.lastSeq = sequence
        stream.messages += 1
        stream.bytes += data.count
        return Message(stream: stream.name, sequence: sequence, subject: subject, data: data, publishedAt: now, deadLetter: deadLetter)
    }

    /// Inserts `messages`, a statement for each ``messagesPerInsert`` of them.
    private static func insert(_ db: Database, _ messages: [Message]) throws {
        for start in stride(from: 0, to: messages.count, by: messagesPerInsert) {
            let some = messages[start..<min(start + messagesPerInsert, messages.count)]
            try db.execute("INSERT INTO messages (stream, seq, subject, data, published_at, dead_letter) VALUES " + SQLRows.placeholders(rows: some.count, columns: 6),
                           some.flatMap { message -> [any SQLArgument] in
                               [message.stream, message.sequence, message.subject, message.data, message.publishedAt, message.deadLetter]
                           })
        }
    }

    /// The most messages one INSERT takes: six placeholders each, within what both engines
    /// take in a statement (SQLite 32,766, PostgreSQL 65,535).
    static let messagesPerInsert = 1_000

    /// Removes the oldest messages while the stream is past one of its limits (count, bytes,
    /// age), as ``dropPastLimits(_:_:removingAtMost:now:)`` does (and says what it says), and
    /// saves its counters.
    @discardableResult
    static func trim(_ db: Database, _ stream: inout Stream, removingAtMost most: Int, now: Double) throws -> Bool {
        let complete = try dropPastLimits(db, &stream, removingAtMost: most, now: now)
        try save(db, stream)
        return complete
    }

    /// Removes the oldest messages while the stream is past one of its limits (count, bytes,
    /// age), together (``removeAll(_:_:before:subject:)``): a few statements however many go
    /// (a burst of messages reaching its age at once), where statements for each would hold a
    /// publish's transaction past its timeout. Past its age, at most the `most` oldest
    /// sequences go: a stream whose messages all reached it while nobody removed them (the
    /// service stopped, the clock moved) would have millions go in one transaction, past
    /// PostgreSQL's timeout. Returns false when more past the age may be left, which the next
    /// publishes and fetches, and the service's look for them (``removeExpired(_:_:atMost:now:)``),
    /// remove a transaction at a time. Its counters are the caller's to save.
    private static func dropPastLimits(_ db: Database, _ stream: inout Stream, removingAtMost most: Int, now: Double) throws -> Bool {
        let kept = try keptWithinLimits(db, stream, removingAtMost: most, now: now)
        try removeAll(db, &stream, before: kept.first)
        return kept.complete
    }

    /// What ``dropPastLimits(_:_:removingAtMost:now:)`` would keep: the first sequence it
    /// leaves, and whether none past the limits would be left after it.
    private static func keptWithinLimits(_ db: Database, _ stream: Stream, removingAtMost most: Int, now: Double) throws -> (first: Int, complete: Bool) {
        // Within its count and bytes, only a stream with an age limit can have one to remove.
        guard stream.messages > 0, stream.messages > stream.maxMessages || stream.bytes > stream.maxBytes || stream.maxAge != nil else {
            return (stream.firstSeq, true)
        }
        return try firstWithinLimits(db, stream, now: now, ageLookedAt: most)
    }

    /// Removes messages of a work queue that are done with (acknowledged, terminated, moved to
    /// the dead letters): nobody counts them missed, as its one consumer had them. Together,
    /// in a few statements however many (at most ``mostPerStatement``), where a statement for
    /// each would hold the acknowledgement of a full batch near PostgreSQL's timeout.
    private static func removeDone(_ db: Database, _ stream: inout Stream, sequences: [Int]) throws {
        guard !sequences.isEmpty else { return }
        let among = " AND seq IN " + SQLRows.placeholders(rows: 1, columns: sequences.count)
        let arguments: [any SQLArgument] = [stream.name] + sequences
        try db.execute("DELETE FROM pending WHERE stream = ?" + among, arguments)
        let gone = try db.rows("DELETE FROM messages WHERE stream = ?" + among + " RETURNING seq, length(data) AS size", arguments)
        stream.messages -= gone.count
        stream.bytes -= try gone.reduce(0) { $0 + (try $1.int("size")) }
        if try gone.contains(where: { try $0.int("seq") == stream.firstSeq }) {
            stream.firstSeq = try db.int("SELECT MIN(seq) FROM messages WHERE stream = ?", [stream.name]) ?? stream.lastSeq + 1
        }
    }

    /// Saves the stream's counters; with `read`, only when they differ from what was read (a
    /// write that removed nothing leaves the row as it was).
    private static func save(_ db: Database, _ stream: Stream, readAs read: Stream? = nil) throws {
        if let read, (read.messages, read.bytes, read.firstSeq, read.lastSeq, read.ids) == (stream.messages, stream.bytes, stream.firstSeq, stream.lastSeq, stream.ids) {
            return
        }
        try db.execute("UPDATE streams SET messages = ?, bytes = ?, first_seq = ?, last_seq = ?, ids = ? WHERE name = ?",
                       [stream.messages, stream.bytes, stream.firstSeq, stream.lastSeq, stream.ids, stream.name])
    }

    // MARK: Consumers

    /// A consumer's row, its counts included.
    struct Consumer {
        var stream: String
        var name: String
        var config: String
        var filter: String?
        var ackWait: Double
        var maxDeliver: Int
        var nextSeq: Int
        var createdAt: Double
        var delivered: Int, redelivered: Int, acknowledged: Int, deadLettered: Int, terminated: Int, missed: Int
        /// Of `missed`, how many its readers have been told of (by a fetch).
        var missedTold: Int
        /// The CURVE key that added it (nil: added without CURVE).
        var owner: String?
        /// The most messages pending at once its creator asked (nil: none asked).
        var maxAckPending: Int?

        /// The most messages pending at once: its own, within the service's `most` (which a
        /// consumer added before the service had one, or before it was lowered, may be over).
        func mostPending(within most: Int) -> Int { min(maxAckPending ?? most, most) }

        init(row: SQLRow) throws {
            (stream, name, config, filter) = (try row.text("stream"), try row.text("name"), try row.text("config"), try row.optionalText("filter"))
            maxAckPending = try row.optionalInt("max_ack_pending")
            (ackWait, maxDeliver, nextSeq, createdAt) = (try row.double("ack_wait"), try row.int("max_deliver"), try row.int("next_seq"), try row.double("created_at"))
            (delivered, redelivered, acknowledged) = (try row.int("delivered"), try row.int("redelivered"), try row.int("acknowledged"))
            (deadLettered, terminated, missed) = (try row.int("dead_lettered"), try row.int("terminated"), try row.int("missed"))
            missedTold = try row.int("missed_told")
            owner = try row.optionalText("owner")
        }
    }

    /// The consumer `name` of `stream`, if there is one.
    private static func findConsumer(_ db: Database, stream: String, name: String) throws -> Consumer? {
        try db.row("SELECT * FROM consumers WHERE stream = ? AND name = ?", [stream, name]).map(Consumer.init(row:))
    }

    static func consumer(_ db: Database, stream: String, name: String) throws -> Consumer {
        guard let consumer = try findConsumer(db, stream: stream, name: name) else {
            _ = try self.stream(db, stream)
            throw JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: stream \(stream) has no consumer \(name)",
                               data: ["stream": .string(stream), "consumer": .string(name)])
        }
        return consumer
    }

    /// Creates a consumer: `config` is what its creator asked (compared when the same name is
    /// added again, its `maxAckPending` 0 made none), the rest with the defaults filled in.
    static func addConsumer(_ db: Database, _ asked: API.ConsumerConfig, config: JSONValue, ackWait: Double, maxDeliver: Int, atMost most: Int,
                            by caller: CallerIdentity?, quota: ClientQuota, now: Double) throws -> API.ConsumerInfo {
        let stream = try stream(db, asked.stream, locking: true)
        if let existing = try findConsumer(db, stream: asked.stream, name: asked.name) {
            let current = try JSONValue(parsing: Array(existing.config.utf8))
            guard current == config else {
                throw JSONRPCError(code: JSONRPCError.conflictCode,
                                   message: "Conflict: stream \(asked.stream) has a consumer \(asked.name) with other settings (\(differences(current: current, asked: config))): consumer.update changes its filter, ack wait, maximum deliveries and most pending; see data.current",
                                   data: ["current": try JSONValue(encoding: try info(db, existing))])
            }
            return try info(db, existing)
        }
        let consumers = try db.int("SELECT COUNT(*) FROM consumers WHERE stream = ?", [asked.stream]) ?? 0
        guard consumers < most else { throw tooMany("consumers of stream \(asked.stream)", limit: most, setting: "streams.max_consumers", remedy: "delete one first") }
        if let key = quota.binding(caller) {
            try db.lockAll(addingConsumers)
            guard try db.int("SELECT COUNT(*) FROM consumers WHERE owner = ?", [key]) ?? 0 < quota.consumers else {
                throw tooMany("consumers", limit: quota.consumers, setting: "streams.client_max_consumers", remedy: "delete one first", perKey: true)
            }
        }
        if stream.retention == .workQueue,
           let other = try db.texts("SELECT name FROM consumers WHERE stream = ?", [asked.stream]).first {
            throw JSONRPCError(code: JSONRPCError.conflictCode,
                               message: "Conflict: work-queue stream \(asked.stream) has its consumer (\(other)); its readers share it",
                               data: ["consumer": .string(other)])
        }
        let next: Int
        if let sequence = asked.startSequence {
            next = sequence
        } else if let time = asked.startTime.flatMap(Timestamp.parse) {
            next = try db.int("SELECT MIN(seq) FROM messages WHERE stream = ? AND published_at >= ?",
                              [asked.stream, time.timeIntervalSince1970]) ?? stream.lastSeq + 1
        } else if asked.deliver == .new {
            next = stream.lastSeq + 1
        } else {
            next = stream.firstSeq
        }
        try db.execute("""
            INSERT INTO consumers (stream, name, config, filter, ack_wait, max_deliver, max_ack_pending, next_seq, created_at, owner)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """, [asked.stream, asked.name, String(decoding: config.jsonBytes, as: UTF8.self), asked.filter, ackWait, maxDeliver, asked.maxAckPending, next, now, caller?.key])
        return try info(db, try consumer(db, stream: asked.stream, name: asked.name))
    }

    static func info(_ db: Database, _ consumer: Consumer) throws -> API.ConsumerInfo {
        try infos(db, stream: try stream(db, consumer.stream), [consumer])[0]
    }

    /// Every consumer of the stream (none: -32003), as ``info(_:_:)`` gives each, counted
    /// together: what is waiting once for each filter, not once for each consumer.
    static func consumers(_ db: Database, stream name: String) throws -> API.ConsumerList {
        let stream = try stream(db, name)
        let consumers = try db.rows("SELECT * FROM consumers WHERE stream = ? ORDER BY name", [name]).map(Consumer.init(row:))
        return API.ConsumerList(consumers: try infos(db, stream: stream, consumers))
    }

    /// The infos of `consumers`: every consumer of `stream`, or one of them.
    private static func infos(_ db: Database, stream: Stream, _ consumers: [Consumer]) throws -> [API.ConsumerInfo] {
        var pending: [String: Int] = [:]
        if consumers.count == 1, let consumer = consumers.first {
            pending[consumer.name] = try db.int("SELECT COUNT(*) FROM pending WHERE stream = ? AND consumer = ?", [stream.name, consumer.name])
        } else {
            for row in try db.rows("SELECT consumer, COUNT(*) AS n FROM pending WHERE stream = ? GROUP BY consumer", [stream.name]) {
                pending[try row.text("consumer")] = try row.int("n")
            }
        }
        let waiting = try waiting(db, stream, consumers)
        return consumers.map { info($0, pending: pending[$0.name] ?? 0, waiting: waiting[$0.name] ?? 0) }
    }

    /// What waits for each of `consumers` (the messages from its position on that its filter
    /// takes), by name: for each filter, the messages from its consumers' first position on,
    /// counted a run between two of their positions at a time, a consumer's being the runs
    /// from its position on; without a filter, from whichever end of the stream is nearer
    /// their positions (the stream's count less those before them). Each run is a statement of
    /// its own, which PostgreSQL scans in parallel when it is long; counted together, in
    /// subqueries of one statement, it scans them one after another.
    private static func waiting(_ db: Database, _ stream: Stream, _ consumers: [Consumer]) throws -> [String: Int] {
        var waiting: [String: Int] = [:]
        for (filter, group) in Dictionary(grouping: consumers, by: \.filter) {
            let positions = Set(group.map(\.nextSeq)).sorted()
            let (matches, filterArguments) = subjectMatches(filter)
            func count(from lower: Int, before upper: Int) throws -> Int {
                try db.int("SELECT COUNT(*) FROM messages WHERE stream = ? AND seq >= ? AND seq < ? AND \(matches)", [stream.name, lower, upper] + filterArguments) ?? 0
            }
            var waitingFrom: [Int: Int] = [:]
            if filter == nil, positions.last! - stream.firstSeq < stream.lastSeq - positions.first! {
                var before = 0, lower = stream.firstSeq
                for position in positions {
                    before += try count(from: lower, before: position)
                    (waitingFrom[position], lower) = (stream.messages - before, position)
                }
            } else {
                var from = 0, upper = Int.max
                for position in positions.reversed() {
                    from += try count(from: position, before: upper)
                    (waitingFrom[position], upper) = (from, position)
                }
            }
            for consumer in group { waiting[consumer.name] = waitingFrom[consumer.nextSeq] }
        }
        return waiting
    }

    private static func info(_ consumer: Consumer, pending: Int, waiting: Int) -> API.ConsumerInfo {
        var info = API.ConsumerInfo(stream: consumer.stream, name: consumer.name, filter: consumer.filter, ackWait: consumer.ackWait,
                                    maxDeliver: consumer.maxDeliver, nextSequence: consumer.nextSeq, pending: pending, waiting: waiting,
                                    delivered: consumer.delivered, redelivered: consumer.redelivered, acknowledged: consumer.acknowledged,
                                    deadLettered: consumer.deadLettered, terminated: consumer.terminated, missed: consumer.missed,
                                    created: Timestamp.format(seconds: consumer.createdAt))
        info.addedBy = consumer.owner
        info.maxAckPending = consumer.maxAckPending
        return info
    }

    /// Changes the consumer's filter ("": none), ack wait, maximum deliveries and most pending
    /// (0: no limit), for the keys that may delete it. A new filter chooses among the messages
    /// from its position on; what it passed over stays behind it. What its creator asked is
    /// changed with them, so adding it again with its settings as they are now changes nothing,
    /// and with those it had is a conflict. Pending messages keep their deadlines: the new
    /// settings apply as each is handed out (or again) from now on.
    static func updateConsumer(_ db: Database, _ asked: API.ConsumerSettings, by caller: CallerIdentity?) throws -> API.ConsumerInfo {
        var consumer = try consumerToChange(db, stream: asked.stream, name: asked.name, by: caller)
        guard case .object(var config) = try JSONValue(parsing: Array(consumer.config.utf8)) else {
            throw JSONRPCError.internalError("consumer \(asked.name) of stream \(asked.stream) has settings that are not an object")
        }
        if let filter = asked.filter {
            consumer.filter = filter.isEmpty ? nil : filter
            config["filter"] = consumer.filter.map { .string($0) }
        }
        if let ackWait = asked.ackWait { (consumer.ackWait, config["ackWait"]) = (ackWait, try JSONValue(encoding: ackWait)) }
        if let maxDeliver = asked.maxDeliver { (consumer.maxDeliver, config["maxDeliver"]) = (maxDeliver, try JSONValue(encoding: maxDeliver)) }
        if let most = asked.maxAckPending {
            consumer.maxAckPending = pendingLimit(most)
            config["maxAckPending"] = consumer.maxAckPending.map { .int(Int64($0)) }
        }
        consumer.config = String(decoding: JSONValue.object(config).jsonBytes, as: UTF8.self)
        try db.execute("UPDATE consumers SET filter = ?, ack_wait = ?, max_deliver = ?, max_ack_pending = ?, config = ? WHERE stream = ? AND name = ?",
                       [consumer.filter, consumer.ackWait, consumer.maxDeliver, consumer.maxAckPending, consumer.config, asked.stream, asked.name])
        return try info(db, consumer)
    }

    /// The consumer `name` of `stream`, its stream locked, if `caller` may change or delete it:
    /// the key that added it, the stream's, or an operator's (``checkMayChange(_:addedBy:_:)``).
    private static func consumerToChange(_ db: Database, stream: String, name: String, by caller: CallerIdentity?) throws -> Consumer {
        let owner = try self.stream(db, stream, locking: true).owner
        let consumer = try consumer(db, stream: stream, name: name)
        if caller?.key != owner { try checkMayChange("consumer \(name) of stream \(stream)", addedBy: consumer.owner, caller) }
        return consumer
    }

    /// A consumer goes by the key that added it, or by its stream's (``checkMayChange(_:addedBy:_:)``).
    static func deleteConsumer(_ db: Database, stream: String, name: String, by caller: CallerIdentity?) throws -> API.Removed {
        _ = try consumerToChange(db, stream: stream, name: name, by: caller)
        try db.execute("DELETE FROM pending WHERE stream = ? AND consumer = ?", [stream, name])
        try db.execute("DELETE FROM consumers WHERE stream = ? AND name = ?", [stream, name])
        return API.Removed(messages: 0)
    }

    // MARK: Fetching

    /// Whether a fetch would hand something out now: a pending message past its deadline, or
    /// one not handed out yet while the consumer has room for one more pending (its most, at
    /// most `mostPending`, the service's); of the messages the stream's limits keep, as the
    /// fetch removes the others first. None while more are past their age than the fetch
    /// removes (`most`): it would remove some and hand out nothing, and a waiting fetch would
    /// end empty where it should wait on.
    static func ready(_ db: Database, stream name: String, consumer consumerName: String, mostPending: Int,
                      removingAtMost most: Int, now: Double) throws -> Bool {
        let kept = try keptWithinLimits(db, try stream(db, name), removingAtMost: most, now: now)
        guard kept.complete else { return false }
        let consumer = try consumer(db, stream: name, name: consumerName)
        let (matches, filter) = subjectMatches(consumer.filter)
        return try db.row("""
            SELECT EXISTS (SELECT 1 FROM pending WHERE stream = ? AND consumer = ? AND deadline <= ? AND seq >= ?)
                OR (EXISTS (SELECT 1 FROM messages WHERE stream = ? AND seq >= ? AND \(matches))
                    AND (SELECT COUNT(*) FROM pending WHERE stream = ? AND consumer = ?) < ?) AS ready
            """, [name, consumerName, now, kept.first, name, max(consumer.nextSeq, kept.first)] + filter
                + [name, consumerName, consumer.mostPending(within: mostPending)])?.bool("ready") ?? false
    }

    /// What one reader asks of a fetch: up to `batch` messages and `maxBytes` of their data
    /// (always one when one is ready).
    struct Ask: Equatable, Sendable {
        var batch: Int
        var maxBytes: Int
    }

    /// Hands out to each of `asks` in turn what a fetch of its own would, one after another:
    /// first the messages whose ack deadline passed (oldest first; past `max_deliver`
    /// deliveries one goes to the dead-letter stream instead), then the next ones not handed
    /// out, as many as its most pending allows. Each is pending until `now + ack_wait`. The
    /// first is told what the consumer missed.
    /// The asks' batches come to at most ``mostPerStatement``.
    static func fetch(_ db: Database, stream name: String, consumer consumerName: String, _ asks: [Ask], mostPending: Int,
                      removingAtMost most: Int, now: Double) throws -> [API.Fetched] {
        var stream = try stream(db, name, locking: true)
        let read = stream
        guard try dropPastLimits(db, &stream, removingAtMost: most, now: now) else {
            // More past their age than a transaction removes: nothing is handed out until they
            // are gone (this fetch removed the oldest of them), as none past its age may be.
            try save(db, stream, readAs: read)
            return asks.map { _ in API.Fetched(messages: [], missed: 0) }
        }
        // Read after the limits are kept: the messages they removed are in its `missed`.
        var consumer = try consumer(db, stream: name, name: consumerName)
        var handout = Handout(asks)
        var delivered = 0, redelivered = 0, deadLettered = 0
        let due = try db.rows("""
            SELECT p.seq, p.deliveries, m.subject, m.data, m.published_at, m.dead_letter
            FROM pending p JOIN messages m ON m.stream = p.stream AND m.seq = p.seq
            WHERE p.stream = ? AND p.consumer = ? AND p.deadline <= ? ORDER BY p.seq LIMIT ?
            """, [name, consumerName, now, handout.room])
        var dueAgain: [any SQLArgument] = [], givenUp: [GivenUp] = []
        for row in due {
            let sequence = try row.int("seq"), deliveries = try row.int("deliveries"), data = try row.blob("data")
            if deliveries >= consumer.maxDeliver {
                givenUp.append(GivenUp(sequence: sequence, deliveries: deliveries, subject: try row.text("subject"), data: data))
                continue
            }
            guard handout.fits(data.count) else { break }
            handout.add(try message(row, sequence: sequence, data: data, deliveries: deliveries + 1), size: data.count)
            dueAgain.append(sequence)
            // One given back undelivered (``Outcome/undelivered``) is handed out the first time now.
            if deliveries == 0 { delivered += 1 } else { redelivered += 1 }
        }
        try giveUp(db, &stream, consumer: consumer, givenUp, removingAtMost: most, now: now)
        deadLettered = givenUp.count
        if !dueAgain.isEmpty {
            try db.execute("UPDATE pending SET deliveries = deliveries + 1, deadline = ? WHERE stream = ? AND consumer = ? AND seq IN "
                               + SQLRows.placeholders(rows: 1, columns: dueAgain.count), [now + consumer.ackWait, name, consumerName] + dueAgain)
        }
        // New messages, as many as the readers have room for; with its most pending reached, a
        // consumer hands out only what is due again (counted only when there is room at all).
        var asked = handout.stopped ? 0 : handout.room
        if asked > 0 {
            asked = min(asked, consumer.mostPending(within: mostPending)
                            - (try db.int("SELECT COUNT(*) FROM pending WHERE stream = ? AND consumer = ?", [name, consumerName]) ?? 0))
        }
        if asked > 0 {
            let (matches, filter) = subjectMatches(consumer.filter)
            let fresh = try db.rows("""
                SELECT seq, subject, data, published_at, dead_letter FROM messages
                WHERE stream = ? AND seq >= ? AND \(matches) ORDER BY seq LIMIT ?
                """, [name, consumer.nextSeq] + filter + [asked])
            var handedOut: [any SQLArgument] = []
            for row in fresh {
                let sequence = try row.int("seq"), data = try row.blob("data")
                guard handout.fits(data.count) else { break }
                handedOut += [name, consumerName, sequence, 1, now + consumer.ackWait]
                handout.add(try message(row, sequence: sequence, data: data, deliveries: 1), size: data.count)
                delivered += 1
                consumer.nextSeq = sequence + 1
            }
            if !handedOut.isEmpty {
                try db.execute("INSERT INTO pending (stream, consumer, seq, deliveries, deadline) VALUES " + SQLRows.placeholders(rows: handedOut.count / 5, columns: 5),
                               handedOut)
            }
            // Nothing further matches: what is past it was passed over by the filter.
            if !handout.stopped, fresh.count < asked { consumer.nextSeq = max(consumer.nextSeq, stream.lastSeq + 1) }
        }
        try db.execute("""
            UPDATE consumers SET next_seq = ?, delivered = delivered + ?, redelivered = redelivered + ?, dead_lettered = dead_lettered + ?,
                missed_told = missed WHERE stream = ? AND name = ?
            """, [consumer.nextSeq, delivered, redelivered, deadLettered, name, consumerName])
        try save(db, stream, readAs: read)
        return handout.messages.enumerated().map { index, messages in
            API.Fetched(messages: messages, missed: index == 0 ? consumer.missed - consumer.missedTold : 0)
        }
    }

    /// The messages one fetch hands out to several readers: each reader's in turn, until it has
    /// its batch, or the next message would take it past its bytes (a reader with none takes
    /// one whatever its size).
    private struct Handout {
        let asks: [Ask]
        private(set) var messages: [[API.Message]]
        /// The reader being handed messages, and the bytes it has.
        private var current = 0, bytes = 0
        /// A message found no reader with room for it: what is after it waits for the next fetch.
        private(set) var stopped = false

        init(_ asks: [Ask]) {
            self.asks = asks
            messages = Array(repeating: [], count: asks.count)
        }

        /// How many more messages the readers have room for, their bytes aside.
        var room: Int {
            guard current < asks.count else { return 0 }
            return asks[current].batch - messages[current].count + asks[(current + 1)...].reduce(0) { $0 + $1.batch }
        }

        /// Whether a reader has room for a message of `size` bytes, going on to the next reader
        /// when this one has none.
        mutating func fits(_ size: Int) -> Bool {
            while current < asks.count {
                let taken = messages[current]
                if taken.isEmpty || (taken.count < asks[current].batch && bytes + size <= asks[current].maxBytes) { return true }
                current += 1
                bytes = 0
            }
            stopped = true
            return false
        }

        /// Hands `message` to the reader ``fits(_:)`` found.
        mutating func add(_ message: API.Message, size: Int) {
            messages[current].append(message)
            bytes += size
        }
    }

    /// ``Outcome/undelivered`` for the pending messages `sequences` of the consumer `key`
    /// (stream, consumer): due at once, each one's last hand-out taken back from its count and
    /// the consumer's; together, in two statements however many. The sequences changed.
    private static func giveBackUndelivered(_ db: Database, _ key: [any SQLArgument], _ sequences: [Int], now: Double) throws -> Set<Int> {
        let among = " AND seq IN " + SQLRows.placeholders(rows: 1, columns: sequences.count)
        let pending: [any SQLArgument] = key + sequences
        try db.execute("""
            UPDATE consumers SET delivered = delivered - (SELECT COUNT(*) FROM pending WHERE stream = ? AND consumer = ? AND deliveries = 1\(among)),
                redelivered = redelivered - (SELECT COUNT(*) FROM pending WHERE stream = ? AND consumer = ? AND deliveries > 1\(among))
            WHERE stream = ? AND name = ?
            """, pending + pending + key)
        return Set(try db.rows("UPDATE pending SET deliveries = deliveries - 1, deadline = ? WHERE stream = ? AND consumer = ? AND deliveries > 0"
                                   + among + " RETURNING seq", [now] + pending).map { try $0.int("seq") })
    }

    private static func message(_ row: SQLRow, sequence: Int, data: [UInt8], deliveries: Int) throws -> API.Message {
        let deadLetter = try row.optionalText("dead_letter").map { try JSONValue(parsing: Array($0.utf8)).decode(as: API.DeadLetter.self) }
        return API.Message(sequence: sequence, subject: try row.text("subject"), data: try JSONValue(parsing: data),
                           published: Timestamp.format(seconds: try row.double("published_at")), deliveries: deliveries, deadLetter: deadLetter)
    }

    /// A message handed out `max_deliver` times without being done.
    private struct GivenUp {
        var sequence: Int
        var deliveries: Int
        var subject: String
        var data: [UInt8]
    }

    /// Messages handed out `max_deliver` times without being done: they go to the stream's
    /// dead-letter stream with why (a dead-letter stream's own are only dropped), and leave
    /// the consumer's pending messages (and a work queue); together, in a few statements
    /// however many.
    private static func giveUp(_ db: Database, _ stream: inout Stream, consumer: Consumer, _ givenUp: [GivenUp], removingAtMost most: Int,
                               now: Double) throws {
        guard !givenUp.isEmpty else { return }
        if let deadLetters = stream.deadLetters {
            var target = try self.stream(db, deadLetters, locking: true)
            let name = stream.name
            try append(db, &target, try givenUp.map { message in
                let why = API.DeadLetter(reason: "handed out \(message.deliveries) times (max_deliver) without an acknowledgement", stream: name,
                                         sequence: message.sequence, consumer: consumer.name, deliveries: message.deliveries)
                return (message.subject, message.data, String(decoding: try JSONValue(encoding: why).jsonBytes, as: UTF8.self))
            }, removingAtMost: most, now: now)
        }
        let sequences = givenUp.map(\.sequence)
        try db.execute("DELETE FROM pending WHERE stream = ? AND consumer = ? AND seq IN " + SQLRows.placeholders(rows: 1, columns: sequences.count),
                       [stream.name, consumer.name] + sequences)
        if stream.retention == .workQueue {
            try removeDone(db, &stream, sequences: sequences)
        }
    }

    // MARK: Acknowledging

    /// What a reader says of messages it was handed.
    enum Outcome: Equatable, Sendable {
        /// Done: not handed out again.
        case ack
        /// Given back: handed out again once `delay` seconds have passed.
        case nak(delay: Double)
        /// Still being worked on: the ack deadline starts again.
        case progress
        /// Not to be done: not handed out again, not dead-lettered.
        case term
        /// Handed out but never sent to its reader (the reader's stream of parts ended
        /// first): handed out again at once, this hand-out not counted.
        case undelivered
    }

    /// Applies `outcome` to each sequence of each of `settlements` (one reader's request each, in
    /// turn) that is pending for the consumer; the others are answered as not pending, as is a
    /// sequence named again after it was settled. On a work-queue stream, a message done or
    /// terminated is deleted. The settlements' sequences come to at most ``mostPerStatement``.
    static func settle(_ db: Database, stream name: String, consumer consumerName: String, _ settlements: [[Int]], _ outcome: Outcome,
                       now: Double) throws -> [API.Acknowledged] {
        var stream = try stream(db, name, locking: true)
        let read = stream
        let consumer = try consumer(db, stream: name, name: consumerName)
        let named = Array(Set(settlements.joined())).sorted()
        let key: [any SQLArgument] = [name, consumerName], namedArguments: [any SQLArgument] = named
        let among = " AND seq IN " + SQLRows.placeholders(rows: 1, columns: named.count) + " RETURNING seq"
        var changed: Set<Int> = []
        switch outcome {
        case .ack, .term:
            changed = Set(try db.rows("DELETE FROM pending WHERE stream = ? AND consumer = ?" + among, key + namedArguments).map { try $0.int("seq") })
        case .nak(let delay):
            changed = Set(try db.rows("UPDATE pending SET deadline = ? WHERE stream = ? AND consumer = ?" + among, [now + delay] + key + namedArguments)
                .map { try $0.int("seq") })
        case .progress:
            changed = Set(try db.rows("UPDATE pending SET deadline = ? WHERE stream = ? AND consumer = ?" + among, [now + consumer.ackWait] + key + namedArguments)
                .map { try $0.int("seq") })
        case .undelivered:
            changed = try giveBackUndelivered(db, key, named, now: now)
        }
        if outcome == .ack || outcome == .term, stream.retention == .workQueue {
            try removeDone(db, &stream, sequences: changed.sorted())
        }
        switch outcome {
        case .ack: try db.execute("UPDATE consumers SET acknowledged = acknowledged + ? WHERE stream = ? AND name = ?", [changed.count, name, consumerName])
        case .term: try db.execute("UPDATE consumers SET terminated = terminated + ? WHERE stream = ? AND name = ?", [changed.count, name, consumerName])
        case .nak, .progress, .undelivered: break
        }
        try save(db, stream, readAs: read)
        // Each sequence is done for the first settlement that names it.
        return settlements.map { sequences in
            var done: [Int] = [], notPending: [Int] = []
            for sequence in sequences {
                if changed.remove(sequence) != nil { done.append(sequence) } else { notPending.append(sequence) }
            }
            return API.Acknowledged(done: done, notPending: notPending)
        }
    }

    // MARK: Writes of several readers

    /// The most messages (a fetch's batches) or sequences (a settlement's) one statement takes:
    /// as many as one request may name, so a statement's placeholders stay within what both
    /// engines take (SQLite's 32,766).
    static let mostPerStatement = 1_000

    /// The most fetches and settlements one transaction takes: what comes next waits for the
    /// whole transaction and the rows it locks.
    static let consumerWritesPerTransaction = 64

    /// A fetch or a settlement one reader asked for, and the request it answers.
    struct ConsumerWrite: Sendable {
        enum Kind: Equatable, Sendable {
            case fetch(Ask)
            case settle(sequences: [Int], Outcome)
        }

        var stream: String
        var consumer: String
        var kind: Kind
        /// The request it answers (nil: none to remember it by).
        var request: String?

        /// What one statement gives all the writes of a group: messages or sequences.
        var size: Int {
            switch kind {
            case .fetch(let ask): ask.batch
            case .settle(let sequences, _): sequences.count
            }
        }

        /// Whether `other` can be done in the same statements: the same consumer, and both
        /// fetches or both settlements with the same outcome.
        func goesWith(_ other: ConsumerWrite) -> Bool {
            guard stream == other.stream, consumer == other.consumer else { return false }
            switch (kind, other.kind) {
            case (.fetch, .fetch): return true
            case (.settle(_, let outcome), .settle(_, let otherOutcome)): return outcome == otherOutcome
            default: return false
            }
        }
    }

    /// Runs `writes` in one transaction, answering each one's result (``API/Fetched`` or
    /// ``API/Acknowledged``) as if it had been run alone: what came together is concurrent, so
    /// any order is one they could have had. They are run by stream in name order (the order
    /// every batch locks them in), and those of one consumer and kind together, a few
    /// statements for all of them. Several writes: one for a consumer that is not there is
    /// refused alone, found before anything is written (one query for all of them), so a
    /// reader that names the wrong consumer does not fail the others' transaction.
    static func write(_ db: Database, _ writes: [ConsumerWrite], mostPending: Int, removingAtMost most: Int,
                      now: Double) throws -> [Result<JSONValue, JSONRPCError>] {
        var results: [Result<JSONValue, JSONRPCError>?] = Array(repeating: nil, count: writes.count)
        if writes.count > 1 {
            for (index, refusal) in try refusals(db, writes) { results[index] = .failure(refusal) }
        }
        let order = writes.indices.filter { results[$0] == nil }.sorted { a, b in
            let (first, second) = (writes[a], writes[b])
            if first.stream != second.stream { return first.stream < second.stream }
            if first.consumer != second.consumer { return first.consumer < second.consumer }
            return a < b
        }
        var remaining = order
        while !remaining.isEmpty {
            let first = remaining.removeFirst(), lead = writes[first]
            // With the first, the rest of its consumer's writes that go with it, in order, while
            // they fit in one statement; the others are a later group's.
            var group = [first], size = lead.size
            for index in remaining where writes[index].goesWith(lead) && size + writes[index].size <= mostPerStatement {
                group.append(index)
                size += writes[index].size
            }
            remaining.removeAll { group.contains($0) }
            switch lead.kind {
            case .fetch:
                let asks = group.map { index -> Ask in
                    guard case .fetch(let ask) = writes[index].kind else { preconditionFailure("a group of fetches holds only fetches") }
                    return ask
                }
                for (index, fetched) in zip(group, try fetch(db, stream: lead.stream, consumer: lead.consumer, asks, mostPending: mostPending, removingAtMost: most, now: now)) {
                    results[index] = .success(try JSONValue(encoding: fetched))
                }
            case .settle(_, let outcome):
                let settlements = group.map { index -> [Int] in
                    guard case .settle(let sequences, _) = writes[index].kind else { preconditionFailure("a group of settlements holds only settlements") }
                    return sequences
                }
                for (index, acknowledged) in zip(group, try settle(db, stream: lead.stream, consumer: lead.consumer, settlements, outcome, now: now)) {
                    results[index] = .success(try JSONValue(encoding: acknowledged))
                }
            }
        }
        return results.map { $0! }
    }

    /// The writes whose consumer is not there, with why (no such stream, or no such consumer).
    private static func refusals(_ db: Database, _ writes: [ConsumerWrite]) throws -> [Int: JSONRPCError] {
        let named = Array(Set(writes.map { [$0.stream, $0.consumer] }))
        let found = Set(try db.rows("SELECT stream, name FROM consumers WHERE (stream, name) IN (VALUES " + SQLRows.placeholders(rows: named.count, columns: 2) + ")",
                                    named.flatMap { $0 }).map { [try $0.text("stream"), try $0.text("name")] })
        var why: [[String]: JSONRPCError] = [:]
        for missing in named where !found.contains(missing) {
            do {
                _ = try consumer(db, stream: missing[0], name: missing[1])
            } catch let refusal as JSONRPCError {
                why[missing] = refusal
            }
        }
        var refusals: [Int: JSONRPCError] = [:]
        for (index, write) in writes.enumerated() {
            if let refusal = why[[write.stream, write.consumer]] { refusals[index] = refusal }
        }
        return refusals
    }
}
