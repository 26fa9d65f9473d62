import ArgumentParser
import BusKit
import BusProtocol
import Contracts
import Foundation

/// Writes (`value` nil or null: deletes) `key` as a client (`kernel` `state.publish`), only
/// at `revision` when given (0: only if absent); returns the key's new revision.
func writeState(_ client: BusClient, key: String, value: JSONValue?, ttl: Double? = nil, revision: UInt64? = nil) async throws -> UInt64 {
    do throws(BusError) {
        return try await client.publish(key: key, value: value, ttl: ttl, revision: revision)
    } catch {
        throw await Failure(error, service: KernelAPI.service, method: KernelAPI.statePublish.name, client: client)
    }
}

/// A key's value as `sb kv` prints it: JSON text, a deletion as `null`.
private func shown(_ value: JSONValue) -> String { value.jsonString }

/// A key as `sb kv get --json` and `sb kv ls --json` print it.
private func json(_ entry: KernelAPI.StateEntries.Entry) -> JSONValue {
    ["key": .string(entry.key), "revision": .int(Int64(clamping: entry.sequence)), "value": entry.value]
}

struct KV: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kv",
        abstract: "The kernel's state as a key-value store with revisions: get, put, create, update, del, ls, history, watch (after nats kv).",
        discussion: """
            A key's revision is the sequence number of its last change (sb sub shows it as "sequence"). create writes only a key that is absent, update only a key still at the revision you read: two clients that read and write back never overwrite each other in silence; the one that comes second is told (exit status 1, error -32004, the key's revision in the message). Keys are paths; with CURVE on a client writes under /client/ only.

            Examples:
              sb kv put /client/demo/route '"LHR-JFK"'
              sb kv get /client/demo/route
              sb kv update /client/demo/route '"CDG-SFO"' 1764115200000123
              sb kv create /client/demo/lock '"me"'
              sb kv ls /client/demo/
              sb kv history /client/demo/route
              sb kv watch /client/demo/ --since 1764115200000123
            """,
        subcommands: [KVGet.self, KVPut.self, KVCreate.self, KVUpdate.self, KVDelete.self, KVList.self, KVHistory.self, KVWatch.self]
    )
}

struct KeyArguments: ParsableArguments {
    @Argument(help: "The key (a path such as /client/name).") var key: String

    func validate() throws {
        guard key.hasPrefix("/"), key.count > 1 else { throw ValidationError("KEY must be a path starting with '/'") }
    }
}

struct KVGet: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "get", abstract: "Print a key's revision and value (exit status 1 when it is absent).")

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @OptionGroup var target: KeyArguments

    func run() async throws {
        try await withClient(connection) { client in
            let page = try await call(client, KernelAPI.stateGet, .init(prefix: target.key, limit: 1)).value
            guard let entry = page.entries.first(where: { $0.key == target.key }) else {
                throw Failure(status: ExitStatus.serviceError, message: "no key \(Output.printable(target.key)) (sb kv history shows whether it was deleted)")
            }
            if output.json {
                Output.json(json(entry), compact: true)
            } else {
                Output.line("\(Output.printable(entry.key)) revision \(entry.sequence)")
                Output.line(Output.stdoutIsTerminal ? Output.pretty(entry.value) : shown(entry.value))
            }
        }
    }
}

/// What the writing verbs share: the key, the value, and how the result is printed.
struct WriteArguments: ParsableArguments {
    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @OptionGroup var target: KeyArguments
    @Argument(help: "The value, as JSON (strings need quotes: '\"text\"'; '-': read from standard input; a negative number goes after --: KEY -- -5).") var value: String
    @Option(parsing: .unconditional, help: ArgumentHelp("How long until the kernel deletes the key: 30s, 10m, 1d, 30 (seconds).", valueName: "duration"), transform: ConnectionOptions.secondsArgument) var ttl: Double?

    func validate() throws {
        _ = try parseJSON(value, "VALUE")
        try checkTimeToLive(ttl)
    }

    /// Writes at `revision` (nil: whatever the key is at) and prints the new revision.
    func write(revision: UInt64?) async throws {
        let value = try parseJSON(self.value, "VALUE")
        try await withClient(connection) { client in
            let written = try await writeState(client, key: target.key, value: value, ttl: ttl, revision: revision)
            printWritten(target.key, written, json: output.json)
        }
    }
}

private func printWritten(_ key: String, _ revision: UInt64, json: Bool) {
    if json {
        Output.json(["key": .string(key), "revision": .int(Int64(clamping: revision))], compact: true)
    } else {
        Output.line("\(Output.printable(key)) revision \(revision)")
    }
}

struct KVPut: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "put", abstract: "Set a key, whatever its revision; print its new revision.")
    @OptionGroup var arguments: WriteArguments
    func run() async throws { try await arguments.write(revision: nil) }
}

struct KVCreate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "create", abstract: "Set a key only if it is absent (else exit status 1, -32004 with its revision).")
    @OptionGroup var arguments: WriteArguments
    func run() async throws { try await arguments.write(revision: 0) }
}

struct KVUpdate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "update", abstract: "Set a key only if it is still at REVISION (else exit status 1, -32004 with its revision).")
    @OptionGroup var arguments: WriteArguments
    @Argument(help: "The revision the key must be at (sb kv get shows it).") var revision: UInt64
    func run() async throws { try await arguments.write(revision: revision) }
}

struct KVDelete: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "del", abstract: "Delete a key (with --revision, only if it is still at it); the deletion is a revision too (of an absent key: nothing changes).",
                                                    aliases: ["rm"])
    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @OptionGroup var target: KeyArguments
    @Option(parsing: .unconditional, help: "Delete only if the key is still at this revision.") var revision: UInt64?

    func run() async throws {
        try await withClient(connection) { client in
            printWritten(target.key, try await writeState(client, key: target.key, value: nil, revision: revision), json: output.json)
        }
    }
}

struct KVList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ls", abstract: "List the keys under prefixes (all keys when none), one a line in byte order; --json adds each one's revision and value.",
        discussion: """
            The kernel answers a page of keys at a time (state.get), and every page is read, however many keys there are; a key that changes while they are read may be listed as it was or as it is. A key under two of the prefixes is listed once.

            Examples:
              sb kv ls /client/
              sb kv ls /pricing/ --json
            """,
        aliases: ["list"])
    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "Key prefixes (all keys when none).") var prefixes: [String] = []

    func validate() throws { try Subscribe.validate(prefixes: prefixes) }

    func run() async throws {
        try await withClient(connection) { client in
            var listed = Set<String>()
            for prefix in prefixes.isEmpty ? [""] : prefixes {
                var after: String?
                repeat {
                    let page = try await call(client, KernelAPI.stateGet, .init(prefix: prefix, after: after)).value
                    for entry in page.entries where listed.insert(entry.key).inserted {
                        if output.json {
                            Output.json(json(entry), compact: true)
                        } else {
                            Output.line(Output.printable(entry.key))
                        }
                    }
                    // Keys come in byte order, so each page starts after the last: a cursor
                    // that does not move on (a kernel not speaking state.get as its contract
                    // says) would have sb list the same page for ever.
                    if let next = page.next, let last = after, !last.utf8.lexicographicallyPrecedes(next.utf8) {
                        throw Failure(status: ExitStatus.serviceError,
                                      message: "kernel state.get: the page cursor did not move on (this page came after \(Output.printable(last)), the next would come after \(Output.printable(next))); stopped listing rather than repeat it")
                    }
                    after = page.next
                } while after != nil
            }
        }
    }
}

struct KVHistory: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "history", abstract: "A key's recent revisions, oldest first: PUT with its value, DEL for a deletion or an expiry.",
        discussion: "The kernel keeps kernel.state_history_per_key revisions of a key (16 by default) while they are among its last state_history_changes changes.")
    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @OptionGroup var target: KeyArguments

    func run() async throws {
        try await withClient(connection) { client in
            let answer = try await call(client, KernelAPI.stateHistory, .init(key: target.key))
            if output.json { return Output.json(answer.json, compact: true) }
            guard !answer.value.revisions.isEmpty else {
                return Output.line("no revisions of \(Output.printable(target.key)) since sequence \(answer.value.since)")
            }
            Output.table(["REVISION", "OP", "VALUE"], answer.value.revisions.map { revision in
                ["\(revision.sequence)", revision.value.isNull ? "DEL" : "PUT", revision.value.isNull ? "" : shown(revision.value)]
            })
        }
    }
}

struct KVWatch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch", abstract: "Print the keys under a prefix, then each change: REVISION PUT|DEL KEY VALUE.",
        discussion: """
            --since REVISION prints exactly the changes after it (deletions included) while the kernel holds them, else says so on stderr and prints every key. --json prints the lines sb sub prints.
            """)
    @OptionGroup var connection: ConnectionOptions
    @Flag(help: "Print JSON lines (as sb sub does).") var json = false
    @Argument(help: "Key prefixes (all keys when none).") var prefixes: [String] = []
    @Option(parsing: .unconditional, help: "Resume after this revision: only the changes since.") var since: UInt64?
    @Option(parsing: .unconditional, help: "Exit after this many lines.") var count: Int?

    func validate() throws {
        try Subscribe.validate(prefixes: prefixes)
        if let count, count <= 0 { throw ValidationError("--count must be positive") }
    }

    func run() async throws {
        try await Subscribe.follow(connection, prefixes: prefixes, includeSnapshot: true, since: since, count: count, notices: json) { update, value in
            if json {
                Output.line(Subscribe.line(update, value).jsonString)
            } else {
                Output.line("\(update.sequence) \(update.isDelete ? "DEL" : "PUT") \(Output.printable(update.key))" + (update.isDelete ? "" : " \(shown(value))"))
            }
        }
    }
}
