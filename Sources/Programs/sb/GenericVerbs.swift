import ArgumentParser
import BusKit
import BusProtocol
import Contracts
import Foundation
import StandardStreams
import SwitchboardConfig
import ZeroMQ

/// Reads JSON given on the command line, or on standard input when the argument is `-`
/// (``StandardInput``); a mistake is a usage error (64) saying where.
func parseJSON(_ text: String, _ what: String) throws -> JSONValue {
    let bytes = text == "-" ? try StandardInput.argument() : Array(text.utf8)
    do {
        return try JSONValue(parsing: bytes)
    } catch {
        let source = text == "-" ? " (from standard input)" : ""
        throw ValidationError("\(what)\(source) is not valid JSON: \(error) (strings need quotes: '\"text\"')")
    }
}

/// Standard input as a verb's argument: `-` in place of a value, params or a message's data
/// takes them from a file or another program (`jq -c . route.json | sb kv put /client/route -`),
/// and so past the size the system allows one command-line argument (128 KiB on Linux).
enum StandardInput {
    /// Read on first use and kept: a verb checks its arguments before it runs, and both read it.
    private static let contents = Result { () throws(ValidationError) in
        if isatty(STDIN_FILENO) == 1 { Output.diagnostic("reading standard input (end it with Ctrl-D)") }
        return try read(atMost: MDP.defaultMaxMessageSize)
    }

    /// What standard input holds, as an argument.
    static func argument() throws(ValidationError) -> [UInt8] { try contents.get() }

    /// Standard input to its end. More than `limit` bytes is a usage error, read no further:
    /// one message could not carry them, and reading on would only fill memory.
    static func read(atMost limit: Int) throws(ValidationError) -> [UInt8] {
        let bytes: [UInt8]?
        do {
            bytes = try FileContents.readToEnd(STDIN_FILENO, atMost: limit)
        } catch {
            throw ValidationError("cannot read standard input: \(error.reason)")
        }
        guard let bytes else {
            throw ValidationError("standard input holds more than \(limit) bytes, the most one message may carry")
        }
        return bytes
    }
}

struct Request: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "request",
        abstract: "Send one JSON-RPC request to a service and print its result.",
        discussion: """
            Examples:
              sb request kernel services.list
              sb req search countries.search '{"query":"par","limit":3}'
              sb request store history.add '{"text":"Amsterdam"}' --json
              sb request search locations.resolve '{"query":"Rome"}' --trace
              sb request search items.grouped '{"order":"natural"}' --stream
              sb request echo whoami --all

            With --trace the request starts a sampled trace: its trace ID is printed on stderr, and \
            each service it reaches logs it.

            With --stream the request asks for its result in parts (18/MDP): each part is printed as it \
            arrives, one JSON line {"part": ...}, then one line {"end": ...} with the result less its parts \
            (a method that cannot stream prints only the end: its whole result). A stream that ends early \
            (its worker died, this reader fell behind) says on stderr how many parts came and why, and exits 1.

            With --all the request goes to every worker of the service registered now, one copy each: a line \
            {"part": {"expected", "workers"}} first, then one {"part": {"worker", "result"}} (or "error") per \
            answer as it comes, then {"end": {"expected", "answered", "missing"}}: the workers that did not answer \
            (they died, drained, or did not answer within the kernel's queue timeout) are in "missing" with why. \
            Other cells that offer the service are asked too: each says its workers in a part with "cell", and \
            their answers and missing workers carry their cell.
            """,
        aliases: ["req"]
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The service (kernel, store, fetcher, search, pricing, ...).") var service: String
    @Argument(help: "The method.") var method: String
    @Argument(help: "The params, as JSON (an object or an array; '-': read from standard input).") var params: String?
    @Flag(help: "Send it in a new sampled trace: every service it reaches logs it with the trace id, printed here on stderr.")
    var trace = false
    @Flag(help: "Ask for the result in parts and print each as it comes, a JSON line each ({\"part\": ...}, then {\"end\": ...}).")
    var stream = false
    @Flag(help: "Send it to every worker of the service and print each answer as it comes, tagged with its worker (see above).")
    var all = false

    func validate() throws {
        if let params { _ = try parseParams(params) }
        if stream && all { throw ValidationError("--stream and --all do not go together: --all asks each worker for one answer") }
    }

    /// JSON-RPC params are by-name (an object) or by-position (an array), never a bare value.
    private func parseParams(_ text: String) throws -> JSONValue {
        let value = try parseJSON(text, "PARAMS")
        switch value {
        case .object, .array: return value
        default: throw ValidationError("PARAMS must be a JSON object or array (JSON-RPC params), got \(text); e.g. '{\"query\":\"par\"}'")
        }
    }

    func run() async throws {
        let params = try self.params.map { try parseParams($0) }
        try await withClient(connection, asOperator: OperatorsOnly.contains(service: service, method: method)) { client in
            guard trace else { return try await answer(client, params) }
            try await BusTracing.withNewTrace(sampled: true) { traceID in
                Output.diagnostic("trace \(traceID)")
                try await answer(client, params)
            }
        }
    }

    private func answer(_ client: BusClient, _ params: JSONValue?) async throws {
        guard stream || all else { return Output.json(try await call(client, service, method, params), compact: output.json) }
        let parts = all ? client.gather(service: service, method: method, paramsText: params?.jsonBytes)
            : client.stream(service: service, method: method, paramsText: params?.jsonBytes)
        let end = try await read(parts, from: client, service: service, method: method) { part in
            Output.line(JSONValue.object(["part": part]).jsonString)
        }
        Output.line(JSONValue.object(["end": end]).jsonString)
    }
}

struct Subscribe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "subscribe",
        abstract: "Print the state under some key prefixes, then every update, one JSON line each.",
        discussion: """
            Each line is {"key", "sequence", "value", "snapshot"}; a deleted key has value null.

            Nothing is lost in silence: when updates are lost (this reader fell behind and the kernel dropped some, or the connection to the kernel dropped), stderr says how many and after which sequence; the subscription then resyncs (with the changes since, when the kernel still holds them, else from a snapshot: the changed and deleted keys follow as "snapshot": true lines) and stderr says so. With --json the notices are also lines of their own: {"event": "missed", "count", "afterSequence", "reason"}, {"event": "resynced", "sequence", "changed"} and {"event": "reset", "since", "reason"}.

            --since N resumes after sequence N (the last line's "sequence" a reader printed): exactly the changes after it, deletions included, while the kernel holds them (kernel.state_history_changes, sb stats shows what it holds) or, with the state on etcd, while etcd does; otherwise a reset notice and the whole snapshot.

            Examples:
              sb subscribe /pricing/               the route and the deal, then changes
              sb sub /catalog/ /store/ --count 5   five lines, then exit
              sb sub --no-snapshot /client/        only what changes from now on
              sb sub /client/ --since 1764115200000123
              sb sub /pricing/route/ | head -n 1   one line: sb ends with its reader
            """,
        aliases: ["sub"]
    )

    @OptionGroup var connection: ConnectionOptions
    @Argument(help: "Key prefixes (all keys when none).") var prefixes: [String] = []
    @Option(parsing: .unconditional, help: "Exit after this many lines.") var count: Int?
    @Flag(help: "Only updates from now on, without the current entries.") var noSnapshot = false
    @Option(parsing: .unconditional, help: "Resume after this sequence: the changes since, not the snapshot.") var since: UInt64?
    @Flag(help: "Print missed/resynced notices as JSON lines on stdout too.") var json = false

    func validate() throws {
        try Self.validate(prefixes: prefixes)
        if let count, count <= 0 { throw ValidationError("--count must be positive") }
        if since != nil, noSnapshot { throw ValidationError("--since and --no-snapshot exclude each other: --since already starts after a sequence") }
    }

    func run() async throws {
        try await Self.follow(connection, prefixes: prefixes, includeSnapshot: !noSnapshot, since: since, count: count, notices: json) { update, value in
            Output.line(Self.line(update, value).jsonString)
        }
    }

    /// A prefix that cannot match a key (``CHP/isKeyPrefix(_:)``) is refused, not followed.
    static func validate(prefixes: [String]) throws {
        if let prefix = prefixes.first(where: { !CHP.isKeyPrefix($0) }) {
            throw ValidationError("prefix \(Output.printable(prefix)) matches no key: keys are paths starting with '/' (as /\(Output.printable(prefix)))")
        }
    }

    /// The line `sb sub` prints for an update (and `sb kv watch --json`).
    static func line(_ update: StateUpdate, _ value: JSONValue) -> JSONValue {
        ["key": .string(update.key), "sequence": .int(Int64(update.sequence)), "value": value, "snapshot": .bool(update.fromSnapshot)]
    }

    /// Follows the state under `prefixes`, handing `print` each update with its value (null
    /// for a deletion), until `count` of them; notices go to stderr, and with `notices` to
    /// stdout as JSON lines too.
    static func follow(_ connection: ConnectionOptions, prefixes: [String], includeSnapshot: Bool, since: UInt64?, count: Int?, notices: Bool,
                       print: (StateUpdate, JSONValue) -> Void) async throws {
        _ = try connection.stateEndpoints
        StandardStreams.endWhenOutputReaderLeaves()
        try await withClient(connection) { client in
            // A kernel that is not there is an error now, not a silent wait.
            _ = try await call(client, KernelAPI.ping)
            let subscription = try await client.subscribe(prefixes: prefixes.isEmpty ? [""] : prefixes, includeSnapshot: includeSnapshot, since: since)
            var printed = 0
            for try await event in subscription {
                if case .synced = event { continue }
                guard let update = event.update else {
                    Output.diagnostic("\(event)")
                    if notices, let line = notice(event) { Output.line(line.jsonString) }
                    continue
                }
                print(update, update.isDelete ? .null : update.json ?? .string(String(decoding: update.value.bytes, as: UTF8.self)))
                printed += 1
                if let count, printed >= count { break }
            }
            await subscription.cancel()
        }
    }

    static func notice(_ event: SubscriptionEvent) -> JSONValue? {
        switch event {
        case .update, .synced: nil
        case .missed(let count, let after, let reason):
            ["event": "missed", "count": count.map { .int(Int64(clamping: $0)) } ?? .null,
             "afterSequence": .int(Int64(clamping: after)), "reason": .string(reason)]
        case .resynced(let sequence, let changed):
            ["event": "resynced", "sequence": .int(Int64(clamping: sequence)), "changed": .int(Int64(changed))]
        case .reset(let since, let reason):
            ["event": "reset", "since": .int(Int64(clamping: since)), "reason": .string(reason)]
        }
    }
}

struct Publish: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "publish",
        abstract: "Set a key in the kernel's state and print its sequence number once it is published.",
        discussion: """
            With CURVE on, a client may write under /client/ only; null deletes the key.

            Examples:
              sb publish /client/alice/status '"online"'
              sb pub /client/alice/cursor '{"x":3,"y":4}' --ttl 30
              sb pub /client/alice/cursor null

            sb kv put does the same; sb kv create and sb kv update write only at the revision given.
            """,
        aliases: ["pub"]
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The key (a path such as /client/name).") var key: String
    @Argument(help: "The value, as JSON (null deletes; '-': read from standard input; a negative number goes after --: KEY -- -5).") var value: String
    @Option(parsing: .unconditional, help: ArgumentHelp("How long until the kernel deletes the key: 30s, 10m, 1d, 30 (seconds).", valueName: "duration"), transform: ConnectionOptions.secondsArgument) var ttl: Double?

    func validate() throws {
        guard key.hasPrefix("/") else { throw ValidationError("KEY must be a path starting with '/'") }
        _ = try parseJSON(value, "VALUE")
        try checkTimeToLive(ttl)
    }

    func run() async throws {
        let value = try parseJSON(self.value, "VALUE")
        try await withClient(connection) { client in
            let sequence = try await writeState(client, key: key, value: value, ttl: ttl)
            if output.json {
                Output.json(["key": .string(key), "sequence": .int(Int64(sequence))], compact: true)
            } else {
                Output.line("published \(key) (sequence \(sequence))")
            }
        }
    }
}

struct Services: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "services",
        abstract: "List the services the kernel knows, with workers, queue, whether they answer (8/MMI) and, under switchboard up, how their processes are doing.",
        discussion: """
            Examples:
              sb services
              sb services search store --json
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: ArgumentHelp("Only these services (default: every one the kernel knows).", valueName: "service")) var only: [String] = []

    func run() async throws {
        try await withActiveKernel(connection, printing: !output.json) { client in
            var list = try await call(client, KernelAPI.servicesList).value
            let asked = try servicesAsked(only, known: list.services.map(\.name))
            list.services.removeAll { !asked($0.name) }
            // What `switchboard up` says of each process (nothing when the bus runs otherwise).
            let processes = (try? await client.call(KernelAPI.stateGet, .init(prefix: SupervisorStatus.prefix)))?.entries
                .compactMap { try? $0.value.decode(as: SupervisorStatus.self) } ?? []
            var rows: [(service: KernelAPI.ServiceList.Entry, available: Bool, process: SupervisorStatus?)] = []
            for service in list.services {
                rows.append((service, (try? await client.hasWorkers(service.name, timeout: .seconds(2))) == true,
                             processes.first { $0.name == service.name }))
            }
            if output.json {
                return Output.json(.array(rows.map { row in
                    var entry = (try? JSONValue(encoding: row.service))?.objectValue ?? [:]
                    entry["available"] = .bool(row.available)
                    if let process = row.process { entry["process"] = try? JSONValue(encoding: process) }
                    return .object(entry)
                }), compact: true)
            }
            // On a bus of several cells: the other cells that serve each service (asked while
            // it has no worker here).
            let cells = rows.contains { $0.service.cells != nil }
            Output.table(["SERVICE", "WORKERS", "IDLE", "QUEUED", "IN FLIGHT", "AVAILABLE"] + (cells ? ["OTHER CELLS"] : []), rows.map { row in
                [row.service.name, "\(row.service.workers)", "\(row.service.idle)", "\(row.service.queued)", "\(row.service.inFlight)",
                 Output.styled(row.available ? "yes" : "no", row.available ? .green : .red)]
                    + (cells ? [row.service.cells?.joined(separator: ",") ?? "-"] : [])
            })
            for process in processes where process.state != .running {
                Output.line(Output.styled("\(process.name): \(process.summary)", .red))
            }
        }
    }
}

/// Whether a service is among those `asked` names (every one, when it names none). A name
/// the kernel does not know (`known`) is exit 69, with the names it does know.
func servicesAsked(_ asked: [String], known: [String]) throws -> (String) -> Bool {
    let unknown = asked.filter { !known.contains($0) }
    guard unknown.isEmpty else {
        throw Failure(status: ExitStatus.unavailable,
                      message: "the kernel knows no service \(unknown.map { "'\($0)'" }.joined(separator: ", ")) (it knows \(known.sorted().joined(separator: ", ")))")
    }
    return { asked.isEmpty || asked.contains($0) }
}

/// Runs `body` with a client of the active kernel: for a kernel pair, each kernel is asked
/// where it stands (a table of both when `printing`), and the questions go to the active one.
/// `asOperator`: with the operator's key, for what only operators may ask.
func withActiveKernel(_ connection: ConnectionOptions, printing: Bool, asOperator: Bool = false,
                      _ body: (BusClient) async throws -> Void) async throws {
    let brokers = try connection.checkedBrokers
    guard brokers.count > 1 else {
        // One kernel: the client that asks the questions asks where it stands first, so a
        // kernel that is not there is waited for once, for --timeout, as by any other verb.
        return try await withClient(connection, asOperator: asOperator) { client in
            let pong = try await call(client, KernelAPI.ping).value
            if printing, let status = pong.pair { printPairTable([(brokers[0], status, true)]) }
            try await body(client)
        }
    }
    let timeout = try connection.requestTimeout
    let answers = try await askEachKernel(brokers, timeout: timeout, curve: try connection.curve(asOperator: asOperator))
    let statuses = zip(brokers, answers).map { (endpoint: $0, status: $1.pong?.pair, reachable: $1.pong != nil) }
    if !statuses.contains(where: \.reachable) {
        // Each was waited for the whole --timeout already: waiting again would double it.
        let failure = Failure.noKernel(at: brokers, waited: timeout,
                                       summary: answers.map(\.connectionSummary).joined(separator: "; "))
        Output.diagnostic(failure.message)
        throw ExitCode(failure.status)
    }
    if printing, statuses.contains(where: { $0.status != nil }) { printPairTable(statuses) }
    guard let active = statuses.first(where: { $0.status?.state == "active" })?.endpoint else {
        return try await withClient(connection, asOperator: asOperator, body)
    }
    var options = connection
    options.endpoint = [active]
    options.stateEndpoint = nil
    try await withClient(options, asOperator: asOperator, body)
}

/// Asks each kernel where it stands, all at once, each over a connection of its own. A kernel
/// is waited for up to `timeout`, as any verb waits for its kernel; but once one has
/// answered, the others get one second more, so a dead kernel beside a live one costs a
/// second, not the whole timeout. In `brokers`' order: the answer (nil when none came) and,
/// for one that did not answer, what became of its connection.
private func askEachKernel(_ brokers: [String], timeout: Duration, curve: CurveClientKeys?) async throws
    -> [(pong: KernelAPI.Pong?, connectionSummary: String)] {
    var answers = Array(repeating: (pong: KernelAPI.Pong?.none, connectionSummary: ""), count: brokers.count)
    var clients: [BusClient] = []
    for endpoint in brokers { clients.append(try await BusClient(brokers: [endpoint], timeout: timeout, curve: curve)) }
    await withTaskGroup(of: (index: Int, pong: KernelAPI.Pong?)?.self) { group in
        for (index, client) in clients.enumerated() {
            group.addTask { (index, try? await client.call(KernelAPI.ping)) }
        }
        var waiting = brokers.count
        var graceStarted = false
        while waiting > 0, let next = await group.next() {
            // nil: the second after the first answer is over.
            guard let (index, pong) = next else { break }
            waiting -= 1
            answers[index].pong = pong
            if pong != nil, !graceStarted, waiting > 0 {
                graceStarted = true
                group.addTask { try? await Task.sleep(for: .seconds(1)); return nil }
            }
        }
        group.cancelAll()
    }
    for (index, client) in clients.enumerated() {
        if answers[index].pong == nil { answers[index].connectionSummary = await client.connectionSummary() }
        await client.close()
    }
    return answers
}

/// Each kernel of a pair: its role, where it stands, and what it last heard of its peer.
private func printPairTable(_ statuses: [(endpoint: String, status: KernelAPI.PairStatus?, reachable: Bool)]) {
    Output.table(["KERNEL", "ROLE", "STATE", "SINCE", "PEER"], statuses.map { endpoint, status, reachable in
        guard let status else { return [endpoint, "-", reachable ? "alone" : Output.styled("unreachable", .red), "-", "-"] }
        let state = status.state == "passive" && !status.synced ? "passive (catching up)" : status.state
        let heard = status.peer.lastHeardSecondsAgo.map { "\(status.peer.state ?? "?"), heard \($0) s ago" } ?? "never heard"
        return [endpoint, status.role, status.state == "active" ? Output.styled(state, .green) : state, status.since, heard]
    })
    Output.line("")
}

struct Stats: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stats",
        abstract: "The kernel's figures per service: requests, errors, queue, workers, latencies.",
        discussion: """
            Latency percentiles are the bounds of the kernel's histogram buckets (upper estimates).

            Examples:
              sb stats
              sb stats search store
              sb stats --prometheus > /var/lib/node_exporter/switchboard.prom
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: ArgumentHelp("Only these services' figures (default: every service's, and the kernel's own).", valueName: "service")) var only: [String] = []
    @Flag(help: "Print the Prometheus text exposition (version 0.0.4) instead.")
    var prometheus = false

    func validate() throws {
        if prometheus && !only.isEmpty { throw ValidationError("--prometheus prints every service's figures; name no service with it") }
    }

    func run() async throws {
        try await withActiveKernel(connection, printing: !output.json && !prometheus) { client in
            if prometheus {
                let metrics = try await call(client, KernelAPI.metrics).value
                return Output.write(metrics.text)
            }
            let stats = try await call(client, KernelAPI.stats)
            let asked = try servicesAsked(only, known: Array(stats.value.services.keys))
            if output.json {
                // Named services: their figures alone, as the kernel gave them.
                let services = stats.json["services"]?.objectValue.map { JSONValue.object($0.filter { asked($0.key) }) } ?? .null
                return Output.json(only.isEmpty ? stats.json : .object(["services": services]), compact: false)
            }
            func micros(_ value: Double?, bound: Bool = false) -> String {
                guard let value else { return "-" }
                return (bound ? "≤ " : "") + (value >= 1_000 ? "\((value / 100).rounded() / 10) ms" : "\(Int(value)) µs")
            }
            Output.table(["SERVICE", "REQUESTS", "ERRORS", "UNAVAILABLE", "QUEUED", "WORKERS", "P50", "P99", "MEAN"],
                         stats.value.services.filter { asked($0.key) }.sorted { $0.key < $1.key }.map { name, figures in
                [name, "\(figures.requests)", "\(figures.errors)", "\(figures.unavailable)", "\(figures.queued)", "\(figures.workers)",
                 micros(figures.p50LatencyMicroseconds.map(Double.init), bound: true), micros(figures.p99LatencyMicroseconds.map(Double.init), bound: true),
                 figures.replies == 0 ? "-" : micros(figures.meanLatencyMicroseconds)]
            })
            // The kernel's own figures, unless services were named.
            guard only.isEmpty else { return }
            if let open = stats.value.openFiles, let limit = stats.value.maxOpenFiles {
                Output.line()
                let refused = stats.value.refusedForOpenFiles ?? 0
                Output.line("open files: \(open) of the \(limit) the kernel may hold (each connection takes one)"
                    + (refused > 0 ? "; \(refused) connections ended as they came, near the limit" : ""))
            }
            if let etcd = stats.value.state.etcd {
                Output.line()
                Output.line("state on etcd \(etcd.endpoints.joined(separator: ",")) under \(etcd.prefix): revision \(etcd.revision) (\(etcd.lagRevisions) behind), "
                    + "lease \(etcd.lease), \(etcd.queuedWrites) writes waiting, \(etcd.failedWrites) failed, \(etcd.droppedWrites) dropped")
            }
            if let cell = stats.value.cell {
                Output.line()
                Output.line("cell \(cell.name): \(cell.received) requests from other cells")
                if !cell.peers.isEmpty {
                    Output.table(["TO CELL", "SENT", "ANSWERED", "P50", "P99", "MEAN"], cell.peers.sorted { $0.key < $1.key }.map { name, figures in
                        [name, "\(figures.sent)", "\(figures.answered)", micros(figures.p50LatencyMicroseconds.map(Double.init), bound: true),
                         micros(figures.p99LatencyMicroseconds.map(Double.init), bound: true), figures.answered == 0 ? "-" : micros(figures.meanLatencyMicroseconds)]
                    })
                }
            }
        }
    }
}

struct Ping: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ping",
        abstract: "Ask the kernel for a pong, and say how long it took.",
        discussion: "Example:\n  sb ping --endpoint tcp://10.0.0.5:5555"
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        try await withClient(connection) { client in
            let started = ContinuousClock.now
            let pong = try await call(client, KernelAPI.ping)
            let milliseconds = ((ContinuousClock.now - started).seconds * 10_000).rounded() / 10
            if output.json {
                var answer = pong.json.objectValue ?? [:]
                answer["milliseconds"] = .double(milliseconds)
                return Output.json(.object(answer), compact: true)
            }
            Output.line("pong from the kernel at \(client.brokers.joined(separator: ", ")) in \(milliseconds) ms (up \(Output.number(pong.value.uptimeSeconds)) s\(pong.value.version.map { ", version \($0)" } ?? ""))")
        }
    }
}
