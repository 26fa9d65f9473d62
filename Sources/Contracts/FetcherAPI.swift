public import BusProtocol
public import ContractKit

/// `fetcher`: the five apps' datasets, downloaded, checked and kept as the last good copy.
public enum FetcherAPI {
    public static let service = "fetcher"
    /// The state keys the fetcher publishes: `/catalog/NAME` for each dataset, with its
    /// name, origin, version, records, fetch time and last error.
    public static let catalogPrefix = "/catalog/"

    public static let datasetsList = Method<NoParams, JSONValue>(service, "datasets.list", "Each dataset's version, origin, fetch time and size.")
    public static let datasetsGet = Method<Get, JSONValue>(service, "datasets.get", "A dataset's records, a page at a time, with its version.")
    public static let datasetsRefresh = Method<Refresh, JSONValue>(service, "datasets.refresh", "Downloads one dataset (or all) now; answers with their entries.")

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
}
