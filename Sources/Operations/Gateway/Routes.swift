import AsyncAlgorithms
import BusKit
import BusProtocol
import Contracts
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import Synchronization

/// The gateway's HTTP routes.
/// A request's context: Hummingbird's basics, and the caller's address (what a caller's
/// ``SnapshotBudget`` and ``CallsPerAddress`` are kept by).
struct GatewayContext: RequestContext, RemoteAddressRequestContext {
    var coreContext: CoreRequestContextStorage
    let remoteAddress: SocketAddress?

    init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        remoteAddress = source.channel.remoteAddress
    }
}

struct Routes: Sendable {
    let options: Gateway.Options
    let client: BusClient
    let feed: StateFeed
    let page: Page
    let logger: Logger
    let snapshotBudget: SnapshotBudget
    let callsPerAddress: CallsPerAddress
    /// The HTTP connections open, and the most, for `/metrics`.
    let connections: ConnectionCount
    /// `POST /rpc` requests, for `/metrics`.
    let rpcRequests = RequestCount()
    /// `POST /rpc` requests refused for `gateway.max_calls_per_address`, for `/metrics`.
    let callsRefused = RequestCount()

    var settings: GatewaySettings { options.settings }

    func router() -> Router<GatewayContext> {
        // HEAD is answered wherever GET is (health checks and monitors send it), as GET's
        // answer without its body; but for the two event streams, whose GET opens one.
        let router = Router(context: GatewayContext.self, options: .autoGenerateHeadEndpoints)
        if !settings.corsOrigins.isEmpty { router.add(middleware: AllowedOrigins(origins: Set(settings.corsOrigins))) }
        router.add(middleware: UnknownPathSaid())
        router.post("/rpc/:service") { request, context in try await rpc(request, context: context) }
        // A call is a POST: another method on a service's path is told so, not that the path is unknown.
        for method in [HTTPRequest.Method.get, .put, .patch, .delete] {
            router.on("/rpc/:service", method: method) { _, _ in Self.onlyPost }
        }
        router.get("/events") { request, context in try await events(request, context: context) }
        router.get("/streams/:stream/:consumer") { request, context in await consumerMessages(request, context: context) }
        router.on("/events", method: .head) { _, _ in Self.onlyGet }
        router.on("/streams/:stream/:consumer", method: .head) { _, _ in Self.onlyGet }
        router.get("/metrics") { request, _ in try await metrics(request) }
        router.get("/healthz") { _, _ in Self.json(.ok, ["status": "ok"]) }
        router.get("/readyz") { _, _ in await ready() }
        router.get("/") { _, _ in page.response(for: "index.html") }
        router.get("/:file") { _, context in page.response(for: context.parameters.get("file") ?? "") }
        return router
    }

    // MARK: Who may call

    /// The caller's token, when tokens are configured: from `Authorization: Bearer`, or
    /// `?access_token=` (a browser's EventSource cannot send headers). nil: let in with no
    /// limits (no tokens configured).
    enum Admission {
        case open
        case token(GatewayToken)
        case refused(Response)
    }

    func admit(_ request: Request) -> Admission {
        let tokens = options.tokens.current
        guard !tokens.isEmpty else { return .open }
        var presented: String?
        if let header = request.headers[.authorization], header.lowercased().hasPrefix("bearer ") {
            presented = String(header.dropFirst("bearer ".count)).trimmingCharacters(in: .whitespaces)
        } else if let query = request.uri.queryParameters["access_token"] {
            presented = String(query)
        }
        guard let presented, let token = tokens.first(where: { Self.constantTimeEquals($0.token, presented) }) else {
            var response = Self.rpcError(.unauthorized, JSONRPCError(code: JSONRPCError.forbiddenCode,
                message: "Unauthorized: send Authorization: Bearer TOKEN (a token from gateway.tokens)"))
            response.headers[.wwwAuthenticate] = "Bearer"
            return .refused(response)
        }
        return .token(token)
    }

    static func constantTimeEquals(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        guard x.count == y.count else { return false }
        return zip(x, y).reduce(0) { $0 | ($1.0 ^ $1.1) } == 0
    }

    // MARK: POST /rpc/{service}

    func rpc(_ request: Request, context: GatewayContext) async throws -> Response {
        rpcRequests.add()
        let token: GatewayToken?
        switch admit(request) {
        case .refused(let response): return response
        case .open: token = nil
        case .token(let allowed): token = allowed
        }
        let service = context.parameters.get("service") ?? ""
        guard MDP.isValidServiceName(service) else {
            return Self.rpcError(.badRequest, .invalidRequest("the service name must be \(MDP.serviceNameRule), got '\(service)'"))
        }
        if let token, !token.allows(service: service) {
            return Self.rpcError(.forbidden, .forbidden("this token may not call the \(service) service"))
        }
        var request = request
        let body: ByteBuffer
        do {
            body = try await request.collectBody(upTo: settings.maxBodyBytes)
        } catch {
            return Self.rpcError(.contentTooLarge, .tooLarge(request.headers[.contentLength].flatMap(Int.init) ?? settings.maxBodyBytes + 1,
                                                             limit: settings.maxBodyBytes))
        }
        let partsFormat = Self.partsFormat(request)
        let caller = caller(request, context)
        let parsed = JSONRPC.parseRequests(body.readableBytesView)
        if case .single(.request(let call)) = parsed, let partsFormat, let id = call.id, id != .null {
            if let refused = await refusal(call, service: service, token: token) {
                let response = JSONRPCResponse(id: id, error: refused)
                return Self.reply(Self.status(for: response), response.jsonBytes)
            }
            guard let taken = callsPerAddress.take(1, for: caller) else { return tooManyCalls(1, from: caller) }
            return await streamed(call, id: id, service: service, trace: Self.trace(request), format: partsFormat, holding: taken)
        }
        switch parsed {
        case .unusable(let response):
            return Self.reply(Self.status(for: response), response.jsonBytes)
        case .single(let item):
            guard let taken = callsPerAddress.take(1, for: caller) else { return tooManyCalls(1, from: caller) }
            let response = await answers(to: [item], service: service, token: token, trace: Self.trace(request))[0]
            taken.end()
            // A notification (no id) is answered with nothing: 204.
            guard let response else { return Response(status: .noContent) }
            let bytes = response.jsonBytes
            guard bytes.count <= settings.maxResponseBytes else {
                return Self.rpcError(.contentTooLarge, tooLargeResponse(bytes.count), id: response.id)
            }
            return Self.reply(Self.status(for: response), bytes)
        case .batch(let items):
            guard items.count <= options.maxBatchItems else {
                return Self.rpcError(.contentTooLarge, .batchTooLarge(items.count, limit: options.maxBatchItems))
            }
            guard let taken = callsPerAddress.take(items.count, for: caller) else { return tooManyCalls(items.count, from: caller) }
            let answered = await answers(to: items, service: service, token: token, trace: Self.trace(request)).compactMap { $0 }
            taken.end()
            guard !answered.isEmpty else { return Response(status: .noContent) }
            // The body is counted as each response joins it: those past the limit are -32010.
            var spent = 0
            let chunks = answered.map { response -> [UInt8] in
                let bytes = response.jsonBytes
                spent += bytes.count + 1
                return spent <= settings.maxResponseBytes ? bytes : JSONRPCResponse(id: response.id, error: tooLargeResponse(spent)).jsonBytes
            }
            return Self.reply(.ok, JSONRPC.batchReply(chunks) ?? [])
        }
    }

    /// The caller the per-address bounds count: the connection's address, or, when that is a
    /// proxy in `gateway.trusted_proxies`, the address the proxy says it forwarded for (the
    /// last entry of `X-Forwarded-For`, the one it added itself; the entries before it are
    /// whatever the caller sent, so never read).
    func caller(_ request: Request, _ context: GatewayContext) -> String {
        let peer = context.remoteAddress.flatMap(GatewaySettings.callerAddress) ?? "unknown"
        guard settings.trustedProxies.contains(peer), let forwarded = request.headers[values: Self.forwardedForField].last,
              let last = forwarded.split(separator: ",").last?.trimmingCharacters(in: .whitespaces), !last.isEmpty else { return peer }
        return GatewaySettings.callerAddress(last) ?? last
    }
    static let forwardedForField = HTTPField.Name("X-Forwarded-For")!

    /// 429 for calls past `gateway.max_calls_per_address`: the caller may send more once
    /// some of its calls are answered.
    func tooManyCalls(_ calls: Int, from caller: String) -> Response {
        callsRefused.add()
        let limit = callsPerAddress.limit
        let message = calls > limit
            ? "Too many calls: a batch of \(calls) is more than one address may have in flight (gateway.max_calls_per_address, \(limit)); send smaller batches"
            : "Too many calls: this address has \(callsPerAddress.inFlight(for: caller)) calls in flight, and may have \(limit) (gateway.max_calls_per_address); send more once they are answered"
        var response = Self.rpcError(.tooManyRequests, JSONRPCError(code: JSONRPCError.serviceUnavailableCode, message: message,
            data: ["retryAfterSeconds": .int(1), "limit": .int(Int64(limit))]))
        response.headers[.retryAfter] = "1"
        return response
    }

    // MARK: Replies in parts

    /// How a client that can take a reply in parts asked for it (its Accept header).
    enum PartsFormat {
        /// `application/x-ndjson`: a JSON line per part, then the response's line.
        case ndjson
        /// `text/event-stream`: an `event: part` per part, then an `event: end` with the response.
        case eventStream
    }

    static func partsFormat(_ request: Request) -> PartsFormat? {
        let accept = request.headers[.accept] ?? ""
        if accept.contains("application/x-ndjson") { return .ndjson }
        if accept.contains("text/event-stream") { return .eventStream }
        return nil
    }

    /// A lone request relayed in parts as they come: each part as the PARTIAL's body carried
    /// it (`{"id","jsonrpc","part"}`), then the JSON-RPC response that ended the stream (its
    /// result less the parts, or the error that ended it early, with `data.parts`). A request
    /// answered before any part (an error, a method or worker that answers in one reply) is
    /// answered as without the Accept header, with its HTTP status.
    /// `taken`: the call's place in its caller's share, given back when the stream ends.
    func streamed(_ call: JSONRPCRequest, id: JSONRPCID, service: String, trace: JSONRPCRequest.Trace?, format: PartsFormat,
                  holding taken: CallsPerAddress.Taken) async -> Response {
        let parts = await BusTracing.withTrace(call.trace ?? trace) {
            client.stream(service: service, method: call.method, paramsText: call.paramsText)
        }
        var iterator = parts.makeAsyncIterator()
        let first: JSONValue?
        do {
            first = try await iterator.next()
        } catch {
            let response = Self.response(id: id, .failure(error as? BusError ?? .cancelled(service: service, method: call.method)))
            return Self.reply(Self.status(for: response), response.jsonBytes)
        }
        guard let first else {
            let response: JSONRPCResponse
            do throws(BusError) { response = Self.response(id: id, .success(try await parts.end())) } catch { response = Self.response(id: id, .failure(error)) }
            return Self.reply(Self.status(for: response), response.jsonBytes)
        }
        var headers: HTTPFields = [.contentType: format == .ndjson ? "application/x-ndjson" : "text/event-stream", .cacheControl: "no-cache"]
        headers[HTTPField.Name("X-Accel-Buffering")!] = "no"
        let limit = settings.maxResponseBytes
        return Response(status: .ok, headers: headers, body: ResponseBody { [iterator] writer in
            defer { taken.end() }
            var iterator = iterator, part: JSONValue? = first, end: JSONRPCResponse
            do {
                while let current = part {
                    let body = JSONRPC.partReply(id: id, partText: current.jsonBytes)
                    guard body.count <= limit else { throw BusError.remote(service: service, tooLargeResponse(body.count)) }
                    try await writer.write(Self.framed(body, format, event: "part"))
                    part = try await iterator.next()
                }
                end = Self.response(id: id, .success(try await parts.end()))
            } catch let error as BusError {
                end = Self.response(id: id, .failure(error))
            }
            // The call has ended on the bus: its place is given back before the caller reads
            // the end, so a call the caller sends on reading it finds the place free.
            taken.end()
            // Any other error is the browser's connection: the stream ends, and with it the request.
            try await writer.write(Self.framed(end.jsonBytes, format, event: "end"))
            try await writer.finish(nil)
        })
    }

    /// One JSON text as a line, or as a Server-Sent Event: named `event` (nil: a plain
    /// message, what `EventSource.onmessage` gets), with `id` when given.
    static func framed(_ json: [UInt8], _ format: PartsFormat, event: String?, id: Int? = nil) -> ByteBuffer {
        switch format {
        case .ndjson: ByteBuffer(bytes: json + [UInt8(ascii: "\n")])
        case .eventStream:
            ByteBuffer(bytes: Array(((id.map { "id: \($0)\n" } ?? "") + (event.map { "event: \($0)\n" } ?? "") + "data: ").utf8) + json + Array("\n\n".utf8))
        }
    }

    /// -32010 for a response body past `gateway.max_response_bytes`.
    func tooLargeResponse(_ bytes: Int) -> JSONRPCError {
        JSONRPCError(code: JSONRPCError.tooLargeCode,
                     message: "Too large: the response would be \(bytes) bytes, over the gateway's limit (gateway.max_response_bytes) of \(settings.maxResponseBytes); ask for less (a page, a smaller batch)",
                     data: ["bytes": .int(Int64(bytes)), "limit": .int(Int64(settings.maxResponseBytes))])
    }

    /// The W3C trace context of an HTTP request (`traceparent`, `tracestate` headers).
    static func trace(_ request: Request) -> JSONRPCRequest.Trace? {
        guard let parent = request.headers[traceParentField] else { return nil }
        return JSONRPCRequest.Trace(parent: parent, state: request.headers[traceStateField])
    }
    static let traceParentField = HTTPField.Name("traceparent")!
    static let traceStateField = HTTPField.Name("tracestate")!

    /// The response to each item, in order (nil for a notification): invalid ones and those
    /// the token forbids are answered here, the others go to `service` in one message (a
    /// lone request as a request, several as a batch), in the trace the item carries or
    /// else the HTTP request's.
    func answers(to items: [JSONRPCItem], service: String, token: GatewayToken?, trace: JSONRPCRequest.Trace? = nil) async -> [JSONRPCResponse?] {
        var responses: [JSONRPCResponse?] = Array(repeating: nil, count: items.count)
        var forwarded: [(index: Int, call: JSONRPCRequest)] = []
        for (index, item) in items.enumerated() {
            switch item {
            case .invalid(let response): responses[index] = response
            case .request(let call):
                if let refusal = await refusal(call, service: service, token: token) {
                    if let id = call.id { responses[index] = JSONRPCResponse(id: id, error: refusal) }
                } else {
                    forwarded.append((index, call))
                }
            }
        }
        let outcomes: [Result<JSONValue, BusError>]
        switch forwarded.count {
        case 0: outcomes = []
        case 1:
            let call = forwarded[0].call
            do throws(BusError) {
                outcomes = [.success(try await BusTracing.withTrace(call.trace ?? trace) { () async throws(BusError) in
                    try await client.request(service: service, method: call.method, paramsText: call.paramsText)
                })]
            } catch {
                outcomes = [.failure(error)]
            }
        default:
            outcomes = await BusTracing.withTrace(trace) { await client.batch(service: service, forwarded.map { ($0.call.method, $0.call.paramsText) }) }
        }
        for (sent, outcome) in zip(forwarded, outcomes) {
            if let id = sent.call.id { responses[sent.index] = Self.response(id: id, outcome) }
        }
        return responses
    }

    /// What the token forbids of this call: a state write (`state.set`, `state.publish`)
    /// outside its writable prefixes, or a read of the state outside its readable prefixes,
    /// the keys it may stream from `/events`: with the kernel's `state.get` and
    /// `state.history`, or through a stream that captures the state (``captureRefusal(_:_:)``).
    func refusal(_ call: JSONRPCRequest, service: String, token: GatewayToken?) async -> JSONRPCError? {
        guard let token else { return nil }
        if service == StreamsAPI.service { return await streamsRefusal(call, token) }
        guard service == KernelAPI.service else { return nil }
        switch call.method {
        case KernelAPI.stateSet.name, KernelAPI.statePublish.name:
            let key = call.params?["key"]?.stringValue ?? ""
            guard token.writablePrefixes.contains(where: { key.hasPrefix($0) }) else {
                let allowed = token.writablePrefixes.isEmpty ? "none" : token.writablePrefixes.joined(separator: ", ")
                return .forbidden("this token may not write \(key.isEmpty ? "that key" : key) (its writable prefixes: \(allowed))")
            }
        case KernelAPI.stateGet.name, KernelAPI.stateHistory.name:
            // Without a prefix, state.get reads every key.
            let asked = call.params?[call.method == KernelAPI.stateGet.name ? "prefix" : "key"]?.stringValue ?? ""
            guard token.mayRead(asked) else { return Self.readRefusal(asked, token) }
        default:
            break
        }
        return nil
    }

    /// A stream that captures the state holds the changes of the keys under its subjects: a
    /// token with readable prefixes may not make one outside them, nor read the messages of
    /// one (or of its dead-letter stream) that holds keys outside them. A token without
    /// readable prefixes reads every key (``GatewayToken/mayRead(_:)``, ``captureRefusal(_:_:)``).
    func streamsRefusal(_ call: JSONRPCRequest, _ token: GatewayToken) async -> JSONRPCError? {
        switch call.method {
        case StreamsAPI.streamAdd.name:
            guard call.params?["captureState"] == true else { return nil }
            let subjects = call.params?["subjects"]?.arrayValue?.compactMap(\.stringValue) ?? []
            return subjects.first { !token.mayRead($0) }.map { Self.readRefusal($0, token) }
        case StreamsAPI.streamMessages.name:
            return await captureRefusal(call.params?["name"]?.stringValue ?? "", token)
        case StreamsAPI.fetch.name, StreamsAPI.nextMethod.name:
            return await captureRefusal(call.params?["stream"]?.stringValue ?? "", token)
        default:
            return nil
        }
    }

    /// Why `token` may not read the messages of `stream`, from the streams service's
    /// `stream.info`: it captures keys outside the token's readable prefixes, or it cannot be
    /// told (the error that question got, which the call would most likely get too). A token
    /// without readable prefixes reads every key: the service is not asked.
    func captureRefusal(_ stream: String, _ token: GatewayToken) async -> JSONRPCError? {
        guard token.readablePrefixes != nil else { return nil }
        var info: StreamsAPI.StreamInfo
        do throws(BusError) {
            info = try await client.call(StreamsAPI.streamInfo, .init(name: stream))
            // A dead-letter stream holds what its stream's consumers gave up on.
            if info.deadLetters == nil, let dot = stream.lastIndex(of: "."),
               let owner = try? await client.call(StreamsAPI.streamInfo, .init(name: String(stream[..<dot]))),
               owner.deadLetters == stream {
                info = owner
            }
        } catch {
            return Self.rpcError(error)
        }
        guard info.captureState == true, let outside = info.subjects.first(where: { !token.mayRead($0) }) else { return nil }
        return .forbidden("this token may not read stream \(stream): it holds the state's changes under \(outside) (its readable prefixes: \(token.readablePrefixes?.joined(separator: ", ") ?? ""))")
    }

    /// A read outside a token's readable prefixes.
    static func readRefusal(_ asked: String, _ token: GatewayToken) -> JSONRPCError {
        .forbidden("this token may not read '\(asked)' (its readable prefixes: \(token.readablePrefixes?.joined(separator: ", ") ?? ""))")
    }

    static func response(id: JSONRPCID, _ outcome: Result<JSONValue, BusError>) -> JSONRPCResponse {
        switch outcome {
        case .success(let result): return JSONRPCResponse(id: id, result: result)
        case .failure(let error): return JSONRPCResponse(id: id, error: rpcError(error))
        }
    }

    /// A failed call as its caller is told it: the service's own error, or what the bus says.
    static func rpcError(_ error: BusError) -> JSONRPCError {
        if case .remote(_, let error) = error { return error }
        return JSONRPCError(code: error.code ?? JSONRPCError.serviceUnavailableCode, message: "\(error)")
    }

    /// The HTTP status of a single response: 200 for a result, else from the error code.
    static func status(for response: JSONRPCResponse) -> HTTPResponse.Status {
        guard case .failure(let error) = response.outcome else { return .ok }
        return status(forCode: error.code)
    }

    static func status(forCode code: Int) -> HTTPResponse.Status {
        switch code {
        case JSONRPCError.parseErrorCode, JSONRPCError.invalidRequestCode, JSONRPCError.invalidParamsCode: .badRequest
        case JSONRPCError.methodNotFoundCode, JSONRPCError.notFoundCode: .notFound
        case JSONRPCError.conflictCode: .conflict
        case JSONRPCError.serviceUnavailableCode: .serviceUnavailable
        case JSONRPCError.timedOutCode: .gatewayTimeout
        case JSONRPCError.upstreamFailedCode, JSONRPCError.outcomeUnknownCode, JSONRPCError.handlerDiedCode: .badGateway
        case JSONRPCError.storageFailedCode: .serviceUnavailable
        case JSONRPCError.tooLargeCode: .contentTooLarge
        case JSONRPCError.forbiddenCode: .forbidden
        default: .internalServerError
        }
    }

    static func rpcError(_ status: HTTPResponse.Status, _ error: JSONRPCError, id: JSONRPCID = .null) -> Response {
        reply(status, JSONRPCResponse(id: id, error: error).jsonBytes)
    }

    static func reply(_ status: HTTPResponse.Status, _ bytes: [UInt8]) -> Response {
        Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }

    static func json(_ status: HTTPResponse.Status, _ value: JSONValue) -> Response {
        reply(status, value.jsonBytes)
    }

    /// The answer to a method other than POST on `/rpc/{service}`.
    static var onlyPost: Response {
        var response = rpcError(.methodNotAllowed, .invalidRequest("a call is sent with POST, its JSON-RPC request as the body"))
        response.headers[.allow] = "POST"
        return response
    }

    /// The answer to HEAD on an event stream: a stream is opened (a subscription, a
    /// consumer's messages handed out) only by a GET that reads it.
    static var onlyGet: Response {
        Response(status: .methodNotAllowed, headers: [.allow: "GET"])
    }

    // MARK: GET /events

    func events(_ request: Request, context: GatewayContext) async throws -> Response {
        let token: GatewayToken?
        switch admit(request) {
        case .refused(let response): return response
        case .open: token = nil
        case .token(let allowed): token = allowed
        }
        let query = request.uri.queryParameters
        var prefixes = query[values: "prefix"].map(String.init)
        if prefixes.isEmpty { prefixes = token?.readablePrefixes ?? settings.prefixes }
        if let token, let refused = prefixes.first(where: { !token.mayRead($0) }) {
            return Self.rpcError(.forbidden, Self.readRefusal(refused, token))
        }
        if let pathless = prefixes.first(where: { !CHP.isKeyPrefix($0) }) {
            return Self.rpcError(.badRequest, .invalidParams(field: "prefix", "'\(pathless)' matches no key: keys are paths starting with '/'"))
        }
        for prefix in prefixes where !(await feed.covers(prefix)) {
            return Self.rpcError(.badRequest, .invalidParams(field: "prefix",
                "'\(prefix)' is not under what this gateway follows (gateway.prefixes: \(settings.prefixes.map { "'\($0)'" }.joined(separator: ", ")))"))
        }
        let lastEventID = request.headers[HTTPField.Name("Last-Event-ID")!] ?? query["since"].map(String.init)
        var since: UInt64?
        if let lastEventID, !lastEventID.isEmpty {
            guard let sequence = UInt64(lastEventID) else {
                return Self.rpcError(.badRequest, .invalidParams(field: "since", "expected an event id (a sequence number), got '\(lastEventID)'"))
            }
            since = sequence
        }
        // What one caller may make the gateway send: the opening events (a snapshot, or the
        // changes since its last id) come out of its address's budget.
        let caller = caller(request, context)
        if let seconds = snapshotBudget.waitBeforeSnapshot(for: caller) {
            var response = Self.rpcError(.tooManyRequests, JSONRPCError(code: JSONRPCError.serviceUnavailableCode,
                message: "Too many snapshots: this address was sent gateway.snapshot_bytes_per_minute (\(settings.snapshotBytesPerMinute) bytes) of opening events in the last minute; try again in \(seconds) s",
                data: ["retryAfterSeconds": .int(Int64(seconds))]))
            response.headers[.retryAfter] = "\(seconds)"
            return response
        }
        let (id, events, backlog) = await feed.attach(prefixes: prefixes, since: since)
        snapshotBudget.charge(backlog.waiting, to: caller)
        let feed = self.feed
        var headers: HTTPFields = [.contentType: "text/event-stream", .cacheControl: "no-cache"]
        headers[HTTPField.Name("X-Accel-Buffering")!] = "no"
        return Response(status: .ok, headers: headers, body: ResponseBody { writer in
            // The stream leaves the feed however the writing ends (the browser gone included).
            do {
                // A retry hint first, so a browser reconnects quickly after a cut.
                try await writer.write(ByteBuffer(string: "retry: 1000\n\n"))
                for await event in events {
                    try await writer.write(event.encoded)
                    backlog.add(-event.size)
                    feed.eventsSent.add(1, ordering: .relaxed)
                }
                try await writer.finish(nil)
            } catch {
                await feed.detach(id)
                throw error
            }
            await feed.detach(id)
        })
    }

    // MARK: GET /streams/{stream}/{consumer}

    /// A consumer's messages pushed as Server-Sent Events, for a browser's `EventSource`:
    /// `consumer.next` asked in parts, each message an event (`id:` its sequence, `data:` the
    /// message as the contract gives it), then `event: end` with how many were sent and missed, or
    /// `event: error` with the JSON-RPC error that ended it. Query `max` and `expires` as
    /// `consumer.next` takes them. A stream or consumer that is not there is refused with its
    /// HTTP status before the stream opens (an `EventSource` stops on it rather than retry).
    func consumerMessages(_ request: Request, context: GatewayContext) async -> Response {
        let token: GatewayToken?
        switch admit(request) {
        case .refused(let response): return response
        case .token(let admitted) where !admitted.allows(service: StreamsAPI.service):
            return Self.rpcError(.forbidden, .forbidden("this token may not call the \(StreamsAPI.service) service"))
        case .token(let admitted): token = admitted
        case .open: token = nil
        }
        let stream = context.parameters.get("stream") ?? "", consumer = context.parameters.get("consumer") ?? ""
        let query = request.uri.queryParameters
        var next = StreamsAPI.Next(stream: stream, consumer: consumer)
        // Checked against the contract's ranges here: once the events have begun, an error
        // can only be an `event: error`, and an `EventSource` would open the stream again.
        let ranges = StreamsAPI.Next.numberRanges
        if let text = query["max"] {
            guard let max = Int(String(text)), let range = ranges["max"], range.contains(Double(max)) else {
                return Self.rpcError(.badRequest, .invalidParams(field: "max", "expected 1 to 1000000 messages, got '\(text)'"))
            }
            next.max = max
        }
        if let text = query["expires"] {
            guard let seconds = Double(String(text)), let range = ranges["expires"], range.contains(seconds) else {
                return Self.rpcError(.badRequest, .invalidParams(field: "expires", "expected 0.001 to 3600 seconds, got '\(text)'"))
            }
            next.expires = seconds
        }
        do throws(BusError) {
            _ = try await client.call(StreamsAPI.consumerInfo, .init(stream: stream, name: consumer))
        } catch {
            let response = Self.response(id: .null, .failure(error))
            return Self.reply(Self.status(for: response), response.jsonBytes)
        }
        if let token, let refused = await captureRefusal(stream, token) {
            let response = JSONRPCResponse(id: .null, error: refused)
            return Self.reply(Self.status(for: response), response.jsonBytes)
        }
        // The service sends nothing while the consumer has nothing: wait as long as asked.
        let parts = client.stream(StreamsAPI.next, next, timeout: .seconds(next.expires ?? 30) + settings.requestTimeout)
        var headers: HTTPFields = [.contentType: "text/event-stream", .cacheControl: "no-cache"]
        headers[HTTPField.Name("X-Accel-Buffering")!] = "no"
        let heartbeat = settings.heartbeat
        return Response(status: .ok, headers: headers, body: ResponseBody { writer in
            try await writer.write(ByteBuffer(string: "retry: 1000\n\n"))
            // Between messages, a comment every heartbeat, as on /events: a write to a browser
            // that left fails, and the request is cancelled with the group, freeing its place
            // in the streams service rather than holding it until `expires`. Any error a write
            // throws is the browser's connection. Each message is handed over only once the
            // last is written, so a slow browser holds back the stream as it did before
            // (whose buffer is bounded), not a queue here.
            let events = AsyncChannel<ConsumerEvent>()
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask {
                    do {
                        for try await message in parts { await events.send(.message(message)) }
                        await events.send(.end(try await parts.end()))
                    } catch let error as BusError {
                        await events.send(.failed(error))
                    }
                    events.finish()
                }
                group.addTask {
                    // Ends quietly when cancelled: a child's error would end the stream with it.
                    while true {
                        try? await Task.sleep(for: heartbeat)
                        if Task.isCancelled { return }
                        await events.send(.keepAlive)
                    }
                }
                for await event in events {
                    switch event {
                    case .message(let message):
                        try await writer.write(Self.framed(try JSONValue(encoding: message).jsonBytes, .eventStream, event: nil, id: message.sequence))
                    case .keepAlive:
                        try await writer.write(Self.keepAlive)
                    case .end(let end):
                        // The counts only: each message was an event of its own.
                        let counts: JSONValue = ["count": .int(Int64(end.count)), "missed": .int(Int64(end.missed))]
                        try await writer.write(Self.framed(counts.jsonBytes, .eventStream, event: "end"))
                    case .failed(let error):
                        try await writer.write(Self.framed(Self.response(id: .null, .failure(error)).jsonBytes, .eventStream, event: "error"))
                    }
                }
                group.cancelAll()
            }
            try await writer.finish(nil)
        })
    }

    /// What the event stream of a consumer's messages writes next.
    private enum ConsumerEvent: Sendable {
        case message(StreamsAPI.Message)
        case end(StreamsAPI.NextEnd)
        case failed(BusError)
        case keepAlive
    }

    /// The comment line written on an event stream while it has nothing else to say.
    private static let keepAlive = StreamEvent(name: nil, id: nil, data: "keep-alive", key: nil).encoded

    // MARK: Operators

    func metrics(_ request: Request) async throws -> Response {
        if case .refused(let response) = admit(request) { return response }
        var text = ""
        do {
            text = try await client.call(KernelAPI.metrics, timeout: .seconds(2)).text
        } catch {
            text = "# the kernel did not answer: \(error)\n"
        }
        // Each stream's and consumer's figures, from the streams service when the bus runs one.
        if (try? await client.hasWorkers(StreamsAPI.service, timeout: .seconds(2))) == true {
            do {
                text += try await client.call(StreamsAPI.metrics, timeout: .seconds(2)).text
            } catch {
                text += "# the streams service did not answer: \(error)\n"
            }
        }
        let streams = await feed.counters
        let rpc = rpcRequests.value
        let lines: [(String, String, String, Int)] = [
            ("switchboard_gateway_streams", "gauge", "Event streams open now.", streams.open),
            ("switchboard_gateway_streams_opened_total", "counter", "Event streams opened.", streams.opened),
            ("switchboard_gateway_events_sent_total", "counter", "Events written to streams.", feed.eventsSent.load(ordering: .relaxed)),
            ("switchboard_gateway_resumes_total", "counter", "Streams resumed from Last-Event-ID with exactly the changes since, from this gateway's memory.", streams.resumes),
            ("switchboard_gateway_kernel_resumes_total", "counter", "Streams resumed from Last-Event-ID with exactly the changes since, from the kernel's history (the gateway had not seen them all).", streams.kernelResumes),
            ("switchboard_gateway_kernel_resumes_declined_total", "counter", "Resumes reset to the snapshot because the most reads of the kernel's history at once were under way.", streams.kernelResumesDeclined),
            ("switchboard_gateway_resets_total", "counter", "Streams that asked to resume and got a reset and a snapshot.", streams.resets),
            ("switchboard_gateway_stream_overflows_total", "counter", "Streams cut because their reader fell too far behind.", streams.overflows),
            ("switchboard_gateway_subscription_gaps_total", "counter", "Times the gateway's own subscription missed updates and resynced.", streams.missed),
            ("switchboard_gateway_rpc_requests_total", "counter", "POST /rpc requests.", rpc),
            ("switchboard_gateway_rpc_refused_total", "counter", "POST /rpc requests refused with 429: their address had gateway.max_calls_per_address calls in flight.", callsRefused.value),
            ("switchboard_gateway_rpc_callers", "gauge", "Addresses with POST /rpc calls in flight now.", callsPerAddress.callers),
            ("switchboard_gateway_connections", "gauge", "HTTP connections open now.", connections.open),
            ("switchboard_gateway_max_connections", "gauge", "The most HTTP connections held at once (gateway.max_connections); more wait to be accepted.", connections.max),
        ]
        for (name, type, help, value) in lines {
            text += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n\(name) \(value)\n"
        }
        return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4"], body: .init(byteBuffer: ByteBuffer(string: text)))
    }

    /// Ready when the kernel answers and every expected service has a worker.
    func ready() async -> Response {
        do {
            let list = try await client.call(KernelAPI.servicesList, timeout: .seconds(2))
            let workers = Dictionary(list.services.map { ($0.name, $0.workers) }, uniquingKeysWith: max)
            let missing = options.services.filter { (workers[$0] ?? 0) == 0 }
            // What `switchboard up` says of processes that keep ending (nothing otherwise).
            let restarting = ((try? await client.call(KernelAPI.stateGet, .init(prefix: SupervisorStatus.prefix), timeout: .seconds(2)))?.entries ?? [])
                .compactMap { try? $0.value.decode(as: SupervisorStatus.self) }.filter { $0.state != .running }
            var body: [String: JSONValue] = ["status": missing.isEmpty ? "ready" : "waiting"]
            if !restarting.isEmpty { body["restarting"] = .array(restarting.compactMap { try? JSONValue(encoding: $0) }) }
            guard missing.isEmpty else {
                body["servicesWithoutWorkers"] = .array(missing.map { .string($0) })
                return Self.json(.serviceUnavailable, .object(body))
            }
            body["services"] = .array(options.services.map { .string($0) })
            return Self.json(.ok, .object(body))
        } catch {
            return Self.json(.serviceUnavailable, ["status": "no kernel", "problem": .string("\(error)")])
        }
    }
}

/// A count shared by the request handlers.
final class RequestCount: Sendable {
    private let count = Atomic<Int>(0)
    func add() { count.add(1, ordering: .relaxed) }
    var value: Int { count.load(ordering: .relaxed) }
}

/// A path no route serves is answered as a missing page file is, "not found" (the router's
/// own 404 has no body: a caller could not tell the gateway from something else saying nothing).
struct UnknownPathSaid<Context: RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let error as HTTPError where error.status == .notFound {
            return Page.notFound()
        }
    }
}

/// CORS for the configured origins only: no header for any other.
struct AllowedOrigins<Context: RequestContext>: RouterMiddleware {
    let origins: Set<String>

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard let origin = request.headers[.origin], origins.contains(origin) else { return try await next(request, context) }
        var response: Response
        if request.method == .options {
            response = Response(status: .noContent)
            response.headers[.accessControlAllowMethods] = "GET, POST, OPTIONS"
            response.headers[.accessControlAllowHeaders] = "Authorization, Content-Type, Last-Event-ID"
            response.headers[.accessControlMaxAge] = "600"
        } else {
            response = try await next(request, context)
        }
        response.headers[.accessControlAllowOrigin] = origin
        response.headers[.vary] = "Origin"
        return response
    }
}
