import Foundation

/// A JSON-RPC 2.0 request id: a number, a string, or null.
public enum JSONRPCID: Sendable, Hashable, Codable, CustomStringConvertible {
    case number(Int64)
    case string(String)
    case null
    /// A number that is not an Int64 (`1.5`, or an integer past Int64's range): JSON-RPC 2.0
    /// says ids SHOULD NOT be such numbers, not MUST NOT, so it is answered, and echoed as
    /// the JSON text it was sent as (a Double would change it).
    case numberText(String)

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() { self = .null }
        else if let number = try? container.decode(Int64.self) { self = .number(number) }
        else if let number = try? container.decode(Double.self) { self = .numberText(JSONValue.double(number).jsonString) }
        else { self = .string(try container.decode(String.self)) }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .number(let number): try container.encode(number)
        case .string(let string): try container.encode(string)
        case .null: try container.encodeNil()
        case .numberText(let text): try container.encode(Double(text) ?? 0)
        }
    }

    /// The id from a request's or a response's `id` member: `value` parsed, `text` as sent.
    /// Nil when it is no valid id (an object, an array, a boolean).
    init?(_ value: JSONValue?, text: some Collection<UInt8>) {
        switch value {
        case nil, .null?: self = .null
        case .int(let number)?: self = .number(number)
        case .string(let string)?: self = .string(string)
        case .double?: self = .numberText(String(decoding: text, as: UTF8.self))
        default: return nil
        }
    }

    /// The id as a JSON value: a ``numberText`` as the nearest Double.
    var json: JSONValue {
        switch self {
        case .number(let number): .int(number)
        case .string(let string): .string(string)
        case .null: .null
        case .numberText(let text): .double(Double(text) ?? 0)
        }
    }

    /// Writes the id as JSON text.
    func write(into output: inout [UInt8]) {
        switch self {
        case .number(let number): JSONText.write(.int(number), into: &output)
        case .string(let string): JSONText.writeString(string, into: &output)
        case .null: output.append(contentsOf: "null".utf8)
        case .numberText(let text): output.append(contentsOf: text.utf8)
        }
    }

    public var description: String {
        var output: [UInt8] = []
        write(into: &output)
        return String(decoding: output, as: UTF8.self)
    }
}

/// A JSON-RPC 2.0 error object, also thrown by service methods.
public struct JSONRPCError: Error, Sendable, Hashable, CustomStringConvertible {
    public var code: Int
    public var message: String
    public var data: JSONValue?

    public init(code: Int, message: String, data: JSONValue? = nil) {
        self.code = code
        self.message = message
        self.data = data
    }

    public var description: String { "error \(code): \(message)" + (data.map { " \($0)" } ?? "") }

    // The codes of the JSON-RPC 2.0 specification, and Switchboard's own (see DESIGN.md).
    public static let parseErrorCode = -32700
    public static let invalidRequestCode = -32600
    public static let methodNotFoundCode = -32601
    public static let invalidParamsCode = -32602
    public static let internalErrorCode = -32603
    public static let serviceUnavailableCode = -32001
    public static let timedOutCode = -32002
    public static let notFoundCode = -32003
    public static let conflictCode = -32004
    public static let upstreamFailedCode = -32005
    public static let outcomeUnknownCode = -32006
    /// The service's storage failed (read-only, full, corrupt); `data.reason` says which.
    public static let storageFailedCode = -32007
    /// The kernel asked is not the active one of its pair (BusKit clients then ask the other).
    public static let notActiveCode = -32008
    public static let tooLargeCode = -32010
    public static let forbiddenCode = -32011
    /// Whatever handled the request died each time it was handed out, as often as a request
    /// is: it is not handed out again, as it may be what ends them.
    public static let handlerDiedCode = -32012
    /// A configuration file that does not read (`sb reload`); `data.key` names the key.
    public static let invalidConfigurationCode = -32013
    /// A reply in parts ended before its FINAL; `data.parts` says how many parts came and
    /// `data.reason` why it ended (`worker_died`, `overrun`).
    public static let streamEndedCode = -32014

    public static func parseError(_ detail: String) -> JSONRPCError { .init(code: parseErrorCode, message: "Parse error: \(detail)") }
    public static func invalidRequest(_ detail: String) -> JSONRPCError { .init(code: invalidRequestCode, message: "Invalid request: \(detail)") }
    public static func methodNotFound(_ method: String) -> JSONRPCError { .init(code: methodNotFoundCode, message: "Method not found: \(method)") }
    /// Invalid params, naming the field in `data.field`.
    public static func invalidParams(field: String, _ detail: String) -> JSONRPCError {
        .init(code: invalidParamsCode, message: "Invalid params: \(field): \(detail)", data: ["field": .string(field)])
    }
    public static func serviceUnavailable(_ service: String, within seconds: Double) -> JSONRPCError {
        .init(code: serviceUnavailableCode, message: "Service unavailable: no worker for '\(service)' within \(formatSeconds(seconds))",
              data: ["service": .string(service)])
    }
    /// -32006: what carried the request (the service's worker, or with `what` the connection
    /// to the kernel) ended before its answer; it is not sent again, as it may have been done.
    public static func outcomeUnknown(_ service: String, _ what: String? = nil) -> JSONRPCError {
        .init(code: outcomeUnknownCode,
              message: "Outcome unknown: \(what ?? "the '\(service)' worker handling this request died"); it was not retried",
              data: ["service": .string(service)])
    }
    /// What ended a request's connection to the kernel, for ``outcomeUnknown(_:_:)``.
    public static let connectionDropped = "the connection to the kernel dropped with this request in flight"
    public static func tooLarge(_ bytes: Int, limit: Int) -> JSONRPCError {
        .init(code: tooLargeCode, message: "Too large: \(bytes) bytes, the limit is \(limit)")
    }
    /// A request or reply (`what`) the kernel would not take: libzmq drops the connection
    /// that carries a message over `kernel.max_message_size` instead of answering.
    public static func overMessageSize(_ what: String, bytes: Int, limit: Int) -> JSONRPCError {
        .init(code: tooLargeCode, message: "Too large: the \(what) is \(bytes) bytes, over the kernel's limit of \(limit) bytes (kernel.max_message_size)",
              data: ["bytes": .int(Int64(bytes)), "limit": .int(Int64(limit))])
    }
    public static func forbidden(_ detail: String) -> JSONRPCError { .init(code: forbiddenCode, message: "Forbidden: \(detail)") }
    /// -32010 for a batch of more requests than `kernel.max_batch_items`.
    public static func batchTooLarge(_ requests: Int, limit: Int) -> JSONRPCError {
        .init(code: tooLargeCode, message: "Too large: the batch has \(requests) requests, the limit (kernel.max_batch_items) is \(limit)",
              data: ["requests": .int(Int64(requests)), "limit": .int(Int64(limit))])
    }
    /// -32012: `what` (a service's workers, the connection to the kernel) died `times` times
    /// with this request in flight.
    /// `otherCause`: what else may end them, said after.
    public static func handlerDied(_ what: String, times: Int, service: String, otherCause: String? = nil) -> JSONRPCError {
        .init(code: handlerDiedCode,
              message: "Not sent again: \(what) died \(times) times while handling this request; it may be what ends them, so it is not handed out again"
                + (otherCause.map { " (or \($0))" } ?? ""),
              data: ["service": .string(service), "times": .int(Int64(times))])
    }
    /// -32014: the parts of a reply stopped after `parts` of them, because `what`.
    public static func streamEnded(_ what: String, parts: Int, reason: String, service: String) -> JSONRPCError {
        .init(code: streamEndedCode, message: "Stream ended: \(what) after \(parts) part\(parts == 1 ? "" : "s"); the parts that came are all there are",
              data: ["parts": .int(Int64(parts)), "reason": .string(reason), "service": .string(service)])
    }
    public static func internalError(_ detail: String) -> JSONRPCError { .init(code: internalErrorCode, message: "Internal error: \(detail)") }
    public static func invalidConfiguration(key: String, _ detail: String) -> JSONRPCError {
        .init(code: invalidConfigurationCode, message: "Invalid configuration: \(detail)", data: ["key": .string(key)])
    }

    static func formatSeconds(_ seconds: Double) -> String {
        seconds == seconds.rounded() ? "\(Int(seconds)) s" : String(format: "%.1f s", seconds)
    }

    var json: JSONValue {
        var object: [String: JSONValue] = ["code": .int(Int64(code)), "message": .string(message)]
        if let data { object["data"] = data }
        return .object(object)
    }
}

/// A JSON-RPC 2.0 request. A request without an id is a notification.
///
/// Its params are kept as JSON text: as they arrived (a service decodes them straight
/// into its handler's type, in one pass) or as encoded once by the sender.
public struct JSONRPCRequest: Sendable, Hashable {
    public var id: JSONRPCID?
    public var method: String
    /// The params' JSON text (an object or an array), or nil when absent.
    public var paramsText: [UInt8]?
    /// W3C trace context, as the request's `traceparent` and `tracestate` members (a
    /// Switchboard extension that JSON-RPC peers ignore; docs/PROTOCOL.md).
    public var trace: Trace?
    /// The sending client's id (its `client` member, a Switchboard extension that JSON-RPC
    /// peers ignore): with the request's `id` it names the request, so a service can answer
    /// one re-sent after a failover with the reply it already gave (docs/PROTOCOL.md).
    public var client: String?
    /// Asks for the result in parts (its `stream` member, a Switchboard extension): a method
    /// that can stream answers with a PARTIAL per part and a FINAL (18/MDP); any other
    /// method, and a 7/MDP worker, answer one reply as if it were absent (docs/PROTOCOL.md).
    public var stream = false

    /// The values of a request's `traceparent` and `tracestate` members.
    public struct Trace: Sendable, Hashable {
        public var parent: String?
        public var state: String?
        public init(parent: String? = nil, state: String? = nil) {
            self.parent = parent
            self.state = state
        }
    }

    public init(id: JSONRPCID?, method: String, params: JSONValue? = nil, trace: Trace? = nil, client: String? = nil, stream: Bool = false) {
        self.init(id: id, method: method, paramsText: params?.jsonBytes, trace: trace, client: client, stream: stream)
    }

    public init(id: JSONRPCID?, method: String, paramsText: [UInt8]?, trace: Trace? = nil, client: String? = nil, stream: Bool = false) {
        self.id = id
        self.method = method
        self.paramsText = paramsText
        self.trace = trace
        self.client = client
        self.stream = stream
    }

    /// The params as a JSON value, parsed from ``paramsText`` on each read.
    public var params: JSONValue? {
        get { paramsText.flatMap { try? JSONValue(parsing: $0, maxDepth: JSONRPC.maxDepth) } }
        set { paramsText = newValue?.jsonBytes }
    }

    public var json: JSONValue {
        var object: [String: JSONValue] = ["jsonrpc": "2.0", "method": .string(method)]
        if let id { object["id"] = id.json }
        if let client { object["client"] = .string(client) }
        if let params { object["params"] = params }
        if let parent = trace?.parent { object["traceparent"] = .string(parent) }
        if let state = trace?.state { object["tracestate"] = .string(state) }
        if stream { object["stream"] = true }
        return .object(object)
    }

    /// Compact JSON text, keys in sorted order like ``JSONValue/jsonBytes``; the params
    /// text goes in as it is.
    public var jsonBytes: [UInt8] {
        var output: [UInt8] = []
        // Room for every member at once (a string with escapes may still grow it).
        output.reserveCapacity(64 + method.utf8.count + (paramsText?.count ?? 0) + (client.map { $0.utf8.count + 12 } ?? 0)
                               + (trace?.parent.map { $0.utf8.count + 16 } ?? 0) + (trace?.state.map { $0.utf8.count + 16 } ?? 0))
        output.append(UInt8(ascii: "{"))
        if let client {
            output.append(contentsOf: #""client":"#.utf8)
            JSONText.writeString(client, into: &output)
            output.append(UInt8(ascii: ","))
        }
        if let id {
            output.append(contentsOf: #""id":"#.utf8)
            id.write(into: &output)
            output.append(UInt8(ascii: ","))
        }
        output.append(contentsOf: #""jsonrpc":"2.0","method":"#.utf8)
        JSONText.writeString(method, into: &output)
        if let paramsText {
            output.append(contentsOf: #","params":"#.utf8)
            output.append(contentsOf: paramsText)
        }
        if stream { output.append(contentsOf: #","stream":true"#.utf8) }
        if let parent = trace?.parent {
            output.append(contentsOf: #","traceparent":"#.utf8)
            JSONText.writeString(parent, into: &output)
        }
        if let state = trace?.state {
            output.append(contentsOf: #","tracestate":"#.utf8)
            JSONText.writeString(state, into: &output)
        }
        output.append(UInt8(ascii: "}"))
        return output
    }

    public static func == (lhs: JSONRPCRequest, rhs: JSONRPCRequest) -> Bool {
        lhs.id == rhs.id && lhs.method == rhs.method && lhs.params == rhs.params && lhs.trace == rhs.trace && lhs.client == rhs.client
            && lhs.stream == rhs.stream
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(id)
        hasher.combine(method)
        hasher.combine(params)
    }
}

/// A JSON-RPC 2.0 response: a result or an error, for the request with `id`.
public struct JSONRPCResponse: Sendable, Hashable {
    public var id: JSONRPCID
    public var outcome: Result<JSONValue, JSONRPCError>

    public init(id: JSONRPCID, result: JSONValue) {
        self.id = id
        self.outcome = .success(result)
    }

    public init(id: JSONRPCID, error: JSONRPCError) {
        self.id = id
        self.outcome = .failure(error)
    }

    /// The response as a JSON value (an id sent as a fraction or past Int64 becomes the
    /// nearest Double here; ``jsonBytes`` writes it as sent).
    public var json: JSONValue {
        var object: [String: JSONValue] = ["jsonrpc": "2.0", "id": id.json]
        switch outcome {
        case .success(let result): object["result"] = result
        case .failure(let error): object["error"] = error.json
        }
        return .object(object)
    }

    /// The response as JSON text, members in sorted order.
    public var jsonBytes: [UInt8] {
        switch outcome {
        case .success(let result): return JSONRPC.resultReply(id: id, resultText: result.jsonBytes)
        case .failure(let error):
            var output = Array(#"{"error":"#.utf8)
            JSONText.write(error.json, into: &output)
            output.append(contentsOf: #","id":"#.utf8)
            id.write(into: &output)
            output.append(contentsOf: #","jsonrpc":"2.0"}"#.utf8)
            return output
        }
    }
}

/// One element of a request body: a valid request, or the error response owed for it.
public enum JSONRPCItem: Sendable, Equatable {
    case request(JSONRPCRequest)
    case invalid(JSONRPCResponse)
}

/// A parsed request body: one request or a batch.
public enum JSONRPCIncoming: Sendable, Equatable {
    case single(JSONRPCItem)
    case batch([JSONRPCItem])
    /// Not JSON, or an empty batch: answer with this response alone.
    case unusable(JSONRPCResponse)

    /// The valid requests of the body, in order.
    public var requests: [JSONRPCRequest] {
        switch self {
        case .unusable, .single(.invalid): []
        case .single(.request(let request)): [request]
        case .batch(let items): items.compactMap { if case .request(let request) = $0 { request } else { nil } }
        }
    }
}

public enum JSONRPC {
    /// The largest nesting accepted in untrusted JSON (deeper input is a parse error).
    public static let maxDepth = 64

    /// Parses a request body (one request or a batch), strictly: `"jsonrpc": "2.0"`, a
    /// string `method`, an id that is a string, an integer or null, params that are an
    /// object or an array. Never throws; bad input becomes the error response it deserves.
    @inlinable  // specialized where called: a generic call per request looked up metadata
    public static func parseRequests(_ bytes: some Collection<UInt8>) -> JSONRPCIncoming {
        if let parsed = bytes.withContiguousStorageIfAvailable({ parseRequests(in: $0) }) { return parsed }
        return Array(bytes).withUnsafeBufferPointer { parseRequests(in: $0) }
    }

    /// One pass over the body: the envelope's members are read, the params only checked and
    /// kept as text, for the service to decode straight into its handler's type.
    @usableFromInline static func parseRequests(in body: UnsafeBufferPointer<UInt8>) -> JSONRPCIncoming {
        let outline: JSONText.Outline
        do {
            outline = try JSONText.outline(body, maxDepth: maxDepth)
        } catch {
            // Say which limit or fault it met: nesting past maxDepth is no syntax error.
            let detail = error.isTooDeep ? "the body nests deeper than \(maxDepth) levels, the limit for JSON from outside" : "the body is not valid JSON (\(error))"
            return .unusable(JSONRPCResponse(id: .null, error: .parseError(detail)))
        }
        switch outline {
        case .array(let elements):
            guard !elements.isEmpty else {
                return .unusable(JSONRPCResponse(id: .null, error: .invalidRequest("empty batch")))
            }
            return .batch(elements.map { range in
                let element = UnsafeBufferPointer(rebasing: body[range])
                guard case .object(let members)? = try? JSONText.outline(element, maxDepth: maxDepth) else { return notAnObject }
                return request(members, in: element)
            })
        case .object(let members):
            return .single(request(members, in: body))
        case .scalar:
            return .single(notAnObject)
        }
    }

    /// Where each member of a request's or a response's envelope lies in its text, read in
    /// one pass: a repeated member counts once, the last one, as a parsed object would have
    /// it; others are ignored.
    private struct EnvelopeMembers {
        var id, jsonrpc, method, params, traceparent, tracestate, client, stream, result, error: Range<Int>?

        init(_ members: [(key: String, range: Range<Int>)]) {
            for member in members {
                switch member.key {
                case "id": id = member.range
                case "jsonrpc": jsonrpc = member.range
                case "method": method = member.range
                case "params": params = member.range
                case "traceparent": traceparent = member.range
                case "tracestate": tracestate = member.range
                case "client": client = member.range
                case "stream": stream = member.range
                case "result": result = member.range
                case "error": error = member.range
                default: break
                }
            }
        }
    }

    /// The value of a member `range` points at in `text`, parsed (the outline checked the
    /// whole text, nesting included).
    private static func memberValue(_ range: Range<Int>?, in text: UnsafeBufferPointer<UInt8>) -> JSONValue? {
        range.flatMap { try? JSONText.parse(UnsafeBufferPointer(rebasing: text[$0]), maxDepth: maxDepth) }
    }

    private static let notAnObject = JSONRPCItem.invalid(JSONRPCResponse(id: .null, error: .invalidRequest("a request must be a JSON object")))

    private static func request(_ members: [(key: String, range: Range<Int>)], in text: UnsafeBufferPointer<UInt8>) -> JSONRPCItem {
        // The members a request may have, read in one pass: a dictionary of them, built per
        // request, costs parsing a small request a large share (`switchboard-bench json`).
        let ranges = EnvelopeMembers(members)
        func value(_ range: Range<Int>?) -> JSONValue? { memberValue(range, in: text) }
        var id: JSONRPCID?
        if let range = ranges.id {
            guard let valid = JSONRPCID(value(range), text: text[range]) else {
                return .invalid(JSONRPCResponse(id: .null, error: .invalidRequest("id must be a string, a number or null")))
            }
            id = valid
        }
        let replyID = id ?? .null
        guard value(ranges.jsonrpc) == .string("2.0") else {
            return .invalid(JSONRPCResponse(id: replyID, error: .invalidRequest("\"jsonrpc\" must be \"2.0\"")))
        }
        guard case .string(let method)? = value(ranges.method), !method.isEmpty else {
            return .invalid(JSONRPCResponse(id: replyID, error: .invalidRequest("method must be a non-empty string")))
        }
        var paramsText: [UInt8]?
        if let range = ranges.params {
            guard text[range.lowerBound] == UInt8(ascii: "{") || text[range.lowerBound] == UInt8(ascii: "[") else {
                return .invalid(JSONRPCResponse(id: replyID, error: .invalidRequest("params must be an object or an array")))
            }
            paramsText = Array(text[range])
        }
        // Trace members that are not strings are ignored, as a peer without tracing would.
        var trace: JSONRPCRequest.Trace?
        if case .string(let parent)? = value(ranges.traceparent) {
            trace = JSONRPCRequest.Trace(parent: parent, state: value(ranges.tracestate)?.stringValue)
        }
        return .request(JSONRPCRequest(id: id, method: method, paramsText: paramsText, trace: trace, client: value(ranges.client)?.stringValue,
                                       stream: value(ranges.stream) == .bool(true)))
    }

    /// A response carrying `resultText`, JSON text encoded by the service itself (so a
    /// result is written once, straight to bytes).
    public static func resultReply(id: JSONRPCID, resultText: [UInt8]) -> [UInt8] {
        envelope(id: id, member: #","jsonrpc":"2.0","result":"#, text: resultText)
    }

    /// ``resultReply(id:resultText:)`` written at the end of `output`: a batch's responses
    /// written into one buffer copy each result once.
    public static func appendResultReply(id: JSONRPCID, resultText: [UInt8], to output: inout [UInt8]) {
        appendEnvelope(id: id, member: #","jsonrpc":"2.0","result":"#, text: resultText, to: &output)
    }

    /// `{"id":ID` + `member` (which names the last member) + `text` + `}`: keys in sorted order.
    private static func envelope(id: JSONRPCID, member: StaticString, text: [UInt8]) -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(40 + text.count)
        appendEnvelope(id: id, member: member, text: text, to: &output)
        return output
    }

    private static func appendEnvelope(id: JSONRPCID, member: StaticString, text: [UInt8], to output: inout [UInt8]) {
        output.append(contentsOf: #"{"id":"#.utf8)
        id.write(into: &output)
        output.append(contentsOf: UnsafeBufferPointer(start: member.utf8Start, count: member.utf8CodeUnitCount))
        output.append(contentsOf: text)
        output.append(UInt8(ascii: "}"))
    }

    /// One part of a reply in parts (an 18/MDP PARTIAL's body): `{"id":ID,"jsonrpc":"2.0","part":PART}`,
    /// `partText` written by the service itself. The FINAL is a response as any other.
    public static func partReply(id: JSONRPCID, partText: [UInt8]) -> [UInt8] {
        envelope(id: id, member: #","jsonrpc":"2.0","part":"#, text: partText)
    }

    /// Reads a PARTIAL's body (see ``partReply(id:partText:)``): its id and its part.
    public static func parsePart(_ bytes: some Collection<UInt8>) throws(ProtocolError) -> (id: JSONRPCID, part: JSONValue) {
        let value: JSONValue
        do { value = try JSONValue(parsing: Array(bytes), maxDepth: maxDepth) } catch { throw ProtocolError("JSON-RPC", "a part is not JSON: \(error)") }
        guard case .object(let object) = value, object["jsonrpc"] == .string("2.0"), let part = object["part"] else {
            throw ProtocolError("JSON-RPC", "a part must be an object with \"jsonrpc\": \"2.0\", an id and a \"part\"")
        }
        switch object["id"] {
        case .int(let number)?: return (.number(number), part)
        case .string(let string)?: return (.string(string), part)
        default: throw ProtocolError("JSON-RPC", "a part's id must be a string or an integer")
        }
    }

    /// Parses a response body: one response or a batch of them.
    public static func parseResponses(_ bytes: some Collection<UInt8>) throws(ProtocolError) -> [JSONRPCResponse] {
        let parsed = bytes.withContiguousStorageIfAvailable { parseResponses(in: $0) } ?? Array(bytes).withUnsafeBufferPointer { parseResponses(in: $0) }
        return try parsed.get()
    }

    /// As a request is read: the envelope's members found in one pass over the text, then
    /// only their values parsed (the result, which the caller gets as a value). Parsing the
    /// whole response into a tree built a dictionary of the envelope too, for four members.
    private static func parseResponses(in body: UnsafeBufferPointer<UInt8>) -> Result<[JSONRPCResponse], ProtocolError> {
        let outline: JSONText.Outline
        do {
            outline = try JSONText.outline(body, maxDepth: maxDepth)
        } catch {
            return .failure(ProtocolError("JSON-RPC", "the response is not valid JSON"))
        }
        return Result { () throws(ProtocolError) -> [JSONRPCResponse] in
            switch outline {
            case .array(let elements):
                var responses: [JSONRPCResponse] = []
                responses.reserveCapacity(elements.count)
                for range in elements {
                    let element = UnsafeBufferPointer(rebasing: body[range])
                    guard case .object(let members)? = try? JSONText.outline(element, maxDepth: maxDepth) else { throw notAResponse }
                    responses.append(try response(members, in: element))
                }
                return responses
            case .object(let members):
                return [try response(members, in: body)]
            case .scalar:
                throw notAResponse
            }
        }
    }

    private static let notAResponse = ProtocolError("JSON-RPC", "a response must be an object with \"jsonrpc\": \"2.0\"")

    /// A response from its envelope's members.
    private static func response(_ members: [(key: String, range: Range<Int>)], in text: UnsafeBufferPointer<UInt8>) throws(ProtocolError) -> JSONRPCResponse {
        let ranges = EnvelopeMembers(members)
        func value(_ range: Range<Int>?) -> JSONValue? { memberValue(range, in: text) }
        guard value(ranges.jsonrpc) == .string("2.0") else { throw notAResponse }
        guard let id = JSONRPCID(value(ranges.id), text: ranges.id.map { text[$0] } ?? text[0..<0]) else {
            throw ProtocolError("JSON-RPC", "response id must be a string, a number or null")
        }
        if let result = value(ranges.result) {
            guard ranges.error == nil else { throw ProtocolError("JSON-RPC", "a response has both result and error") }
            return JSONRPCResponse(id: id, result: result)
        }
        guard case .object(let error)? = value(ranges.error), let code = error["code"]?.intValue,
            case .string(let message)? = error["message"]
        else { throw ProtocolError("JSON-RPC", "a response needs a result or an error with code and message") }
        return JSONRPCResponse(id: id, error: JSONRPCError(code: Int(code), message: message, data: error["data"]))
    }

    /// The reply body answering every request in `body` with `error`, for a request the
    /// kernel could not deliver: one response (with the request's id, or null) for a single
    /// request, an array for a batch (empty when the batch held only notifications). A body
    /// that is not JSON-RPC gets one response with a null id, in an array when it looks like a
    /// batch. Parses the body once and never fails.
    public static func errorReply(to body: some Collection<UInt8>, error: JSONRPCError) -> [UInt8] {
        switch parseRequests(body) {
        case .single(.request(let request)):
            return JSONRPCResponse(id: request.id ?? .null, error: error).jsonBytes
        case .single(.invalid):
            return JSONRPCResponse(id: .null, error: error).jsonBytes
        case .batch(let items):
            let responses = items.compactMap { item -> JSONRPCResponse? in
                guard case .request(let request) = item, let id = request.id else { return nil }
                return JSONRPCResponse(id: id, error: error)
            }
            return encodeReply(responses, batch: true) ?? []
        case .unusable:
            let looksLikeBatch = body.first { ![0x20, 0x0A, 0x0D, 0x09].contains($0) } == UInt8(ascii: "[")
            return encodeReply([JSONRPCResponse(id: .null, error: error)], batch: looksLikeBatch) ?? []
        }
    }

    /// Encodes a list of responses as the body owed for `incoming`: one object for a single
    /// request, an array for a batch, nothing when only notifications were answered.
    public static func encodeReply(_ responses: [JSONRPCResponse], batch: Bool) -> [UInt8]? {
        batch ? batchReply(responses.map(\.jsonBytes)) : responses.first?.jsonBytes
    }

    /// A batch's reply from its responses' JSON text: an array, or nothing when only
    /// notifications were answered (JSON-RPC 2.0).
    public static func batchReply(_ responses: [[UInt8]]) -> [UInt8]? {
        guard !responses.isEmpty else { return nil }
        var output: [UInt8] = [UInt8(ascii: "[")]
        output.reserveCapacity(responses.reduce(2) { $0 + $1.count + 1 })
        for (index, response) in responses.enumerated() {
            if index > 0 { output.append(UInt8(ascii: ",")) }
            output.append(contentsOf: response)
        }
        output.append(UInt8(ascii: "]"))
        return output
    }
}
