public import BusKit
import BusProtocol
public import Catalog
import CatalogFeed
import Foundation
public import Logging
public import Contracts

/// The `search` service: countries, places with Wikipedia links, the grouped hiring list,
/// news sources and headlines, flights and airlines, all answered from in-memory indexes.
///
/// It starts from the bundled copies, then follows `/catalog/*`: when the fetcher
/// announces a version it does not have, it reads that dataset page by page over the bus
/// (`fetcher` `datasets.get`), builds the new index aside and swaps it in at once. Queries
/// read one snapshot of the indexes, so none sees a half-built index or a mix of two.
/// The store keeps what belongs to the user: the search history (every resolved place)
/// and the selected news sources.
public actor SearchService: BusService, ServiceWork {
    public static let name = SearchAPI.service

    let logger: Logger
    nonisolated let indexes = IndexHolder()
    private var client: BusClient?
    /// How long a call to the store or the fetcher may take.
    let busTimeout: Duration

    private let catalog: Subscription?

    /// Builds every index from the bundled copies, so the service answers from the first
    /// request. `client` reaches the fetcher and the store, `catalog` follows `/catalog/`
    /// (both nil: a service off the bus, for tests and benchmarks).
    public init(logger: Logger? = nil, busTimeout: Duration = .seconds(5), client: BusClient? = nil, catalog: Subscription? = nil) {
        self.logger = logger ?? Logger(label: "switchboard.search")
        self.busTimeout = busTimeout
        self.client = client
        self.catalog = catalog
        for dataset in Dataset.allCases {
            do {
                let copy = try dataset.bundledCopy()
                indexes.rebuild(copy.decoded.content, version: copy.version, origin: "bundled")
            } catch {
                self.logger.error("bundled copy unusable", metadata: ["dataset": "\(dataset)", "problem": "\(error)"])
            }
        }
    }

    /// Builds one dataset's index from `content` (for tests and benchmarks without a fetcher).
    public func load(_ content: DatasetContent, version: String, origin: String = "test") {
        indexes.rebuild(content, version: version, origin: origin)
    }

    /// Follows the catalog until cancelled.
    public func work() async {
        guard let client, let catalog else { return }
        let indexes = self.indexes
        let follower = CatalogFollower(datasets: Set(Dataset.allCases), client: client, timeout: busTimeout, logger: logger,
                                       currentVersion: { indexes.version(of: $0) },
                                       install: { content, version, origin in
                                           indexes.rebuild(content, version: version, origin: origin)
                                       },
                                       originChanged: { dataset, version, origin in indexes.noteOrigin(origin, of: dataset, version: version) })
        await follower.follow(catalog)
    }

    // MARK: Methods

    public nonisolated func methods(_ table: inout MethodTable<SearchService>) {
        table.on(SearchAPI.countriesSearch) { search, params in try search.countries(params) }
        table.on(SearchAPI.locationsSearch) { search, params in try search.locations(params) }
        table.on(SearchAPI.locationsResolve) { search, params in try await search.resolve(params) }
        table.onStream(SearchAPI.itemsGroupedStream) { search, params, parts in try await search.items(params, parts: parts) }
        table.on(SearchAPI.sourcesList) { search, params in try await search.sources(params) }
        table.on(SearchAPI.headlinesList) { search, params in try await search.headlines(params) }
        table.on(SearchAPI.flightsList) { search, params in try search.flights(params) }
        table.on(SearchAPI.airlinesGet) { search, params in try search.airline(params) }
        table.on(SearchAPI.indexesList) { search, _ in search.indexList() }
    }

    /// Calls the store on behalf of a request; a failure says what needed it.
    func store<P, R>(_ method: Method<P, R>, _ params: P, for purpose: String) async throws -> R {
        guard let client else { throw JSONRPCError.notConnected(to: method.service, neededFor: purpose) }
        return try await client.call(method, params, timeout: busTimeout, neededFor: purpose)
    }
}
