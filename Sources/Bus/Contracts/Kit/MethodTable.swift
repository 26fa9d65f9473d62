public import BusProtocol
import Foundation
import Instrumentation
import Synchronization
public import Logging

/// A service of the bus: an actor with a name and a table of JSON-RPC methods, each from its
/// contract (see ``Method``).
///
/// ```swift
/// actor Echo: BusService {
///     static let name = EchoAPI.service
///     nonisolated func methods(_ table: inout MethodTable<Echo>) {
///         table.on(EchoAPI.echo) { echo, params in params }
///     }
/// }
/// ```
public protocol BusService: Actor {
    /// The service name workers register under (7/MDP READY).
    static var name: String { get }
    /// Adds the service's methods to `table`; called once when hosting starts.
    nonisolated func methods(_ table: inout MethodTable<Self>)
    /// Where the results of its state-changing methods are remembered (default: in memory,
    /// for ten minutes). A service with durable effects keeps them with the effect.
    nonisolated func makeReplyMemory() -> any ReplyMemory
    /// Called once its host begins to drain, after every connection told the kernel to send
    /// it nothing more: a handler waiting for something to answer with (a message to hand out)
    /// should end its wait and answer with what it has, so its client asks again of another
    /// worker rather than hold the drain to its timeout. Default: nothing.
    func draining() async
}

extension BusService {
    public nonisolated func makeReplyMemory() -> any ReplyMemory { RecentReplies() }
    /// Nothing to end: no hop onto a service that may be busy with other work.
    public nonisolated func draining() async {}
}

/// The JSON-RPC methods of a service, each from its contract.
///
/// Params are checked against the schema generated from the method's `Params` type before
/// the handler runs (a wrong type, a missing or an unknown field is answered -32602 with
/// `data.field` and `data.expected`), then decoded straight from the request's bytes; the
/// result is encoded straight to the reply's bytes. Every table also answers `rpc.discover`.
public struct MethodTable<Service: BusService>: Sendable {
    /// A handler takes the params' JSON text (nil when absent) and gives the result's.
    enum Handler {
        /// Runs anywhere (a service's methods, which may run concurrently).
        case async(@Sendable (Service, [UInt8]?) async throws -> [UInt8])
        /// Runs on the service's own executor, without suspending (the kernel's methods,
        /// answered on its loop thread as each request arrives).
        case isolated(@Sendable (isolated Service, [UInt8]?) throws -> [UInt8])
        /// Answers in parts: each goes to `out` as it comes (nil: kept for the one reply).
        case stream(@Sendable (Service, [UInt8]?, _ out: (any PartOut)?) async throws -> [UInt8])
    }
    private var handlers: [String: Handler] = [:]
    /// The methods that change state: each named request of theirs runs once.
    private var stateChanging: Set<String> = []
    private let exactlyOnce: ExactlyOnce
    /// Where each request that carried a trace is logged when answered (nil: nowhere).
    public var logger: Logger?
    /// What one request body may cost (the kernel's `max_batch_items` and `max_message_size`).
    public var limits = BodyLimits()
    /// The methods in the order they were added, for `rpc.discover`.
    private var descriptions: [MethodDescription] = []

    /// The table of `service`'s methods.
    public init(of service: Service) {
        exactlyOnce = ExactlyOnce(memory: service.makeReplyMemory())
        service.methods(&self)
        let discovery = ServiceDescription(service: Service.name, methods: descriptions)
        onIsolated(Method.discover(Service.name)) { _, _ in discovery }
    }

    /// Adds `method` with the handler that answers it. A thrown ``JSONRPCError`` is answered
    /// as it is; any other error as -32603 with its description.
    public mutating func on<P, R>(_ method: Method<P, R>, _ handler: @escaping @Sendable (Service, P) async throws -> R) {
        let schema = add(method)
        handlers[method.name] = .async { service, params in
            try encodeJSON(try await handler(service, try decodeParams(P.self, params, schema: schema)))
        }
    }

    /// Adds `method` with a handler that runs isolated to the service and never suspends, so
    /// ``answerNow(body:on:)`` can answer it at once.
    public mutating func onIsolated<P, R>(_ method: Method<P, R>, _ handler: @escaping @Sendable (isolated Service, P) throws -> R) {
        let schema = add(method)
        handlers[method.name] = .isolated { service, params in
            try encodeJSON(try handler(service, try decodeParams(P.self, params, schema: schema)))
        }
    }

    /// Adds `method` with an isolated handler that writes its result's JSON text itself, in
    /// the shape of the method's result type: for results that carry stored JSON (state
    /// values), spliced in as they are rather than parsed and encoded again.
    public mutating func onIsolated<P, R>(_ method: Method<P, R>, encoded handler: @escaping @Sendable (isolated Service, P) throws -> [UInt8]) {
        let schema = add(method)
        handlers[method.name] = .isolated { service, params in
            try handler(service, try decodeParams(P.self, params, schema: schema))
        }
    }

    /// Adds a method that can answer in parts: the handler sends each part to `parts` as it
    /// has it and returns the result less the parts. Asked to stream (18/MDP), the parts go
    /// out one by one and the result ends the stream; asked otherwise, the one reply is the
    /// result with the parts gathered back in (``StreamMethod/gather``).
    public mutating func onStream<P, Part, R>(_ method: StreamMethod<P, Part, R>,
                                             _ handler: @escaping @Sendable (Service, P, Parts<Part>) async throws -> R) {
        let schema = add(method.method, description: method.methodDescription)
        handlers[method.name] = .stream { service, params, out in
            let parts = Parts<Part>(out: out)
            let result = try await handler(service, try decodeParams(P.self, params, schema: schema), parts)
            return try encodeJSON(out == nil ? method.gather(result, parts.kept) : result)
        }
    }

    /// Whether any method answers in parts (its worker speaks 18/MDP).
    public var streams: Bool { descriptions.contains { $0.part != nil } }

    /// Checks `method` belongs here once, lists it for `rpc.discover`; its params' schema.
    private mutating func add<P, R>(_ method: Method<P, R>, description: MethodDescription? = nil) -> JSONValue {
        precondition(method.service == Service.name, "\(method.name) is a method of \(method.service), not \(Service.name)")
        precondition(handlers[method.name] == nil, "\(method.name) is already in \(Service.name)'s table")
        descriptions.append(description ?? method.methodDescription)
        if method.changesState { stateChanging.insert(method.name) }
        return JSONSchema.of(P.self)
    }

    /// Runs `method` on `service` in this process, answered as a request through the bus
    /// is: its request and reply as JSON text (a service used without a bus, its tests).
    public func call<P, R>(_ method: Method<P, R>, _ params: P, on service: Service) async throws -> R {
        let body = JSONRPCRequest(id: .number(0), method: method.name, paramsText: try method.paramsText(params)).jsonBytes
        let reply = await answer(body: body, on: service).reply
        guard let response = try JSONRPC.parseResponses(reply).first else { throw JSONRPCError.internalError("no response") }
        return try decodeResult(R.self, try response.outcome.get())
    }

    /// Answers a whole request body (a request or a batch), with how many of the responses
    /// are errors (the host reports that count to the kernel, which never reads replies).
    /// Each request runs in the trace it carries (``BusTracing``). `parts`: where the parts
    /// of a single request that asks to stream go, each a PARTIAL's whole body (nil: this
    /// worker answers in one reply only).
    public func answer(body: [UInt8], on service: Service, parts: (any PartOut)? = nil) async -> (reply: [UInt8], errors: Int) {
        await answer(JSONRPC.parseRequests(body), on: service, parts: parts)
    }

    /// ``answer(body:on:parts:)`` for a body as it arrived in a frame, read where it lies.
    public func answer(body: Frame, on service: Service, parts: (any PartOut)? = nil) async -> (reply: [UInt8], errors: Int) {
        await answer(body.withUnsafeBytes { JSONRPC.parseRequests($0) }, on: service, parts: parts)
    }

    private func answer(_ incoming: JSONRPCIncoming, on service: Service, parts: (any PartOut)?) async -> (reply: [UInt8], errors: Int) {
        let single = if case .single = incoming { true } else { false }
        if let refusal = limits.refusal(of: incoming) { return (refusal, 1) }
        let requests = incoming.requests
        var outcomes: [Result<[UInt8], any Error>] = []
        outcomes.reserveCapacity(requests.count)
        var budget = ReplyBudget(limit: limits.maxReplyBytes, requests: requests.count)
        for request in requests {
            guard budget.hasRoom else {
                outcomes.append(.failure(budget.notRun))
                continue
            }
            // Closures handed straight to non-escaping parameters: their contexts stay on the stack.
            outcomes.append(budget.admit(await traced(request) {
                guard stateChanging.contains(request.method), let key = RequestKey(request) else {
                    return try await run(request, on: service, single: single, parts: parts)
                }
                return try await exactlyOnce.run(key) { try await run(request, on: service, single: single, parts: parts) }.get()
            }))
        }
        var writer = ReplyWriter(incoming)
        writer.write(outcomes)
        return writer.finish()
    }

    /// Runs `request`'s handler; `single`: the body held this request alone (only then can it
    /// answer in parts, to `parts`).
    private func run(_ request: JSONRPCRequest, on service: Service, single: Bool, parts: (any PartOut)?) async throws -> [UInt8] {
        switch handlers[request.method] {
        case .async(let handler)?: return try await handler(service, request.paramsText)
        case .isolated(let handler)?: return try await handler(service, request.paramsText)
        case .stream(let handler)?:
            // Parts go out only for a lone request that asked for them and can be told apart by its id.
            guard single, request.stream, let id = request.id, id != .null, let parts else { return try await handler(service, request.paramsText, nil) }
            // Each part within the kernel's message limit, as the table's limits are now
            // (a host sets them after the methods are added).
            return try await handler(service, request.paramsText, RequestParts(id: id, limit: limits.maxReplyBytes, out: parts))
        case nil: throw JSONRPCError.methodNotFound(request.method)
        }
    }

    /// ``answer(body:on:)`` without suspending, on the service's executor, for tables whose
    /// methods are all ``onIsolated(_:_:)`` (the kernel's): a turn at a time. Requests run
    /// in order until their results in this turn reach `turnBytes`; what is left is handed
    /// back (``BodyUnderWay``) for ``goOn(_:on:turnBytes:)`` in a later turn, so a batch
    /// whose results are large does not keep the executor from everything else meanwhile.
    public func answerNow(body: [UInt8], on service: isolated Service, turnBytes: Int) -> BodyAnswering {
        let incoming = JSONRPC.parseRequests(body)
        if let refusal = limits.refusal(of: incoming) { return .answered(reply: refusal, errors: 1) }
        var underWay = BodyUnderWay(incoming: incoming, limit: limits.maxReplyBytes)
        guard let answered = goOn(&underWay, on: service, turnBytes: turnBytes) else { return .underWay(underWay) }
        return .answered(reply: answered.reply, errors: answered.errors)
    }

    /// Answers the next turn's requests of a body ``answerNow(body:on:turnBytes:)`` began,
    /// writing their responses into its reply: the reply (with how many of its responses are
    /// errors) once every request is answered, else nil. In place: the body's reply grows
    /// where it lies, turn after turn.
    public func goOn(_ body: inout BodyUnderWay, on service: isolated Service, turnBytes: Int) -> (reply: [UInt8], errors: Int)? {
        var outcomes: [Result<[UInt8], any Error>] = []
        outcomes.reserveCapacity(body.requests.count - body.next)
        var bytesThisTurn = 0
        // At least one request a turn, however small `turnBytes`.
        while body.next < body.requests.count {
            let outcome = runNow(body.requests[body.next], on: service, budget: &body.budget)
            if case .success(let result) = outcome { bytesThisTurn += result.count }
            outcomes.append(outcome)
            body.next += 1
            if bytesThisTurn >= turnBytes { break }
        }
        if body.next < body.requests.count {
            // Answered in turns: room for the reply as large as the requests answered so far
            // say it will be (a quarter more, within the limit), taken before the reply grows,
            // so a later turn seldom moves what the earlier ones wrote.
            let expected = (body.writer.count + bytesThisTurn) / body.next * body.requests.count
            body.writer.reserve(min(expected + expected / 4, limits.maxReplyBytes + ReplyBudget.errorRoom * body.requests.count))
            body.writer.write(outcomes)
            return nil
        }
        body.writer.write(outcomes)
        return body.writer.finish()
    }

    /// Runs `request`'s isolated handler in its trace, its result counted against `budget`.
    private func runNow(_ request: JSONRPCRequest, on service: isolated Service, budget: inout ReplyBudget) -> Result<[UInt8], any Error> {
        guard budget.hasRoom else { return .failure(budget.notRun) }
        let run = {
            Result<[UInt8], any Error> {
                switch handlers[request.method] {
                // The request's key is known to the handler, as in ``answer(body:on:)``'s exactly-once runs.
                case .isolated(let handler)?: return try RequestKey.$current.withValue(RequestKey(request)) { try handler(service, request.paramsText) }
                case .async?, .stream?: throw JSONRPCError.internalError("\(request.method) cannot be answered without suspending")
                case nil: throw JSONRPCError.methodNotFound(request.method)
                }
            }
        }
        guard let context = BusTracing.context(of: request.trace) else { return budget.admit(run()) }
        return budget.admit(InstrumentationContext.withValue(context) {
            let started = ContinuousClock.now
            let outcome = run()
            record(request, outcome, since: started, sampled: BusTracing.isSampled(context))
            return outcome
        })
    }

    /// Runs `body` for `request` in the request's trace, if it carries one, and logs it: at
    /// info when the trace is sampled, else at debug. When spans are recorded (and the trace
    /// is sampled), it runs in a server span, the child of the span that sent it.
    private func traced(_ request: JSONRPCRequest, _ body: () async throws -> [UInt8]) async -> Result<[UInt8], any Error> {
        let context = BusTracing.context(of: request.trace)
        guard BusTracing.recordsSpans(in: context) else {
            guard let context else { return await Self.outcome(of: body) }
            return await InstrumentationContext.withValue(context) { await logged(request, in: context, body) }
        }
        do {
            return .success(try await BusTracing.withSpan(service: Service.name, method: request.method, kind: .server,
                                                          context: context ?? InstrumentationContext.current ?? .topLevel) {
                try await logged(request, in: context, body).get()
            })
        } catch {
            return .failure(error)
        }
    }

    /// Runs `body`, and logs the request when it carried a trace (`context`).
    private func logged(_ request: JSONRPCRequest, in context: InstrumentationContext?, _ body: () async throws -> [UInt8]) async -> Result<[UInt8], any Error> {
        guard context != nil else { return await Self.outcome(of: body) }
        let started = ContinuousClock.now
        let outcome = await Self.outcome(of: body)
        record(request, outcome, since: started, sampled: BusTracing.isSampled(context))
        return outcome
    }

    private static func outcome(of body: () async throws -> [UInt8]) async -> Result<[UInt8], any Error> {
        do { return .success(try await body()) } catch { return .failure(error) }
    }

    private func record(_ request: JSONRPCRequest, _ outcome: Result<[UInt8], any Error>, since started: ContinuousClock.Instant, sampled: Bool) {
        let level: Logger.Level = sampled ? .info : .debug
        // Most requests carry a trace and few are logged: nothing is built for those that are not.
        guard let logger, logger.logLevel <= level else { return }
        let milliseconds = (ContinuousClock.now - started) / .milliseconds(1)
        var metadata: Logger.Metadata = ["method": "\(request.method)", "ms": "\((milliseconds * 1_000).rounded() / 1_000)"]
        if case .failure(let error) = outcome { metadata["error"] = "\((error as? JSONRPCError)?.code ?? JSONRPCError.internalErrorCode)" }
        logger.log(level: level, "request answered", metadata: metadata)
    }
}

/// A body ``MethodTable/answerNow(body:on:turnBytes:)`` has begun to answer: its requests,
/// the next to run, and the reply written so far.
public struct BodyUnderWay: Sendable {
    fileprivate let requests: [JSONRPCRequest]
    fileprivate var next = 0
    fileprivate var budget: ReplyBudget
    fileprivate var writer: ReplyWriter

    fileprivate init(incoming: JSONRPCIncoming, limit: Int) {
        requests = incoming.requests
        budget = ReplyBudget(limit: limit, requests: requests.count)
        writer = ReplyWriter(incoming)
    }
}

/// What a turn of answering a body left: its reply (with how many of its responses are
/// errors), or the rest to answer in a later turn.
public enum BodyAnswering: Sendable {
    case answered(reply: [UInt8], errors: Int)
    case underWay(BodyUnderWay)
}

/// Writes the reply to a body from the outcome of each of its valid requests, in order, as
/// they come (a body answered in turns is written a turn at a time): notifications get no
/// response; an error thrown that is no ``JSONRPCError`` is -32603. Every response is
/// written into the one reply, so a result is copied once (a batch's reply can be as large
/// as the message limit).
struct ReplyWriter: Sendable {
    private let incoming: JSONRPCIncoming
    private var reply: [UInt8] = []
    /// The next item of a batch to answer; how many responses are written, how many errors.
    private var nextItem = 0, written = 0, errors = 0

    init(_ incoming: JSONRPCIncoming) { self.incoming = incoming }

    /// The bytes written so far.
    var count: Int { reply.count }

    /// Room for `bytes` in all, taken now if the reply has less: as much for a reply not yet
    /// begun, else at least twice its room, so a reply written over many turns moves seldom.
    mutating func reserve(_ bytes: Int) {
        guard reply.capacity < bytes else { return }
        reply.reserveCapacity(reply.isEmpty ? bytes : max(bytes, reply.capacity * 2))
    }

    /// Writes the responses to the next requests, whose outcomes these are.
    mutating func write(_ outcomes: [Result<[UInt8], any Error>]) {
        let room = outcomes.reduce(2) { room, outcome in room + 1 + ((try? outcome.get())?.count ?? 0) + ReplyBudget.errorRoom }
        reserve(reply.count + room)
        for outcome in outcomes { write(outcome) }
    }

    private mutating func write(_ outcome: Result<[UInt8], any Error>) {
        let request: JSONRPCRequest
        switch incoming {
        case .unusable, .single(.invalid): return
        case .single(.request(let single)): request = single
        case .batch(let items):
            writeInvalid(items)
            guard nextItem < items.count, case .request(let next) = items[nextItem] else { return }
            nextItem += 1
            request = next
        }
        guard let id = request.id else { return }
        startResponse()
        switch outcome {
        case .success(let result):
            JSONRPC.appendResultReply(id: id, resultText: result, to: &reply)
            return
        case .failure(let error as JSONRPCError): reply += JSONRPCResponse(id: id, error: error).jsonBytes
        case .failure(let error): reply += JSONRPCResponse(id: id, error: .internalError(String(describing: error))).jsonBytes
        }
        errors += 1
    }

    /// A batch's invalid members from the next item on, each answered where it stands.
    private mutating func writeInvalid(_ items: [JSONRPCItem]) {
        while nextItem < items.count, case .invalid(let response) = items[nextItem] {
            startResponse()
            reply += response.jsonBytes
            errors += 1
            nextItem += 1
        }
    }

    /// Before a response: in a batch, `[` or the comma after the one before.
    private mutating func startResponse() {
        if case .batch = incoming { reply.append(UInt8(ascii: written == 0 ? "[" : ",")) }
        written += 1
    }

    /// The whole reply, once every request's outcome is written: empty when nothing is
    /// answered (a notification, a batch of them).
    mutating func finish() -> (reply: [UInt8], errors: Int) {
        switch incoming {
        case .unusable(let response), .single(.invalid(let response)): return (response.jsonBytes, 1)
        case .single(.request): return written == 0 ? ([], 0) : (reply, errors)
        case .batch(let items):
            writeInvalid(items)
            guard written > 0 else { return ([], 0) }
            reply.append(UInt8(ascii: "]"))
            return (reply, errors)
        }
    }
}

/// Where the parts of a request answered in parts go (a worker's PARTIALs), and whether
/// anyone still reads them.
public protocol PartOut: Sendable {
    /// Sends one part's JSON text; throws once the stream has ended (nobody reads it).
    func send(_ part: [UInt8]) async throws
    /// Whether the parts are still read: false once the kernel said nobody reads them (the
    /// client cancelled, or a part could not reach it) or the connection to the kernel went.
    var isRead: Bool { get }
}

/// One request's parts, each a PARTIAL's whole body (its id and the part), within the
/// kernel's message limit.
private struct RequestParts: PartOut {
    let id: JSONRPCID
    let limit: Int
    let out: any PartOut

    func send(_ part: [UInt8]) async throws {
        let body = JSONRPC.partReply(id: id, partText: part)
        guard body.count <= limit else { throw JSONRPCError.overMessageSize("part", bytes: body.count, limit: limit) }
        try await out.send(body)
    }

    var isRead: Bool { out.isRead }
}

/// Where a streaming method's handler sends its parts (``MethodTable/onStream(_:_:)``): out
/// as PARTIALs one by one, or kept for the one reply when the request did not ask to stream.
public final class Parts<Part: Codable & Sendable>: Sendable {
    private let out: (any PartOut)?
    private let keptParts = Mutex<[Part]>([])

    init(out: (any PartOut)?) {
        self.out = out
    }

    /// Whether the parts go out one by one (the caller asked to stream).
    public var areStreamed: Bool { out != nil }

    /// Whether the parts are still read (always, when they are kept for the one reply). A
    /// handler that waits between parts looks, and ends once they are not, rather than hold
    /// its worker's place until its next part fails.
    public var isRead: Bool { out?.isRead ?? true }

    /// How often ``pause(for:)`` looks whether the parts are still read.
    static var lookAgain: Duration { .milliseconds(50) }

    /// Waits `duration`, or less: it ends once the parts are no longer read, so a handler
    /// that waits between parts (or for something to send) frees its worker's place soon
    /// after its reader leaves, not at its next part. Throws when the task is cancelled. It
    /// looks every ``lookAgain``: the kernel's word that nobody reads comes on the
    /// connection's loop, and a look costs nothing beside a part.
    public func pause(for duration: Duration) async throws {
        let clock = ContinuousClock()
        let ends = clock.now + duration
        while isRead, clock.now < ends {
            try await Task.sleep(for: min(Self.lookAgain, ends - clock.now))
        }
    }

    /// Sends one part. Throws when the task was cancelled, when the part alone is over the
    /// kernel's message limit (-32010: the stream ends there), or when it cannot go out.
    public func send(_ part: Part) async throws {
        try Task.checkCancellation()
        guard let out else { return keptParts.withLock { $0.append(part) } }
        try await out.send(try encodeJSON(part))
    }

    var kept: [Part] { keptParts.withLock { $0 } }
}

/// What one request body may cost. A batch is answered in one message, so its count of
/// requests is refused up front when over the limit, and its reply is counted as each result
/// joins it: once the bytes pass the limit, the result that passed it and every request after
/// (not run) are answered -32010 instead, so no reply grows past the message limit however
/// the requests multiply what they ask for.
public struct BodyLimits: Sendable {
    public var maxBatchItems: Int
    public var maxReplyBytes: Int
    public init(maxBatchItems: Int = 100, maxReplyBytes: Int = MDP.defaultMaxMessageSize) {
        self.maxBatchItems = maxBatchItems
        self.maxReplyBytes = maxReplyBytes
    }

    /// The reply to a batch with too many requests: the refusal for each of its ids, so a
    /// client waiting on each hears at once (nil: within the limit).
    func refusal(of incoming: JSONRPCIncoming) -> [UInt8]? {
        guard case .batch(let items) = incoming, items.count > maxBatchItems else { return nil }
        let error = JSONRPCError.batchTooLarge(items.count, limit: maxBatchItems)
        let responses = items.compactMap { item -> JSONRPCResponse? in
            guard case .request(let request) = item, let id = request.id else { return nil }
            return JSONRPCResponse(id: id, error: error)
        }
        return JSONRPC.encodeReply(responses.isEmpty ? [JSONRPCResponse(id: .null, error: error)] : responses, batch: true) ?? []
    }
}

/// The bytes a reply has reached while its results come in (see ``BodyLimits``).
struct ReplyBudget {
    let limit: Int
    /// What results may take: the limit less room for an error response for every request,
    /// so the errors answered in place of results that did not fit keep the whole reply
    /// within the limit too.
    private let forResults: Int
    private(set) var spent = 0
    /// Room for one more result: nothing has passed the limit yet.
    var hasRoom: Bool { spent <= forResults }
    /// The most an error response (its id, message and data) takes.
    static let errorRoom = 512

    init(limit: Int, requests: Int) {
        self.limit = limit
        forResults = max(0, limit - requests * Self.errorRoom)
    }

    /// `outcome`, or -32010 when its result takes the reply past the limit.
    mutating func admit(_ outcome: Result<[UInt8], any Error>) -> Result<[UInt8], any Error> {
        // A result's envelope (id, "jsonrpc", separators) is counted with it.
        let envelope = 64
        guard case .success(let result) = outcome else {
            spent += envelope
            return outcome
        }
        spent += result.count + envelope
        guard spent > forResults else { return outcome }
        return .failure(JSONRPCError.overMessageSize("reply", bytes: spent, limit: limit))
    }

    /// For a request not run because the reply is already full.
    var notRun: JSONRPCError {
        JSONRPCError(code: JSONRPCError.tooLargeCode,
                     message: "Too large: not run: the batch's reply already passed the limit of \(limit) bytes (kernel.max_message_size); send it in smaller batches",
                     data: ["limit": .int(Int64(limit))])
    }
}

/// Parses params' JSON text once, checks the tree against `schema`, then decodes `P` from the
/// tree (``JSONValue/decode(as:)``). Absent params (and an empty array) are an empty object,
/// or null for `JSONValue`.
func decodeParams<P: Decodable>(_ type: P.Type, _ text: [UInt8]?, schema: JSONValue) throws -> P {
    if P.self == JSONValue.self {
        guard let text else { return JSONValue.null as! P }
        return try JSONValue(parsing: text, maxDepth: JSONRPC.maxDepth) as! P
    }
    var value = try text.map { try JSONValue(parsing: $0, maxDepth: JSONRPC.maxDepth) } ?? [:]
    if value == [] { value = [:] }
    if case .array = value {
        throw SchemaCheck.Mismatch(field: "params", expected: "an object (params by name)", problem: "must be an object (params by name)").error
    }
    if let mismatch = SchemaCheck.mismatch(value, schema) { throw mismatch.error }
    if P.self == NoParams.self { return NoParams() as! P }
    do {
        return try value.decode(as: P.self)
    } catch let error as DecodingError {
        throw paramsError(error)
    }
}

/// JSON text of `value`, as ``JSONValue/jsonBytes`` writes it (sorted keys, slashes as they are).
func encodeJSON<T: Encodable>(_ value: T) throws -> [UInt8] {
    try JSONValue(encoding: value).jsonBytes
}

/// A result as its contract's type: a reply that does not fit is -32603 naming the field.
public func decodeResult<R: Decodable>(_ type: R.Type, _ value: JSONValue) throws -> R {
    if let value = value as? R { return value }
    do {
        return try value.decode(as: R.self)
    } catch let error as DecodingError {
        let mismatch = paramsError(error)
        throw JSONRPCError.internalError("the reply does not fit the contract: \(mismatch.message)")
    }
}

private func paramsError(_ error: DecodingError) -> JSONRPCError {
    func path(_ codingPath: [any CodingKey], _ last: (any CodingKey)? = nil) -> String {
        let keys = codingPath + (last.map { [$0] } ?? [])
        let text = keys.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
        return text.isEmpty ? "params" : text.replacingOccurrences(of: ".[", with: "[")
    }
    switch error {
    case .keyNotFound(let key, let context):
        return .invalidParams(field: path(context.codingPath, key), "is required")
    case .typeMismatch(let type, let context):
        return .invalidParams(field: path(context.codingPath), "must be \(describe(type))")
    case .valueNotFound(let type, let context):
        return .invalidParams(field: path(context.codingPath), "must be \(describe(type)), not null")
    case .dataCorrupted(let context):
        return .invalidParams(field: path(context.codingPath), context.debugDescription)
    @unknown default:
        return .invalidParams(field: "params", "\(error)")
    }
}

private func describe(_ type: Any.Type) -> String {
    switch type {
    case is String.Type: return "a string"
    case is Int.Type, is Int64.Type, is Int32.Type: return "an integer"
    case is Double.Type, is Float.Type: return "a number"
    case is Bool.Type: return "true or false"
    default:
        let name = String(describing: type)
        if name.hasPrefix("Array") { return "an array" }
        if name.hasPrefix("Dictionary") { return "an object" }
        return "a \(name)"
    }
}
