public import BusKit
public import FetcherService
public import Foundation
public import Gateway
public import Kernel
public import StoreService
public import StreamsService
public import Supervisor
public import SwitchboardConfig
public import Telemetry
import BusProtocol

/// `Config/switchboard.yaml`: the settings of every piece, each section read by the module it
/// belongs to (`kernel:` and `pair:` by Kernel, `security:` by BusKit, `gateway:` by Gateway,
/// `store:`, `streams:`, `fetcher:`, `services:` and `supervisor:` by theirs). Every key is optional; an
/// environment variable `SWITCHBOARD_<PATH>` overrides the file (``ConfigDocument``), and
/// flags given on the command line override both.
public struct ConfigFile: Sendable, Equatable {
    public var kernel = KernelConfiguration()
    public var services = ConfigFile.defaultServices
    public var store = StoreSettings()
    public var streams = StreamsSettings()
    public var fetcher = FetcherSettings()
    public var security = SecuritySettings()
    public var supervisor = SupervisorSettings()
    public var gateway = GatewaySettings()
    public var telemetry = TelemetrySettings()
    /// `pair:`, when this kernel is one of a primary/backup pair (also in `kernel.pair`).
    public var pair: PairSettings?
    /// The log level of every piece unless its own section says otherwise.
    public var logLevel = "info"
    /// `log_format`: every piece's log lines as `text` or as `json` (one object per line).
    public var logFormat = "text"
    /// `kernel.log_level`: the kernel's own level, when it differs.
    public var kernelLogLevel: String?

    public init() {}

    /// The services `switchboard up` runs, in start order, with their default worker counts.
    public static let serviceNames = ["echo", "store", "streams", "fetcher", "search", "pricing"]
    public static let defaultServices: [String: ServiceSettings] = [
        "echo": .init(workers: 2), "store": .init(workers: 8), "streams": .init(workers: 2), "fetcher": .init(workers: 4),
        "search": .init(workers: 4), "pricing": .init(workers: 2),
    ]
    public static var logLevels: [String] { ConfigSection.logLevels }

    /// Every key the file may hold, section by section as each module declares its own.
    static let schema = ConfigSchema.map([
        "log_level": .value,
        "log_format": .value,
        "kernel": KernelConfiguration.schema,
        "pair": PairConfiguration.schema,
        "services": .each(Set(serviceNames), ServiceSettings.schema),
        "store": StoreSettings.schema,
        "streams": StreamsSettings.schema,
        "fetcher": FetcherSettings.schema,
        "security": SecuritySettings.schema,
        "gateway": GatewaySettings.schema,
        "telemetry": TelemetrySettings.schema,
        "supervisor": SupervisorSettings.schema,
    ])

    /// Reads and checks a YAML file, then applies `SWITCHBOARD_*` variables from `environment`.
    /// Unknown keys (and unknown `SWITCHBOARD_*` variables) and bad values are errors.
    public static func load(_ url: URL?, environment: [String: String] = ProcessInfo.processInfo.environment) throws -> ConfigFile {
        try ConfigDocument.load(url, schema: schema, environment: environment, read: ConfigFile.init(reading:))
    }

    /// Parses YAML text, with `SWITCHBOARD_*` overrides from `environment`.
    public static func parse(_ text: String, environment: [String: String] = [:]) throws -> ConfigFile {
        try ConfigDocument.parse(text, schema: schema, environment: environment, read: ConfigFile.init(reading:))
    }

    /// The environment variable that overrides a key path.
    public static func variable(for path: String) -> String { ConfigDocument.variable(for: path) }

    init(reading file: ConfigSection) throws(ConfigError) {
        if let value = try file.logLevel("log_level") { logLevel = value }
        if let value = try file.choice("log_format", ["text", "json"]) { logFormat = value }
        let kernelSection = try file.section("kernel")
        kernel = try KernelConfiguration(reading: kernelSection)
        kernelLogLevel = try kernelSection.logLevel("log_level")
        if file.has("pair") {
            let section = try file.section("pair")
            // A pair's kernels replicate their state to each other; on etcd each would write
            // it there too, fenced by one election that they do not yet share.
            guard kernel.stateEtcd == nil else {
                throw ConfigError(path: "pair", problem: "a kernel pair with kernel.state.backend: etcd is not supported: leave out pair; a second kernel with the same kernel.state, on another machine, is the active kernel's standby through etcd's election (docs/STATE-ON-ETCD.md); or keep the pair with the state in memory")
            }
            // A cell's kernels are told apart in its directory by the election of its state in
            // etcd, which a pair link does not take part in.
            guard kernel.cell == nil else {
                throw ConfigError(path: "pair", problem: "a kernel pair in a cell is not supported: give the cell's kernels the state in etcd (kernel.state.backend: etcd), where a second one waits for the cell's election (docs/CELLS.md)")
            }
            let configuration = try PairConfiguration(reading: section)
            kernel.pair = configuration
            pair = try PairSettings(reading: section, configuration: configuration)
        }
        for (name, section) in try file.section("services").sections() {
            services[name] = try ServiceSettings(reading: section, over: Self.defaultServices[name]!, maxWindow: MDP.maxWindow)
        }
        store = try StoreSettings(reading: file.section("store"))
        streams = try StreamsSettings(reading: file.section("streams"))
        fetcher = try FetcherSettings(reading: file.section("fetcher"))
        security = try SecuritySettings(reading: file.section("security"))
        supervisor = try SupervisorSettings(reading: file.section("supervisor"))
        gateway = try GatewaySettings(reading: file.section("gateway"))
        telemetry = try TelemetrySettings(reading: file.section("telemetry"))
    }

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
}

/// `pair:`: this kernel is one of a primary/backup pair (docs/PAIR.md).
public struct PairSettings: Sendable, Equatable {
    /// Role, where this kernel hears its peer, the peer's pair endpoint, heartbeats.
    public var configuration: PairConfiguration
    /// The peer kernel's broker, and its CHP endpoints (default: the three ports after it).
    public var peerBroker: String
    public var peerState: StateEndpoints

    init(reading pair: ConfigSection, configuration: PairConfiguration) throws(ConfigError) {
        self.configuration = configuration
        peerBroker = configuration.peerBroker ?? ""
        if let value = pair.values["peer_state"] {
            guard let text = value as? String, let parsed = StateEndpoints(text) else {
                throw pair.refuse("peer_state", expected: "tcp://HOST:PORT (the snapshot; publisher and collector follow) or snapshot,publisher,collector")
            }
            peerState = parsed
        } else {
            guard let following = StateEndpoints(followingBroker: peerBroker) else {
                throw ConfigError(path: pair.path("peer_state"), problem: "is required when pair.peer_broker is not tcp://HOST:PORT")
            }
            peerState = following
        }
    }
}

extension SecuritySettings {
    /// The rules on keys given by hand (the kernel's secret key with its allow-lists, a
    /// connecting piece's server key with its own secret key) that the pieces apply at their
    /// start, applied as `switchboard up` would (CURVE on unless the file turns it off), for
    /// `switchboard check`: the key folder is not read, as it may be another machine's.
    public func checkKeysGivenByHand() throws(ConfigError) {
        guard isOn(default: true) else { return }
        var asUp = self
        asUp.curve = true
        if kernelSecretKey != nil { _ = try asUp.kernelSecurity() }
        if serverKey != nil || secretKey != nil { _ = try asUp.connectingKeys(as: KeyFolder.client) }
    }

    /// The kernel's side: nil when CURVE is off.
    public func kernelSecurity(services: [String] = ConfigFile.serviceNames + [KeyFolder.supervisor]) throws(ConfigError) -> KernelSecurity? {
        guard isOn() else { return nil }
        if let kernelSecretKey {
            guard !clientKeys.isEmpty || !workerKeys.isEmpty else {
                throw ConfigError(path: "security.worker_keys", problem: "no key is allowed: list the public keys of the services (and clients in security.client_keys, operators in security.operator_keys)")
            }
            return KernelSecurity(secretKey: kernelSecretKey, clientKeys: Set(clientKeys), workerKeys: Set(workerKeys), operatorKeys: Set(operatorKeys))
        }
        let folder = keyFolder
        do {
            var serviceKeys: [String: String] = [:]
            for name in services { if let key = try folder.publicKey(name) { serviceKeys[key] = name } }
            return KernelSecurity(secretKey: try folder.secretKey(KeyFolder.kernel),
                                  clientKeys: Set(try folder.clientPublicKeys() + clientKeys), workerKeys: Set(workerKeys),
                                  serviceKeys: serviceKeys, operatorKeys: Set(try folder.operatorPublicKeys() + operatorKeys))
        } catch {
            throw ConfigError(path: "security.keys_dir", problem: "\(error)")
        }
    }
}
