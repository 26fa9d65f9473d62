import BusProtocol
public import SwitchboardConfig

extension KernelConfiguration {
    /// The keys of `kernel:` (the kernel's log level is the deployment's business, read there).
    public static let schema = ConfigSchema.map(valueKeys.merging(["state": stateSchema, "cell": cellSchema]) { $1 })

    /// An `etcd:` section, as etcd's clients name its settings.
    private static let etcdSchema = ConfigSchema.map([
        "endpoints": .value, "prefix": .value, "username": .text, "password": .text,
        "ca_file": .value, "cert_file": .value, "key_file": .value, "lease_seconds": .value,
    ])

    /// `kernel.state:`: where the state is kept.
    static let stateSchema = ConfigSchema.map(["backend": .value, "etcd": etcdSchema])

    /// `kernel.cell:`: the cell this kernel is of (docs/CELLS.md).
    static let cellSchema = ConfigSchema.map(["name": .value, "advertise": .value, "window": .value, "etcd": etcdSchema])

    private static let valueKeys = Dictionary(uniqueKeysWithValues: [
        "broker", "snapshot", "publisher", "collector", "heartbeat_ms", "liveness", "queue_timeout_ms",
        "max_message_size", "no_retry", "writable_prefixes", "log_level",
        "max_queued", "max_queued_bytes", "max_services", "peer_backlog", "subscriber_backlog", "subscriber_timeout_ms",
        "peer_timeout_ms",
        "state_max_value_bytes", "max_batch_items", "max_deliveries", "client_share_percent",
        "state_max_keys", "state_max_bytes", "client_state_max_keys", "client_state_max_bytes",
        "state_history_changes", "state_history_bytes", "state_history_per_key",
    ].map { ($0, ConfigSchema.value) })

    /// Reads `kernel:` over the defaults (every key optional).
    public init(reading kernel: ConfigSection) throws(ConfigError) {
        self.init()
        if let value = try kernel.endpoint("broker") { brokerEndpoint = value }
        if let value = try kernel.endpoint("snapshot") { snapshotEndpoint = value }
        if let value = try kernel.endpoint("publisher") { publisherEndpoint = value }
        if let value = try kernel.endpoint("collector") { collectorEndpoint = value }
        if let value = try kernel.milliseconds("heartbeat_ms", atMost: ConfigSection.Limit.hourMilliseconds) { heartbeatInterval = value }
        if let value = try kernel.integer("liveness", atMost: 1_000) { heartbeatLiveness = value }
        if let value = try kernel.milliseconds("queue_timeout_ms") { queueTimeout = value }
        if let value = try kernel.integer("max_message_size", atMost: 1 << 30) { maxMessageSize = value }
        if let value = try kernel.integer("max_queued", atMost: 10_000_000) { maxQueuedPerService = value }
        if let value = try kernel.integer("max_queued_bytes", atMost: 1 << 40) { maxQueuedBytes = value }
        if let value = try kernel.integer("max_services", atMost: 1_000_000) { maxServices = value }
        if let value = try kernel.integer("peer_backlog", atMost: Int(Int32.max)) { peerBacklog = value }
        if let value = try kernel.integer("subscriber_backlog", atMost: Int(Int32.max)) { subscriberBacklog = value }
        if let value = try kernel.milliseconds("subscriber_timeout_ms") { subscriberTimeout = value }
        if let value = try kernel.milliseconds("peer_timeout_ms") { peerTimeout = value }
        if let value = try kernel.integer("state_max_value_bytes", atMost: 1 << 30) { stateMaxValueBytes = value }
        if let value = try kernel.integer("client_share_percent", atMost: 100) { clientSharePercent = value }
        if let value = try kernel.integer("max_deliveries", atMost: 100) { maxDeliveries = value }
        if let value = try kernel.integer("max_batch_items", atMost: 100_000) { maxBatchItems = value }
        if let value = try kernel.integer("state_max_keys", atMost: 100_000_000) { stateMaxKeys = value }
        if let value = try kernel.integer("state_max_bytes", atMost: 1 << 40) { stateMaxBytes = value }
        if let value = try kernel.integer("client_state_max_keys", atMost: 100_000_000) { clientStateMaxKeys = value }
        if let value = try kernel.integer("client_state_max_bytes", atMost: 1 << 40) { clientStateMaxBytes = value }
        if let value = try kernel.integer("state_history_changes", atMost: 100_000_000) { stateHistoryChanges = value }
        if let value = try kernel.integer("state_history_bytes", atMost: 1 << 40) { stateHistoryBytes = value }
        if let value = try kernel.integer("state_history_per_key", atMost: 100_000) { stateHistoryPerKey = value }
        if let value = try kernel.strings("no_retry") { nonRetriableServices = Set(value) }
        if let prefixes = try kernel.keyPrefixes("writable_prefixes") { collectorWritablePrefixes = prefixes }
        stateEtcd = try Self.readStateBackend(try kernel.section("state"))
        if let stateEtcd { try checkFits(etcd: stateEtcd, kernel) }
        let cell = try kernel.section("cell")
        if !cell.values.isEmpty { self.cell = try Self.readCell(cell) }
    }

    /// `kernel.cell`: a name, the etcd of the directory, where other cells reach this one.
    private static func readCell(_ cell: ConfigSection) throws(ConfigError) -> CellConfiguration {
        _ = try cell.required("name", "is required: the cell's name, unique on the bus")
        guard let name = try cell.text("name", "the cell's name"), MDP.isValidCellName(name) else { throw cell.refuse("name", expected: MDP.cellNameRule) }
        var configuration = CellConfiguration(name: name, etcd: try readEtcd(try cell.section("etcd"), prefix: CellConfiguration.defaultPrefix,
                                                                                why: "a cell's directory is kept in etcd"))
        configuration.advertise = try cell.endpoint("advertise")
        if let window = try cell.integer("window", atMost: MDP.maxWindow) {
            guard window >= 1 else { throw cell.refuse("window", expected: "1 to \(MDP.maxWindow)") }
            configuration.window = window
        }
        return configuration
    }

    /// `kernel.state.backend` (`memory`, the default, or `etcd`) and its `etcd:` settings.
    private static func readStateBackend(_ state: ConfigSection) throws(ConfigError) -> EtcdStateSettings? {
        let backend = try state.choice("backend", ["memory", "etcd"]) ?? "memory"
        let etcd = try state.section("etcd")
        guard backend == "etcd" else {
            if !etcd.values.isEmpty { throw ConfigError(path: state.path("etcd"), problem: "is read only with kernel.state.backend: etcd") }
            return nil
        }
        return try readEtcd(etcd, prefix: EtcdStateSettings.defaultPrefix, why: "kernel.state.backend: etcd")
    }

    /// An `etcd:` section (`why`: what needs it, for the error when it names no member).
    private static func readEtcd(_ etcd: ConfigSection, prefix defaultPrefix: String, why: String) throws(ConfigError) -> EtcdStateSettings {
        guard let endpoints = try etcd.strings("endpoints"), !endpoints.isEmpty else {
            throw ConfigError(path: etcd.path("endpoints"), problem: "is required: \(why): the etcd members' client URLs, such as [http://127.0.0.1:2379]")
        }
        for endpoint in endpoints where !(endpoint.hasPrefix("http://") || endpoint.hasPrefix("https://")) {
            throw ConfigError(path: etcd.path("endpoints"), problem: "expected http://HOST:PORT or https://HOST:PORT, got \(endpoint)")
        }
        var settings = EtcdStateSettings(endpoints: endpoints)
        settings.prefix = defaultPrefix
        if let prefix = try etcd.text("prefix", "a key prefix such as /switchboard/state") {
            guard prefix.hasPrefix("/"), !prefix.hasSuffix("/") else { throw etcd.refuse("prefix", expected: "a key prefix starting with '/', without a '/' at the end") }
            settings.prefix = prefix
        }
        settings.username = try etcd.text("username", "etcd's user name")
        settings.password = try etcd.text("password", "etcd's password")
        guard (settings.username == nil) == (settings.password == nil) else {
            throw ConfigError(path: etcd.path(settings.username == nil ? "username" : "password"), problem: "is required with \(settings.username == nil ? "password" : "username")")
        }
        if let seconds = try etcd.integer("lease_seconds", atMost: EtcdStateSettings.leaseSecondsRange.upperBound) {
            guard seconds >= EtcdStateSettings.leaseSecondsRange.lowerBound else {
                throw etcd.refuse("lease_seconds", expected: "at least \(EtcdStateSettings.leaseSecondsRange.lowerBound) (etcd grants no shorter lease)")
            }
            settings.leaseSeconds = seconds
        }
        (settings.caFile, settings.certificateFile, settings.keyFile) = try etcd.clientTLSFiles()
        return settings
    }

    /// With etcd, one entry must fit one etcd request (which etcd bounds), and the pair's own
    /// copying of the state has no part (both kernels read etcd).
    private func checkFits(etcd: EtcdStateSettings, _ kernel: ConfigSection) throws(ConfigError) {
        if stateMaxValueBytes > Self.etcdMaxValueBytes {
            throw ConfigError(path: kernel.path("state_max_value_bytes"),
                              problem: "is \(stateMaxValueBytes), over what one etcd request carries with its record (\(Self.etcdMaxValueBytes) bytes of etcd's 1.5 MiB request limit) for kernel.state.backend: etcd")
        }
    }

    /// The largest key and value a state entry may hold on etcd: etcd refuses a request over
    /// 1.5 MiB (`--max-request-bytes`), and the record and the request's own fields need room.
    public static let etcdMaxValueBytes = 1_536 * 1_024 - 16 * 1_024
}

extension PairConfiguration {
    /// The keys of `pair:` this kernel reads (`peer_broker` and `peer_state` say where
    /// clients find the peer: the deployment reads them too).
    public static let schema = ConfigSchema.values(["role", "listen", "peer", "peer_broker", "peer_state", "heartbeat_ms"])

    /// Reads `pair:`; role, listen, peer and peer_broker are required.
    public init(reading pair: ConfigSection) throws(ConfigError) {
        let why = "is required in a pair (role, listen, peer, peer_broker)"
        _ = try pair.required("role", why)
        guard let role = try? pair.choice("role", ["primary", "backup"]).flatMap(Role.init(rawValue:)) else {
            throw pair.refuse("role", expected: "primary or backup")
        }
        _ = try pair.required("listen", why)
        _ = try pair.required("peer", why)
        _ = try pair.required("peer_broker", why)
        self.init(role: role, listen: try pair.endpoint("listen")!, peer: try pair.endpoint("peer")!)
        if let value = try pair.milliseconds("heartbeat_ms", atMost: ConfigSection.Limit.hourMilliseconds) { heartbeatInterval = value }
        peerBroker = try pair.endpoint("peer_broker")
    }
}
