import BusProtocol
import Contracts
import ZeroMQ

/// Who sent a message, as far as the kernel can tell from its ZAP user id.
enum Peer: Equatable {
    /// Plain text (no CURVE): anyone on the network.
    case unauthenticated
    /// A client key: requests, subscriptions, and state under the writable prefixes.
    case client(key: String)
    /// An operator's key: a client that may also ask what ``OperatorsOnly`` lists. Looked up
    /// at each request, so a key removed by a reload stops being one at once.
    case `operator`(key: String)
    /// A worker key: may register `service` only, or any service when nil (a key for a
    /// whole services host, `security.worker_keys`).
    case worker(key: String, service: String?)

    init(userID: String?, security: KernelSecurity?) {
        guard let security, let userID else {
            self = .unauthenticated
            return
        }
        let key = Self.key(in: userID)
        if userID.hasPrefix(ZAPHandler.workerPrefix), security.workerKeys.contains(key) {
            self = .worker(key: key, service: nil)
        } else if userID.hasPrefix(ZAPHandler.workerPrefix), let service = security.serviceKeys[key] {
            self = .worker(key: key, service: service)
        } else if security.operatorKeys.contains(key) {
            self = .operator(key: key)
        } else {
            self = .client(key: key)
        }
    }

    /// The public key in a ZAP user id (`client:KEY`, `worker:KEY`).
    static func key(in userID: String) -> String { String(userID.drop { $0 != ":" }.dropFirst()) }

    /// Whether this peer may offer `service` (READY).
    func mayServe(_ service: String) -> Bool {
        switch self {
        case .unauthenticated: true
        case .client, .operator: false
        case .worker(_, let only): only == nil || only == service
        }
    }

    /// The key whose quota its writes under the writable prefixes count against.
    var quotaOwner: String {
        switch self {
        case .unauthenticated: "(unauthenticated)"
        case .client(let key), .operator(let key), .worker(let key, _): key
        }
    }

    /// What a worker that asked for callers is told of it (``MDP/callerPart``): its rank and
    /// key, empty when nobody can be told apart.
    var callerID: String {
        switch self {
        case .unauthenticated: ""
        case .client(let key): CallerIdentity(rank: .client, key: key).description
        case .operator(let key): CallerIdentity(rank: .operator, key: key).description
        case .worker(let key, _): CallerIdentity(rank: .worker, key: key).description
        }
    }

    /// Whether it may ask what ``OperatorsOnly`` lists: an operator's key, or anyone
    /// when nobody can be told apart (no CURVE).
    var isOperator: Bool {
        switch self {
        case .unauthenticated, .operator: true
        case .client, .worker: false
        }
    }
}

/// Who may write which state keys: the one rule `state.set` and the CHP collector share.
///
/// Keys under `/kernel/` are the kernel's own. With CURVE on, a client key writes only
/// under the writable prefixes (`/client/`); a service's key writes there and under its
/// own prefixes (`/NAME/`, and those `stateOwners` gives it, such as `/catalog/` for the
/// fetcher); a key for a whole services host writes anywhere else. Without CURVE nobody
/// can be told apart: `state.set` is open (services publish through it) and the collector
/// keeps to the writable prefixes.
struct StateAccess {
    let writablePrefixes: [String]
    let owners: [String: String]
    /// The same prefixes as bytes, for keys the state holds as bytes.
    private let writablePrefixFrames: [Frame]
    private static let kernelPrefix = Frame(KernelAPI.StateKeys.prefix)

    init(configuration: KernelConfiguration) {
        writablePrefixes = configuration.collectorWritablePrefixes
        owners = configuration.statePrefixOwners
        writablePrefixFrames = writablePrefixes.map { Frame($0) }
    }

    /// Whether `peer` may write `key` through `state.set` (or, with `collector`, a KVSET).
    enum Verdict {
        /// Under the writable prefixes: anyone may, and it counts against the writer's quota.
        case clientWritable
        /// Elsewhere, by a peer that may.
        case allowed
        case refused(JSONRPCError)
    }

    /// Whether `peer` may write `key` (each prefix compared once per write).
    func verdict(_ key: Frame, by peer: Peer, collector: Bool) -> Verdict {
        if key.hasPrefix(Self.kernelPrefix) { return .refused(.forbidden("keys under /kernel/ are the kernel's own")) }
        if writablePrefixFrames.contains(where: { key.hasPrefix($0) }) { return .clientWritable }
        switch peer {
        case .unauthenticated:
            return collector ? .refused(.forbidden("clients publish only keys under \(writablePrefixes.joined(separator: ", ")) (the kernel's writable prefixes)")) : .allowed
        case .client, .operator:
            return .refused(.forbidden("a client key may set only keys under \(writablePrefixes.joined(separator: ", "))"))
        case .worker(_, nil):
            return .allowed
        case .worker(_, let service?):
            let own = ["/\(service)/"] + owners.filter { $0.value == service }.map(\.key)
            if own.contains(where: { key.hasPrefix(Frame($0)) }) { return .allowed }
            return .refused(.forbidden("the \(service) service's key may set only keys under \((own + writablePrefixes).joined(separator: ", "))"))
        }
    }
}
