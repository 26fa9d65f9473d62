public import Catalog
public import SwitchboardConfig
public import Foundation

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

extension FetcherSettings {
    public static let schema = ConfigSchema.map([
        "attempts": .value,
        "datasets": .each(Set(Dataset.allCases.map(\.rawValue)), .values(["url", "refresh_seconds", "timeout_ms", "max_mb", "headers"])),
    ])

    /// Reads `fetcher:`: what differs from each dataset's defaults.
    public init(reading fetcher: ConfigSection) throws(ConfigError) {
        self.init()
        attempts = try fetcher.integer("attempts", atMost: 100)
        for (name, entry) in try fetcher.section("datasets").sections() {
            guard let dataset = Dataset(rawValue: name) else { continue }  // the schema allows only datasets
            var source = Source()
            if let url = entry.values["url"] {
                guard let text = url as? String, let parsed = URL(string: text), ["http", "https", "file"].contains(parsed.scheme ?? "") else {
                    throw entry.refuse("url", expected: "an http, https or file URL")
                }
                source.url = parsed
            }
            source.refreshInterval = try entry.seconds("refresh_seconds", atMost: ConfigSection.Limit.yearSeconds)
            source.timeout = try entry.milliseconds("timeout_ms")
            source.maxBytes = try entry.integer("max_mb", atMost: 1 << 20).map { $0 * 1_048_576 }
            if let value = entry.values["headers"] {
                guard let headers = value as? [String: String] else {
                    throw ConfigError(path: entry.path("headers"), problem: "expected a mapping of header names to strings")
                }
                source.headers = headers
            }
            sources[dataset] = source
        }
    }
}
