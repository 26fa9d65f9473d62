import Catalog
import Foundation
import Synchronization

/// Every index the search service answers from, one per dataset, each with the version of
/// the copy it was built from. A value: a query takes one and is never affected by a
/// rebuild that finishes while it runs.
struct SearchIndexes: Sendable {
    var countries = CountryIndex([])
    var places = PlaceIndex([])
    var items = ItemIndex([])
    var sources = SourceIndex([])
    var headlines = HeadlineIndex([])
    var flights = FlightIndex([])
    var airlines = AirlineIndex([])
    /// What each index was built from.
    var built: [Dataset: Built] = [:]

    struct Built: Sendable {
        let version: String
        let origin: String
        let records: Int
        let builtAt: Date
        let buildDuration: Duration
    }

    /// One dataset's index, built and ready to install.
    enum Index: Sendable {
        case countries(CountryIndex), places(PlaceIndex), items(ItemIndex), sources(SourceIndex), headlines(HeadlineIndex)
        case flights(FlightIndex), airlines(AirlineIndex)

        /// Builds the index of `content` (the slow part, done before anything is replaced).
        init(_ content: DatasetContent) {
            switch content {
            case .countries(let records): self = .countries(CountryIndex(records))
            case .locations(let records): self = .places(PlaceIndex(records))
            case .items(let records): self = .items(ItemIndex(records))
            case .sources(let records): self = .sources(SourceIndex(records))
            case .headlines(let records): self = .headlines(HeadlineIndex(records))
            case .flights(let records): self = .flights(FlightIndex(records))
            case .airlines(let records): self = .airlines(AirlineIndex(records))
            }
        }
    }

    mutating func install(_ index: Index, built: Built, for dataset: Dataset) {
        switch index {
        case .countries(let index): countries = index
        case .places(let index): places = index
        case .items(let index): items = index
        case .sources(let index): sources = index
        case .headlines(let index): headlines = index
        case .flights(let index): flights = index
        case .airlines(let index): airlines = index
        }
        self.built[dataset] = built
    }
}

/// The current indexes, shared by the queries running at once: a rebuild swaps one
/// dataset's index in a single step.
final class IndexHolder: Sendable {
    private let current = Mutex(SearchIndexes())

    /// The indexes as they are now, for one query.
    var snapshot: SearchIndexes { current.withLock { $0 } }

    /// Builds `content`'s index (without holding anything), then installs it.
    func rebuild(_ content: DatasetContent, version: String, origin: String) {
        let started = ContinuousClock.now
        let index = SearchIndexes.Index(content)
        let built = SearchIndexes.Built(version: version, origin: origin, records: content.count, builtAt: Date(),
                                        buildDuration: ContinuousClock.now - started)
        current.withLock { $0.install(index, built: built, for: content.dataset) }
    }

    func version(of dataset: Dataset) -> String? { current.withLock { $0.built[dataset]?.version } }

    /// Records that the copy with `version` now comes from `origin` (the same bytes, so
    /// no rebuild: the bundled copy confirmed by the fetcher, say).
    func noteOrigin(_ origin: String, of dataset: Dataset, version: String) {
        current.withLock { indexes in
            guard let built = indexes.built[dataset], built.version == version else { return }
            indexes.built[dataset] = SearchIndexes.Built(version: version, origin: origin, records: built.records, builtAt: built.builtAt,
                                           buildDuration: built.buildDuration)
        }
    }
}
