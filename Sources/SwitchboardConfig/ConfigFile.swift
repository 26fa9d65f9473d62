public import BusKit
public import Foundation
public import Kernel
import BusProtocol
public import Catalog
import Yams
public import ZeroMQ

/// An error in a configuration file, naming the key's path and what was expected
/// ("kernel.heartbeat_ms: expected a positive integer, got \"fast\"").
public struct ConfigError: Error, Sendable, Equatable, CustomStringConvertible {
    public let path: String
    public let problem: String
    /// The environment variable the bad value came from, when it did not come from the file.
    public var variable: String?
    public init(path: String, problem: String, variable: String? = nil) {
        self.path = path
        self.problem = problem
        self.variable = variable
    }
    public var description: String {
        if let variable { return "\(variable) (overrides \(path)): \(problem)" }
        return path.isEmpty ? problem : "\(path): \(problem)"
    }
}

/// `pair:`: this kernel is one of a primary/backup pair (docs/PAIR.md).
public struct PairSettings: Sendable, Equatable {
    /// Role, where this kernel hears its peer, the peer's pair endpoint, heartbeats.
    public var configuration: PairConfiguration
    /// The peer kernel's broker, and its CHP endpoints (default: the three ports after it).
    public var peerBroker: String
    public var peerState: StateEndpoints
}

/// `store:` as the file gives it; what it leaves out keeps the store's own default (the
/// executable hands these to `StoreConfiguration`).
public struct StoreSettings: Sendable, Equatable {
    public var path: String?
    public var historyLimit: Int?
    public var maxSizeBytes: Int?
    /// How long each write's result is kept for a request sent again.
    public var rememberSeconds: Int?
    /// `postgres` (the `url`, `pool_size`, `tls`, `ca_file` keys) instead of the SQLite file.
    public var postgres: Postgres?
    public init() {}

    /// `store.backend: postgres` and how to reach the database.
    public struct Postgres: Sendable, Equatable {
        public var url: String
        public var poolSize: Int?
        /// disable, prefer or require.
        public var tls: String?
        public var caFile: String?
        public init(url: String, poolSize: Int? = nil, tls: String? = nil, caFile: String? = nil) {
            (self.url, self.poolSize, self.tls, self.caFile) = (url, poolSize, tls, caFile)
        }
    }
}

/// `fetcher:` as the file gives it: attempts, and per dataset what differs from the
/// fetcher's defaults (the executable applies these to `FetcherConfiguration.defaults`).
public struct FetcherSettings: Sendable, Equatable {
    public struct Source: Sendable, Equatable {
        public var url: URL?
        public var refreshInterval: Duration?
        public var timeout: Duration?
        public var maxBytes: Int?
        public var headers: [String: String]?
        public init() {}
    }
    public var attempts: Int?
    public var sources: [Dataset: Source] = [:]
    public init() {}
}

/// `Config/switchboard.yaml`: the settings of every piece. Every key is optional; an
/// environment variable `SWITCHBOARD_<PATH>` (the key's path in capitals, dots as
/// underscores: `SWITCHBOARD_KERNEL_BROKER`, `SWITCHBOARD_SERVICES_STORE_WORKERS`) overrides
/// the file, and flags given on the command line override both.
public struct ConfigFile: Sendable, Equatable {
    public var kernel = KernelConfiguration()
    public var services = ConfigFile.defaultServices
    public var store = StoreSettings()
    public var fetcher = FetcherSettings()
    public var security = SecuritySettings()
    public var supervisor = SupervisorSettings()
    public var gateway = GatewaySettings()
    /// `pair:`, when this kernel is one of a primary/backup pair (also in `kernel.pair`).
    public var pair: PairSettings?
    /// The log level of every piece unless its own section says otherwise.
    public var logLevel = "info"
    /// `kernel.log_level`: the kernel's own level, when it differs.
    public var kernelLogLevel: String?

    /// The kernels every piece connects to: this configuration's, and with a pair the peer's
    /// too (a wildcard or any-address host becomes loopback).
    public var brokerEndpoints: [String] {
        [Self.connectable(kernel.brokerEndpoint)] + (pair.map { [$0.peerBroker] } ?? [])
    }

    /// Each of ``brokerEndpoints``' CHP endpoints.
    public var stateEndpoints: [StateEndpoints] {
        [StateEndpoints(snapshot: Self.connectable(kernel.snapshotEndpoint), publisher: Self.connectable(kernel.publisherEndpoint),
                        collector: Self.connectable(kernel.collectorEndpoint))]
            + (pair.map { [$0.peerState] } ?? [])
    }

    /// An endpoint a client can connect to: a wildcard or any-address host becomes loopback.
    public static func connectable(_ endpoint: String) -> String {
        endpoint.replacingOccurrences(of: "tcp://*:", with: "tcp://127.0.0.1:")
            .replacingOccurrences(of: "tcp://0.0.0.0:", with: "tcp://127.0.0.1:")
    }

    /// The level a piece ("kernel" or a service's name) logs at.
    public func logLevel(for piece: String) -> String {
        (piece == "kernel" ? kernelLogLevel : piece == "gateway" ? gateway.logLevel : services[piece]?.logLevel) ?? logLevel
    }

    public init() {}

    /// The services `switchboard up` runs, in start order, with their default worker counts.
    public static let serviceNames = ["echo", "store", "fetcher", "search", "pricing"]
    public static let defaultServices: [String: ServiceSettings] = [
        "echo": .init(workers: 2), "store": .init(workers: 8), "fetcher": .init(workers: 4),
        "search": .init(workers: 4), "pricing": .init(workers: 2),
    ]
    public static let logLevels = ["trace", "debug", "info", "notice", "warning", "error", "critical"]

    /// Reads and checks a YAML file, then applies `SWITCHBOARD_*` variables from `environment`.
    /// Unknown keys (and unknown `SWITCHBOARD_*` variables) and bad values are errors.
    public static func load(_ url: URL?, environment: [String: String] = ProcessInfo.processInfo.environment) throws -> ConfigFile {
        var text = ""
        if let url {
            do {
                text = try String(contentsOf: url, encoding: .utf8)
            } catch {
                throw ConfigError(path: "", problem: "cannot read \(url.path): \(error.localizedDescription)")
            }
        }
        return try parse(text, environment: environment)
    }

    /// Parses YAML text, with `SWITCHBOARD_*` overrides from `environment`.
    public static func parse(_ text: String, environment: [String: String] = [:]) throws -> ConfigFile {
        let root: Any?
        do {
            root = try Yams.load(yaml: text)
        } catch {
            throw ConfigError(path: "", problem: "not valid YAML: \(error)")
        }
        var tree = try root.map { try mapping($0, "") } ?? [:]
        let overridden = try applyOverrides(environment, to: &tree)
        do {
            try checkKeys(tree, against: schema, "")
            return try Reader().read(tree)
        } catch var error as ConfigError {
            // A bad value a variable gave is that variable's fault, not the file's.
            if let path = overridden.first(where: { error.path == $0 || error.path.hasPrefix($0 + "[") }) {
                error.variable = variable(for: path)
            }
            throw error
        }
    }

    // MARK: Schema

    /// Every key the file may hold: a mapping of names to sub-schemas, or a value.
    indirect enum Schema: Sendable {
        case value
        case map([String: Schema])
        /// Keys any of `names`, each with the same schema.
        case each(Set<String>, Schema)

        var children: [(String, Schema)] {
            switch self {
            case .value: []
            case .map(let keys): keys.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
            case .each(let names, let schema): names.sorted().map { ($0, schema) }
            }
        }
    }

    static let schema = Schema.map([
        "log_level": .value,
        "kernel": .map(Dictionary(uniqueKeysWithValues: [
            "broker", "snapshot", "publisher", "collector", "heartbeat_ms", "liveness", "queue_timeout_ms",
            "max_message_size", "no_retry", "writable_prefixes", "log_level",
            "max_queued", "max_queued_bytes", "max_services", "peer_backlog", "subscriber_backlog", "subscriber_timeout_ms",
            "state_max_value_bytes", "max_batch_items", "max_deliveries", "client_share_percent",
            "state_max_keys", "state_max_bytes", "client_state_max_keys", "client_state_max_bytes",
        ].map { ($0, Schema.value) })),
        "services": .each(Set(serviceNames), .map(["enabled": .value, "workers": .value, "window": .value, "log_level": .value])),
        "store": .map(["backend": .value, "path": .value, "history_limit": .value, "max_size_mb": .value, "remember_seconds": .value,
                       "url": .value, "pool_size": .value, "tls": .value, "ca_file": .value]),
        "pair": .map(Dictionary(uniqueKeysWithValues: ["role", "listen", "peer", "peer_broker", "peer_state", "heartbeat_ms"].map { ($0, Schema.value) })),
        "fetcher": .map([
            "attempts": .value,
            "datasets": .each(Set(Dataset.allCases.map(\.rawValue)), .map([
                "url": .value, "refresh_seconds": .value, "timeout_ms": .value, "max_mb": .value, "headers": .value,
            ])),
        ]),
        "security": .map(Dictionary(uniqueKeysWithValues: [
            "curve", "keys_dir", "kernel_secret_key", "kernel_secret_key_file", "server_key", "secret_key", "secret_key_file",
            "client_keys", "worker_keys",
        ].map { ($0, Schema.value) })),
        "gateway": .map(Dictionary(uniqueKeysWithValues: [
            "enabled", "listen", "max_body_bytes", "prefixes", "history", "history_bytes", "stream_backlog_bytes", "max_response_bytes",
            "heartbeat_seconds", "request_timeout_ms",
            "tokens", "cors_origins", "log_level",
        ].map { ($0, Schema.value) })),
        "supervisor": .map(Dictionary(uniqueKeysWithValues: [
            "start_timeout_seconds", "stop_timeout_seconds", "restart_backoff_ms", "restart_backoff_max_ms",
            "restart_limit", "restart_window_seconds",
        ].map { ($0, Schema.value) })),
    ])

    /// The dotted path of every value in the schema ("kernel.broker", …).
    static var valuePaths: [String] {
        func walk(_ schema: Schema, _ prefix: String) -> [String] {
            if case .value = schema { return [prefix] }
            return schema.children.flatMap { walk($0.1, prefix.isEmpty ? $0.0 : "\(prefix).\($0.0)") }
        }
        return walk(schema, "")
    }

    /// Values an environment variable gives as text, never read as YAML.
    static let literalPaths: Set<String> = ["security.kernel_secret_key", "security.server_key", "security.secret_key"]

    /// The environment variable that overrides a key path.
    public static func variable(for path: String) -> String {
        "SWITCHBOARD_" + path.uppercased().replacingOccurrences(of: ".", with: "_")
    }

    /// Applies the `SWITCHBOARD_*` variables; returns the key paths they set.
    private static func applyOverrides(_ environment: [String: String], to tree: inout [String: Any]) throws -> [String] {
        let paths = Dictionary(uniqueKeysWithValues: valuePaths.map { (variable(for: $0), $0) })
        var overridden: [String] = []
        for (name, text) in environment.sorted(by: { $0.key < $1.key }) where name.hasPrefix("SWITCHBOARD_") {
            guard let path = paths[name] else {
                throw ConfigError(path: name, problem: "unknown variable; SWITCHBOARD_* variables override configuration keys (e.g. SWITCHBOARD_KERNEL_BROKER for kernel.broker)")
            }
            // Numbers, booleans, lists and mappings are read as YAML; anything else, and
            // every key (Z85 may start with YAML's `!`, `&` or `*`), is the text as given.
            let parsed = literalPaths.contains(path) ? nil : (try? Yams.load(yaml: text))
            let value: Any = if let parsed, parsed is Int || parsed is Bool || parsed is [Any] || parsed is [String: Any] { parsed } else { text }
            try set(value, at: path.split(separator: ".").map(String.init), in: &tree, from: name)
            overridden.append(path)
        }
        return overridden
    }

    private static func set(_ value: Any, at keys: [String], in tree: inout [String: Any], from variable: String) throws {
        guard let first = keys.first else { return }
        if keys.count == 1 {
            tree[first] = value
            return
        }
        var child = try (tree[first]).map { try mapping($0, first) } ?? [:]
        try set(value, at: Array(keys.dropFirst()), in: &child, from: variable)
        tree[first] = child
    }

    private static func checkKeys(_ map: [String: Any], against schema: Schema, _ path: String) throws {
        let allowed = Dictionary(uniqueKeysWithValues: schema.children)
        for key in map.keys.sorted() {
            let full = path.isEmpty ? key : "\(path).\(key)"
            guard let child = allowed[key] else {
                throw ConfigError(path: full, problem: "unknown key; expected one of \(allowed.keys.sorted().joined(separator: ", "))")
            }
            if case .value = child { continue }
            // A section may be written but left empty (`datasets:` with everything commented out).
            guard let value = map[key], !(value is NSNull) else { continue }
            try checkKeys(try mapping(value, full), against: child, full)
        }
    }

    static func mapping(_ value: Any, _ path: String) throws -> [String: Any] {
        if value is NSNull { return [:] }
        guard let map = value as? [String: Any] else {
            throw ConfigError(path: path, problem: "expected a mapping of keys to values, got \(describe(value))")
        }
        return map
    }

    static func describe(_ value: Any) -> String {
        switch value {
        case let text as String: "\"\(text)\""
        case is [Any]: "a list"
        case is [String: Any]: "a mapping"
        default: "\(value)"
        }
    }
}

/// Which services `switchboard up` starts, and how.
public struct ServiceSettings: Sendable, Equatable {
    public var enabled = true
    /// Worker connections.
    public var workers: Int
    /// Requests each connection holds at once (the Switchboard window extension; 1 is
    /// plain 7/MDP, one request per connection).
    public var window: Int
    /// Overrides the top-level `log_level` for this service.
    public var logLevel: String?

    public init(enabled: Bool = true, workers: Int, window: Int = 16, logLevel: String? = nil) {
        self.enabled = enabled
        self.workers = workers
        self.window = window
        self.logLevel = logLevel
    }
}

/// CURVE settings.
///
/// Two ways to give keys. By default they live in `keys_dir` (``KeyFolder``): `switchboard
/// up` makes them on first run, the kernel allows each service's key to serve that service
/// and the local client's key (and any in `clients/`), and each piece takes its own pair.
/// Or explicitly, for machines that do not share a folder: the kernel's secret key and the
/// allow-lists, and for a connecting piece the kernel's public key and its own secret key.
/// Keys in `client_keys` and `worker_keys` are allowed in either way.
public struct SecuritySettings: Sendable, Equatable {
    /// nil when the configuration does not say: `switchboard up` then turns CURVE on; the
    /// kernel or a service run alone stays plain (with a warning), for any ZeroMQ peer.
    public var curve: Bool?
    public var keysDir = KeyFolder.defaultPath
    public var kernelSecretKey: String?
    public var serverKey: String?
    public var secretKey: String?
    public var clientKeys: [String] = []
    public var workerKeys: [String] = []

    public init() {}

    public var keyFolder: KeyFolder { KeyFolder(keysDir) }

    /// Whether CURVE is on: as configured, else `defaultOn` (true under `switchboard up`).
    public func isOn(default defaultOn: Bool = false) -> Bool { curve ?? defaultOn }

    /// The kernel's side: nil when CURVE is off.
    public func kernelSecurity(services: [String] = ConfigFile.serviceNames + [KeyFolder.supervisor]) throws(ConfigError) -> KernelSecurity? {
        guard isOn() else { return nil }
        if let kernelSecretKey {
            guard !clientKeys.isEmpty || !workerKeys.isEmpty else {
                throw ConfigError(path: "security.worker_keys", problem: "no key is allowed: list the public keys of the services (and clients in security.client_keys)")
            }
            return KernelSecurity(secretKey: kernelSecretKey, clientKeys: Set(clientKeys), workerKeys: Set(workerKeys))
        }
        let folder = keyFolder
        do {
            var serviceKeys: [String: String] = [:]
            for name in services { if let key = try folder.publicKey(name) { serviceKeys[key] = name } }
            return KernelSecurity(secretKey: try folder.secretKey(KeyFolder.kernel),
                                  clientKeys: Set(try folder.clientPublicKeys() + clientKeys), workerKeys: Set(workerKeys),
                                  serviceKeys: serviceKeys)
        } catch {
            throw ConfigError(path: "security.keys_dir", problem: "\(error)")
        }
    }

    /// The keys piece `name` (a service, or "client") connects with: nil when CURVE is off.
    public func connectingKeys(as name: String) throws(ConfigError) -> CurveClientKeys? {
        guard isOn() else { return nil }
        if serverKey == nil && secretKey == nil {
            do {
                return try keyFolder.connectingKeys(as: name)
            } catch {
                throw ConfigError(path: "security.keys_dir", problem: "\(error)")
            }
        }
        guard let serverKey else {
            throw ConfigError(path: "security.server_key", problem: "required with security.secret_key: the kernel's public key")
        }
        guard let secretKey else {
            throw ConfigError(path: "security.secret_key_file", problem: "required with security.server_key: this host's secret key")
        }
        do {
            return try CurveClientKeys(serverKey: serverKey, secretKey: secretKey)
        } catch {
            throw ConfigError(path: "security", problem: "the keys are not usable: \(error)")
        }
    }
}

/// How `switchboard up` watches its processes.
public struct SupervisorSettings: Sendable, Equatable {
    /// How long each process may take to start and register.
    public var startTimeout: Duration = .seconds(30)
    /// How long a process may take to stop after SIGTERM before it is killed.
    public var stopTimeout: Duration = .seconds(15)
    /// The wait before the first restart, doubled for each restart in a row, up to the maximum.
    public var restartBackoff: Duration = .milliseconds(500)
    public var restartBackoffMax: Duration = .seconds(10)
    /// More restarts than this of one process within the window and `up` gives up.
    public var restartLimit = 5
    public var restartWindow: Duration = .seconds(60)

    public init() {}
}

/// The HTTP gateway (`switchboard gateway`, started by `switchboard up`).
public struct GatewaySettings: Sendable, Equatable {
    public var enabled = true
    public var host = "127.0.0.1"
    public var port = 8080
    /// The largest request body `POST /rpc` accepts (bigger: 413, -32010).
    public var maxBodyBytes = 1 << 20
    /// The key prefixes the gateway follows for `/events` (one kernel subscription).
    public var prefixes = [""]
    /// Changes kept, so that a reconnecting browser gets exactly what it missed: at most
    /// this many, and this many bytes of keys and values (the oldest go first).
    public var history = 10_000
    public var historyBytes = 8 << 20
    /// Bytes of events one stream may have waiting (its reader slow) beyond its opening
    /// snapshot before it is cut; the browser reconnects and resumes from its last id.
    public var streamBacklogBytes = 4 << 20
    /// The largest response body `POST /rpc` sends; past it the results that do not fit are
    /// answered -32010 (a batch), or the response is (a single request).
    public var maxResponseBytes = 16 << 20
    /// A comment line on every event stream this often, for proxies.
    public var heartbeat: Duration = .seconds(15)
    public var requestTimeout: Duration = .seconds(10)
    /// Bearer tokens; none: every caller is let in (only without CURVE; with CURVE on,
    /// `switchboard up` makes one in the key folder when none is configured).
    public var tokens: [GatewayToken] = []
    /// Origins that may call from a browser page of their own (none: no CORS headers).
    public var corsOrigins: [String] = []
    public var logLevel: String?

    public init() {}

    /// The token file `switchboard up` makes when CURVE is on and no token is configured.
    public static let defaultTokenFile = "gateway.token"
}

/// One bearer token the gateway accepts, and what it allows.
public struct GatewayToken: Sendable, Equatable {
    public var token: String
    /// Services it may call ("*": any).
    public var services: [String]
    /// Key prefixes it may write with `kernel` `state.set` (none: no writes).
    public var writablePrefixes: [String]
    /// Key prefixes it may stream from `/events` (nil: all the gateway follows).
    public var readablePrefixes: [String]?

    public init(token: String, services: [String] = ["*"], writablePrefixes: [String] = [], readablePrefixes: [String]? = nil) {
        self.token = token
        self.services = services
        self.writablePrefixes = writablePrefixes
        self.readablePrefixes = readablePrefixes
    }

    public func allows(service: String) -> Bool { services.contains("*") || services.contains(service) }

    /// Whether it may stream the keys under `prefix`.
    public func mayRead(_ prefix: String) -> Bool { readablePrefixes.map { $0.contains { prefix.hasPrefix($0) } } ?? true }
}

/// Turns the checked tree into settings, naming the path of any bad value.
private struct Reader {
    func read(_ tree: [String: Any]) throws -> ConfigFile {
        var file = ConfigFile()
        if let value = tree["log_level"] { file.logLevel = try logLevel(value, "log_level") }
        let kernel = try section(tree, "kernel")
        var k = file.kernel
        if let value = kernel["broker"] { k.brokerEndpoint = try endpoint(value, "kernel.broker") }
        if let value = kernel["snapshot"] { k.snapshotEndpoint = try endpoint(value, "kernel.snapshot") }
        if let value = kernel["publisher"] { k.publisherEndpoint = try endpoint(value, "kernel.publisher") }
        if let value = kernel["collector"] { k.collectorEndpoint = try endpoint(value, "kernel.collector") }
        if let value = kernel["heartbeat_ms"] { k.heartbeatInterval = .milliseconds(try positive(value, "kernel.heartbeat_ms", atMost: Limit.hour_ms)) }
        if let value = kernel["liveness"] { k.heartbeatLiveness = try positive(value, "kernel.liveness", atMost: 1_000) }
        if let value = kernel["queue_timeout_ms"] { k.queueTimeout = .milliseconds(try positive(value, "kernel.queue_timeout_ms", atMost: Limit.day_ms)) }
        if let value = kernel["max_message_size"] { k.maxMessageSize = try positive(value, "kernel.max_message_size", atMost: 1 << 30) }
        if let value = kernel["max_queued"] { k.maxQueuedPerService = try positive(value, "kernel.max_queued", atMost: 10_000_000) }
        if let value = kernel["max_queued_bytes"] { k.maxQueuedBytes = try positive(value, "kernel.max_queued_bytes", atMost: 1 << 40) }
        if let value = kernel["max_services"] { k.maxServices = try positive(value, "kernel.max_services", atMost: 1_000_000) }
        if let value = kernel["peer_backlog"] { k.peerBacklog = try positive(value, "kernel.peer_backlog", atMost: Int(Int32.max)) }
        if let value = kernel["subscriber_backlog"] { k.subscriberBacklog = try positive(value, "kernel.subscriber_backlog", atMost: Int(Int32.max)) }
        if let value = kernel["subscriber_timeout_ms"] { k.subscriberTimeout = .milliseconds(try positive(value, "kernel.subscriber_timeout_ms", atMost: Limit.day_ms)) }
        if let value = kernel["state_max_value_bytes"] { k.stateMaxValueBytes = try positive(value, "kernel.state_max_value_bytes", atMost: 1 << 30) }
        if let value = kernel["client_share_percent"] { k.clientSharePercent = try positive(value, "kernel.client_share_percent", atMost: 100) }
        if let value = kernel["max_deliveries"] { k.maxDeliveries = try positive(value, "kernel.max_deliveries", atMost: 100) }
        if let value = kernel["max_batch_items"] { k.maxBatchItems = try positive(value, "kernel.max_batch_items", atMost: 100_000) }
        if let value = kernel["state_max_keys"] { k.stateMaxKeys = try positive(value, "kernel.state_max_keys", atMost: 100_000_000) }
        if let value = kernel["state_max_bytes"] { k.stateMaxBytes = try positive(value, "kernel.state_max_bytes", atMost: 1 << 40) }
        if let value = kernel["client_state_max_keys"] { k.clientStateMaxKeys = try positive(value, "kernel.client_state_max_keys", atMost: 100_000_000) }
        if let value = kernel["client_state_max_bytes"] { k.clientStateMaxBytes = try positive(value, "kernel.client_state_max_bytes", atMost: 1 << 40) }
        if let value = kernel["no_retry"] { k.nonRetriableServices = Set(try strings(value, "kernel.no_retry")) }
        if let value = kernel["writable_prefixes"] {
            let prefixes = try strings(value, "kernel.writable_prefixes")
            guard prefixes.allSatisfy({ $0.hasPrefix("/") }) else {
                throw ConfigError(path: "kernel.writable_prefixes", problem: "expected key prefixes starting with '/'")
            }
            k.collectorWritablePrefixes = prefixes
        }
        if tree["pair"] != nil {
            let pair = try section(tree, "pair")
            func required(_ key: String) throws -> Any {
                guard let value = pair[key] else {
                    throw ConfigError(path: "pair.\(key)", problem: "is required in a pair (role, listen, peer, peer_broker)")
                }
                return value
            }
            let roleValue = try required("role")
            guard let roleText = roleValue as? String, let role = PairConfiguration.Role(rawValue: roleText) else {
                throw ConfigError(path: "pair.role", problem: "expected primary or backup, got \(ConfigFile.describe(roleValue))")
            }
            var configuration = PairConfiguration(role: role, listen: try endpoint(try required("listen"), "pair.listen"),
                                                  peer: try endpoint(try required("peer"), "pair.peer"))
            if let value = pair["heartbeat_ms"] { configuration.heartbeatInterval = .milliseconds(try positive(value, "pair.heartbeat_ms", atMost: Limit.hour_ms)) }
            let peerBroker = try endpoint(try required("peer_broker"), "pair.peer_broker")
            configuration.peerBroker = peerBroker
            let peerState: StateEndpoints
            if let value = pair["peer_state"] {
                guard let text = value as? String, let parsed = StateEndpoints(text) else {
                    throw ConfigError(path: "pair.peer_state", problem: "expected tcp://HOST:PORT (the snapshot; publisher and collector follow) or snapshot,publisher,collector, got \(ConfigFile.describe(value))")
                }
                peerState = parsed
            } else {
                guard let following = StateEndpoints(followingBroker: peerBroker) else {
                    throw ConfigError(path: "pair.peer_state", problem: "is required when pair.peer_broker is not tcp://HOST:PORT")
                }
                peerState = following
            }
            k.pair = configuration
            file.pair = PairSettings(configuration: configuration, peerBroker: peerBroker, peerState: peerState)
        }
        file.kernel = k

        let services = try section(tree, "services")
        for (name, value) in services {
            let path = "services.\(name)"
            let entry = try ConfigFile.mapping(value, path)
            var settings = file.services[name]!
            if let value = entry["enabled"] { settings.enabled = try bool(value, "\(path).enabled") }
            if let value = entry["workers"] { settings.workers = try positive(value, "\(path).workers", atMost: 1_000) }
            if let value = entry["window"] { settings.window = try positive(value, "\(path).window", atMost: MDP.maxWindow) }
            if let value = entry["log_level"] { settings.logLevel = try logLevel(value, "\(path).log_level") }
            file.services[name] = settings
        }
        if let value = kernel["log_level"] { file.kernelLogLevel = try logLevel(value, "kernel.log_level") }

        let store = try section(tree, "store")
        if let value = store["path"] {
            guard let path = value as? String, !path.isEmpty else {
                throw ConfigError(path: "store.path", problem: "expected a file path, got \(ConfigFile.describe(value))")
            }
            file.store.path = path
        }
        if let value = store["history_limit"] { file.store.historyLimit = try positive(value, "store.history_limit", atMost: 1_000_000) }
        if let value = store["max_size_mb"] { file.store.maxSizeBytes = try positive(value, "store.max_size_mb", atMost: 1 << 20) * 1_048_576 }
        if let value = store["remember_seconds"] { file.store.rememberSeconds = try positive(value, "store.remember_seconds", atMost: Limit.year_s) }
        let backend = try store["backend"].map { value -> String in
            guard let text = value as? String, ["sqlite", "postgres"].contains(text) else {
                throw ConfigError(path: "store.backend", problem: "expected sqlite or postgres, got \(ConfigFile.describe(value))")
            }
            return text
        } ?? "sqlite"
        if backend == "postgres" {
            guard let value = store["url"] else {
                throw ConfigError(path: "store.url", problem: "is required with store.backend: postgres (postgres://USER:PASSWORD@HOST:PORT/DATABASE; SWITCHBOARD_STORE_URL keeps the password out of the file)")
            }
            guard let url = value as? String, let components = URLComponents(string: url), ["postgres", "postgresql"].contains(components.scheme ?? ""),
                  !(components.host ?? "").isEmpty, !(components.user ?? "").isEmpty else {
                // The value may hold a password: it is not repeated.
                throw ConfigError(path: "store.url", problem: "expected postgres://USER:PASSWORD@HOST:PORT/DATABASE")
            }
            var postgres = StoreSettings.Postgres(url: url)
            if let value = store["pool_size"] { postgres.poolSize = try positive(value, "store.pool_size", atMost: 1_000) }
            if let value = store["tls"] {
                guard let text = value as? String, ["disable", "prefer", "require"].contains(text) else {
                    throw ConfigError(path: "store.tls", problem: "expected disable, prefer or require, got \(ConfigFile.describe(value))")
                }
                postgres.tls = text
            }
            if let value = store["ca_file"] {
                guard let path = value as? String, !path.isEmpty else {
                    throw ConfigError(path: "store.ca_file", problem: "expected a PEM file's path, got \(ConfigFile.describe(value))")
                }
                postgres.caFile = path
            }
            file.store.postgres = postgres
        } else if let key = ["url", "pool_size", "tls", "ca_file"].first(where: { store[$0] != nil }) {
            throw ConfigError(path: "store.\(key)", problem: "applies to store.backend: postgres only")
        }

        let fetcher = try section(tree, "fetcher")
        if let value = fetcher["attempts"] { file.fetcher.attempts = try positive(value, "fetcher.attempts", atMost: 100) }
        for (name, value) in try section(fetcher, "datasets", parent: "fetcher") {
            let path = "fetcher.datasets.\(name)"
            let dataset = Dataset(rawValue: name)!
            let entry = try ConfigFile.mapping(value, path)
            var source = file.fetcher.sources[dataset] ?? FetcherSettings.Source()
            if let url = entry["url"] {
                guard let text = url as? String, let parsed = URL(string: text), ["http", "https", "file"].contains(parsed.scheme ?? "") else {
                    throw ConfigError(path: "\(path).url", problem: "expected an http, https or file URL, got \(ConfigFile.describe(url))")
                }
                source.url = parsed
            }
            if let value = entry["refresh_seconds"] { source.refreshInterval = .seconds(try positive(value, "\(path).refresh_seconds", atMost: Limit.year_s)) }
            if let value = entry["timeout_ms"] { source.timeout = .milliseconds(try positive(value, "\(path).timeout_ms", atMost: Limit.day_ms)) }
            if let value = entry["max_mb"] { source.maxBytes = try positive(value, "\(path).max_mb", atMost: 1 << 20) * 1_048_576 }
            if let value = entry["headers"] {
                guard let headers = value as? [String: String] else {
                    throw ConfigError(path: "\(path).headers", problem: "expected a mapping of header names to strings")
                }
                source.headers = headers
            }
            file.fetcher.sources[dataset] = source
        }

        let security = try section(tree, "security")
        var s = file.security
        if let value = security["curve"] { s.curve = try bool(value, "security.curve") }
        if let value = security["keys_dir"] {
            guard let path = value as? String, !path.isEmpty else {
                throw ConfigError(path: "security.keys_dir", problem: "expected a folder path, got \(ConfigFile.describe(value))")
            }
            s.keysDir = path
        }
        s.kernelSecretKey = try key(in: security, inline: "kernel_secret_key", file: "kernel_secret_key_file")
        s.secretKey = try key(in: security, inline: "secret_key", file: "secret_key_file")
        if let value = security["server_key"] { s.serverKey = try z85Key(value, "security.server_key") }
        if let value = security["client_keys"] { s.clientKeys = try keys(value, "security.client_keys") }
        if let value = security["worker_keys"] { s.workerKeys = try keys(value, "security.worker_keys") }
        file.security = s

        let supervisor = try section(tree, "supervisor")
        var u = file.supervisor
        if let value = supervisor["start_timeout_seconds"] { u.startTimeout = .seconds(try positive(value, "supervisor.start_timeout_seconds", atMost: Limit.day_s)) }
        if let value = supervisor["stop_timeout_seconds"] { u.stopTimeout = .seconds(try positive(value, "supervisor.stop_timeout_seconds", atMost: Limit.day_s)) }
        if let value = supervisor["restart_backoff_ms"] { u.restartBackoff = .milliseconds(try positive(value, "supervisor.restart_backoff_ms", atMost: Limit.day_ms)) }
        if let value = supervisor["restart_backoff_max_ms"] { u.restartBackoffMax = .milliseconds(try positive(value, "supervisor.restart_backoff_max_ms", atMost: Limit.day_ms)) }
        if let value = supervisor["restart_limit"] { u.restartLimit = try positive(value, "supervisor.restart_limit", atMost: 1_000_000) }
        if let value = supervisor["restart_window_seconds"] { u.restartWindow = .seconds(try positive(value, "supervisor.restart_window_seconds", atMost: Limit.day_s)) }
        file.supervisor = u

        let gateway = try section(tree, "gateway")
        var g = file.gateway
        if let value = gateway["enabled"] { g.enabled = try bool(value, "gateway.enabled") }
        if let value = gateway["listen"] { (g.host, g.port) = try hostAndPort(value, "gateway.listen") }
        if let value = gateway["max_body_bytes"] { g.maxBodyBytes = try positive(value, "gateway.max_body_bytes", atMost: 1 << 30) }
        if let value = gateway["prefixes"] {
            g.prefixes = try strings(value, "gateway.prefixes")
            if g.prefixes.isEmpty { throw ConfigError(path: "gateway.prefixes", problem: "expected at least one key prefix (\"\" for every key)") }
        }
        if let value = gateway["history"] { g.history = try positive(value, "gateway.history", atMost: 10_000_000) }
        if let value = gateway["history_bytes"] { g.historyBytes = try positive(value, "gateway.history_bytes", atMost: 1 << 40) }
        if let value = gateway["stream_backlog_bytes"] { g.streamBacklogBytes = try positive(value, "gateway.stream_backlog_bytes", atMost: 1 << 40) }
        if let value = gateway["max_response_bytes"] { g.maxResponseBytes = try positive(value, "gateway.max_response_bytes", atMost: 1 << 31) }
        if let value = gateway["heartbeat_seconds"] { g.heartbeat = .seconds(try positive(value, "gateway.heartbeat_seconds", atMost: Limit.day_s)) }
        if let value = gateway["request_timeout_ms"] { g.requestTimeout = .milliseconds(try positive(value, "gateway.request_timeout_ms", atMost: Limit.day_ms)) }
        if let value = gateway["cors_origins"] { g.corsOrigins = try strings(value, "gateway.cors_origins") }
        if let value = gateway["log_level"] { g.logLevel = try logLevel(value, "gateway.log_level") }
        if let value = gateway["tokens"] { g.tokens = try tokens(value, "gateway.tokens") }
        file.gateway = g
        return file
    }

    private func hostAndPort(_ value: Any, _ path: String) throws -> (String, Int) {
        let problem = ConfigError(path: path, problem: "expected HOST:PORT such as 127.0.0.1:8080 or [::1]:8080, got \(ConfigFile.describe(value))")
        guard let text = value as? String, let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
              (0...65535).contains(port) else { throw problem }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { throw problem }
        return (host, port)
    }

    /// `gateway.tokens`: a list of {token | token_file, services, writable_prefixes}.
    private func tokens(_ value: Any, _ path: String) throws -> [GatewayToken] {
        guard let list = value as? [Any] else { throw ConfigError(path: path, problem: "expected a list of tokens, got \(ConfigFile.describe(value))") }
        return try list.enumerated().map { index, item in
            let here = "\(path)[\(index)]"
            let map = try ConfigFile.mapping(item, here)
            for key in map.keys where !["token", "token_file", "services", "writable_prefixes", "readable_prefixes"].contains(key) {
                throw ConfigError(path: "\(here).\(key)", problem: "unknown key; expected one of readable_prefixes, services, token, token_file, writable_prefixes")
            }
            var token: String
            switch (map["token"], map["token_file"]) {
            case (let text as String, nil):
                token = text
            case (nil, let file as String):
                do {
                    token = try String(contentsOfFile: file, encoding: .utf8)
                } catch {
                    throw ConfigError(path: "\(here).token_file", problem: "cannot read \(file): \(error.localizedDescription)")
                }
            default:
                throw ConfigError(path: here, problem: "give token (the text) or token_file (a file holding it), one of the two")
            }
            token = token.trimmingCharacters(in: .whitespacesAndNewlines)
            guard token.count >= 16 else { throw ConfigError(path: here, problem: "a token must be at least 16 characters") }
            let services = try map["services"].map { try strings($0, "\(here).services") } ?? ["*"]
            let prefixes = try map["writable_prefixes"].map { try strings($0, "\(here).writable_prefixes") } ?? []
            let readable = try map["readable_prefixes"].map { try strings($0, "\(here).readable_prefixes") }
            return GatewayToken(token: token, services: services, writablePrefixes: prefixes, readablePrefixes: readable)
        }
    }

    private func section(_ tree: [String: Any], _ name: String, parent: String? = nil) throws -> [String: Any] {
        guard let value = tree[name] else { return [:] }
        return try ConfigFile.mapping(value, parent.map { "\($0).\(name)" } ?? name)
    }

    /// Every number a configuration gives is checked against a range here before anything
    /// multiplies or converts it (megabytes to bytes, milliseconds to nanoseconds, a count to
    /// a socket option's Int32).
    private func positive(_ value: Any, _ path: String, atMost maximum: Int) throws -> Int {
        guard let number = value as? Int, (1...maximum).contains(number) else {
            throw ConfigError(path: path, problem: "expected an integer from 1 to \(maximum), got \(ConfigFile.describe(value))")
        }
        return number
    }

    /// Upper bounds shared by several keys.
    private enum Limit {
        static let hour_ms = 3_600_000
        static let day_ms = 86_400_000
        static let day_s = 86_400
        static let year_s = 31_536_000
    }

    private func bool(_ value: Any, _ path: String) throws -> Bool {
        guard let flag = value as? Bool else {
            throw ConfigError(path: path, problem: "expected true or false, got \(ConfigFile.describe(value))")
        }
        return flag
    }

    private func logLevel(_ value: Any, _ path: String) throws -> String {
        guard let level = value as? String, ConfigFile.logLevels.contains(level) else {
            throw ConfigError(path: path, problem: "expected one of \(ConfigFile.logLevels.joined(separator: ", ")), got \(ConfigFile.describe(value))")
        }
        return level
    }

    private func endpoint(_ value: Any, _ path: String) throws -> String {
        guard let text = value as? String, ["tcp://", "ipc://", "inproc://"].contains(where: { text.hasPrefix($0) }), text.count > 8 else {
            throw ConfigError(path: path, problem: "expected an endpoint such as tcp://127.0.0.1:5555, got \(ConfigFile.describe(value))")
        }
        return text
    }

    private func strings(_ value: Any, _ path: String) throws -> [String] {
        guard let list = value as? [Any], let strings = list as? [String] else {
            throw ConfigError(path: path, problem: "expected a list of strings, got \(ConfigFile.describe(value))")
        }
        return strings
    }

    private func z85Key(_ value: Any, _ path: String) throws -> String {
        guard let text = (value as? String)?.trimmingCharacters(in: .whitespacesAndNewlines), Z85.decode(text)?.count == 32 else {
            throw ConfigError(path: path, problem: "expected a CURVE key: 40 characters of Z85 as `switchboard keygen` prints, got \(ConfigFile.describe(value))")
        }
        return text
    }

    private func keys(_ value: Any, _ path: String) throws -> [String] {
        let list = try strings(value, path)
        return try list.enumerated().map { try z85Key($0.element, "\(path)[\($0.offset)]") }
    }

    /// A secret key given inline or as a file holding it (as `switchboard keygen --out` writes).
    private func key(in section: [String: Any], inline: String, file: String) throws -> String? {
        if section[inline] != nil && section[file] != nil {
            throw ConfigError(path: "security.\(inline)", problem: "give either \(inline) or \(file), not both")
        }
        if let value = section[inline] { return try z85Key(value, "security.\(inline)") }
        guard let value = section[file] else { return nil }
        guard let path = value as? String, !path.isEmpty else {
            throw ConfigError(path: "security.\(file)", problem: "expected a file path, got \(ConfigFile.describe(value))")
        }
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw ConfigError(path: "security.\(file)", problem: "cannot read \(path): \(error.localizedDescription)")
        }
        guard let secret = CurveKeyFile.secretKey(in: text) else {
            throw ConfigError(path: "security.\(file)", problem: "\(path) holds no CURVE secret key (expected the file `switchboard keygen --out` writes)")
        }
        return secret
    }
}
