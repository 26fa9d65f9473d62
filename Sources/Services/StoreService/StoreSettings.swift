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
    /// `backend: postgres` (and how to reach it) instead of the SQLite file.
    public var postgres: PostgresSection?
    public init() {}
}

extension StoreSettings {
    public static let schema = ConfigSchema.values(["path", "history_limit", "max_size_mb", "remember_seconds"] + PostgresSection.keys)

    /// Reads `store:`.
    public init(reading store: ConfigSection) throws(ConfigError) {
        self.init()
        path = try store.text("path", "a file path")
        historyLimit = try store.integer("history_limit", atMost: 1_000_000)
        maxSizeBytes = try store.integer("max_size_mb", atMost: 1 << 20).map { $0 * 1_048_576 }
        rememberSeconds = try store.integer("remember_seconds", atMost: ConfigSection.Limit.yearSeconds)
        postgres = try PostgresSection.reading(store)
    }
}
