public import BusKit
import BusProtocol
public import Catalog
import Foundation
public import Logging

/// The `search` service: countries, places with Wikipedia links, the grouped hiring list,
/// news sources and headlines, flights and airlines, all answered from in-memory indexes.
///
/// It starts from the bundled copies, then follows `/catalog/*`: when the fetcher
/// announces a version it does not have, it reads that dataset page by page over the bus
/// (`fetcher` `datasets.get`), builds the new index aside and swaps it in at once. Queries
/// read one snapshot of the indexes, so none sees a half-built index or a mix of two.
/// The store keeps what belongs to the user: the search history (every resolved place)
/// and the selected news sources.
public actor SearchService: BusService {
    public static let name = "search"

    let logger: Logger
    nonisolated let indexes = IndexHolder()
    private var client: BusClient?
    private var feed: Task<Void, Never>?
    /// The latest version the fetcher announced, per dataset.
    private var announced: [Dataset: String] = [:]
    private var loaders: [Dataset: Task<Void, Never>] = [:]
    /// How long a call to the store or the fetcher may take.
    let busTimeout: Duration

    /// Builds every index from the bundled copies, so the service answers from the first request.
    public init(logger: Logger? = nil, busTimeout: Duration = .seconds(5)) {
        self.logger = logger ?? Logger(label: "switchboard.search")
        self.busTimeout = busTimeout
        for dataset in Dataset.allCases {
            do {
                let data = try dataset.bundledData()
                indexes.rebuild(try dataset.decode(data).content, version: Dataset.version(of: data), origin: "bundled")
            } catch {
                self.logger.error("bundled copy unusable", metadata: ["dataset": "\(dataset)", "problem": "\(error)"])
            }
        }
    }

    /// Builds one dataset's index from `content` (for tests and benchmarks without a fetcher).
    public func load(_ content: DatasetContent, version: String, origin: String = "test") {
        indexes.rebuild(content, version: version, origin: origin)
    }

    /// The named place nearest to a point, and how far it is (for benchmarks; the methods
    /// answer with more).
    public nonisolated func nearestNamedPlace(latitude: Double, longitude: Double) -> (name: String, distanceKm: Double)? {
        let places = indexes.snapshot.places
        guard let found = places.nearestNamed(to: Coordinates(latitude: latitude, longitude: longitude)) else { return nil }
        return (places.label(found.index), found.km)
    }

    /// Starts following the catalog: `catalog` is a subscription to `/catalog/`; `client`
    /// reaches the fetcher and the store.
    public func start(client: BusClient, catalog: Subscription) {
        self.client = client
        feed = Task { [weak self] in
            do {
                for try await update in catalog { await self?.catalogChanged(update) }
            } catch where !Task.isCancelled {
                self?.logger.warning("the catalog subscription ended", metadata: ["problem": "\(error)"])
            } catch {}
        }
    }

    /// Stops following the catalog (the subscription is the caller's to cancel).
    public func stop() {
        feed?.cancel()
        feed = nil
        for loader in loaders.values { loader.cancel() }
        loaders.removeAll()
        client = nil
    }

    // MARK: Following the catalog

    private func catalogChanged(_ update: StateUpdate) {
        guard let value = update.json, let name = value["name"]?.stringValue, let dataset = Dataset(rawValue: name),
              let version = value["version"]?.stringValue else { return }
        announced[dataset] = version
        if let origin = value["origin"]?.stringValue { indexes.noteOrigin(origin, of: dataset, version: version) }
        guard loaders[dataset] == nil, indexes.version(of: dataset) != version else { return }
        loaders[dataset] = Task { await self.follow(dataset) }
    }

    /// Loads `dataset` until the index has the version last announced; retries with back-off
    /// while the fetcher cannot be reached.
    private func follow(_ dataset: Dataset) async {
        var failures = 0
        while !Task.isCancelled, let wanted = announced[dataset], indexes.version(of: dataset) != wanted, let client {
            do {
                let copy = try await Self.read(dataset, through: client, timeout: busTimeout)
                let started = ContinuousClock.now
                let indexes = self.indexes
                // Decoding and building take a while for a large dataset: off the actor.
                try await Task.detached {
                    indexes.rebuild(try dataset.content(fromRecords: copy.records), version: copy.version, origin: copy.origin)
                }.value
                logger.info("index rebuilt", metadata: ["dataset": "\(dataset)", "version": "\(copy.version)", "origin": "\(copy.origin)",
                                                        "records": "\(copy.records.count)", "took": "\((ContinuousClock.now - started).formatted)"])
                // A newer copy than the one announced: its announcement is on the way.
                if copy.version != wanted { announced[dataset] = copy.version }
                failures = 0
            } catch {
                failures += 1
                let delay = Duration.milliseconds(min(30_000, 250 << min(failures, 7)))
                logger.warning("cannot load a dataset; keeping the current index", metadata: [
                    "dataset": "\(dataset)", "problem": "\(error)", "retry in": "\(delay.formatted)"])
                try? await Task.sleep(for: delay)
            }
        }
        loaders[dataset] = nil
    }

    struct Copy: Sendable {
        var records: [JSONValue] = []
        var version = ""
        var origin = ""
    }

    /// Reads every record of `dataset` from the fetcher, one page at a time. When the
    /// version changes between pages it starts again, so the copy is always one version.
    static func read(_ dataset: Dataset, through client: BusClient, timeout: Duration) async throws -> Copy {
        let pageSize = 1_000
        for _ in 0..<3 {
            var copy = Copy()
            var total = 1
            var consistent = true
            while copy.records.count < total {
                let page = try await client.request(service: "fetcher", method: "datasets.get", params: [
                    "name": .string(dataset.rawValue), "offset": .int(Int64(copy.records.count)), "limit": .int(Int64(pageSize)),
                ], timeout: timeout)
                guard let version = page["version"]?.stringValue, let count = page["total"]?.intValue,
                      let records = page["records"]?.arrayValue else {
                    throw BusError.protocolViolation("fetcher datasets.get: a page without version, total or records")
                }
                if copy.records.isEmpty {
                    copy.version = version
                    copy.origin = page["origin"]?.stringValue ?? "unknown"
                } else if version != copy.version {
                    consistent = false
                    break
                }
                total = Int(count)
                if records.isEmpty { break }
                copy.records += records
            }
            if consistent { return copy }
        }
        throw BusError.protocolViolation("fetcher datasets.get: \(dataset) kept changing while it was read")
    }

    // MARK: Methods

    public nonisolated func methods(_ table: inout MethodTable<SearchService>) {
        table.on("countries.search") { (search, params: CountriesParams) in try search.countries(params) }
        table.on("locations.search") { (search, params: LocationsParams) in try search.locations(params) }
        table.on("locations.resolve") { (search, params: ResolveParams) in try await search.resolve(params) }
        table.on("items.grouped") { (search, params: ItemsParams) in try search.items(params) }
        table.on("sources.list") { (search, params: SourcesParams) in try await search.sources(params) }
        table.on("headlines.list") { (search, params: HeadlinesParams) in try await search.headlines(params) }
        table.on("flights.list") { (search, params: FlightsParams) in try search.flights(params) }
        table.on("airlines.get") { (search, params: AirlineParams) in try search.airline(params) }
        table.on("indexes.list") { (search, _: NoParams) in search.indexList() }
    }

    /// Calls the store, turning its failure into an error that says what needed it.
    func store(_ method: String, _ params: JSONValue? = nil, for purpose: String) async throws -> JSONValue {
        guard let client else {
            throw JSONRPCError(code: JSONRPCError.serviceUnavailableCode, message: "Service unavailable: \(purpose) needs the store, and this search service is not connected to a bus")
        }
        do {
            return try await client.request(service: "store", method: method, params: params, timeout: busTimeout)
        } catch {
            throw JSONRPCError(code: error.code ?? JSONRPCError.serviceUnavailableCode, message: "\(purpose) needs the store: \(error)",
                               data: ["service": "store"])
        }
    }
}
