
/// `switchboard up`'s own service, `supervisor` (registered with the supervisor's key beside
/// its kernel): rolling restarts and configuration reloads, asked for by `sb restart` and
/// `sb reload` (or SIGUSR2 and SIGHUP to `up`). For operators' keys only (``OperatorsOnly``).
public enum SupervisorAPI {
    public static let service = "supervisor"

    public static let restart = Method<RestartParams, Restarted>(service, "restart", "Replaces services' processes one at a time: each new process registers before the old one drains and leaves, so no request fails or is re-sent.")
    public static let reload = Method<NoParams, Reloaded>(service, "reload", "Re-reads the configuration and applies what can change live; an invalid file is refused and the running configuration kept.")

    /// The services to restart in this order (default: every service `up` runs, and the gateway).
    public struct RestartParams: Codable, Sendable {
        public var services: [String]?
        public init(services: [String]? = nil) { self.services = services }
    }

    public struct Restarted: Codable, Sendable {
        public struct Entry: Codable, Sendable, Equatable {
            public var name: String
            public var oldPid: Int?
            public var newPid: Int
            public init(name: String, oldPid: Int?, newPid: Int) { (self.name, self.oldPid, self.newPid) = (name, oldPid, newPid) }
        }
        public var restarted: [Entry]
        public init(restarted: [Entry]) { self.restarted = restarted }
    }

    /// What a reload changed, by key path (values are not echoed: tokens and keys are among them).
    public struct Reloaded: Codable, Sendable, Equatable {
        /// The file read (nil: no file, the defaults and `SWITCHBOARD_*` variables).
        public var file: String?
        /// Changed keys now in effect.
        public var applied: [String]
        /// Changed keys that take effect only when the bus (or the process named) restarts.
        public var needsRestart: [String]
        /// Services restarted one at a time to apply a new worker count.
        public var restarted: [String]
        public init(file: String?, applied: [String] = [], needsRestart: [String] = [], restarted: [String] = []) {
            (self.file, self.applied, self.needsRestart, self.restarted) = (file, applied, needsRestart, restarted)
        }
    }
}
