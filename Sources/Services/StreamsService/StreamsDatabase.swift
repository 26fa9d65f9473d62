import BusProtocol
import Contracts
import Foundation
import GRDB

/// What the streams service does in its database, one function per operation, each run in
/// one transaction (a write's by ``SQLiteWriter``) at the time `now` (Unix seconds) it is
/// handed. The service has checked the params' shapes; these check what only the database
/// knows (names taken, subjects held, what is pending).
enum StreamsDatabase {
    typealias API = StreamsAPI

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
        var createdAt: Double

        init(row: Row) {
            name = row["name"]
            retention = API.Retention(rawValue: row["retention"]) ?? .limits
            (maxMessages, maxBytes, maxAge, duplicateWindow) = (row["max_messages"], row["max_bytes"], row["max_age"], row["duplicate_window"])
            deadLetters = row["dead_letters"]
            (messages, bytes, firstSeq, lastSeq, createdAt) = (row["messages"], row["bytes"], row["first_seq"], row["last_seq"], row["created_at"])
        }

        init(_ config: Settings, deadLetters: String?, now: Double) {
            (name, retention, maxMessages, maxBytes, maxAge, duplicateWindow)
                = (config.name, config.retention, config.maxMessages, config.maxBytes, config.maxAge, config.duplicateWindow)
            self.deadLetters = deadLetters
            (messages, bytes, firstSeq, lastSeq, createdAt) = (0, 0, 1, 0, now)
        }
    }

    /// A stream's settings with the defaults filled in.
    struct Settings: Equatable {
        var name: String
        var subjects: [String]
        var retention: API.Retention
        var maxMessages: Int
        var maxBytes: Int
        var maxAge: Double?
        var duplicateWindow: Double
    }

    static func stream(_ db: Database, _ name: String) throws -> Stream {
        guard let row = try Row.fetchOne(db, sql: "SELECT * FROM streams WHERE name = ?", arguments: [name]) else {
            throw JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: no stream \(name)", data: ["stream": .string(name)])
        }
        return Stream(row: row)
    }

    static func subjects(_ db: Database, of name: String) throws -> [String] {
        try String.fetchAll(db, sql: "SELECT prefix FROM subjects WHERE stream = ? ORDER BY prefix", arguments: [name])
    }

    /// Creates the stream and its dead-letter stream, unless `most` streams are there already;
    /// the same settings again change nothing.
    static func addStream(_ db: Database, _ settings: Settings, atMost most: Int, now: Double) throws -> API.StreamInfo {
        if let row = try Row.fetchOne(db, sql: "SELECT * FROM streams WHERE name = ?", arguments: [settings.name]) {
            let existing = Stream(row: row)
            let same = Settings(name: existing.name, subjects: try subjects(db, of: existing.name), retention: existing.retention,
                                maxMessages: existing.maxMessages, maxBytes: existing.maxBytes, maxAge: existing.maxAge,
                                duplicateWindow: existing.duplicateWindow)
            guard same == Settings(name: settings.name, subjects: settings.subjects.sorted(), retention: settings.retention,
                                   maxMessages: settings.maxMessages, maxBytes: settings.maxBytes, maxAge: settings.maxAge,
                                   duplicateWindow: settings.duplicateWindow) else {
                throw JSONRPCError(code: JSONRPCError.conflictCode, message: "Conflict: stream \(settings.name) exists with other settings; see data.current",
                                   data: ["current": try JSONValue(encoding: try info(db, existing))])
            }
            return try info(db, existing)
        }
        let streams = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM streams WHERE dead_letters IS NOT NULL") ?? 0
        guard streams < most else { throw tooMany("streams", limit: most, setting: "streams.max_streams", remedy: "delete one first") }
        for prefix in settings.subjects {
            if let held = try Row.fetchOne(db, sql: """
                SELECT prefix, stream FROM subjects
                WHERE substr(?, 1, length(prefix)) = prefix OR substr(prefix, 1, length(?)) = ?
                """, arguments: [prefix, prefix, prefix]) {
                let (other, stream): (String, String) = (held["prefix"], held["stream"])
                throw JSONRPCError(code: JSONRPCError.conflictCode,
                                   message: "Conflict: subjects \(prefix) and \(other) overlap, and stream \(stream) holds \(other)",
                                   data: ["stream": .string(stream), "subject": .string(other)])
            }
        }
        let deadLetters = API.deadLetters(of: settings.name)
        let stream = Stream(settings, deadLetters: deadLetters, now: now)
        try insert(db, stream)
        // The dead-letter stream keeps what its stream's consumers could not have done, under
        // the same limits; nothing is published to it but by them.
        try insert(db, Stream(Settings(name: deadLetters, subjects: [], retention: .limits, maxMessages: settings.maxMessages,
                                       maxBytes: settings.maxBytes, maxAge: settings.maxAge, duplicateWindow: 0),
                              deadLetters: nil, now: now))
        for prefix in settings.subjects {
            try db.execute(sql: "INSERT INTO subjects (prefix, stream) VALUES (?, ?)", arguments: [prefix, settings.name])
        }
        return try info(db, stream)
    }

    private static func insert(_ db: Database, _ stream: Stream) throws {
        try db.execute(sql: """
            INSERT INTO streams (name, retention, max_messages, max_bytes, max_age, duplicate_window, dead_letters, created_at)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            """, arguments: [stream.name, stream.retention.rawValue, stream.maxMessages, stream.maxBytes, stream.maxAge,
                             stream.duplicateWindow, stream.deadLetters, stream.createdAt])
    }

    /// -32010: a count the service bounds is reached.
    private static func tooMany(_ what: String, limit: Int, setting: String, remedy: String) -> JSONRPCError {
        JSONRPCError(code: JSONRPCError.tooLargeCode, message: "Too many: \(limit) \(what) are the most the service holds (\(setting)); \(remedy)",
                     data: ["limit": .int(Int64(limit)), "setting": .string(setting)])
    }

    static func info(_ db: Database, _ stream: Stream) throws -> API.StreamInfo {
        API.StreamInfo(name: stream.name, subjects: try subjects(db, of: stream.name), retention: stream.retention,
                       maxMessages: stream.maxMessages, maxBytes: stream.maxBytes, maxAge: stream.maxAge,
                       duplicateWindow: stream.duplicateWindow, messages: stream.messages, bytes: stream.bytes,
                       firstSequence: stream.firstSeq, lastSequence: stream.lastSeq,
                       consumers: try String.fetchAll(db, sql: "SELECT name FROM consumers WHERE stream = ? ORDER BY name", arguments: [stream.name]),
                       deadLetters: stream.deadLetters, created: Timestamp.format(seconds: stream.createdAt))
    }

    static func list(_ db: Database) throws -> API.StreamList {
        API.StreamList(streams: try Row.fetchAll(db, sql: "SELECT * FROM streams ORDER BY name").map { try info(db, Stream(row: $0)) })
    }

    /// Deletes the stream with everything that is its: messages, ids, consumers, pending, and
    /// its dead-letter stream. A dead-letter stream goes only with its stream.
    static func deleteStream(_ db: Database, _ name: String) throws -> API.Removed {
        let stream = try stream(db, name)
        if stream.deadLetters == nil, let owner = try String.fetchOne(db, sql: "SELECT name FROM streams WHERE dead_letters = ?", arguments: [name]) {
            throw JSONRPCError.invalidParams(field: "name", "\(name) is stream \(owner)'s dead-letter stream: it goes when \(owner) is deleted")
        }
        var removed = 0
        for name in [name] + (stream.deadLetters.map { [$0] } ?? []) {
            removed += try Int.fetchOne(db, sql: "SELECT messages FROM streams WHERE name = ?", arguments: [name]) ?? 0
            for table in ["messages", "message_ids", "consumers", "pending", "subjects"] {
                try db.execute(sql: "DELETE FROM \(table) WHERE stream = ?", arguments: [name])
            }
            try db.execute(sql: "DELETE FROM streams WHERE name = ?", arguments: [name])
        }
        return API.Removed(messages: removed)
    }

    /// Deletes every message; the sequence goes on, and each consumer counts what it missed.
    static func purge(_ db: Database, _ name: String) throws -> API.Removed {
        let stream = try stream(db, name)
        try db.execute(sql: """
            UPDATE consumers SET missed = missed
                + (SELECT COUNT(*) FROM pending p WHERE p.stream = consumers.stream AND p.consumer = consumers.name)
                + (SELECT COUNT(*) FROM messages m WHERE m.stream = consumers.stream AND m.seq >= consumers.next_seq
                   AND (consumers.filter IS NULL OR substr(m.subject, 1, length(consumers.filter)) = consumers.filter))
            WHERE stream = ?
            """, arguments: [name])
        try db.execute(sql: "DELETE FROM pending WHERE stream = ?", arguments: [name])
        try db.execute(sql: "DELETE FROM messages WHERE stream = ?", arguments: [name])
        try db.execute(sql: "UPDATE streams SET messages = 0, bytes = 0, first_seq = last_seq + 1 WHERE name = ?", arguments: [name])
        return API.Removed(messages: stream.messages)
    }

    // MARK: Messages

    /// Keeps a message in the stream holding `subject`; a known id within the duplicate
    /// window answers the first one's sequence instead.
    static func publish(_ db: Database, subject: String, data: [UInt8], id: String?, now: Double) throws -> API.Published {
        guard let name = try String.fetchOne(db, sql: "SELECT stream FROM subjects WHERE substr(?, 1, length(prefix)) = prefix",
                                             arguments: [subject]) else {
            throw JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: no stream holds subject \(subject)",
                               data: ["subject": .string(subject)])
        }
        var stream = try stream(db, name)
        if let id {
            try db.execute(sql: "DELETE FROM message_ids WHERE stream = ? AND published_at < ?", arguments: [name, now - stream.duplicateWindow])
            if let first = try Int.fetchOne(db, sql: "SELECT seq FROM message_ids WHERE stream = ? AND id = ?", arguments: [name, id]) {
                return API.Published(stream: name, sequence: first, duplicate: true)
            }
        }
        guard data.count <= stream.maxBytes else {
            throw JSONRPCError(code: JSONRPCError.tooLargeCode,
                               message: "Too large: the message's \(data.count) bytes are over stream \(name)'s max_bytes (\(stream.maxBytes))",
                               data: ["limit": .int(Int64(stream.maxBytes)), "bytes": .int(Int64(data.count))])
        }
        let sequence = try append(db, &stream, subject: subject, data: data, deadLetter: nil, now: now)
        if let id {
            try db.execute(sql: "INSERT INTO message_ids (stream, id, seq, published_at) VALUES (?, ?, ?, ?)", arguments: [name, id, sequence, now])
        }
        return API.Published(stream: name, sequence: sequence, duplicate: false)
    }

    /// Adds a message at the stream's next sequence, then removes the oldest past its limits.
    private static func append(_ db: Database, _ stream: inout Stream, subject: String, data: [UInt8], deadLetter: String?, now: Double) throws -> Int {
        let sequence = stream.lastSeq + 1
        try db.execute(sql: "INSERT INTO messages (stream, seq, subject, data, published_at, dead_letter) VALUES (?, ?, ?, ?, ?, ?)",
                       arguments: [stream.name, sequence, subject, Data(data), now, deadLetter])
        if stream.messages == 0 { stream.firstSeq = sequence }
        stream.lastSeq = sequence
        stream.messages += 1
        stream.bytes += data.count
        try trim(db, &stream, now: now)
        return sequence
    }

    /// Removes the oldest messages while the stream is past one of its limits (count, bytes,
    /// age), and saves its counters.
    static func trim(_ db: Database, _ stream: inout Stream, now: Double) throws {
        while stream.messages > 0 {
            guard let oldest = try Row.fetchOne(db, sql: """
                SELECT seq, subject, length(data) AS size, published_at FROM messages WHERE stream = ? ORDER BY seq LIMIT 1
                """, arguments: [stream.name]) else { break }
            let expired = stream.maxAge.map { (oldest["published_at"] as Double) < now - $0 } ?? false
            guard stream.messages > stream.maxMessages || stream.bytes > stream.maxBytes || expired else { break }
            try remove(db, &stream, sequence: oldest["seq"], subject: oldest["subject"], size: oldest["size"], missed: true)
        }
        try save(db, stream)
    }

    /// Removes one message; with `missed`, every consumer that had not had it done counts it.
    private static func remove(_ db: Database, _ stream: inout Stream, sequence: Int, subject: String, size: Int, missed: Bool) throws {
        if missed {
            try db.execute(sql: """
                UPDATE consumers SET missed = missed + 1
                WHERE stream = ? AND (
                    name IN (SELECT consumer FROM pending WHERE stream = ? AND seq = ?)
                    OR (next_seq <= ? AND (filter IS NULL OR substr(?, 1, length(filter)) = filter)))
                """, arguments: [stream.name, stream.name, sequence, sequence, subject])
        }
        try db.execute(sql: "DELETE FROM pending WHERE stream = ? AND seq = ?", arguments: [stream.name, sequence])
        try db.execute(sql: "DELETE FROM messages WHERE stream = ? AND seq = ?", arguments: [stream.name, sequence])
        stream.messages -= 1
        stream.bytes -= size
        if sequence == stream.firstSeq {
            stream.firstSeq = try Int.fetchOne(db, sql: "SELECT MIN(seq) FROM messages WHERE stream = ?", arguments: [stream.name]) ?? stream.lastSeq + 1
        }
    }

    private static func save(_ db: Database, _ stream: Stream) throws {
        try db.execute(sql: "UPDATE streams SET messages = ?, bytes = ?, first_seq = ?, last_seq = ? WHERE name = ?",
                       arguments: [stream.messages, stream.bytes, stream.firstSeq, stream.lastSeq, stream.name])
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

        init(row: Row) {
            (stream, name, config, filter) = (row["stream"], row["name"], row["config"], row["filter"])
            (ackWait, maxDeliver, nextSeq, createdAt) = (row["ack_wait"], row["max_deliver"], row["next_seq"], row["created_at"])
            (delivered, redelivered, acknowledged) = (row["delivered"], row["redelivered"], row["acknowledged"])
            (deadLettered, terminated, missed) = (row["dead_lettered"], row["terminated"], row["missed"])
        }
    }

    /// The consumer `name` of `stream`, if there is one.
    private static func findConsumer(_ db: Database, stream: String, name: String) throws -> Consumer? {
        try Row.fetchOne(db, sql: "SELECT * FROM consumers WHERE stream = ? AND name = ?", arguments: [stream, name]).map(Consumer.init(row:))
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
    /// added again), the rest with the defaults filled in.
    static func addConsumer(_ db: Database, _ asked: API.ConsumerConfig, config: JSONValue, ackWait: Double, maxDeliver: Int, atMost most: Int,
                            now: Double) throws -> API.ConsumerInfo {
        let stream = try stream(db, asked.stream)
        if let existing = try findConsumer(db, stream: asked.stream, name: asked.name) {
            guard try JSONValue(parsing: Array(existing.config.utf8)) == config else {
                throw JSONRPCError(code: JSONRPCError.conflictCode, message: "Conflict: stream \(asked.stream) has a consumer \(asked.name) with other settings; see data.current",
                                   data: ["current": try JSONValue(encoding: try info(db, existing))])
            }
            return try info(db, existing)
        }
        let consumers = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM consumers WHERE stream = ?", arguments: [asked.stream]) ?? 0
        guard consumers < most else { throw tooMany("consumers of stream \(asked.stream)", limit: most, setting: "streams.max_consumers", remedy: "delete one first") }
        if stream.retention == .workQueue,
           let other = try String.fetchOne(db, sql: "SELECT name FROM consumers WHERE stream = ?", arguments: [asked.stream]) {
            throw JSONRPCError(code: JSONRPCError.conflictCode,
                               message: "Conflict: work-queue stream \(asked.stream) has its consumer (\(other)); its readers share it",
                               data: ["consumer": .string(other)])
        }
        let next: Int
        if let sequence = asked.startSequence {
            next = sequence
        } else if let time = asked.startTime.flatMap(Timestamp.parse) {
            next = try Int.fetchOne(db, sql: "SELECT MIN(seq) FROM messages WHERE stream = ? AND published_at >= ?",
                                    arguments: [asked.stream, time.timeIntervalSince1970]) ?? stream.lastSeq + 1
        } else if asked.deliver == .new {
            next = stream.lastSeq + 1
        } else {
            next = stream.firstSeq
        }
        try db.execute(sql: """
            INSERT INTO consumers (stream, name, config, filter, ack_wait, max_deliver, next_seq, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            """, arguments: [asked.stream, asked.name, String(decoding: config.jsonBytes, as: UTF8.self), asked.filter, ackWait, maxDeliver, next, now])
        return try info(db, try consumer(db, stream: asked.stream, name: asked.name))
    }

    static func info(_ db: Database, _ consumer: Consumer) throws -> API.ConsumerInfo {
        let pending = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM pending WHERE stream = ? AND consumer = ?", arguments: [consumer.stream, consumer.name]) ?? 0
        let waiting = try Int.fetchOne(db, sql: """
            SELECT COUNT(*) FROM messages WHERE stream = ? AND seq >= ? AND (? IS NULL OR substr(subject, 1, length(?)) = ?)
            """, arguments: [consumer.stream, consumer.nextSeq, consumer.filter, consumer.filter, consumer.filter]) ?? 0
        return API.ConsumerInfo(stream: consumer.stream, name: consumer.name, filter: consumer.filter, ackWait: consumer.ackWait,
                                maxDeliver: consumer.maxDeliver, nextSequence: consumer.nextSeq, pending: pending, waiting: waiting,
                                delivered: consumer.delivered, redelivered: consumer.redelivered, acknowledged: consumer.acknowledged,
                                deadLettered: consumer.deadLettered, terminated: consumer.terminated, missed: consumer.missed,
                                created: Timestamp.format(seconds: consumer.createdAt))
    }

    static func deleteConsumer(_ db: Database, stream: String, name: String) throws -> API.Removed {
        _ = try consumer(db, stream: stream, name: name)
        try db.execute(sql: "DELETE FROM pending WHERE stream = ? AND consumer = ?", arguments: [stream, name])
        try db.execute(sql: "DELETE FROM consumers WHERE stream = ? AND name = ?", arguments: [stream, name])
        return API.Removed(messages: 0)
    }

    // MARK: Fetching

    /// Whether a fetch would hand something out now: a pending message past its deadline, or
    /// one not handed out yet.
    static func ready(_ db: Database, stream: String, consumer name: String, now: Double) throws -> Bool {
        let consumer = try consumer(db, stream: stream, name: name)
        return try Bool.fetchOne(db, sql: """
            SELECT EXISTS (SELECT 1 FROM pending WHERE stream = ? AND consumer = ? AND deadline <= ?)
                OR EXISTS (SELECT 1 FROM messages WHERE stream = ? AND seq >= ? AND (? IS NULL OR substr(subject, 1, length(?)) = ?))
            """, arguments: [stream, name, now, stream, consumer.nextSeq, consumer.filter, consumer.filter, consumer.filter]) ?? false
    }

    /// Hands out up to `batch` messages and `maxBytes` of data (always one when one is ready):
    /// first those whose ack deadline passed (oldest first; past `max_deliver` deliveries one
    /// goes to the dead-letter stream instead), then the next ones not handed out. Each is
    /// pending until `now + ack_wait`.
    static func fetch(_ db: Database, stream name: String, consumer consumerName: String, batch: Int, maxBytes: Int, now: Double) throws -> API.Fetched {
        var stream = try stream(db, name)
        var consumer = try consumer(db, stream: name, name: consumerName)
        try trim(db, &stream, now: now)
        var out: [API.Message] = []
        var bytes = 0, redelivered = 0, deadLettered = 0
        var full = false
        let due = try Row.fetchAll(db, sql: """
            SELECT p.seq, p.deliveries, m.subject, m.data, m.published_at, m.dead_letter
            FROM pending p JOIN messages m ON m.stream = p.stream AND m.seq = p.seq
            WHERE p.stream = ? AND p.consumer = ? AND p.deadline <= ? ORDER BY p.seq LIMIT ?
            """, arguments: [name, consumerName, now, batch])
        for row in due {
            let sequence: Int = row["seq"], deliveries: Int = row["deliveries"], data: Data = row["data"]
            if deliveries >= consumer.maxDeliver {
                try giveUp(db, &stream, consumer: consumer, sequence: sequence, deliveries: deliveries, row: row, now: now)
                deadLettered += 1
                continue
            }
            guard out.isEmpty || bytes + data.count <= maxBytes else {
                full = true
                break
            }
            try db.execute(sql: "UPDATE pending SET deliveries = deliveries + 1, deadline = ? WHERE stream = ? AND consumer = ? AND seq = ?",
                           arguments: [now + consumer.ackWait, name, consumerName, sequence])
            out.append(try message(row, sequence: sequence, data: data, deliveries: deliveries + 1))
            bytes += data.count
            redelivered += 1
        }
        var delivered = 0
        if !full, out.count < batch {
            let asked = batch - out.count
            let fresh = try Row.fetchAll(db, sql: """
                SELECT seq, subject, data, published_at, dead_letter FROM messages
                WHERE stream = ? AND seq >= ? AND (? IS NULL OR substr(subject, 1, length(?)) = ?) ORDER BY seq LIMIT ?
                """, arguments: [name, consumer.nextSeq, consumer.filter, consumer.filter, consumer.filter, asked])
            for row in fresh {
                let sequence: Int = row["seq"], data: Data = row["data"]
                guard out.isEmpty || bytes + data.count <= maxBytes else {
                    full = true
                    break
                }
                try db.execute(sql: "INSERT INTO pending (stream, consumer, seq, deliveries, deadline) VALUES (?, ?, ?, 1, ?)",
                               arguments: [name, consumerName, sequence, now + consumer.ackWait])
                out.append(try message(row, sequence: sequence, data: data, deliveries: 1))
                bytes += data.count
                delivered += 1
                consumer.nextSeq = sequence + 1
            }
            // Nothing further matches: what is past it was passed over by the filter.
            if !full, fresh.count < asked { consumer.nextSeq = max(consumer.nextSeq, stream.lastSeq + 1) }
        }
        let missed = try Int.fetchOne(db, sql: "SELECT missed - missed_told FROM consumers WHERE stream = ? AND name = ?",
                                      arguments: [name, consumerName]) ?? 0
        try db.execute(sql: """
            UPDATE consumers SET next_seq = ?, delivered = delivered + ?, redelivered = redelivered + ?, dead_lettered = dead_lettered + ?,
                missed_told = missed WHERE stream = ? AND name = ?
            """, arguments: [consumer.nextSeq, delivered, redelivered, deadLettered, name, consumerName])
        try save(db, stream)
        return API.Fetched(messages: out, missed: missed)
    }

    private static func message(_ row: Row, sequence: Int, data: Data, deliveries: Int) throws -> API.Message {
        let deadLetter = try (row["dead_letter"] as String?).map { try JSONValue(parsing: Array($0.utf8)).decode(as: API.DeadLetter.self) }
        return API.Message(sequence: sequence, subject: row["subject"], data: try JSONValue(parsing: Array(data)),
                           published: Timestamp.format(seconds: row["published_at"]), deliveries: deliveries, deadLetter: deadLetter)
    }

    /// A message handed out `max_deliver` times without being done: it goes to the stream's
    /// dead-letter stream with why (a dead-letter stream's own are only dropped), and leaves
    /// the consumer's pending messages (and a work queue).
    private static func giveUp(_ db: Database, _ stream: inout Stream, consumer: Consumer, sequence: Int, deliveries: Int, row: Row, now: Double) throws {
        if let deadLetters = stream.deadLetters {
            var target = try self.stream(db, deadLetters)
            let why = API.DeadLetter(reason: "handed out \(deliveries) times (max_deliver) without an acknowledgement", stream: stream.name,
                                     sequence: sequence, consumer: consumer.name, deliveries: deliveries)
            let data: Data = row["data"]
            _ = try append(db, &target, subject: row["subject"], data: Array(data),
                           deadLetter: String(decoding: try JSONValue(encoding: why).jsonBytes, as: UTF8.self), now: now)
        }
        try db.execute(sql: "DELETE FROM pending WHERE stream = ? AND consumer = ? AND seq = ?", arguments: [stream.name, consumer.name, sequence])
        if stream.retention == .workQueue {
            try remove(db, &stream, sequence: sequence, subject: row["subject"], size: (row["data"] as Data).count, missed: false)
        }
    }

    // MARK: Acknowledging

    /// What a reader says of messages it was handed.
    enum Outcome {
        /// Done: not handed out again.
        case ack
        /// Given back: handed out again once `delay` seconds have passed.
        case nak(delay: Double)
        /// Still being worked on: the ack deadline starts again.
        case progress
        /// Not to be done: not handed out again, not dead-lettered.
        case term
    }

    /// Applies `outcome` to each sequence pending for the consumer; the others are answered
    /// as not pending. On a work-queue stream, a message done or terminated is deleted.
    static func settle(_ db: Database, stream name: String, consumer consumerName: String, sequences: [Int], _ outcome: Outcome,
                       now: Double) throws -> API.Acknowledged {
        var stream = try stream(db, name)
        let consumer = try consumer(db, stream: name, name: consumerName)
        var done: [Int] = [], notPending: [Int] = []
        for sequence in sequences {
            let key: [any DatabaseValueConvertible] = [name, consumerName, sequence]
            switch outcome {
            case .ack, .term:
                try db.execute(sql: "DELETE FROM pending WHERE stream = ? AND consumer = ? AND seq = ?", arguments: StatementArguments(key))
            case .nak(let delay):
                try db.execute(sql: "UPDATE pending SET deadline = ? WHERE stream = ? AND consumer = ? AND seq = ?",
                               arguments: StatementArguments([now + delay] + key))
            case .progress:
                try db.execute(sql: "UPDATE pending SET deadline = ? WHERE stream = ? AND consumer = ? AND seq = ?",
                               arguments: StatementArguments([now + consumer.ackWait] + key))
            }
            guard db.changesCount > 0 else {
                notPending.append(sequence)
                continue
            }
            done.append(sequence)
            switch outcome {
            case .ack, .term:
                if stream.retention == .workQueue,
                   let row = try Row.fetchOne(db, sql: "SELECT subject, length(data) AS size FROM messages WHERE stream = ? AND seq = ?", arguments: [name, sequence]) {
                    try remove(db, &stream, sequence: sequence, subject: row["subject"], size: row["size"], missed: false)
                }
            case .nak, .progress:
                break
            }
        }
        switch outcome {
        case .ack: try db.execute(sql: "UPDATE consumers SET acknowledged = acknowledged + ? WHERE stream = ? AND name = ?", arguments: [done.count, name, consumerName])
        case .term: try db.execute(sql: "UPDATE consumers SET terminated = terminated + ? WHERE stream = ? AND name = ?", arguments: [done.count, name, consumerName])
        case .nak, .progress: break
        }
        try save(db, stream)
        return API.Acknowledged(done: done, notPending: notPending)
    }
}
