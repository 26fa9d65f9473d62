public import BusProtocol
public import Contracts
import ZeroMQ

/// Why a request through the bus failed.
public enum BusError: Error, Sendable, Equatable, CustomStringConvertible {
    /// No reply within the client's timeout.
    case timedOut(service: String, method: String, after: Duration)
    /// The kernel found no worker for the service within its queue timeout (-32001).
    case unavailable(service: String, message: String)
    /// The service (or the kernel) answered with a JSON-RPC error.
    case remote(service: String, JSONRPCError)
    /// The reply could not be understood.
    case protocolViolation(String)
    /// Refused before anything was sent: an argument no kernel could serve.
    case invalidArgument(String)
    /// The client was closed.
    case closed
    /// The task waiting for the reply was cancelled.
    case cancelled(service: String, method: String)

    public var description: String {
        switch self {
        case .timedOut(let service, let method, let after):
            "\(service) \(method): no reply within \(after.formatted)"
        case .unavailable(let service, let message):
            "\(service): \(message)"
        case .remote(let service, let error):
            "\(service): \(error)"
        case .protocolViolation(let problem):
            "protocol violation: \(problem)"
        case .invalidArgument(let problem):
            "invalid argument: \(problem)"
        case .closed:
            "the bus client is closed"
        case .cancelled(let service, let method):
            "\(service) \(method): cancelled"
        }
    }

    /// The JSON-RPC error code behind this error, where there is one.
    public var code: Int? {
        switch self {
        case .unavailable: JSONRPCError.serviceUnavailableCode
        case .remote(_, let error): error.code
        case .timedOut: JSONRPCError.timedOutCode
        case .invalidArgument: JSONRPCError.invalidParamsCode
        default: nil
        }
    }
}

extension BusClient {
    /// A call made while answering another (a service asking the store, say): a failure
    /// becomes a JSON-RPC error that names the service and what needed it, keeping the
    /// service's own code (-32001, -32002, -32007, ...).
    public func call<P, R>(_ method: Method<P, R>, _ params: P, timeout: Duration? = nil,
                           neededFor purpose: String) async throws(JSONRPCError) -> R {
        do {
            return try await call(method, params, timeout: timeout)
        } catch {
            // The service's own data stays (a conflict's winner, say), with the service named.
            var data: [String: JSONValue] = [:]
            if case .remote(_, let remote) = error, case .object(let fields)? = remote.data { data = fields }
            data["service"] = .string(method.service)
            // The message says the service's message once; its data is the data's, not the
            // message's too.
            let said = if case .remote(let service, let remote) = error { "\(service): error \(remote.code): \(remote.message)" } else { "\(error)" }
            throw JSONRPCError(code: error.code ?? JSONRPCError.serviceUnavailableCode, message: "\(purpose) needs the \(method.service) service: \(said)",
                               data: .object(data))
        }
    }
}

extension JSONRPCError {
    /// -32001 for a service that is not on a bus and so cannot reach `service`.
    public static func notConnected(to service: String, neededFor purpose: String) -> JSONRPCError {
        JSONRPCError(code: serviceUnavailableCode, message: "Service unavailable: \(purpose) needs the \(service) service, and this service is not connected to a bus",
                     data: ["service": .string(service)])
    }
}
