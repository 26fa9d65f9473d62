import ArgumentParser
import BusKit
import BusProtocol
import CommandWords
import Contracts
import Foundation
import StandardStreams
import SwitchboardConfig
import ZeroMQ

/// Where the kernel is and how long to wait: shared by every verb.
///
/// `--endpoint` (or `SB_ENDPOINT`, comma-separated for several kernels) is the broker;
/// `--state-endpoint` (or `SB_STATE_ENDPOINT`) the CHP snapshot endpoint, with the
/// publisher and collector on the next two ports (the kernel's defaults: 5556, 5557,
/// 5558), or all three given comma-separated; by default the broker's host, its port + 1.
struct ConnectionOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("The kernel's broker endpoint, or a kernel pair's two, comma-separated, primary first (env SB_ENDPOINT; default tcp://127.0.0.1:5555).", valueName: "endpoint"))
    var endpoint: [String] = []

    @Option(name: .long, help: ArgumentHelp("The kernel's state endpoint: CHP snapshot, or snapshot,publisher,collector (env SB_STATE_ENDPOINT; default: the broker's port + 1).", valueName: "endpoint"))
    var stateEndpoint: String?

    @Option(name: .long, help: ArgumentHelp("How long to wait for an answer: 5s, 500ms, 2m (env SB_TIMEOUT; default 5s).", valueName: "duration"))
    var timeout: String?

    // A key may begin with '-': `SB.main()` attaches it to the flag before parsing.
    @Option(name: .long, help: ArgumentHelp("The kernel's CURVE public key, for a kernel with security.curve on (env SB_SERVER_KEY).", valueName: "key"))
    var serverKey: String?

    @Option(name: .long, help: ArgumentHelp("This client's key file from `switchboard keygen --out` (env SB_KEY_FILE); needed with --server-key, and without it the kernel's key is the key folder's kernel.pub.", valueName: "file"))
    var keyFile: String?

    @Option(name: .long, help: ArgumentHelp("The bus's key folder, where `switchboard up` left client.key and kernel.pub (env SB_KEY_DIR; default data/keys): used when it holds them and no --server-key is given.", valueName: "folder"))
    var keyDir: String?

    var environment: [String: String] { ProcessInfo.processInfo.environment }

    /// Checked as the verb's arguments are parsed, so a bad value is a usage error of that
    /// verb, shown with its usage.
    func validate() throws {
        _ = try requestTimeout
        _ = try checkedBrokers
        if givenStateEndpoint != nil { _ = try stateEndpoints }
    }

    /// The key folder sb looks in when no server key is given.
    var keyFolder: KeyFolder {
        KeyFolder(keyDir ?? environment["SB_KEY_DIR"].flatMap { $0.isEmpty ? nil : $0 } ?? KeyFolder.defaultPath)
    }

    /// The CURVE keys to connect with: the server key and key file given (a key file alone:
    /// with the key folder's kernel.pub, as a client given a key of its own for the local bus
    /// connects), else the local client's keys in the key folder (the operator's,
    /// `asOperator`, when it holds them), else nil (plain text).
    func curve(asOperator: Bool = false) throws -> CurveClientKeys? {
        var serverKey = self.serverKey ?? environment["SB_SERVER_KEY"].flatMap { $0.isEmpty ? nil : $0 }
        let keyFile = self.keyFile ?? environment["SB_KEY_FILE"].flatMap { $0.isEmpty ? nil : $0 }
        if serverKey == nil, keyFile != nil {
            do {
                serverKey = try keyFolder.publicKey(KeyFolder.kernel)
            } catch {
                throw ValidationError("--key-dir: \(error)")
            }
            if serverKey == nil {
                throw ValidationError("--key-file needs --server-key (the kernel's public key), or a key folder with the kernel's kernel.pub (--key-dir, default data/keys; none at \(keyFolder.path))")
            }
        }
        guard let serverKey else {
            do {
                return try asOperator ? keyFolder.operatorKeys() : keyFolder.clientKeys()
            } catch {
                throw ValidationError("--key-dir: \(error)")
            }
        }
        guard let keyFile else { throw ValidationError("--server-key needs --key-file (this client's key pair, from `switchboard keygen --out`)") }
        let text = String(decoding: try fileContents(keyFile, for: "--key-file", atMost: FileContents.largestKeyFile), as: UTF8.self)
        guard let secret = CurveKeyFile.secretKey(in: text) else {
            throw ValidationError("--key-file: \(keyFile) holds no secret key (use the .key file `switchboard keygen --out` writes, not the .pub)")
        }
        do {
            return try CurveClientKeys(serverKey: serverKey, secretKey: secret)
        } catch {
            throw ValidationError("--server-key: '\(serverKey)' is not a CURVE public key (40 characters of Z85)")
        }
    }

    /// The broker endpoints, from the flag, else the environment, else the default.
    var brokers: [String] {
        if !endpoint.isEmpty { return endpoint.flatMap(ConfigSection.commaSeparated) }
        if let listed = environment["SB_ENDPOINT"].map(ConfigSection.commaSeparated), !listed.isEmpty { return listed }
        return ["tcp://127.0.0.1:5555"]
    }

    /// The broker endpoints, each checked to be one sb can connect to (a usage error otherwise).
    var checkedBrokers: [String] {
        get throws {
            for broker in brokers where !ConfigSection.isEndpoint(broker, schemes: ["tcp://", "ipc://"]) {
                throw ValidationError("\(Self.origin("--endpoint", variable: "SB_ENDPOINT", flagGiven: !endpoint.isEmpty)): '\(broker)' is not an endpoint such as tcp://127.0.0.1:5555 or ipc:///path")
            }
            return brokers
        }
    }

    var requestTimeout: Duration {
        get throws {
            guard let text = timeout ?? environment["SB_TIMEOUT"], !text.isEmpty else { return .seconds(5) }
            guard let duration = Self.duration(text) else {
                throw ValidationError("\(Self.origin("--timeout", variable: "SB_TIMEOUT", flagGiven: timeout != nil)): '\(text)' is not a duration such as 5s, 500ms or 2m (up to a day)")
            }
            return duration
        }
    }

    /// Where a bad value came from, for its message: the flag, or the variable standing in for it.
    private static func origin(_ flag: String, variable: String, flagGiven: Bool) -> String {
        flagGiven ? flag : "\(variable) (for \(flag))"
    }

    /// `5s`, `500ms`, `2m`, `1.5` (seconds); positive, at most a day.
    static func duration(_ text: String) -> Duration? {
        // Up to a day: checked before it becomes milliseconds (1e300 would trap the conversion).
        guard let seconds = seconds(text), seconds > 0, seconds <= 86_400 else { return nil }
        return .milliseconds(Int64((seconds * 1_000).rounded()))
    }

    /// A span of time as every flag of sb that takes one reads it: a number of seconds
    /// (`30`, `0.5`), or a number with a unit (`500ms`, `5s`, `2m`, `12h`, `7d`). Any sign, so
    /// that each flag's own range check names what it takes; nil for anything else.
    static func seconds(_ text: String) -> Double? {
        let units: [(suffix: String, seconds: Double)] = [("ms", 0.001), ("s", 1), ("m", 60), ("h", 3_600), ("d", 86_400)]
        let unit = units.first { text.hasSuffix($0.suffix) }
        guard let value = Double(text.dropLast(unit?.suffix.count ?? 0)), value.isFinite else { return nil }
        return value * (unit?.seconds ?? 1)
    }

    /// The transform of a flag that takes a span of time (`seconds(_:)`), as its value in seconds.
    static func secondsArgument(_ text: String) throws -> Double {
        guard let seconds = seconds(text) else { throw ValidationError("'\(text)' is not \(spanExamples)") }
        return seconds
    }

    /// What `seconds(_:)` takes, as its errors say it.
    static let spanExamples = "a span of time such as 30 (seconds), 500ms, 5s, 2m, 12h or 7d"

    /// The state endpoints as the flag, else the environment, gives them (nil: derived from the brokers).
    private var givenStateEndpoint: String? {
        stateEndpoint ?? environment["SB_STATE_ENDPOINT"].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// Each kernel's CHP snapshot, publisher and collector endpoints.
    var stateEndpoints: [StateEndpoints] {
        get throws {
            if let text = givenStateEndpoint {
                let parts = text.split(separator: ";").map(String.init)
                let endpoints = parts.compactMap { StateEndpoints($0) }
                let source = Self.origin("--state-endpoint", variable: "SB_STATE_ENDPOINT", flagGiven: stateEndpoint != nil)
                guard endpoints.count == parts.count else {
                    throw ValidationError("\(source): give tcp://HOST:PORT (the publisher and collector follow on the next two ports), or snapshot,publisher,collector; for a kernel pair one per kernel, separated by ';'")
                }
                guard parts.count == brokers.count else {
                    throw ValidationError("\(source) gives the state of \(parts.count) kernel\(parts.count == 1 ? "" : "s"), the endpoint \(brokers.count): give one per kernel, separated by ';'")
                }
                return endpoints
            }
            return try brokers.map { broker in
                guard let endpoints = StateEndpoints(followingBroker: broker) else {
                    throw ValidationError("--state-endpoint is needed when the broker endpoint is not tcp://HOST:PORT")
                }
                return endpoints
            }
        }
    }

    /// A client for the kernel, with the timeout as its default; `asOperator` for what only
    /// operators may ask (`OperatorsOnly`); on `loop` (another client's) when given, sharing
    /// its thread.
    func client(asOperator: Bool = false, loop: SocketLoop? = nil) async throws -> BusClient {
        try await BusClient(brokers: try checkedBrokers, loop: loop, timeout: requestTimeout, curve: try curve(asOperator: asOperator),
                            // Those given are checked whatever the verb; else the client derives them from
                            // the brokers where it can (the verbs that follow the state check that first).
                            state: givenStateEndpoint == nil ? nil : try stateEndpoints)
    }
}

/// Options about what is printed.
struct OutputOptions: ParsableArguments {
    @Flag(name: .long, help: "Print JSON (one document, or one line per item) instead of a table.")
    var json = false
}

/// For a verb's default sub-verb that takes no arguments (`sb stream` is `sb stream ls`): a
/// word after the verb that names none of its sub-verbs is refused naming them, not as an
/// argument the default sub-verb did not expect.
struct NoOtherVerb<Verb: ParsableCommand>: ParsableArguments {
    @Argument(help: .hidden) var word: String?

    func validate() throws {
        guard let word else { return }
        throw ValidationError(CommandWords.noSuchVerb(word, of: Verb.self, path: "sb \(Verb._commandName)"))
    }
}

/// A verb's default sub-verb that takes no word (``NoOtherVerb``): a word after the verb that
/// names none of its sub-verbs is refused with the verb's usage (``SB/unknownVerb(_:)``), not
/// the default sub-verb's.
protocol TakesNoWord {
    associatedtype Verb: ParsableCommand
    var otherVerb: NoOtherVerb<Verb> { get }
}

/// Sends one request the way every verb does: the answer, or the failure printed on stderr
/// and turned into the exit status (1 the service answered an error, 69 no service or no
/// kernel, 75 timed out).
///
/// The answer is the JSON the service sent, whatever its contract's result type: verbs print
/// it as it came with --json.
func call<P, R>(_ client: BusClient, _ method: Method<P, R>, _ params: P, timeout: Duration? = nil) async throws -> Answer<R> {
    let json: JSONValue
    do {
        json = try await client.call(method.json, params, timeout: timeout)
    } catch {
        throw await Failure(error, service: method.service, method: method.name, client: client)
    }
    do {
        return Answer(json: json, value: try decodeResult(R.self, json))
    } catch {
        throw Failure(status: ExitStatus.serviceError, message: "\(method.service) \(method.name): \((error as? JSONRPCError)?.message ?? "\(error)")")
    }
}

/// Calls a method that answers in parts: `onPart` sees each as it comes; the answer is the end.
func stream<P, Part, R>(_ client: BusClient, _ method: StreamMethod<P, Part, R>, _ params: P, timeout: Duration? = nil,
                        onPart: (Part) -> Void) async throws -> Answer<R> {
    let end = try await read(client.stream(method, params, timeout: timeout), from: client, service: method.service, method: method.name, onPart: onPart)
    return Answer(json: (try? JSONValue(encoding: end)) ?? .null, value: end)
}

/// Reads a reply in parts to its end: `onPart` sees each part; a failure is ready to print.
func read<Part, End>(_ parts: PartStream<Part, End>, from client: BusClient, service: String, method: String,
                     onPart: (Part) -> Void) async throws -> End {
    do throws(BusError) {
        do {
            for try await part in parts { onPart(part) }
        } catch let error as BusError {
            throw error
        } catch {
            throw BusError.cancelled(service: service, method: method)
        }
        return try await parts.end()
    } catch {
        throw await Failure(error, service: service, method: method, client: client)
    }
}

/// ``call(_:_:_:timeout:)`` for a method without params.
func call<R>(_ client: BusClient, _ method: Method<NoParams, R>, timeout: Duration? = nil) async throws -> Answer<R> {
    try await call(client, method, NoParams(), timeout: timeout)
}

/// A service's answer twice: as it came (what `--json` prints, unchanged) and as its
/// contract's result type (what the tables read).
struct Answer<Value: Sendable>: Sendable {
    let json: JSONValue
    let value: Value
}

/// `sb request`: any service and method by name, params as given.
func call(_ client: BusClient, _ service: String, _ method: String, _ params: JSONValue?) async throws -> JSONValue {
    do {
        return try await client.request(service: service, method: method, params: params)
    } catch {
        throw await Failure(error, service: service, method: method, client: client)
    }
}

/// A request that failed, ready to print and to end the process with its exit status.
struct Failure: Error {
    let status: Int32
    let message: String
    /// The service's JSON-RPC error, when it answered one.
    let error: JSONRPCError?

    init(status: Int32, message: String, error: JSONRPCError? = nil) {
        self.status = status
        self.message = message
        self.error = error
    }

    init(_ error: BusError, service: String, method: String, client: BusClient) async {
        switch error {
        case .remote(_, let rpc):
            let status: Int32 = rpc.code == JSONRPCError.serviceUnavailableCode ? ExitStatus.unavailable
                : rpc.code == JSONRPCError.timedOutCode ? ExitStatus.timedOut : ExitStatus.serviceError
            // The error's data (data.field, data.expected, a conflict's current value) as one
            // line of JSON: a script reads it, and no string in it can break the line.
            let data = rpc.data.map { " data: \($0.jsonString)" } ?? ""
            self.init(status: status, message: "\(service) \(method): error \(rpc.code): \(rpc.message)\(data)", error: rpc)
        case .unavailable(_, let message):
            self.init(status: ExitStatus.unavailable, message: "\(service) \(method): \(message)",
                      error: JSONRPCError(code: JSONRPCError.serviceUnavailableCode, message: message))
        case .timedOut(_, _, let after):
            // No answer: is the kernel there at all, and does the service have a worker? The
            // kernel is asked only over a connection that completed its handshake: without
            // one the question could not be answered either.
            let hasWorkers = await client.isConnectedToAKernel() ? try? await client.hasWorkers(service, timeout: .seconds(1)) : nil
            switch hasWorkers {
            case nil:
                // Say what the connection went through, not a guess.
                self = .noKernel(at: client.brokers, waited: after, summary: await client.connectionSummary())
            case false? where service != KernelAPI.service:
                // A name with no worker is more often mistyped than on its way: say those
                // that have workers (the kernel lists a name once a request was sent to it, served or not).
                let served = (try? await client.call(KernelAPI.servicesList, timeout: .seconds(1)))?.services
                    .filter { $0.workers > 0 || $0.cells != nil }.map(\.name) ?? []
                let servedNames = served.isEmpty ? "" : "; services with workers: \(served.sorted().joined(separator: ", "))"
                self.init(status: ExitStatus.unavailable, message: "\(service) \(method): no '\(service)' service is running (no worker within \(after.formatted)\(servedNames))",
                          error: JSONRPCError(code: JSONRPCError.serviceUnavailableCode, message: "no worker for '\(service)'"))
            default:
                self.init(status: ExitStatus.timedOut, message: "\(service) \(method): no answer within \(after.formatted)",
                          error: JSONRPCError(code: JSONRPCError.timedOutCode, message: "timed out after \(after.formatted)"))
            }
        case .cancelled:
            // Interrupted (sb exits 128 + the signal); the error names the call already.
            self.init(status: ExitStatus.serviceError, message: "\(error)",
                      error: JSONRPCError(code: JSONRPCError.internalErrorCode, message: "\(error)"))
        default:
            self.init(status: ExitStatus.serviceError, message: "\(service) \(method): \(error)",
                      error: JSONRPCError(code: JSONRPCError.internalErrorCode, message: "\(error)"))
        }
    }
}

extension Failure {
    /// No kernel answered: where it was asked, for how long, and what the connections went through.
    static func noKernel(at brokers: [String], waited: Duration, summary: String) -> Failure {
        Failure(status: ExitStatus.unavailable, message: "no kernel answers at \(brokers.joined(separator: ", ")) (waited \(waited.formatted)): \(summary)",
                error: JSONRPCError(code: JSONRPCError.serviceUnavailableCode, message: "kernel unreachable"))
    }
}

/// sysexits-style statuses.
enum ExitStatus {
    static let serviceError: Int32 = 1
    static let usage: Int32 = 64
    static let unavailable: Int32 = 69
    static let ioError = StandardStreams.outputFailedStatus
    static let timedOut: Int32 = 75
    static let configuration: Int32 = 78
}

/// Runs a verb's body with a client: prints a failure on stderr and exits with its status.
func withClient(_ connection: ConnectionOptions, asOperator: Bool = false, _ body: (BusClient) async throws -> Void) async throws {
    let client = try await connection.client(asOperator: asOperator)
    do {
        try await body(client)
        await client.close()
    } catch let failure as Failure {
        await client.close()
        Output.diagnostic(failure.message)
        throw ExitCode(failure.status)
    } catch {
        await client.close()
        throw error
    }
}

/// A number given with `--flag`, checked against the range the method's contract gives its
/// `field` (``NumberRanges``) before anything is sent: outside it, a usage error naming the
/// flag, where the service would refuse the params naming the field. `unit`: what it counts.
func checkRange<P: NumberRanges>(_ value: Double?, flag: String, field: String, of params: P.Type, unit: String = "") throws(ValidationError) {
    guard let value, let range = P.numberRanges[field], !range.contains(value) else { return }
    func text(_ bound: Double) -> String { bound == bound.rounded() && abs(bound) < 1e18 ? String(Int64(bound)) : String(bound) }
    throw ValidationError("--\(flag) must be \(text(range.lowerBound)) to \(text(range.upperBound))\(unit.isEmpty ? "" : " " + unit)")
}

/// `--ttl`: more than 0 (a key is kept until deleted without it), up to what the kernel takes.
func checkTimeToLive(_ ttl: Double?) throws(ValidationError) {
    guard let ttl, !(ttl > 0 && ttl <= TimeToLive.maxSeconds) else { return }
    throw ValidationError("--ttl must be more than 0 and at most \(Int(TimeToLive.maxSeconds)) seconds (a year); without it the key is kept until deleted")
}

func checkRange<P: NumberRanges>(_ value: Int?, flag: String, field: String, of params: P.Type) throws(ValidationError) {
    try checkRange(value.map(Double.init), flag: flag, field: field, of: params)
}

/// The bytes of the file at `path`, at most `limit` of them; when it cannot be read, or holds
/// more, a usage error that says which (`what`: the flag or thing it is for) and why.
func fileContents(_ path: String, for what: String, atMost limit: Int) throws(ValidationError) -> [UInt8] {
    do {
        return try FileContents.bytes(path, atMost: limit)
    } catch {
        throw ValidationError("\(what): cannot read \(path): \(error.reason)")
    }
}

/// A descriptor open to read the file at `path`; when it cannot be opened, or is a folder, a
/// usage error that says which (`what`) and why.
func openForReading(_ path: String, for what: String) throws(ValidationError) -> Int32 {
    do {
        return try FileContents.openForReading(path)
    } catch {
        throw ValidationError("\(what): cannot read \(path): \(error.reason)")
    }
}
