public import Catalog
public import Foundation

/// Where each dataset comes from and how it is fetched.
public struct FetcherConfiguration: Sendable, Equatable {
    public struct Source: Sendable, Equatable {
        /// The remote copy (`http`, `https` or `file`); nil: the bundled copy only.
        public var url: URL?
        public var refreshInterval: Duration
        public var timeout: Duration
        /// Extra request headers. A value `$NAME` is read from the environment variable
        /// NAME at start (and never logged); the header is left out when NAME is unset.
        public var headers: [String: String]
        /// The largest body accepted, in bytes.
        public var maxBytes: Int

        public init(url: URL?, refreshInterval: Duration = .seconds(900), timeout: Duration = .seconds(10),
                    headers: [String: String] = [:], maxBytes: Int = 32 * 1_048_576) {
            self.url = url
            self.refreshInterval = refreshInterval
            self.timeout = timeout
            self.headers = headers
            self.maxBytes = maxBytes
        }
    }

    public var sources: [Dataset: Source]
    /// Download attempts per refresh (1 = no retry) and the first back-off.
    public var attempts = 3
    public var retryBase: Duration = .milliseconds(250)
    /// The largest body kept in the store as the last good copy (multi-megabyte, below the
    /// kernel's message limit).
    public var maxSnapshotBytes = 16 * 1_048_576

    /// The real sources, NewsAPI's key from `NEWSAPI_KEY`.
    public static var defaults: FetcherConfiguration {
        var sources: [Dataset: Source] = [:]
        for dataset in Dataset.allCases {
            var source = Source(url: dataset.defaultURL)
            if dataset.isNewsAPI {
                source.headers = ["X-Api-Key": "$NEWSAPI_KEY"]
                source.refreshInterval = .seconds(1_800)
            }
            sources[dataset] = source
        }
        return FetcherConfiguration(sources: sources)
    }

    public init(sources: [Dataset: Source]) {
        self.sources = sources
    }

    /// The headers to send, with `$NAME` values taken from `environment`.
    static func resolvedHeaders(_ headers: [String: String], environment: [String: String]) -> [(String, String)] {
        headers.sorted { $0.key < $1.key }.compactMap { name, value in
            guard value.hasPrefix("$") else { return (name, value) }
            guard let resolved = environment[String(value.dropFirst())], !resolved.isEmpty else { return nil }
            return (name, resolved)
        }
    }
}
