public import SwitchboardConfig

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

extension SupervisorSettings {
    public static let schema = ConfigSchema.values([
        "start_timeout_seconds", "stop_timeout_seconds", "restart_backoff_ms", "restart_backoff_max_ms", "restart_limit", "restart_window_seconds",
    ])

    /// Reads `supervisor:` over the defaults.
    public init(reading supervisor: ConfigSection) throws(ConfigError) {
        self.init()
        if let value = try supervisor.seconds("start_timeout_seconds") { startTimeout = value }
        if let value = try supervisor.seconds("stop_timeout_seconds") { stopTimeout = value }
        if let value = try supervisor.milliseconds("restart_backoff_ms") { restartBackoff = value }
        if let value = try supervisor.milliseconds("restart_backoff_max_ms") { restartBackoffMax = value }
        if let value = try supervisor.integer("restart_limit", atMost: 1_000_000) { restartLimit = value }
        if let value = try supervisor.seconds("restart_window_seconds") { restartWindow = value }
    }
}

extension ServiceSettings {
    public static let schema = ConfigSchema.values(["enabled", "workers", "window", "log_level"])

    /// Reads `services.NAME:` over `defaults`; `maxWindow` is the protocol's largest window.
    public init(reading service: ConfigSection, over defaults: ServiceSettings, maxWindow: Int) throws(ConfigError) {
        self = defaults
        if let value = try service.bool("enabled") { enabled = value }
        if let value = try service.integer("workers", atMost: 1_000) { workers = value }
        if let value = try service.integer("window", atMost: maxWindow) { window = value }
        if let value = try service.logLevel("log_level") { logLevel = value }
    }
}
