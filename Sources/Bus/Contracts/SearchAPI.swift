public import BusProtocol
public import ContractKit

/// `search`: queries over the service's own copies of the datasets.
public enum SearchAPI {
    public static let service = "search"

    public static let countriesSearch = Method<Countries, CountryResults>(service, "countries.search", "Countries whose name or capital matches (case and accents ignored), best first.")
    public static let locationsSearch = Method<Locations, PlaceResults>(service, "locations.search", "Known places by name, or by distance from 'latitude, longitude'.")
    public static let locationsResolve = Method<Resolve, ResolvedPlace>(service, "locations.resolve", "A place name or coordinates as Wikipedia Places links; adds it to the history.", changesState: true)
    public static let itemsGrouped = Method<Items, GroupedItems>(service, "items.grouped", "The hiring list: named items grouped by list, sorted by name.")
    public static let sourcesList = Method<Sources, SourceList>(service, "sources.list", "News sources (English by default; language 'all'), marking the selected ones.")
    public static let headlinesList = Method<Headlines, HeadlinePage>(service, "headlines.list", "Headlines from the given or selected sources, newest first, a page at a time.")
    public static let flightsList = Method<Flights, FlightList>(service, "flights.list", "Outbound and inbound flights, each with its airline.")
    public static let airlinesGet = Method<Airline, JSONValue>(service, "airlines.get", "One airline by id.")
    public static let indexesList = Method<NoParams, [IndexEntry]>(service, "indexes.list", "The datasets indexed, with their versions and origins.")

    public struct Countries: Codable, Sendable {
        public var query: String?
        public var region: String?
        public var offset: Int?
        public var limit: Int?
        public init(query: String? = nil, region: String? = nil, offset: Int? = nil, limit: Int? = nil) {
            (self.query, self.region, self.offset, self.limit) = (query, region, offset, limit)
        }
    }
    public struct Locations: Codable, Sendable {
        public var query: String?
        public var offset: Int?
        public var limit: Int?
        public init(query: String? = nil, offset: Int? = nil, limit: Int? = nil) { (self.query, self.offset, self.limit) = (query, offset, limit) }
    }
    public struct Resolve: Codable, Sendable {
        public var query: String
        public init(query: String) { self.query = query }
    }
    public struct Items: Codable, Sendable {
        public enum Order: String, Codable, Sendable, CaseIterable, SchemaDescribed {
            /// The apps' order: "Item 1", "Item 100", "Item 2".
            case lexical
            /// Numbers in names by value: "Item 1", "Item 2", "Item 100".
            case natural
        }
        /// Lexical when absent.
        public var order: Order?
        public var listId: Int?
        public init(order: Order? = nil, listId: Int? = nil) { (self.order, self.listId) = (order, listId) }
    }
    public struct Sources: Codable, Sendable {
        public var language: String?
        public var category: String?
        public init(language: String? = nil, category: String? = nil) { (self.language, self.category) = (language, category) }
    }
    public struct Headlines: Codable, Sendable {
        public var sources: [String]?
        public var page: Int?
        public var pageSize: Int?
        public init(sources: [String]? = nil, page: Int? = nil, pageSize: Int? = nil) { (self.sources, self.page, self.pageSize) = (sources, page, pageSize) }
    }
    public struct Flights: Codable, Sendable {
        public enum Direction: String, Codable, Sendable, CaseIterable, SchemaDescribed { case outbound, inbound }
        /// Both when absent.
        public var direction: Direction?
        public init(direction: Direction? = nil) { self.direction = direction }
    }
    public struct Airline: Codable, Sendable {
        public var id: String
        public init(id: String) { self.id = id }
    }

    // MARK: Results (records of the datasets are objects as the fetcher normalises them)

    public struct CountryResults: ResultShape, Sendable {
        public var query: String
        public var region: String?
        public var total: Int
        public var offset: Int
        public var limit: Int
        /// Countries, each with `match` when a capital or alternative name matched.
        public var countries: [JSONValue]
    }
    public struct Place: Codable, Sendable {
        public var name: String?
        public var label: String
        public var latitude: Double
        public var longitude: Double
        public var distanceKm: Double?
    }
    public struct PlaceResults: ResultShape, Sendable {
        public var query: String
        /// "name" or "coordinates".
        public var kind: String
        public var total: Int
        public var offset: Int
        public var places: [Place]
    }
    public struct ResolvedPlace: ResultShape, Sendable {
        public var query: String
        public var kind: String
        public var name: String?
        public var label: String
        public var latitude: Double
        public var longitude: Double
        public var nearest: Place?
        public var deepLink: String
        public var webLink: String
        public var historyRecorded: Bool
        public var historyProblem: String?
    }
    public struct GroupedItems: ResultShape, Sendable {
        public struct Group: Codable, Sendable {
            public struct Item: Codable, Sendable {
                public var id: Int
                public var listId: Int
                public var name: String
            }
            public var listId: Int
            public var count: Int
            public var items: [Item]
        }
        public var order: String
        public var total: Int
        /// Items left out for having no name.
        public var dropped: Int
        public var groups: [Group]
    }
    public struct SourceList: ResultShape, Sendable {
        public var language: String
        public var category: String?
        public var total: Int
        public var selected: [String]
        /// Sources, each with `selected`.
        public var sources: [JSONValue]
    }
    public struct HeadlinePage: ResultShape, Sendable {
        /// "ok", "no-sources-selected" or "no-results".
        public var status: String
        public var message: String?
        public var sources: [String]
        public var unknownSources: [String]
        public var total: Int
        public var page: Int
        public var pageSize: Int
        public var hasMore: Bool
        public var articles: [JSONValue]
    }
    public struct FlightList: ResultShape, Sendable {
        public var outbound: [JSONValue]?
        public var inbound: [JSONValue]?
        public var unknownAirlines: [String]
    }
    public struct IndexEntry: Codable, Sendable {
        public var name: String
        public var version: String?
        public var origin: String?
        public var records: Int?
        public var builtAt: String?
        public var buildMs: Double?
    }
}

extension SearchAPI.Countries: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["offset": Ranges.offset, "limit": 1...1_000]
}

extension SearchAPI.Locations: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["offset": Ranges.offset, "limit": 1...1_000]
}

extension SearchAPI.Headlines: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["page": 1...1_000_000, "pageSize": 1...100]
}
