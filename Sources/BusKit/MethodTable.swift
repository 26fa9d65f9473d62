public import BusProtocol
import Foundation

/// A service of the bus: an actor with a name and a table of JSON-RPC methods.
///
/// ```swift
/// actor Echo: BusService {
///     static let name = "echo"
///     nonisolated func methods(_ table: inout MethodTable<Echo>) {
///         table.on("echo") { echo, params: JSONValue in params }
///     }
/// }
/// ```
public protocol BusService: Actor {
    /// The service name workers register under (7/MDP READY).
    static var name: String { get }
    /// Adds the service's methods to `table`; called once when hosting starts.
    nonisolated func methods(_ table: inout MethodTable<Self>)
}

/// For methods that take no params: accepts an absent, empty or null `params`.
public struct NoParams: Decodable, Sendable {
    public init() {}
    public init(from decoder: any Decoder) throws {}
}

/// The JSON-RPC methods of a service, each with typed params and result.
///
/// One pass each way: params are decoded straight from the request's bytes into the
/// handler's `Decodable` type, and the result is encoded straight to the reply's bytes.
public struct MethodTable<Service: BusService>: Sendable {
    /// Takes the params' JSON text (nil when absent) and gives the result's.
    typealias Handler = @Sendable (Service, [UInt8]?) async throws -> [UInt8]
    private(set) var handlers: [String: Handler] = [:]

    public init() {}

    /// Adds `method`. Its params are decoded as `P`; a decoding failure is answered with
    /// -32602 naming the field. A thrown ``JSONRPCError`` is answered as it is; any other
    /// error as -32603 with its description.
    public mutating func on<P: Decodable & Sendable, R: Encodable & Sendable>(
        _ method: String, _ handler: @escaping @Sendable (Service, P) async throws -> R
    ) {
        handlers[method] = { service, params in
            try encodeResult(try await handler(service, try decodeParams(P.self, params)))
        }
    }

    /// The names of all methods, sorted.
    public var methodNames: [String] { handlers.keys.sorted() }

    /// The table of `service`'s methods.
    public init(of service: Service) {
        service.methods(&self)
    }

    /// Runs `method` on `service` in this process, answering as a request through the bus
    /// would (for benchmarks and single-process use).
    public func call(_ method: String, params: JSONValue? = nil, on service: Service) async throws(JSONRPCError) -> JSONValue {
        let body = JSONRPCRequest(id: .number(0), method: method, params: params).jsonBytes
        let reply = await answer(body: body, on: service).reply
        guard let response = try? JSONRPC.parseResponses(reply).first else { throw .internalError("no response") }
        return try response.outcome.get()
    }

    /// Runs one request against `service`: the reply's text and whether it is an error (nil
    /// for a notification, which gets no reply).
    func answer(_ request: JSONRPCRequest, on service: Service) async -> (reply: [UInt8], isError: Bool)? {
        let outcome: Result<[UInt8], JSONRPCError>
        if let handler = handlers[request.method] {
            do {
                outcome = .success(try await handler(service, request.paramsText))
            } catch let error as JSONRPCError {
                outcome = .failure(error)
            } catch {
                outcome = .failure(.internalError(String(describing: error)))
            }
        } else {
            outcome = .failure(.methodNotFound(request.method))
        }
        guard let id = request.id else { return nil }
        switch outcome {
        case .success(let result): return (JSONRPC.resultReply(id: id, resultText: result), false)
        case .failure(let error): return (JSONRPCResponse(id: id, error: error).jsonBytes, true)
        }
    }

    /// Answers a whole request body (a request or a batch), with how many of the responses
    /// are errors (the host reports that count to the kernel, which never reads replies).
    func answer(body: [UInt8], on service: Service) async -> (reply: [UInt8], errors: Int) {
        switch JSONRPC.parseRequests(body) {
        case .unusable(let response), .single(.invalid(let response)):
            return (response.jsonBytes, 1)
        case .single(.request(let request)):
            guard let answer = await answer(request, on: service) else { return ([], 0) }
            return (answer.reply, answer.isError ? 1 : 0)
        case .batch(let items):
            var replies: [[UInt8]] = [], errors = 0
            for item in items {
                switch item {
                case .invalid(let response):
                    replies.append(response.jsonBytes)
                    errors += 1
                case .request(let request):
                    guard let answer = await answer(request, on: service) else { continue }
                    replies.append(answer.reply)
                    if answer.isError { errors += 1 }
                }
            }
            return (JSONRPC.batchReply(replies) ?? [], errors)
        }
    }
}

/// Decodes params' JSON text as `P` in one pass, turning decoding errors into -32602
/// naming the field. Absent params decode as an empty object (or null for `JSONValue`).
func decodeParams<P: Decodable>(_ type: P.Type, _ text: [UInt8]?) throws -> P {
    if P.self == NoParams.self { return NoParams() as! P }
    if P.self == JSONValue.self {
        guard let text else { return JSONValue.null as! P }
        return try JSONValue(parsing: text, maxDepth: JSONRPC.maxDepth) as! P
    }
    do {
        return try JSONDecoder().decode(P.self, from: text.map { Data($0) } ?? Data("{}".utf8))
    } catch let error as DecodingError {
        throw paramsError(error)
    }
}

/// Encodes a result in one pass: JSON text with sorted keys and unescaped slashes, as
/// ``JSONValue/jsonBytes`` writes it.
func encodeResult<R: Encodable>(_ result: R) throws -> [UInt8] {
    if let json = result as? JSONValue { return json.jsonBytes }
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    return Array(try encoder.encode(result))
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
