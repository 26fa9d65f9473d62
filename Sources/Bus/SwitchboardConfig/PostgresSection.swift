import Foundation

/// `backend: postgres` and how to reach the database, as a durable service's section
/// (`store:`, `streams:`) gives it; the executable makes it the service's `PostgresSettings`.
public struct PostgresSection: Sendable, Equatable {
    public var url: String
    public var poolSize: Int?
    /// disable, prefer or require.
    public var tls: String?
    public var caFile: String?
    /// How long one database operation may take before the caller hears "unreachable".
    public var timeout: Duration?
    /// The key that sets `timeout` as the file names it (`store.timeout_ms`): errors of an
    /// operation that outlasted it name it, the setting to raise for a database that answers
    /// slowly.
    public var timeoutKey: String

    public init(url: String, poolSize: Int? = nil, tls: String? = nil, caFile: String? = nil, timeout: Duration? = nil, timeoutKey: String = "timeout_ms") {
        (self.url, self.poolSize, self.tls, self.caFile, self.timeout, self.timeoutKey) = (url, poolSize, tls, caFile, timeout, timeoutKey)
    }

    /// The keys a section with a database backend takes beside its own.
    public static let keys = ["backend", "url", "pool_size", "tls", "ca_file", "timeout_ms"]

    /// Reads `backend` (sqlite, the default, or postgres) and, for postgres, the keys that say
    /// how to reach it (which apply to postgres only). nil: SQLite.
    public static func reading(_ section: ConfigSection) throws(ConfigError) -> PostgresSection? {
        guard try section.choice("backend", ["sqlite", "postgres"]) == "postgres" else {
            if let key = keys.dropFirst().first(where: section.has) {
                throw ConfigError(path: section.path(key), problem: "applies to \(section.path("backend")): postgres only")
            }
            return nil
        }
        let variable = "SWITCHBOARD_" + section.path("url").uppercased().replacingOccurrences(of: ".", with: "_")
        guard let value = section.values["url"] else {
            throw ConfigError(path: section.path("url"), problem: "is required with \(section.path("backend")): postgres (postgres://USER:PASSWORD@HOST:PORT/DATABASE; \(variable) keeps the password out of the file)")
        }
        guard let url = value as? String, let components = URLComponents(string: url), ["postgres", "postgresql"].contains(components.scheme ?? ""),
              !(components.host ?? "").isEmpty, !(components.user ?? "").isEmpty else {
            // The value may hold a password: it is not repeated.
            throw ConfigError(path: section.path("url"), problem: "expected postgres://USER:PASSWORD@HOST:PORT/DATABASE")
        }
        // libpq's parameters (`?sslmode=verify-full`) are not read: taken in silence, a URL
        // asking for a checked certificate would get the TLS of `tls`, which may check none.
        guard components.query == nil else {
            throw ConfigError(path: section.path("url"), problem: "takes no parameters after '?' (such as sslmode): TLS is \(section.path("tls")) and \(section.path("ca_file"))")
        }
        let tls = try section.choice("tls", ["disable", "prefer", "require"])
        let caFile = try section.text("ca_file", "a PEM file's path")
        // Without TLS there is no certificate to check: a CA file there would be ignored in silence.
        if tls == "disable", caFile != nil {
            throw ConfigError(path: section.path("ca_file"), problem: "applies to \(section.path("tls")): prefer or require only")
        }
        return PostgresSection(url: url, poolSize: try section.integer("pool_size", atMost: 1_000), tls: tls, caFile: caFile,
                               timeout: try section.milliseconds("timeout_ms"), timeoutKey: section.path("timeout_ms"))
    }
}
