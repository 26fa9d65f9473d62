public import BusProtocol

/// `streams`: messages kept until someone has done the work. A stream holds the messages
/// published to its subjects (prefixes), numbered by its sequence and bounded by its limits;
/// a consumer is a named position in a stream whose messages are handed out (fetched) and
/// kept pending until acknowledged, handed out again after the ack deadline, and moved to
/// the stream's dead-letter stream past its maximum deliveries. Several readers fetching
/// from one consumer share its messages, each message to one reader at a time.
///
/// Durations are in seconds. A message's `data` is any JSON value.
public enum StreamsAPI {
    public static let service = "streams"

    /// The dead-letter stream of stream `name`: where its consumers' messages go past their
    /// maximum deliveries (stream names hold no '.', so it cannot clash).
    public static func deadLetters(of name: String) -> String { name + deadLettersSuffix }

    /// The stream whose dead letters stream `name` holds (nil: it is no dead-letter stream).
    public static func stream(ofDeadLetters name: String) -> String? {
        name.hasSuffix(deadLettersSuffix) ? String(name.dropLast(deadLettersSuffix.count)) : nil
    }

    private static let deadLettersSuffix = ".dead"

    public static let streamAdd = Method<StreamConfig, StreamInfo>(service, "stream.add", "Creates a stream holding the messages published to its subjects (prefixes), with its dead-letter stream NAME.dead; the same again changes nothing, different settings for an existing name are -32004 (stream.update changes its subjects and limits).", changesState: true)
    public static let streamUpdate = Method<StreamSettings, StreamInfo>(service, "stream.update", "Changes a stream's subjects and limits, and its dead-letter stream's limits with them: those given, the others stay. Lowered, the oldest messages past the limits go before the answer, a transaction at a time, and the consumers count what they missed; maxAge 0 lifts the age limit. Subjects given are every prefix it holds from then on (no other stream's may overlap them): messages kept under one left out stay. Its retention, and a capturing stream's subjects, stay as added.", changesState: true)
    public static let streamInfo = Method<StreamName, StreamInfo>(service, "stream.info", "A stream's settings, messages, bytes, sequences and consumers (-32003: no such stream).")
    public static let streamList = Method<NoParams, StreamList>(service, "stream.list", "Every stream, dead-letter streams included.")
    public static let metrics = Method<NoParams, KernelAPI.Metrics>(service, "stream.metrics", "Each stream's messages and bytes, and each consumer's pending messages, deliveries, redeliveries, acknowledgements, dead letters and misses, in the Prometheus text format (the gateway's /metrics carries them).")
    public static let streamMessages = Method<ReadMessages, Messages>(service, "stream.messages", "Reads a stream's messages without a consumer (nothing handed out, nothing pending): from a sequence on, or the last ones; at most max of them and 1 MiB of data.")
    public static let streamDelete = Method<StreamName, Removed>(service, "stream.delete", "Deletes a stream with its messages, its consumers and its dead-letter stream.", changesState: true)
    public static let streamPurge = Method<Purge, Removed>(service, "stream.purge", "Deletes a stream's messages (with subject, those whose subject starts with it; with keep, all but the last keep of them), keeping its sequence, settings and consumers (who are told what they missed).", changesState: true)
    public static let publish = Method<Publish, Published>(service, "stream.publish", "Keeps a message in the stream that holds its subject, answered once durable; with an id, a re-send within the stream's duplicate window is stored once (duplicate: true).", changesState: true)
    public static let consumerAdd = Method<ConsumerConfig, ConsumerInfo>(service, "consumer.add", "Creates a durable consumer on a stream: from the start (all), only new messages, a sequence or a time; a subject filter; its ack deadline, maximum deliveries and the most messages pending at once (maxAckPending; absent or 0: the service's most, streams.max_ack_pending, 10,000 by default, over which it is -32010). The same again changes nothing; different settings are -32004.", changesState: true)
    public static let consumerUpdate = Method<ConsumerSettings, ConsumerInfo>(service, "consumer.update", "Changes a consumer's subject filter (\"\": every subject), ack wait, maximum deliveries and most pending (maxAckPending 0: the service's most): those given, the others stay, as do its position and pending messages. A new filter chooses among the messages not handed out yet. A message already handed out keeps its deadline; one handed out as many times as the new maximum goes to the dead letters once its deadline passes.", changesState: true)
    public static let consumerInfo = Method<ConsumerName, ConsumerInfo>(service, "consumer.info", "A consumer's position, its pending and waiting messages, and its counts.")
    public static let consumerList = Method<ConsumersOf, ConsumerList>(service, "consumer.list", "Every consumer of a stream, as consumer.info gives each, counted together: what waits is counted once for each subject filter, not once for each consumer (-32003: no such stream).")
    public static let consumerDelete = Method<ConsumerName, Removed>(service, "consumer.delete", "Deletes a consumer and what it had pending.", changesState: true)
    public static let fetch = Method<Fetch, Fetched>(service, "consumer.fetch", "Hands out up to batch messages (and max_bytes of data) to this reader: those whose ack deadline passed first, then the next ones; each stays pending until acknowledged. With wait, waits that long for one when none is ready (less when its worker drains: ask again).", changesState: true)
    public static let nextMethod = Method<Next, NextEnd>(service, "consumer.next", "Hands out messages as they come (push): each part is one message, pending until acknowledged as a fetched one is, until max messages or expires seconds (sooner when its worker drains: ask again for the rest); the end counts them. Asked without parts, the messages of that time in one reply.")
    /// ``nextMethod`` in parts: a message a part, sent as soon as the consumer has it.
    public static let next = StreamMethod(nextMethod, part: Message.self) { end, parts in
        var whole = end
        whole.messages = parts
        return whole
    }
    public static let ack = Method<Sequences, Acknowledged>(service, "consumer.ack", "Acknowledges messages: done, not handed out again (on a work-queue stream they are deleted).", changesState: true)
    public static let nak = Method<Nak, Acknowledged>(service, "consumer.nak", "Gives messages back: handed out again after delay seconds (0: at the next fetch).", changesState: true)
    public static let progress = Method<Sequences, Acknowledged>(service, "consumer.progress", "Still working on messages: their ack deadline starts again.", changesState: true)
    public static let term = Method<Sequences, Acknowledged>(service, "consumer.term", "Stops delivering messages without processing them (not handed out again, not dead-lettered).", changesState: true)

    // MARK: Params

    public enum Retention: String, Codable, Sendable, CaseIterable, SchemaDescribed {
        /// Messages stay until the stream's limits remove the oldest.
        case limits
        /// Each message stays until its one consumer acknowledges (or terminates) it.
        case workQueue = "work_queue"
    }

    public struct StreamConfig: Codable, Sendable, Equatable {
        public var name: String
        /// Subject prefixes: a message published to a subject starting with one is kept here.
        /// No two streams hold overlapping prefixes.
        public var subjects: [String]
        public var retention: Retention?
        /// Limits: past any of them the oldest messages go (absent: the service's defaults).
        public var maxMessages: Int?
        public var maxBytes: Int?
        /// Seconds a message is kept (absent or 0: until the other limits remove it).
        public var maxAge: Double?
        /// Seconds a publisher's message id is remembered (absent: 120).
        public var duplicateWindow: Double?
        /// True: the stream keeps the kernel's state (12/CHP) instead of what is published:
        /// every change of a key under its subjects (key prefixes, such as `/pricing/`) is a
        /// message whose subject is the key and whose data is ``StateChange``, kept once, in the
        /// state's order. Publishing to it is refused.
        public var captureState: Bool?

        public init(name: String, subjects: [String], retention: Retention? = nil, maxMessages: Int? = nil, maxBytes: Int? = nil,
                    maxAge: Double? = nil, duplicateWindow: Double? = nil, captureState: Bool? = nil) {
            (self.name, self.subjects, self.retention, self.maxMessages, self.maxBytes, self.maxAge, self.duplicateWindow)
                = (name, subjects, retention, maxMessages, maxBytes, maxAge, duplicateWindow)
            self.captureState = captureState
        }
    }

    /// New subjects or limits for stream `name` (``streamUpdate``): at least one of them.
    public struct StreamSettings: Codable, Sendable {
        public var name: String
        /// Every subject prefix the stream holds from now on (as ``StreamConfig/subjects``).
        public var subjects: [String]?
        public var maxMessages: Int?
        public var maxBytes: Int?
        /// Seconds a message is kept; 0: no age limit any more.
        public var maxAge: Double?
        /// Seconds a publisher's message id is remembered.
        public var duplicateWindow: Double?

        public init(name: String, subjects: [String]? = nil, maxMessages: Int? = nil, maxBytes: Int? = nil, maxAge: Double? = nil,
                    duplicateWindow: Double? = nil) {
            (self.name, self.subjects, self.maxMessages, self.maxBytes, self.maxAge, self.duplicateWindow)
                = (name, subjects, maxMessages, maxBytes, maxAge, duplicateWindow)
        }
    }

    public struct StreamName: Codable, Sendable {
        public var name: String

        public init(name: String) { self.name = name }
    }

    /// The messages of stream `name` to delete (``streamPurge``): all of them, or those
    /// `subject` and `keep` choose.
    public struct Purge: Codable, Sendable {
        public var name: String
        /// Only messages whose subject starts with it.
        public var subject: String?
        /// All but the last this many (of those `subject` chooses).
        public var keep: Int?

        public init(name: String, subject: String? = nil, keep: Int? = nil) { (self.name, self.subject, self.keep) = (name, subject, keep) }
    }

    /// Messages read without a consumer: from a sequence on, or the last ones.
    public struct ReadMessages: Codable, Sendable {
        public var name: String
        /// The first sequence to read (absent: the stream's first message, or with `last`, the
        /// last `last` messages).
        public var from: Int?
        /// The last this many messages (with `filter`, of those it keeps), oldest first.
        public var last: Int?
        /// Only subjects starting with it.
        public var filter: String?
        /// At most this many messages (absent: 100), and 1 MiB of data (always one message).
        public var max: Int?

        public init(name: String, from: Int? = nil, last: Int? = nil, filter: String? = nil, max: Int? = nil) {
            (self.name, self.from, self.last, self.filter, self.max) = (name, from, last, filter, max)
        }
    }

    public struct Publish: Codable, Sendable {
        public var subject: String
        public var data: JSONValue
        /// The publisher's message id: the same id again within the duplicate window is stored once.
        public var id: String?

        public init(subject: String, data: JSONValue, id: String? = nil) { (self.subject, self.data, self.id) = (subject, data, id) }
    }

    /// Where a new consumer starts: at most one of `startSequence` and `startTime`, else `deliver`.
    public enum Deliver: String, Codable, Sendable, CaseIterable, SchemaDescribed {
        /// From the stream's first message.
        case all
        /// Only messages published after the consumer was made.
        case new
    }

    public struct ConsumerConfig: Codable, Sendable, Equatable {
        public var stream: String
        public var name: String
        public var deliver: Deliver?
        public var startSequence: Int?
        /// An ISO 8601 time: from the first message published at or after it.
        public var startTime: String?
        /// Only messages whose subject starts with it.
        public var filter: String?
        /// Seconds a handed-out message stays with its reader before it is handed out again (absent: 30).
        public var ackWait: Double?
        /// Deliveries before a message goes to the dead-letter stream (absent: 5).
        public var maxDeliver: Int?
        /// Messages handed out and not yet acknowledged at most (absent or 0: the service's most,
        /// `streams.max_ack_pending`, over which it is refused): with that many pending, fetches
        /// hand out only those due again until some are done.
        public var maxAckPending: Int?

        public init(stream: String, name: String, deliver: Deliver? = nil, startSequence: Int? = nil, startTime: String? = nil,
                    filter: String? = nil, ackWait: Double? = nil, maxDeliver: Int? = nil, maxAckPending: Int? = nil) {
            (self.stream, self.name, self.deliver, self.startSequence, self.startTime, self.filter, self.ackWait, self.maxDeliver)
                = (stream, name, deliver, startSequence, startTime, filter, ackWait, maxDeliver)
            self.maxAckPending = maxAckPending
        }
    }

    public struct ConsumerName: Codable, Sendable {
        public var stream: String
        public var name: String

        public init(stream: String, name: String) { (self.stream, self.name) = (stream, name) }
    }

    /// The stream whose consumers ``consumerList`` lists.
    public struct ConsumersOf: Codable, Sendable {
        public var stream: String

        public init(stream: String) { self.stream = stream }
    }

    /// New settings for consumer `name` of `stream` (``consumerUpdate``): at least one of them.
    public struct ConsumerSettings: Codable, Sendable {
        public var stream: String
        public var name: String
        /// Only subjects starting with it from now on; "": every subject.
        public var filter: String?
        /// Seconds a handed-out message stays with its reader before it is handed out again.
        public var ackWait: Double?
        /// Deliveries before a message goes to the dead-letter stream.
        public var maxDeliver: Int?
        /// Messages pending at once at most; 0: the service's most (`streams.max_ack_pending`).
        public var maxAckPending: Int?

        public init(stream: String, name: String, filter: String? = nil, ackWait: Double? = nil, maxDeliver: Int? = nil, maxAckPending: Int? = nil) {
            (self.stream, self.name, self.filter, self.ackWait, self.maxDeliver, self.maxAckPending) = (stream, name, filter, ackWait, maxDeliver, maxAckPending)
        }
    }

    public struct Fetch: Codable, Sendable {
        public var stream: String
        public var consumer: String
        /// At most this many messages (absent: 1).
        public var batch: Int?
        /// At most this many bytes of data, but always one message when one is ready (absent: 1 MiB).
        public var maxBytes: Int?
        /// Seconds to wait for a message when none is ready (absent: 0, answer at once).
        public var wait: Double?

        public init(stream: String, consumer: String, batch: Int? = nil, maxBytes: Int? = nil, wait: Double? = nil) {
            (self.stream, self.consumer, self.batch, self.maxBytes, self.wait) = (stream, consumer, batch, maxBytes, wait)
        }
    }

    public struct Next: Codable, Sendable {
        /// What an absent `max` and `expires` stand for.
        public static let defaultMax = 1_000, defaultExpires: Double = 30

        public var stream: String
        public var consumer: String
        /// At most this many messages (absent: ``defaultMax``, 1,000).
        public var max: Int?
        /// Seconds it goes on (absent: ``defaultExpires``, 30).
        public var expires: Double?
        public init(stream: String, consumer: String, max: Int? = nil, expires: Double? = nil) {
            (self.stream, self.consumer, self.max, self.expires) = (stream, consumer, max, expires)
        }
    }

    public struct Sequences: Codable, Sendable {
        /// The most sequences one ack, nak, progress or term names.
        public static let most = 1_000

        public var stream: String
        public var consumer: String
        public var sequences: [Int]

        public init(stream: String, consumer: String, sequences: [Int]) { (self.stream, self.consumer, self.sequences) = (stream, consumer, sequences) }
    }

    public struct Nak: Codable, Sendable {
        public var stream: String
        public var consumer: String
        public var sequences: [Int]
        /// Seconds before they are handed out again (absent: 0).
        public var delay: Double?

        public init(stream: String, consumer: String, sequences: [Int], delay: Double? = nil) {
            (self.stream, self.consumer, self.sequences, self.delay) = (stream, consumer, sequences, delay)
        }
    }

    // MARK: Results

    public struct StreamInfo: Codable, Sendable {
        public var name: String
        public var subjects: [String]
        public var retention: Retention
        public var maxMessages: Int
        public var maxBytes: Int
        public var maxAge: Double?
        public var duplicateWindow: Double
        /// Messages and bytes of data held now.
        public var messages: Int
        public var bytes: Int
        /// The oldest message's sequence (the next one's when empty) and the last one given.
        public var firstSequence: Int
        public var lastSequence: Int
        public var consumers: [String]
        /// Its dead-letter stream (absent for a dead-letter stream itself).
        public var deadLetters: String?
        public var created: String
        /// True when it keeps the kernel's state (``StreamConfig/captureState``).
        public var captureState: Bool?
        /// Capturing: the state's sequence of the last change kept (0: none yet), and how many
        /// times the kernel could not give every change since it (some were not kept).
        public var capturedSequence: Int?
        public var captureGaps: Int?
        /// The CURVE public key that added it, which may delete or purge it (absent: added
        /// without CURVE, or by the service from its configuration).
        public var addedBy: String?

        public init(name: String, subjects: [String], retention: StreamsAPI.Retention, maxMessages: Int, maxBytes: Int, maxAge: Double?,
                    duplicateWindow: Double, messages: Int, bytes: Int, firstSequence: Int, lastSequence: Int, consumers: [String],
                    deadLetters: String?, created: String) {
            (self.name, self.subjects, self.retention, self.maxMessages, self.maxBytes, self.maxAge, self.duplicateWindow)
                = (name, subjects, retention, maxMessages, maxBytes, maxAge, duplicateWindow)
            (self.messages, self.bytes, self.firstSequence, self.lastSequence, self.consumers, self.deadLetters, self.created)
                = (messages, bytes, firstSequence, lastSequence, consumers, deadLetters, created)
        }
    }

    /// What a stream that captures the kernel's state keeps for each change of a key (the
    /// message's subject).
    public struct StateChange: Codable, Sendable, Equatable {
        /// The change's sequence in the kernel's state (its revision of the key).
        public var sequence: Int
        /// The key's new value; absent for a deletion.
        public var value: JSONValue?
        /// The value's bytes, when it was not JSON or larger than the stream keeps (`value` absent).
        public var valueBytes: Int?

        public init(sequence: Int, value: JSONValue?, valueBytes: Int? = nil) { (self.sequence, self.value, self.valueBytes) = (sequence, value, valueBytes) }
    }

    public struct Messages: Codable, Sendable {
        /// In sequence order; each with `deliveries` 0 (read, not handed out).
        public var messages: [Message]
        /// The sequence to read from next.
        public var next: Int

        public init(messages: [Message], next: Int) { (self.messages, self.next) = (messages, next) }
    }

    public struct StreamList: Codable, Sendable {
        public var streams: [StreamInfo]

        public init(streams: [StreamInfo]) { self.streams = streams }
    }

    public struct ConsumerList: Codable, Sendable {
        public var consumers: [ConsumerInfo]

        public init(consumers: [ConsumerInfo]) { self.consumers = consumers }
    }

    public struct Removed: Codable, Sendable {
        /// Messages deleted.
        public var messages: Int

        public init(messages: Int) { self.messages = messages }
    }

    public struct Published: Codable, Sendable {
        public var stream: String
        public var sequence: Int
        /// True when the id was published within the duplicate window: `sequence` is the first one's.
        public var duplicate: Bool

        public init(stream: String, sequence: Int, duplicate: Bool) { (self.stream, self.sequence, self.duplicate) = (stream, sequence, duplicate) }
    }

    public struct ConsumerInfo: Codable, Sendable {
        public var stream: String
        public var name: String
        public var filter: String?
        public var ackWait: Double
        public var maxDeliver: Int
        /// Messages pending at once at most as asked (absent: the service's most, `streams.max_ack_pending`).
        public var maxAckPending: Int?
        /// The next sequence never handed out.
        public var nextSequence: Int
        /// Handed out and not yet acknowledged.
        public var pending: Int
        /// Not yet handed out.
        public var waiting: Int
        public var delivered: Int
        public var redelivered: Int
        public var acknowledged: Int
        public var deadLettered: Int
        public var terminated: Int
        /// Messages the stream's limits removed before this consumer had them done.
        public var missed: Int
        public var created: String
        /// The CURVE public key that added it (absent: added without CURVE).
        public var addedBy: String?

        public init(stream: String, name: String, filter: String?, ackWait: Double, maxDeliver: Int, nextSequence: Int, pending: Int, waiting: Int,
                    delivered: Int, redelivered: Int, acknowledged: Int, deadLettered: Int, terminated: Int, missed: Int, created: String) {
            (self.stream, self.name, self.filter, self.ackWait, self.maxDeliver, self.nextSequence, self.pending, self.waiting)
                = (stream, name, filter, ackWait, maxDeliver, nextSequence, pending, waiting)
            (self.delivered, self.redelivered, self.acknowledged, self.deadLettered, self.terminated, self.missed, self.created)
                = (delivered, redelivered, acknowledged, deadLettered, terminated, missed, created)
        }
    }

    public struct Message: Codable, Sendable {
        public var sequence: Int
        public var subject: String
        public var data: JSONValue
        public var published: String
        /// How many times it has been handed out, this time included (0: read by `stream.messages`).
        public var deliveries: Int
        /// On a dead letter: why, and where it came from.
        public var deadLetter: DeadLetter?

        public init(sequence: Int, subject: String, data: JSONValue, published: String, deliveries: Int, deadLetter: StreamsAPI.DeadLetter?) {
            (self.sequence, self.subject, self.data, self.published, self.deliveries, self.deadLetter) = (sequence, subject, data, published, deliveries, deadLetter)
        }
    }

    public struct DeadLetter: Codable, Sendable {
        public var reason: String
        public var stream: String
        public var sequence: Int
        public var consumer: String
        public var deliveries: Int

        public init(reason: String, stream: String, sequence: Int, consumer: String, deliveries: Int) {
            (self.reason, self.stream, self.sequence, self.consumer, self.deliveries) = (reason, stream, sequence, consumer, deliveries)
        }
    }

    public struct Fetched: Codable, Sendable {
        public var messages: [Message]
        /// Messages the stream's limits removed before they were handed out (since the last fetch).
        public var missed: Int

        public init(messages: [StreamsAPI.Message], missed: Int) { (self.messages, self.missed) = (messages, missed) }
    }

    public struct NextEnd: Codable, Sendable {
        /// The messages, when asked without parts (in parts: empty, each was a part).
        public var messages: [Message]
        /// Messages handed out.
        public var count: Int
        /// Messages the stream's limits removed before they were handed out.
        public var missed: Int

        public init(messages: [Message], count: Int, missed: Int) { (self.messages, self.count, self.missed) = (messages, count, missed) }
    }

    public struct Acknowledged: Codable, Sendable {
        /// The sequences this call applied to (pending for this consumer until now).
        public var done: [Int]
        /// Those that were not pending: acknowledged, terminated or dead-lettered before, or never handed out.
        public var notPending: [Int]

        public init(done: [Int], notPending: [Int]) { (self.done, self.notPending) = (done, notPending) }
    }
}

extension StreamsAPI.StreamConfig: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = [
        "maxMessages": 1...1_000_000_000, "maxBytes": 1...1_099_511_627_776, "maxAge": 0...3_153_600_000, "duplicateWindow": 0...86_400,
    ]
}

extension StreamsAPI.StreamSettings: NumberRanges {
    public static let numberRanges = StreamsAPI.StreamConfig.numberRanges
}

extension StreamsAPI.ConsumerConfig: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = [
        "startSequence": 1...1_000_000_000_000, "ackWait": 0.001...86_400, "maxDeliver": 1...1_000, "maxAckPending": 0...1_000_000,
    ]
}

extension StreamsAPI.ConsumerSettings: NumberRanges {
    public static let numberRanges = StreamsAPI.ConsumerConfig.numberRanges.filter { ["ackWait", "maxDeliver", "maxAckPending"].contains($0.key) }
}

extension StreamsAPI.Purge: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["keep": 0...1_000_000_000]
}

extension StreamsAPI.ReadMessages: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["from": 1...1_000_000_000_000, "last": 1...1_000, "max": 1...1_000]
}

extension StreamsAPI.Fetch: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["batch": 1...1_000, "maxBytes": 1...16_777_216, "wait": 0...60]
}

extension StreamsAPI.Next: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["max": 1...1_000_000, "expires": 0.001...3_600]
}

extension StreamsAPI.Nak: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["delay": 0...86_400]
}
