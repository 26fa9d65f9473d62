public import BusProtocol

/// `search`: queries over the service's own copies of the datasets.
public enum SearchAPI {
    public static let service = "search"

    public static let countriesSearch = Method<Countries, CountryResults>(service, "countries.search", "Countries whose name or capital matches (case and accents ignored), best first.")
    public static let locationsSearch = Method<Locations, PlaceResults>(service, "locations.search", "Known places by name, or by distance from 'latitude, longitude'.")
    public static let locationsResolve = Method<Resolve, ResolvedPlace>(service, "locations.resolve", "A place name or coordinates as Wikipedia Places links; adds it to the history.", changesState: true)
    public static let itemsGrouped = Method<Items, GroupedItems>(service, "items.grouped", "The hiring list: named items grouped by list, sorted by name.")
    /// `items.grouped` in parts: each part is a run of up to ``GroupedItems/itemsPerPart``
    /// items of one group (a big group comes in several, `count` its whole size), in the
    /// order of the one reply; the end is the answer with no groups (order, total, dropped).
    public static let itemsGroupedStream = StreamMethod(itemsGrouped, part: GroupedItems.Group.self) { end, parts in
        var whole = end
        for part in parts {
            if let last = whole.groups.indices.last, whole.groups[last].listId == part.listId {
                whole.groups[last].items += part.items
            } else {
                whole.groups.append(part)
            }
        }
        return whole
    }
    public static let sourcesList = Method<Sources, SourceList>(service, "sources.list", "News sources (English by default; language 'all'), marking the selected ones.")
    public static let headlinesList = Method<Headlines, HeadlinePage>(service, "headlines.list", "Headlines from the given or selected sources, newest first, a page at a time.")
    public static let flightsList = Method<Flights, FlightList>(service, "flights.list", "Outbound and inbound flights, each with its airline.")
    public static let airlinesGet = Method<Airline, AirlineFlights>(service, "airlines.get", "One airline by id, with its flights' ids.")
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

    public struct CountryResults: Codable, Sendable {
        public var query: String
        public var region: String?
        public var total: Int
        public var offset: Int
        public var limit: Int
        public var countries: [FoundCountry]
        public init(query: String, region: String?, total: Int, offset: Int, limit: Int, countries: [FoundCountry]) {
            (self.query, self.region, self.total, self.offset, self.limit, self.countries) = (query, region, total, offset, limit, countries)
        }
    }
    /// What of a country matched the query, best first: the start of its name, the start of
    /// its capital, or another part of either.
    public enum CountryMatch: String, Codable, Sendable, CaseIterable, SchemaDescribed { case name, capital, other }
    /// A country countries.search found: the record's fields and `match` (absent without a query).
    public struct FoundCountry: Codable, Sendable {
        public var country: Country
        public var match: CountryMatch?
        /// The country's fields as JSON, made once when the search index was built: an answer
        /// copies them instead of encoding every country again. Not part of the value.
        private let fields: [String: JSONValue]?
        public init(_ country: Country, match: CountryMatch?, fields: [String: JSONValue]? = nil) {
            (self.country, self.match, self.fields) = (country, match, fields)
        }
        private enum Keys: String, CodingKey { case match }
        public init(from decoder: any Decoder) throws {
            country = try Country(from: decoder)
            match = try decoder.container(keyedBy: Keys.self).decodeIfPresent(CountryMatch.self, forKey: .match)
            fields = nil
        }
        public func encode(to encoder: any Encoder) throws {
            if var fields {
                fields["match"] = match.map { .string($0.rawValue) }
                var container = encoder.singleValueContainer()
                try container.encode(JSONValue.object(fields))
                return
            }
            try country.encode(to: encoder)
            var container = encoder.container(keyedBy: Keys.self)
            try container.encodeIfPresent(match, forKey: .match)
        }
    }
    public struct Place: Codable, Sendable {
        public var name: String?
        public var label: String
        public var latitude: Double
        public var longitude: Double
        public var distanceKm: Double?
        public init(name: String?, label: String, latitude: Double, longitude: Double, distanceKm: Double? = nil) {
            (self.name, self.label, self.latitude, self.longitude, self.distanceKm) = (name, label, latitude, longitude, distanceKm)
        }
    }
    public struct PlaceResults: Codable, Sendable {
        public var query: String
        /// "name" or "coordinates".
        public var kind: String
        public var total: Int
        public var offset: Int
        public var places: [Place]
        public init(query: String, kind: String, total: Int, offset: Int, places: [Place]) {
            (self.query, self.kind, self.total, self.offset, self.places) = (query, kind, total, offset, places)
        }
    }
    public struct ResolvedPlace: Codable, Sendable {
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
        public init(query: String, kind: String, name: String?, label: String, latitude: Double, longitude: Double, nearest: Place?,
                    deepLink: String, webLink: String, historyRecorded: Bool, historyProblem: String?) {
            (self.query, self.kind, self.name, self.label, self.latitude, self.longitude, self.nearest) = (query, kind, name, label, latitude, longitude, nearest)
            (self.deepLink, self.webLink, self.historyRecorded, self.historyProblem) = (deepLink, webLink, historyRecorded, historyProblem)
        }
    }
    public struct GroupedItems: Codable, Sendable {
        public struct Group: Codable, Sendable {
            public struct Item: Codable, Sendable {
                public var id: Int
                public var listId: Int
                public var name: String
                public init(id: Int, listId: Int, name: String) { (self.id, self.listId, self.name) = (id, listId, name) }
            }
            public var listId: Int
            public var count: Int
            public var items: [Item]
            public init(listId: Int, count: Int, items: [Item]) { (self.listId, self.count, self.items) = (listId, count, items) }
        }
        /// The most items one part of ``SearchAPI/itemsGroupedStream`` carries.
        public static let itemsPerPart = 1_000
        public var order: String
        public var total: Int
        /// Items left out for having no name: of the list asked for, or of all.
        public var dropped: Int
        public var groups: [Group]
        public init(order: String, total: Int, dropped: Int, groups: [Group]) {
            (self.order, self.total, self.dropped, self.groups) = (order, total, dropped, groups)
        }
    }
    public struct SourceList: Codable, Sendable {
        public var language: String
        public var category: String?
        public var total: Int
        public var selected: [String]
        public var sources: [ListedSource]
        public init(language: String, category: String?, total: Int, selected: [String], sources: [ListedSource]) {
            (self.language, self.category, self.total, self.selected, self.sources) = (language, category, total, selected, sources)
        }
    }
    public struct HeadlinePage: Codable, Sendable {
        /// "ok", "no-sources-selected" or "no-results".
        public var status: String
        public var message: String?
        public var sources: [String]
        public var unknownSources: [String]
        public var total: Int
        public var page: Int
        public var pageSize: Int
        public var hasMore: Bool
        /// Never a removed one.
        public var articles: [Article]
        public init(status: String, message: String?, sources: [String], unknownSources: [String], total: Int, page: Int, pageSize: Int,
                    hasMore: Bool, articles: [Article]) {
            (self.status, self.message, self.sources, self.unknownSources, self.total) = (status, message, sources, unknownSources, total)
            (self.page, self.pageSize, self.hasMore, self.articles) = (page, pageSize, hasMore, articles)
        }
    }
    public struct FlightList: Codable, Sendable {
        /// Absent when only the other direction was asked for.
        public var outbound: [ListedFlight]?
        public var inbound: [ListedFlight]?
        /// Airline ids of flights that the airlines dataset does not know.
        public var unknownAirlines: [String]
        public init(outbound: [ListedFlight]?, inbound: [ListedFlight]?, unknownAirlines: [String]) {
            (self.outbound, self.inbound, self.unknownAirlines) = (outbound, inbound, unknownAirlines)
        }
    }
    /// A flight joined with its airline.
    public struct ListedFlight: Codable, Sendable {
        public var id: Int
        public var direction: Flight.Direction
        public var airlineId: String
        /// Absent when the airlines dataset does not know `airlineId`.
        public var airline: Contracts.Airline?
        public var departureAirportCode: String
        public var arrivalAirportCode: String
        public var price: Money
        public init(_ flight: Flight, airline: Contracts.Airline?) {
            (id, direction, airlineId, self.airline) = (flight.id, flight.direction, flight.airline, airline)
            (departureAirportCode, arrivalAirportCode, price) = (flight.departureAirportCode, flight.arrivalAirportCode, flight.fare)
        }
    }
    /// A news source with whether it is selected: the record's fields and `selected`.
    public struct ListedSource: Codable, Sendable {
        public var source: NewsSource
        public var selected: Bool
        public init(_ source: NewsSource, selected: Bool) { (self.source, self.selected) = (source, selected) }
        private enum Keys: String, CodingKey { case selected }
        public init(from decoder: any Decoder) throws {
            source = try NewsSource(from: decoder)
            selected = try decoder.container(keyedBy: Keys.self).decode(Bool.self, forKey: .selected)
        }
        public func encode(to encoder: any Encoder) throws {
            try source.encode(to: encoder)
            var container = encoder.container(keyedBy: Keys.self)
            try container.encode(selected, forKey: .selected)
        }
    }
    /// An airline with the ids of its flights: the record's fields and `flights`.
    public struct AirlineFlights: Codable, Sendable {
        public var airline: Contracts.Airline
        public var flights: [Int]
        public init(_ airline: Contracts.Airline, flights: [Int]) { (self.airline, self.flights) = (airline, flights) }
        private enum Keys: String, CodingKey { case flights }
        public init(from decoder: any Decoder) throws {
            airline = try Contracts.Airline(from: decoder)
            flights = try decoder.container(keyedBy: Keys.self).decode([Int].self, forKey: .flights)
        }
        public func encode(to encoder: any Encoder) throws {
            try airline.encode(to: encoder)
            var container = encoder.container(keyedBy: Keys.self)
            try container.encode(flights, forKey: .flights)
        }
    }
    public struct IndexEntry: Codable, Sendable {
        public var name: String
        public var version: String?
        public var origin: String?
        public var records: Int?
        public var builtAt: String?
        public var buildMs: Double?
        public init(name: String, version: String? = nil, origin: String? = nil, records: Int? = nil, builtAt: String? = nil, buildMs: Double? = nil) {
            (self.name, self.version, self.origin, self.records, self.builtAt, self.buildMs) = (name, version, origin, records, builtAt, buildMs)
        }
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
