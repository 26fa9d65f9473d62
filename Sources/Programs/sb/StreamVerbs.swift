import ArgumentParser
import BusKit
import BusProtocol
import Contracts
import Foundation
import StandardStreams

// `sb stream`: the streams service's durable streams and consumers. Each verb prints lines or
// a table for people and, with --json, the service's answer as one JSON line.

struct Stream: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stream",
        abstract: "Durable streams: add one, publish to it, consume it in a group and acknowledge.",
        discussion: """
            Examples:
              sb stream add orders orders.
              sb stream pub orders.new '{"id": 7}'
              sb stream read orders --last 10
              sb stream consumer orders billing
              sb stream fetch orders billing --batch 10 --wait 5
              sb stream sub orders billing --ack
              sb stream ack orders billing 1 2 3
            """,
        subcommands: [StreamList.self, StreamInfo.self, StreamAdd.self, StreamEdit.self, StreamDelete.self, StreamPurge.self, StreamPublish.self, StreamRead.self,
                      StreamConsumer.self, StreamFetch.self, StreamSubscribe.self, StreamAck.self, StreamNak.self, StreamProgress.self, StreamTerm.self],
        defaultSubcommand: StreamList.self
    )
}

struct StreamList: AsyncParsableCommand, TakesNoWord {
    static let configuration = CommandConfiguration(commandName: "ls", abstract: "Every stream: its subjects, messages, sequences and consumers.")

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @OptionGroup var otherVerb: NoOtherVerb<Stream>

    func run() async throws {
        try await appVerb(connection, output, { try await call($0, StreamsAPI.streamList) }) { answer in
            Output.table(["STREAM", "SUBJECTS", "MESSAGES", "BYTES", "FIRST", "LAST", "CONSUMERS"], answer.streams.map { stream in
                [stream.name, stream.subjects.joined(separator: " "), String(stream.messages), String(stream.bytes),
                 String(stream.firstSequence), String(stream.lastSequence), stream.consumers.joined(separator: " ")]
            })
        }
    }
}

struct StreamInfo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "info", abstract: "A stream's settings and counts, and each consumer's position.")

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The stream's name.") var name: String

    func run() async throws {
        try await withClient(connection) { client in
            let stream = try await call(client, StreamsAPI.streamInfo, StreamsAPI.StreamName(name: name))
            let consumers = try await call(client, StreamsAPI.consumerList, StreamsAPI.ConsumersOf(stream: name)).value.consumers
            if output.json {
                Output.json(["stream": stream.json, "consumers": try JSONValue(encoding: consumers)], compact: true)
                return
            }
            let info = stream.value
            let holds = StreamsAPI.stream(ofDeadLetters: info.name).map { "the dead letters of stream \($0)" }
                ?? "subjects \(info.subjects.joined(separator: " "))"
            Output.line("stream \(info.name) (\(info.retention.rawValue)): \(holds)")
            // Empty, the first sequence is the next one's (after a purge: past the last).
            let sequences = info.messages == 0 ? "next sequence \(info.firstSequence)" : "sequences \(info.firstSequence)-\(info.lastSequence)"
            Output.line("  messages \(info.messages) of \(info.maxMessages), bytes \(info.bytes) of \(info.maxBytes)"
                        + (info.maxAge.map { ", kept \(Output.span($0))" } ?? "") + ", \(sequences)")
            Output.line("  duplicate window \(Output.span(info.duplicateWindow))" + (info.deadLetters.map { ", dead letters in \($0)" } ?? ""))
            if info.captureState == true {
                Output.line("  captures the state under its subjects: changes to sequence \(info.capturedSequence ?? 0) kept"
                            + (info.captureGaps.map { $0 > 0 ? ", \($0) gaps" : "" } ?? ""))
            }
            if let key = info.addedBy { Output.line("  added by " + keyName(key)) }
            // Each consumer's settings: what `sb stream consumer` was given, which a second
            // add must repeat.
            for consumer in consumers {
                Output.line("  consumer \(consumer.name): " + consumerSettings(of: consumer) + (consumer.addedBy.map { ", added by " + keyName($0) } ?? ""))
            }
            guard !consumers.isEmpty else { return }
            Output.table(["CONSUMER", "NEXT", "WAITING", "PENDING", "DELIVERED", "REDELIVERED", "ACKED", "TERMINATED", "DEAD", "MISSED"], consumers.map { consumer in
                [consumer.name, String(consumer.nextSequence), String(consumer.waiting), String(consumer.pending), String(consumer.delivered),
                 String(consumer.redelivered), String(consumer.acknowledged), String(consumer.terminated), String(consumer.deadLettered), String(consumer.missed)]
            })
        }
    }

    /// A CURVE public key, with its name when the key folder holds it.
    private func keyName(_ key: String) -> String {
        "key " + (connection.keyFolder.name(of: key).map { "\($0) (\(key))" } ?? key)
    }
}

struct StreamAdd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "add",
        abstract: "Create a stream holding the messages published to its subjects (prefixes).",
        discussion: """
            Examples:
              sb stream add orders orders. --max-age 86400
              sb stream add prices /pricing/ --capture-state   each change under /pricing/
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The stream's name: letters, digits, '-' and '_'.") var name: String
    @Argument(help: "Subject prefixes it holds.") var subjects: [String]
    @Flag(help: "A work queue: each message stays until its one consumer has it done.") var workQueue = false
    @OptionGroup var limits: StreamLimitOptions
    @Flag(help: "Keep the kernel's state instead: every change of a key under the subjects (key prefixes), the key as subject.") var captureState = false

    func run() async throws {
        let config = StreamsAPI.StreamConfig(name: name, subjects: subjects, retention: workQueue ? .workQueue : nil, maxMessages: limits.maxMessages,
                                             maxBytes: limits.maxBytes, maxAge: limits.maxAge, duplicateWindow: limits.duplicateWindow,
                                             captureState: captureState ? true : nil)
        try await appVerb(connection, output, { try await call($0, StreamsAPI.streamAdd, config) }) { info in
            Output.line("stream \(info.name): subjects \(info.subjects.joined(separator: " ")), \(info.messages) messages, dead letters in \(info.deadLetters ?? "-")")
        }
    }
}

/// A stream's limits, as `sb stream add` sets them and `sb stream edit` changes them.
struct StreamLimitOptions: ParsableArguments {
    @Option(parsing: .unconditional, help: "At most this many messages (the oldest go).") var maxMessages: Int?
    @Option(parsing: .unconditional, help: "At most this many bytes of data (the oldest go).") var maxBytes: Int?
    @Option(parsing: .unconditional, help: ArgumentHelp("How long a message is kept: 7d, 12h, 3600 (seconds), or none (no age limit, as a stream is added without it).", valueName: "duration"), transform: Self.age) var maxAge: Double?
    @Option(parsing: .unconditional, help: ArgumentHelp("How long a message id is remembered, for exactly-once publishing: 10m, 120 (seconds; 2m when a stream is added without it).", valueName: "duration"), transform: ConnectionOptions.secondsArgument) var duplicateWindow: Double?

    /// `--max-age none` is 0 in the params: no age limit.
    static func age(_ text: String) throws -> Double {
        if text == "none" { return 0 }
        guard let seconds = ConnectionOptions.seconds(text) else {
            throw ValidationError("'\(text)' is neither none nor \(ConnectionOptions.spanExamples)")
        }
        return seconds
    }

    var anyGiven: Bool { maxMessages != nil || maxBytes != nil || maxAge != nil || duplicateWindow != nil }

    func validate() throws {
        typealias Config = StreamsAPI.StreamConfig
        try checkRange(maxMessages, flag: "max-messages", field: "maxMessages", of: Config.self)
        try checkRange(maxBytes, flag: "max-bytes", field: "maxBytes", of: Config.self)
        try checkRange(maxAge, flag: "max-age", field: "maxAge", of: Config.self, unit: "seconds")
        try checkRange(duplicateWindow, flag: "duplicate-window", field: "duplicateWindow", of: Config.self, unit: "seconds")
    }
}

struct StreamEdit: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "edit",
        abstract: "Change a stream's subjects or limits (and its dead letters' limits); lowered, the oldest messages past them go at once.",
        discussion: """
            --subjects gives every prefix the stream holds from then on: messages kept under one \
            left out stay. Its retention, and a capturing stream's subjects, stay as added. \
            Consumers count what the new limits remove before they had it done (MISSED in sb \
            stream info).

            Examples:
              sb stream edit orders --max-age 30d
              sb stream edit orders --max-age none   no age limit
              sb stream edit orders --max-messages 10000 --max-bytes 100000000
              sb stream edit orders --subjects orders. returns.
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The stream's name.") var name: String
    @Option(parsing: .upToNextOption, help: "Every subject prefix it holds from now on.") var subjects: [String] = []
    @OptionGroup var limits: StreamLimitOptions
    @OptionGroup var owner: StreamOwnerOptions

    func validate() throws {
        guard limits.anyGiven || !subjects.isEmpty else {
            throw ValidationError("give what to change: --subjects, --max-messages, --max-bytes, --max-age or --duplicate-window")
        }
    }

    func run() async throws {
        let changed = StreamsAPI.StreamSettings(name: name, subjects: subjects.isEmpty ? nil : subjects, maxMessages: limits.maxMessages,
                                                maxBytes: limits.maxBytes, maxAge: limits.maxAge, duplicateWindow: limits.duplicateWindow)
        try await appVerb(connection, output, asOperator: owner.asOperator, { try await call($0, StreamsAPI.streamUpdate, changed) }) { info in
            Output.line("stream \(info.name): subjects \(info.subjects.joined(separator: " ")), at most \(info.maxMessages) messages and \(info.maxBytes) bytes"
                        + (info.maxAge.map { ", kept \(Output.span($0))" } ?? "") + ", duplicate window \(Output.span(info.duplicateWindow))"
                        + "; holds \(info.messages) message\(info.messages == 1 ? "" : "s")")
        }
    }
}

/// Changing a stream is for the key that added it (with CURVE on), or an operator's.
struct StreamOwnerOptions: ParsableArguments {
    @Flag(name: .customLong("as-operator"), help: "Send it with the operator's key (KEYS/operator.key), which may change any stream: with CURVE on, a client key changes only the streams it added.")
    var asOperator = false
}

struct StreamDelete: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "rm", abstract: "Delete a stream with its messages, consumers and dead letters.",
                                                    aliases: ["del", "delete"])

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The stream's name.") var name: String
    @OptionGroup var owner: StreamOwnerOptions

    func run() async throws {
        try await appVerb(connection, output, asOperator: owner.asOperator, { try await call($0, StreamsAPI.streamDelete, StreamsAPI.StreamName(name: name)) }) { removed in
            Output.line("deleted stream \(name) (\(removed.messages) message\(removed.messages == 1 ? "" : "s"))")
        }
    }
}

struct StreamPurge: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "purge",
        abstract: "Delete a stream's messages (or those of a subject), keeping its settings and consumers.",
        discussion: """
            The sequence goes on; consumers count what they had not had done (MISSED in sb \
            stream info).

            Examples:
              sb stream purge orders
              sb stream purge orders --subject orders.test.
              sb stream purge prices --subject /pricing/ --keep 10   all but the last 10
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The stream's name.") var name: String
    @Option(help: "Only the messages whose subject starts with this.") var subject: String?
    @Option(parsing: .unconditional, help: "All but the last this many (of the subject's, with --subject).") var keep: Int?
    @OptionGroup var owner: StreamOwnerOptions

    func validate() throws {
        try checkRange(keep, flag: "keep", field: "keep", of: StreamsAPI.Purge.self)
    }

    func run() async throws {
        let purge = StreamsAPI.Purge(name: name, subject: subject, keep: keep)
        try await appVerb(connection, output, asOperator: owner.asOperator, { try await call($0, StreamsAPI.streamPurge, purge) }) { removed in
            Output.line("purged stream \(name) (\(removed.messages) message\(removed.messages == 1 ? "" : "s"))")
        }
    }
}

struct StreamPublish: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pub",
        abstract: "Publish a message; answered once it is kept.",
        discussion: """
            DATA is read as JSON when it is JSON, else kept as a string. With DATA '-' it is \
            standard input (as text, its final newlines dropped as $(...) drops them).

            Examples:
              sb stream pub orders.new '{"id": 7}' --id order-7
              jq -c .order order.json | sb stream pub orders.new -
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The subject.") var subject: String
    @Argument(help: "The message's data ('-': standard input; data beginning with '-' goes after --: SUBJECT -- -5).") var data: String
    @Option(help: "A message id: publishing it again within the stream's duplicate window keeps it once.") var id: String?

    func validate() throws { _ = try message() }

    /// DATA as the message's data: JSON when it parses, else the text.
    private func message() throws -> JSONValue {
        guard data == "-" else { return (try? JSONValue(parsing: Array(data.utf8))) ?? .string(data) }
        let bytes = try StandardInput.argument()
        if let value = try? JSONValue(parsing: bytes) { return value }
        guard var text = String(validating: bytes, as: UTF8.self) else {
            throw ValidationError("DATA (from standard input) is neither JSON nor UTF-8 text")
        }
        while text.last?.isNewline == true { text.removeLast() }
        return .string(text)
    }

    func run() async throws {
        let value = try message()
        try await appVerb(connection, output, { try await call($0, StreamsAPI.publish, StreamsAPI.Publish(subject: subject, data: value, id: id)) }) { published in
            Output.line(published.duplicate ? "\(published.stream) \(published.sequence) (a duplicate: kept once)" : "\(published.stream) \(published.sequence)")
        }
    }
}

struct StreamRead: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "read",
        abstract: "Read a stream's messages without a consumer (nothing is handed out or acknowledged).",
        discussion: """
            Prints one line per message: its sequence, subject, time and data.

            Examples:
              sb stream read orders                    from the first message
              sb stream read orders --from 120 --max 50
              sb stream read orders --last 10 --filter orders.new
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The stream.") var stream: String
    @Option(parsing: .unconditional, help: "From this sequence (default: the first).") var from: Int?
    @Option(parsing: .unconditional, help: "The last this many messages.") var last: Int?
    @Option(help: "Only subjects starting with this.") var filter: String?
    @Option(parsing: .unconditional, help: "At most this many messages (default 100).") var max: Int?

    func validate() throws {
        if from != nil, last != nil { throw ValidationError("give --from or --last, not both") }
        try checkRange(from, flag: "from", field: "from", of: StreamsAPI.ReadMessages.self)
        try checkRange(last, flag: "last", field: "last", of: StreamsAPI.ReadMessages.self)
        try checkRange(max, flag: "max", field: "max", of: StreamsAPI.ReadMessages.self)
    }

    func run() async throws {
        let asked = StreamsAPI.ReadMessages(name: stream, from: from, last: last, filter: filter, max: max)
        try await appVerb(connection, output, { try await call($0, StreamsAPI.streamMessages, asked) }) { read in
            for message in read.messages {
                Output.line("\(message.sequence) \(message.subject) \(message.published) \(String(decoding: message.data.jsonBytes, as: UTF8.self))")
            }
        }
    }
}

struct StreamConsumer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "consumer",
        abstract: "Create a durable consumer of a stream (add, the default), change one (edit), or delete one (rm).",
        discussion: """
            Examples:
              sb stream consumer orders billing --ack-wait 10 --max-deliver 3
              sb stream consumer edit orders billing --ack-wait 5m
              sb stream consumer rm orders billing
            """,
        subcommands: [StreamConsumerAdd.self, StreamConsumerEdit.self, StreamConsumerDelete.self],
        defaultSubcommand: StreamConsumerAdd.self
    )
}

struct StreamConsumerAdd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "add",
        abstract: "Create a durable consumer of a stream (its readers share its messages); given again with the same settings, show it.",
        discussion: "Example:\n  sb stream consumer orders billing --ack-wait 10 --max-deliver 3"
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The stream.") var stream: String
    @Argument(help: "The consumer's name.") var name: String
    @Flag(help: "Only messages published from now on (default: from the first).") var new = false
    @Option(parsing: .unconditional, help: "From this sequence.") var fromSequence: Int?
    @Option(help: "From this time (ISO 8601).") var fromTime: String?
    @Option(help: "Only subjects starting with this.") var filter: String?
    @OptionGroup var settings: ConsumerSettingsOptions

    func validate() throws {
        try checkRange(fromSequence, flag: "from-sequence", field: "startSequence", of: StreamsAPI.ConsumerConfig.self)
    }

    func run() async throws {
        let config = StreamsAPI.ConsumerConfig(stream: stream, name: name, deliver: new ? .new : nil, startSequence: fromSequence, startTime: fromTime,
                                               filter: filter, ackWait: settings.ackWait, maxDeliver: settings.maxDeliver, maxAckPending: settings.maxPending)
        try await appVerb(connection, output, { try await call($0, StreamsAPI.consumerAdd, config) }) { info in
            Output.line("consumer \(info.name) of \(info.stream): next \(info.nextSequence), waiting \(info.waiting), pending \(info.pending)")
        }
    }
}

/// A consumer's settings as `sb stream info` and `sb stream consumer edit` say them: "subjects
/// orders.eu., ack wait 30s, dead-lettered after 5 deliveries, at most 100 pending".
func consumerSettings(of consumer: StreamsAPI.ConsumerInfo) -> String {
    (consumer.filter.map { "subjects \($0)" } ?? "every subject")
        + ", ack wait \(Output.span(consumer.ackWait)), dead-lettered after \(consumer.maxDeliver) deliveries"
        + (consumer.maxAckPending.map { ", at most \($0) pending" } ?? "")
}

/// A consumer's settings, as `sb stream consumer add` sets them and `edit` changes them.
struct ConsumerSettingsOptions: ParsableArguments {
    @Option(parsing: .unconditional, help: ArgumentHelp("How long a reader has a message before it is handed out again: 30s, 500ms, 2m (30s when a consumer is added without it).", valueName: "duration"), transform: ConnectionOptions.secondsArgument) var ackWait: Double?
    @Option(parsing: .unconditional, help: "Deliveries before a message goes to the dead letters (5 when a consumer is added without it).") var maxDeliver: Int?
    @Option(parsing: .unconditional, help: "Messages its readers have pending at once at most; with that many, they are handed only those due again until some are acknowledged (0: the service's most, streams.max_ack_pending, as a consumer is added without it).") var maxPending: Int?

    var anyGiven: Bool { ackWait != nil || maxDeliver != nil || maxPending != nil }

    func validate() throws {
        try checkRange(ackWait, flag: "ack-wait", field: "ackWait", of: StreamsAPI.ConsumerConfig.self, unit: "seconds")
        try checkRange(maxDeliver, flag: "max-deliver", field: "maxDeliver", of: StreamsAPI.ConsumerConfig.self)
        try checkRange(maxPending, flag: "max-pending", field: "maxAckPending", of: StreamsAPI.ConsumerConfig.self)
    }
}

struct StreamConsumerEdit: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "edit",
        abstract: "Change a consumer's filter, ack wait, maximum deliveries or most pending; its position and pending messages stay.",
        discussion: """
            A new filter chooses among the messages not handed out yet. A message already handed \
            out keeps its deadline; the new settings apply as messages are handed out from now on.

            Examples:
              sb stream consumer edit orders billing --ack-wait 5m --max-deliver 10
              sb stream consumer edit orders billing --max-pending 0   the service's most
              sb stream consumer edit orders billing --filter orders.eu.
              sb stream consumer edit orders billing --filter ''       every subject
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The stream.") var stream: String
    @Argument(help: "The consumer's name.") var name: String
    @Option(help: "Only subjects starting with this from now on ('': every subject).") var filter: String?
    @OptionGroup var settings: ConsumerSettingsOptions
    @OptionGroup var owner: StreamOwnerOptions

    func validate() throws {
        guard filter != nil || settings.anyGiven else {
            throw ValidationError("give the settings to change: --filter, --ack-wait, --max-deliver or --max-pending")
        }
    }

    func run() async throws {
        let changed = StreamsAPI.ConsumerSettings(stream: stream, name: name, filter: filter, ackWait: settings.ackWait, maxDeliver: settings.maxDeliver,
                                                  maxAckPending: settings.maxPending)
        try await appVerb(connection, output, asOperator: owner.asOperator, { try await call($0, StreamsAPI.consumerUpdate, changed) }) { info in
            Output.line("consumer \(info.name) of \(info.stream): " + consumerSettings(of: info) + "; next \(info.nextSequence), pending \(info.pending)")
        }
    }
}

struct StreamConsumerDelete: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm", abstract: "Delete a consumer with its position and what its readers had pending (the stream's messages stay).",
        aliases: ["del", "delete"])

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The stream.") var stream: String
    @Argument(help: "The consumer's name.") var name: String
    @OptionGroup var owner: StreamOwnerOptions

    func run() async throws {
        try await appVerb(connection, output, asOperator: owner.asOperator,
                          { try await call($0, StreamsAPI.consumerDelete, StreamsAPI.ConsumerName(stream: stream, name: name)) }) { _ in
            Output.line("deleted consumer \(name) of \(stream)")
        }
    }
}

struct StreamFetch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fetch",
        abstract: "Take messages from a consumer: each stays yours until acknowledged or its ack wait passes.",
        discussion: """
            Prints one line per message: its sequence, subject, deliveries and data.
            Example:
              sb stream fetch orders billing --batch 10 --wait 5 --ack
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The stream.") var stream: String
    @Argument(help: "The consumer.") var consumer: String
    @Option(parsing: .unconditional, help: "At most this many messages (default 1).") var batch: Int?
    @Option(parsing: .unconditional, help: ArgumentHelp("How long to wait for one when none is ready: 5s, 500ms, 5 (seconds; default 0).", valueName: "duration"), transform: ConnectionOptions.secondsArgument) var wait: Double?
    @Flag(help: "Acknowledge them once printed.") var ack = false

    /// A message as a line: its sequence, subject, deliveries and data.
    static func show(_ message: StreamsAPI.Message) {
        Output.line("\(message.sequence) \(message.subject) (delivery \(message.deliveries)) \(String(decoding: message.data.jsonBytes, as: UTF8.self))")
    }

    func validate() throws {
        // The timeout is computed from it before the service can refuse it: a duration that
        // does not fit would trap.
        try checkRange(wait, flag: "wait", field: "wait", of: StreamsAPI.Fetch.self, unit: "seconds")
        try checkRange(batch, flag: "batch", field: "batch", of: StreamsAPI.Fetch.self)
    }

    func run() async throws {
        let fetch = StreamsAPI.Fetch(stream: stream, consumer: consumer, batch: batch, wait: wait)
        try await withClient(connection) { client in
            // The call may wait as long as asked, and then answer; a worker that drains (a
            // rolling restart) answers at once, with nothing: asked again for the wait left.
            let until = ContinuousClock.now + .seconds(wait ?? 0)
            var fetch = fetch
            var fetched = try await call(client, StreamsAPI.fetch, fetch, timeout: try wait.map { .seconds($0) + (try connection.requestTimeout) })
            while wait != nil, fetched.value.messages.isEmpty, fetched.value.missed == 0, until - .now >= .milliseconds(10) {
                fetch.wait = (until - .now).seconds
                fetched = try await call(client, StreamsAPI.fetch, fetch, timeout: until - .now + (try connection.requestTimeout))
            }
            if output.json {
                Output.json(fetched.json, compact: true)
            } else {
                if fetched.value.missed > 0 { Output.diagnostic("\(fetched.value.missed) messages were removed by the stream's limits before you had them") }
                for message in fetched.value.messages { Self.show(message) }
            }
            let sequences = fetched.value.messages.map(\.sequence)
            if ack, !sequences.isEmpty {
                _ = try await call(client, StreamsAPI.ack, StreamsAPI.Sequences(stream: stream, consumer: consumer, sequences: sequences))
            }
        }
    }
}

struct StreamSubscribe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sub",
        abstract: "Take a consumer's messages as they come (push): each stays yours until acknowledged or its ack wait passes.",
        discussion: """
            Prints one line per message as fetch does, until --count messages or for --expires.
            A streams worker that stops meanwhile (a rolling restart) hands over to another; one that dies (a crash), or the kernel going away (a restart, a pair's failover), is said on stderr, and sb goes on once another worker or the kernel is there.
            Example:
              sb stream sub orders billing --count 100 --ack
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The stream.") var stream: String
    @Argument(help: "The consumer.") var consumer: String
    @Option(parsing: .unconditional, help: "Stop after this many messages (default \(StreamsAPI.Next.defaultMax)).") var count: Int?
    @Option(parsing: .unconditional, help: ArgumentHelp("Stop after this long: 30s, 10m, 60 (seconds; default \(Int(StreamsAPI.Next.defaultExpires))s).", valueName: "duration"), transform: ConnectionOptions.secondsArgument) var expires: Double?
    @Flag(help: "Acknowledge each once printed.") var ack = false

    func validate() throws {
        // As fetch's --wait: the timeout is computed from it.
        try checkRange(expires, flag: "expires", field: "expires", of: StreamsAPI.Next.self, unit: "seconds")
        try checkRange(count, flag: "count", field: "max", of: StreamsAPI.Next.self)
    }

    func run() async throws {
        StandardStreams.endWhenOutputReaderLeaves()
        try await withClient(connection) { client in
            let until = ContinuousClock.now + .seconds(expires ?? StreamsAPI.Next.defaultExpires)
            var left = count ?? StreamsAPI.Next.defaultMax, missed = 0
            // A worker that drains (a rolling restart) ends its parts early; one that dies while
            // it hands messages out (a crash) ends them with -32014 worker_died, and a kernel that
            // goes away (a restart, a pair's failover) with -32014 connection_lost. What was handed
            // out stays pending, or acknowledged: the reader asks again, of the worker that takes
            // over, for what is left.
            while left > 0 {
                let remaining = until - .now
                guard remaining >= .milliseconds(10) else { break }
                let next = StreamsAPI.Next(stream: stream, consumer: consumer, max: left, expires: remaining.seconds)
                let parts = client.stream(StreamsAPI.next, next, timeout: remaining + (try connection.requestTimeout))
                do {
                    for try await message in parts {
                        if output.json { Output.json(try JSONValue(encoding: message), compact: true) } else { StreamFetch.show(message) }
                        left -= 1
                        if ack { _ = try await call(client, StreamsAPI.ack, StreamsAPI.Sequences(stream: stream, consumer: consumer, sequences: [message.sequence])) }
                    }
                    missed += try await parts.end().missed
                } catch let error as BusError {
                    guard let notice = Self.goingOn(after: error) else {
                        throw await Failure(error, service: StreamsAPI.service, method: StreamsAPI.nextMethod.name, client: client)
                    }
                    Output.diagnostic(notice)
                }
            }
            if missed > 0 { Output.diagnostic("\(missed) messages were removed by the stream's limits before you had them") }
        }
    }

    /// What sb says when `error` ended a push it asks again for (-32014 by a worker that died
    /// or a kernel connection that dropped); nil for any other error, which ends sb.
    static func goingOn(after error: BusError) -> String? {
        guard case .remote(_, let rpc) = error, rpc.code == JSONRPCError.streamEndedCode else { return nil }
        switch rpc.data?["reason"]?.stringValue {
        case "worker_died": return "the streams worker handing these messages out died; going on with another"
        case "connection_lost": return "the connection to the kernel dropped (a restart?); going on once it is back"
        default: return nil
        }
    }
}

/// `ack`, `nak`, `progress` and `term`: what a reader says of messages it was handed.
struct SettleOptions: ParsableArguments {
    @Argument(help: "The stream.") var stream: String
    @Argument(help: "The consumer.") var consumer: String
    @Argument(help: "The messages' sequences (any number: sent \(StreamsAPI.Sequences.most) a request).") var sequences: [Int]

    func validate() throws {
        if let bad = sequences.first(where: { $0 < 1 }) { throw ValidationError("sequences are 1 or more (sb stream fetch prints them), got \(bad)") }
    }

    /// The sequences as the requests carry them, at most ``StreamsAPI/Sequences/most`` each.
    var batches: [[Int]] {
        stride(from: 0, to: sequences.count, by: StreamsAPI.Sequences.most).map { Array(sequences[$0..<min($0 + StreamsAPI.Sequences.most, sequences.count)]) }
    }

    func params(_ batch: [Int]) -> StreamsAPI.Sequences { StreamsAPI.Sequences(stream: stream, consumer: consumer, sequences: batch) }
}

let notPendingHelp = "A sequence that was not pending (done before, handed out again to another reader since, or never handed out) is named on stderr, exit status 1."

/// Runs `ack`, `nak`, `progress` or `term` and prints what it applied to. A sequence that was
/// not pending (done before, handed to another reader since, or never handed out) is exit
/// status 1: a script that acknowledges late learns that its work may have been done twice.
/// When a request fails after others were answered, what those applied to is printed before
/// the failure, and the sequences left are named: none of it is to be sent again blindly.
func settleMessages(_ connection: ConnectionOptions, _ output: OutputOptions, _ verb: String, _ settle: SettleOptions,
            _ body: (BusClient, [Int]) async throws -> Answer<StreamsAPI.Acknowledged>) async throws {
    try await withClient(connection) { client in
        var answer = StreamsAPI.Acknowledged(done: [], notPending: [])
        var failure: (any Error)?
        // The sequences the requests answered so far carried: the first ones given.
        var answered = 0
        for batch in settle.batches {
            do {
                let part = try await body(client, batch).value
                answer.done += part.done
                answer.notPending += part.notPending
                answered += batch.count
            } catch {
                failure = error
                break
            }
        }
        if let failure, answer.done.isEmpty, answer.notPending.isEmpty { throw failure }
        if output.json {
            Output.json(try JSONValue(encoding: answer), compact: true)
        } else if !answer.done.isEmpty {
            Output.line("\(verb) \(answer.done.map(String.init).joined(separator: " "))")
        }
        if let failure {
            let given = settle.sequences
            Output.diagnostic("not known to be \(verb), as the request for them failed (below): the last \(given.count - answered) of the \(given.count) sequences given, from \(given[answered]) on")
            throw failure
        }
        if !answer.notPending.isEmpty {
            throw Failure(status: ExitStatus.serviceError,
                          message: "not pending (done before, or never handed out): \(answer.notPending.map(String.init).joined(separator: " "))")
        }
    }
}

struct StreamAck: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ack", abstract: "Acknowledge messages: done, not handed out again.", discussion: notPendingHelp)

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @OptionGroup var settle: SettleOptions

    func run() async throws {
        try await settleMessages(connection, output, "acknowledged", settle) { try await call($0, StreamsAPI.ack, settle.params($1)) }
    }
}

struct StreamNak: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "nak", abstract: "Give messages back: handed out again, after --delay.", discussion: notPendingHelp)

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @OptionGroup var settle: SettleOptions
    @Option(parsing: .unconditional, help: ArgumentHelp("How long before they are handed out again: 10s, 500ms, 5m (default 0).", valueName: "duration"), transform: ConnectionOptions.secondsArgument) var delay: Double?

    func validate() throws {
        try checkRange(delay, flag: "delay", field: "delay", of: StreamsAPI.Nak.self, unit: "seconds")
    }

    func run() async throws {
        try await settleMessages(connection, output, "given back", settle) {
            try await call($0, StreamsAPI.nak, StreamsAPI.Nak(stream: settle.stream, consumer: settle.consumer, sequences: $1, delay: delay))
        }
    }
}

struct StreamProgress: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "progress", abstract: "Still working on messages: their ack wait starts again, so they are not handed out to another reader yet.",
        discussion: notPendingHelp)

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @OptionGroup var settle: SettleOptions

    func run() async throws {
        try await settleMessages(connection, output, "in progress", settle) { try await call($0, StreamsAPI.progress, settle.params($1)) }
    }
}

struct StreamTerm: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "term", abstract: "Stop delivering messages without doing them (not dead-lettered).", discussion: notPendingHelp)

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @OptionGroup var settle: SettleOptions

    func run() async throws {
        try await settleMessages(connection, output, "terminated", settle) { try await call($0, StreamsAPI.term, settle.params($1)) }
    }
}
