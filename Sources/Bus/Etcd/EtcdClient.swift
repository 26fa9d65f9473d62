import AsyncHTTPClient
import BusProtocol
import ClientTLS
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

/// A client of etcd's v3 API (range, put, delete, transactions, leases, watches) over its
/// JSON gateway (`POST /v3/...` on the client port), with async-http-client.
///
/// A request goes to the endpoint that answered last; when an endpoint cannot be reached
/// (the request was never sent) the next one is tried, so a cluster's members can be given
/// in any order. A request that reached etcd and failed is not sent again: whether a write
/// whose answer was lost took effect is for the caller to find out (its revision, or a
/// transaction's comparison, tells). Every wait is bounded by ``Settings/requestTimeout``;
/// every error is an ``EtcdError`` naming the operation and the endpoint.
///
/// ```swift
/// let etcd = try EtcdClient(endpoints: ["http://127.0.0.1:2379"])
/// let revision = try await etcd.put(Array("/a".utf8), Array("1".utf8))
/// for try await update in etcd.watch(prefix: Array("/".utf8), from: revision) { print(update) }
/// ```
public final class EtcdClient: Sendable {
    public struct Settings: Sendable {
        /// `http://HOST:PORT` or `https://HOST:PORT` of each member's client URL.
        public var endpoints: [String]
        /// Etcd's user and password, when its authentication is on.
        public var username: String?
        public var password: String?
        /// For `https://` endpoints: the CA that signed the members' certificates, and this
        /// client's own certificate and key when the members ask for one (PEM files).
        public var caFile: String?
        public var certificateFile: String?
        public var keyFile: String?
        /// How long one request may take, connecting included.
        public var requestTimeout: Duration = .seconds(5)
        /// How long connecting to one endpoint may take before the next is tried.
        public var connectTimeout: Duration = .seconds(1)
        /// How long a watch may hear nothing before it connects again, from where it was (to
        /// the next member when this one cannot be reached): a member cut off from this
        /// client by the network sends nothing and closes nothing, and etcd's own progress
        /// notices on an idle watch are minutes apart.
        public var watchSilence: Duration = .seconds(3)

        public init(endpoints: [String]) { self.endpoints = endpoints }
    }

    public let settings: Settings
    let http: HTTPClient
    /// For watches: the same, with a read timeout of ``Settings/watchSilence``.
    let watchHTTP: HTTPClient
    /// The index of the endpoint that answered last: tried first.
    private let preferred = Atomic<Int>(0)
    /// The authentication token, once there is one.
    private let token = Mutex<String?>(nil)
    /// The largest answer read (a range of a whole prefix can be large).
    static let maxAnswerBytes = 256 * 1_048_576

    public convenience init(endpoints: [String]) throws(EtcdError) {
        try self.init(settings: Settings(endpoints: endpoints))
    }

    public init(settings: Settings) throws(EtcdError) {
        guard !settings.endpoints.isEmpty else { throw EtcdError(operation: "connect", endpoint: nil, kind: .configuration, message: "no endpoint given") }
        for endpoint in settings.endpoints where !(endpoint.hasPrefix("http://") || endpoint.hasPrefix("https://")) || URL(string: endpoint)?.host == nil {
            throw EtcdError(operation: "connect", endpoint: endpoint, kind: .configuration, message: "an endpoint is http://HOST:PORT or https://HOST:PORT")
        }
        self.settings = settings
        var configuration = HTTPClient.Configuration()
        configuration.timeout = .init(connect: TimeAmount(settings.connectTimeout))
        // No span per call: etcd's calls are the kernel's own upkeep (lease keep-alives, the
        // watch, state written for many requests at once), each of which would otherwise be
        // a trace of its own beside the requests' traces.
        configuration.tracing.tracer = nil
        if settings.caFile != nil || settings.certificateFile != nil {
            do throws(ClientTLSError) {
                configuration.tlsConfiguration = try ClientTLS.configuration(caFile: settings.caFile, certificateFile: settings.certificateFile,
                                                                             keyFile: settings.keyFile)
            } catch {
                throw EtcdError(operation: "connect", endpoint: nil, kind: .configuration, message: "the TLS file \(error)")
            }
        }
        http = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
        configuration.timeout.read = TimeAmount(settings.watchSilence)
        watchHTTP = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }

    /// Set once ``close()`` ran.
    private let closed = Atomic<Bool>(false)

    /// Closes its connections; watches end.
    public func close() async {
        closed.store(true, ordering: .relaxed)
        try? await http.shutdown()
        try? await watchHTTP.shutdown()
    }

    deinit {
        // Released without close() (its owner threw on the way): its connections still go,
        // in the background, rather than async-http-client trapping for a client left open.
        if !closed.load(ordering: .relaxed) {
            http.shutdown { _ in }
            watchHTTP.shutdown { _ in }
        }
    }

    // MARK: Keys

    /// The key `key`, or every key from `key` up to `end` (exclusive; ``prefixEnd(_:)`` for a
    /// prefix), as of `revision` (nil: the latest), at most `limit` of them.
    public func range(_ key: [UInt8], end: [UInt8]? = nil, revision: Int64? = nil, limit: Int64? = nil) async throws(EtcdError) -> EtcdRange {
        let answer = try await call("/v3/kv/range", GatewayJSON.rangeRequest(key: key, end: end, revision: revision, limit: limit),
                                    operation: "range \(Self.describe(key))")
        return GatewayJSON.range(answer)
    }

    /// Every key under `prefix`.
    public func range(prefix: [UInt8], revision: Int64? = nil) async throws(EtcdError) -> EtcdRange {
        try await range(prefix, end: Self.prefixEnd(prefix), revision: revision)
    }

    /// Writes `value` at `key` (attached to `lease` when not 0); returns the write's revision.
    @discardableResult
    public func put(_ key: [UInt8], _ value: [UInt8], lease: Int64 = 0) async throws(EtcdError) -> Int64 {
        let answer = try await call("/v3/kv/put", GatewayJSON.putRequest(key: key, value: value, lease: lease), operation: "put \(Self.describe(key))")
        return GatewayJSON.revision(answer)
    }

    /// Deletes `key`, or every key from `key` up to `end`; returns how many went and the
    /// store's revision after.
    @discardableResult
    public func delete(_ key: [UInt8], end: [UInt8]? = nil) async throws(EtcdError) -> (deleted: Int64, revision: Int64) {
        let answer = try await call("/v3/kv/deleterange", GatewayJSON.deleteRequest(key: key, end: end), operation: "delete \(Self.describe(key))")
        return (GatewayJSON.int(answer["deleted"]), GatewayJSON.revision(answer))
    }

    /// Runs `success` when every comparison holds, `failure` otherwise, as one atomic step.
    public func transaction(when compare: [EtcdCompare], then success: [EtcdOperation], else failure: [EtcdOperation] = []) async throws(EtcdError) -> EtcdTransaction {
        let request: JSONValue = [
            "compare": .array(compare.map(GatewayJSON.compare)),
            "success": .array(success.map(GatewayJSON.operation)),
            "failure": .array(failure.map(GatewayJSON.operation)),
        ]
        let answer = try await call("/v3/kv/txn", request, operation: "transaction")
        let responses = answer["responses"]?.arrayValue ?? []
        let ranges = responses.compactMap { $0["response_range"].map(GatewayJSON.range) }
        let deleted = responses.compactMap { $0["response_delete_range"].map { GatewayJSON.int($0["deleted"]) } }
        return EtcdTransaction(succeeded: answer["succeeded"]?.boolValue ?? false, revision: GatewayJSON.revision(answer), ranges: ranges,
                               deleted: deleted)
    }

    /// Drops the history before `revision`: a read or watch of an older revision then fails
    /// (``EtcdError/Kind/compacted(_:)``).
    public func compact(to revision: Int64) async throws(EtcdError) {
        _ = try await call("/v3/kv/compaction", ["revision": GatewayJSON.int(revision)], operation: "compact to \(revision)")
    }

    // MARK: Leases

    /// A new lease of `ttl` seconds.
    public func grantLease(ttl: Int64) async throws(EtcdError) -> EtcdLease {
        let answer = try await call("/v3/lease/grant", ["TTL": GatewayJSON.int(ttl)], operation: "grant a lease")
        if let error = answer["error"]?.stringValue, !error.isEmpty {
            throw EtcdError(operation: "grant a lease", endpoint: nil, kind: .refused(code: 0), message: error)
        }
        return EtcdLease(id: GatewayJSON.int(answer["ID"]), ttl: GatewayJSON.int(answer["TTL"]))
    }

    /// Renews `lease` once; returns the seconds it now has, 0 when it has expired (its keys
    /// are gone).
    public func keepAlive(_ lease: Int64) async throws(EtcdError) -> Int64 {
        let answer = try await call("/v3/lease/keepalive", ["ID": GatewayJSON.int(lease)], operation: "keep lease \(lease) alive")
        return GatewayJSON.int((answer["result"] ?? answer)["TTL"])
    }

    /// Ends `lease` now, deleting its keys.
    public func revoke(_ lease: Int64) async throws(EtcdError) {
        _ = try await call("/v3/lease/revoke", ["ID": GatewayJSON.int(lease)], operation: "revoke lease \(lease)")
    }

    // MARK: Watches

    /// Every change to `key` (or from `key` up to `end`) from revision `from` on, resumed
    /// from the revision after the last it delivered when a connection drops or a member goes.
    public func watch(_ key: [UInt8], end: [UInt8]? = nil, from revision: Int64, progressNotify: Bool = true) -> EtcdWatch {
        EtcdWatch(client: self, key: key, end: end, start: revision, progressNotify: progressNotify)
    }

    /// Every change under `prefix` from revision `from` on (``watch(_:end:from:progressNotify:)``).
    public func watch(prefix: [UInt8], from revision: Int64, progressNotify: Bool = true) -> EtcdWatch {
        watch(prefix, end: Self.prefixEnd(prefix), from: revision, progressNotify: progressNotify)
    }

    // MARK: Requests

    /// The endpoints in the order to try them: the one that answered last first.
    func endpointsToTry() -> [(index: Int, endpoint: String)] {
        let first = preferred.load(ordering: .relaxed)
        let endpoints = settings.endpoints
        return (0..<endpoints.count).map { offset in
            let index = (first + offset) % endpoints.count
            return (index, endpoints[index])
        }
    }

    func answered(by index: Int) { preferred.store(index, ordering: .relaxed) }

    /// Posts `body` to `path` and returns etcd's answer; tries the next endpoint when one
    /// cannot be reached, and authenticates again once when the token was refused.
    func call(_ path: String, _ body: JSONValue, operation: String) async throws(EtcdError) -> JSONValue {
        do {
            return try await callOnce(path, body, operation: operation)
        } catch where error.kind == .refused(code: EtcdError.unauthenticated) && settings.username != nil {
            forgetToken()
            return try await callOnce(path, body, operation: operation)
        }
    }

    /// Drops the authentication token (etcd refused it: it expired): the next request asks
    /// for a new one.
    func forgetToken() { token.withLock { $0 = nil } }

    private func callOnce(_ path: String, _ body: JSONValue, operation: String) async throws(EtcdError) -> JSONValue {
        var unreachable: [String] = []
        for (index, endpoint) in endpointsToTry() {
            do {
                let answer = try await exchange(try await request(endpoint + path, body: body, endpoint: endpoint), operation: operation, endpoint: endpoint)
                answered(by: index)
                return answer
            } catch let error as EtcdError {
                throw error
            } catch where Self.neverSent(error) {
                unreachable.append("\(endpoint) (\(describe(error, at: endpoint)))")
            } catch {
                throw EtcdError(operation: operation, endpoint: endpoint, kind: Self.timedOut(error) ? .timedOut : .unreachable,
                                message: Self.timedOut(error) ? "no answer within \(settings.requestTimeout)" : describe(error, at: endpoint))
            }
        }
        throw EtcdError(operation: operation, endpoint: nil, kind: .unreachable, message: "no member reachable: \(unreachable.joined(separator: ", "))")
    }

    /// Sends `request` and returns etcd's whole answer (up to ``maxAnswerBytes``), or the
    /// error it carries.
    private func exchange(_ request: HTTPClientRequest, operation: String, endpoint: String) async throws -> JSONValue {
        let response = try await http.execute(request, timeout: TimeAmount(settings.requestTimeout))
        let bytes = try await response.body.collect(upTo: Self.maxAnswerBytes)
        return try Self.answer(Array(bytes.readableBytesView), status: response.status.code, operation: operation, endpoint: endpoint)
    }

    /// A POST of `body` to `url`, with the token when authentication is on.
    func request(_ url: String, body: JSONValue, endpoint: String) async throws -> HTTPClientRequest {
        Self.post(url, body, token: try await authenticationToken(endpoint: endpoint))
    }

    private static func post(_ url: String, _ body: JSONValue, token: String?) -> HTTPClientRequest {
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        if let token { request.headers.add(name: "Authorization", value: token) }
        request.body = .bytes(ByteBuffer(bytes: body.jsonBytes))
        return request
    }

    /// The token for the configured user (asked for once, again after it was refused); nil
    /// without a user.
    private func authenticationToken(endpoint: String) async throws -> String? {
        guard let username = settings.username else { return nil }
        if let token = token.withLock({ $0 }) { return token }
        let operation = "authenticate as \(username)"
        let credentials: JSONValue = ["name": .string(username), "password": .string(settings.password ?? "")]
        let answer = try await exchange(Self.post(endpoint + "/v3/auth/authenticate", credentials, token: nil), operation: operation, endpoint: endpoint)
        guard let fresh = answer["token"]?.stringValue, !fresh.isEmpty else {
            throw EtcdError(operation: operation, endpoint: endpoint, kind: .malformedAnswer, message: "no token in the answer")
        }
        token.withLock { $0 = fresh }
        return fresh
    }

    /// Etcd's answer, or the error it carries (`{"error", "message", "code"}`, a gRPC code).
    static func answer(_ bytes: [UInt8], status: UInt, operation: String, endpoint: String) throws(EtcdError) -> JSONValue {
        guard let json = try? JSONValue(parsing: bytes) else {
            let text = String(decoding: bytes.prefix(200), as: UTF8.self)
            throw EtcdError(operation: operation, endpoint: endpoint, kind: .malformedAnswer, message: "HTTP \(status), not JSON: \(text)")
        }
        if let code = json["code"]?.intValue, code != 0 || status != 200 {
            let message = json["message"]?.stringValue ?? json["error"]?.stringValue ?? "HTTP \(status)"
            if code == 11, message.contains("compacted") {
                throw EtcdError(operation: operation, endpoint: endpoint, kind: .compacted, message: message)
            }
            throw EtcdError(operation: operation, endpoint: endpoint, kind: .refused(code: Int(code)), message: message)
        }
        guard status == 200 else {
            throw EtcdError(operation: operation, endpoint: endpoint, kind: .refused(code: 0), message: "HTTP \(status)")
        }
        return json
    }

    /// Whether `error` means the request never left: the endpoint could not be connected to.
    static func neverSent(_ error: any Error) -> Bool {
        switch error {
        case is NIOConnectionError: return true
        case let error as HTTPClientError: return error == .connectTimeout
        case let error as ChannelError:
            if case .connectTimeout = error { return true }
            return false
        case let error as IOError: return [ECONNREFUSED, EHOSTUNREACH, ENETUNREACH].contains(error.errnoCode)
        default: return false
        }
    }

    static func timedOut(_ error: any Error) -> Bool {
        guard let error = error as? HTTPClientError else { return false }
        return error == .deadlineExceeded || error == .readTimeout
    }

    /// What went wrong reaching `endpoint`, in a line an operator can act on.
    func describe(_ error: any Error, at endpoint: String) -> String {
        if let error = error as? NIOConnectionError, let connect = error.connectionErrors.last { return "\(connect.error)" }
        // What a TLS setup that does not match the member's comes to, said in its terms.
        guard endpoint.hasPrefix("https://") else { return "\(error)" }
        if settings.certificateFile == nil, let closed = error as? HTTPClientError, closed == .remoteConnectionClosed {
            return "\(error): the member closed the connection, as one that asks its clients for a certificate (etcd's --client-cert-auth) does to a client without one (give this client's certificate and key)"
        }
        if case NIOSSLError.handshakeFailed = error, ClientTLS.isUntrustedServer(error) {
            return "\(error): the member's certificate is not signed by a CA this client trusts (give the CA that signed the members' certificates)"
        }
        return "\(error)"
    }

    /// A key as an error message shows it: its text when it is UTF-8, else its bytes in hex.
    static func describe(_ key: [UInt8]) -> String {
        if let text = String(validating: key, as: UTF8.self), !text.contains(where: { $0.isNewline }) { return text }
        return key.map { String(format: "%02x", $0) }.joined()
    }
}

/// What went wrong talking to etcd: the operation, the member, and what it said.
public struct EtcdError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// No member could be connected to, or the connection dropped before an answer.
        case unreachable
        /// No answer within the request timeout: the request may or may not have taken effect.
        case timedOut
        /// Etcd refused the request; `code` is the gRPC status code it gave (3: invalid, 9:
        /// failed precondition, 16: not authenticated...).
        case refused(code: Int)
        /// The revision asked for was compacted away.
        case compacted
        /// The answer was not what the API answers.
        case malformedAnswer
        /// The client's own settings are wrong.
        case configuration
    }

    /// gRPC's code for a refused or expired token.
    static let unauthenticated = 16

    public let operation: String
    /// The member's endpoint, when one answered (or was the one tried).
    public let endpoint: String?
    public let kind: Kind
    public let message: String

    public var description: String {
        "etcd \(operation)\(endpoint.map { " at \($0)" } ?? ""): \(message)"
    }
}
