public import SwitchboardConfig
import Foundation

/// `store:` as the file gives it; what it leaves out keeps the store's own default (the
/// executable hands these to `StoreConfiguration`).
public struct StoreSettings: Sendable, Equatable {
    public var path: String?
    public var historyLimit: Int?
    public var maxSizeBytes: Int?
    /// How long each write's result is kept for a request sent again.
    public var rememberSeconds: Int?
    /// `postgres` (the `url`, `pool_size`, `tls`, `ca_file`, `timeout_ms` keys) instead of the SQLite file.
    public var postgres: Postgres?
    public init() {}

    /// `store.backend: postgres` and how to reach the database.
    public struct Postgres: Sendable, Equatable {
        public var url: String
        public var poolSize: Int?
        /// disable, prefer or require.
        public var tls: String?
        public var caFile: String?
        /// How long one database operation may take before the caller hears "unreachable".
        public var timeout: Duration?
        public init(url: String, poolSize: Int? = nil, tls: String? = nil, caFile: String? = nil, timeout: Duration? = nil) {
            (self.url, self.poolSize, self.tls, self.caFile, self.timeout) = (url, poolSize, tls, caFile, timeout)
        }
    }
}

extension StoreSettings {
    public static let schema = ConfigSchema.values(["backend", "path", "history_limit", "max_size_mb", "remember_seconds", "url", "pool_size", "tls", "ca_file", "timeout_ms"])

    /// Reads `store:`.
    public init(reading store: ConfigSection) throws(ConfigError) {
        self.init()
        path = try store.text("path", "a file path")
        historyLimit = try store.integer("history_limit", atMost: 1_000_000)
        maxSizeBytes = try store.integer("max_size_mb", atMost: 1 << 20).map { $0 * 1_048_576 }
        rememberSeconds = try store.integer("remember_seconds", atMost: ConfigSection.Limit.yearSeconds)
        if try store.choice("backend", ["sqlite", "postgres"]) == "postgres" {
            guard let value = store.values["url"] else {
                throw ConfigError(path: store.path("url"), problem: "is required with store.backend: postgres (postgres://USER:PASSWORD@HOST:PORT/DATABASE; SWITCHBOARD_STORE_URL keeps the password out of the file)")
            }
            guard let url = value as? String, let components = URLComponents(string: url), ["postgres", "postgresql"].contains(components.scheme ?? ""),
                  !(components.host ?? "").isEmpty, !(components.user ?? "").isEmpty else {
                // The value may hold a password: it is not repeated.
                throw ConfigError(path: store.path("url"), problem: "expected postgres://USER:PASSWORD@HOST:PORT/DATABASE")
            }
            postgres = Postgres(url: url, poolSize: try store.integer("pool_size", atMost: 1_000), tls: try store.choice("tls", ["disable", "prefer", "require"]),
                                caFile: try store.text("ca_file", "a PEM file's path"),
                                timeout: try store.milliseconds("timeout_ms"))
        } else if let key = ["url", "pool_size", "tls", "ca_file", "timeout_ms"].first(where: store.has) {
            throw ConfigError(path: store.path(key), problem: "applies to store.backend: postgres only")
        }
    }
}
