public import BusProtocol

/// `fetcher`: the five apps' datasets, downloaded, checked and kept as the last good copy.
public enum FetcherAPI {
    public static let service = "fetcher"
    /// The state keys the fetcher publishes: `/catalog/NAME` for each dataset, with its
    /// name, origin, version, records, fetch time and last error.
    public static let catalogPrefix = "/catalog/"

    public static let datasetsList = Method<NoParams, [DatasetEntry]>(service, "datasets.list", "Each dataset's version, origin, fetch time and size.")
    public static let datasetsGet = Method<Get, DatasetPage>(service, "datasets.get", "A dataset's records, a page at a time, with its version.")
    public static let datasetsRefresh = Method<Refresh, [DatasetEntry]>(service, "datasets.refresh", "Downloads one dataset (or all) now; answers with their entries.")
    /// `datasets.refresh` with its progress in parts: one as each dataset's download ends, in
    /// the order they end; the end is the whole answer, as in one reply.
    public static let datasetsRefreshStream = StreamMethod(datasetsRefresh, part: RefreshProgress.self) { end, _ in end }

    public struct Get: Codable, Sendable {
        public var name: String
        public var offset: Int?
        public var limit: Int?
        public init(name: String, offset: Int? = nil, limit: Int? = nil) { (self.name, self.offset, self.limit) = (name, offset, limit) }
    }
    public struct Refresh: Codable, Sendable {
        public var name: String?
        public init(name: String? = nil) { self.name = name }
    }

    // MARK: Results

    /// One dataset's download ended (`done` of `total`), failed when `lastError` says so.
    public struct RefreshProgress: Codable, Sendable {
        public var name: String
        public var done: Int
        public var total: Int
        public var lastError: String?
        public init(name: String, done: Int, total: Int, lastError: String?) { (self.name, self.done, self.total, self.lastError) = (name, done, total, lastError) }
    }

    public struct DatasetEntry: Codable, Sendable {
        public var name: String
        /// "remote", "cache" or "bundled"; absent with no usable copy.
        public var origin: String?
        public var version: String?
        public var records: Int
        public var dropped: Int
        public var fetchedAt: String?
        public var lastError: String?
        public var nextRefresh: String?
        public var url: String?
        public init(name: String, origin: String?, version: String?, records: Int, dropped: Int, fetchedAt: String?, lastError: String?,
                    nextRefresh: String?, url: String?) {
            (self.name, self.origin, self.version, self.records, self.dropped, self.fetchedAt, self.lastError, self.nextRefresh, self.url)
                = (name, origin, version, records, dropped, fetchedAt, lastError, nextRefresh, url)
        }
    }
    public struct DatasetPage: Codable, Sendable {
        public var name: String
        public var version: String
        public var origin: String
        public var total: Int
        public var offset: Int
        /// The dataset's records, normalised (Sources/Services/Catalog/Models.swift).
        public var records: [JSONValue]
        public init(name: String, version: String, origin: String, total: Int, offset: Int, records: [JSONValue]) {
            (self.name, self.version, self.origin, self.total, self.offset, self.records) = (name, version, origin, total, offset, records)
        }
    }
}

extension FetcherAPI.Get: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["offset": Ranges.offset, "limit": 1...1_000]
}
