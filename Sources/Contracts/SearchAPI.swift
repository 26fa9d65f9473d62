public import BusProtocol
public import ContractKit

/// `search`: queries over the service's own copies of the datasets.
public enum SearchAPI {
    public static let service = "search"

    public static let countriesSearch = Method<Countries, JSONValue>(service, "countries.search", "Countries whose name or capital matches (case and accents ignored), best first.")
    public static let locationsSearch = Method<Locations, JSONValue>(service, "locations.search", "Known places by name, or by distance from 'latitude, longitude'.")
    public static let locationsResolve = Method<Resolve, JSONValue>(service, "locations.resolve", "A place name or coordinates as Wikipedia Places links; adds it to the history.")
    public static let itemsGrouped = Method<Items, JSONValue>(service, "items.grouped", "The hiring list: named items grouped by list, sorted by name.")
    public static let sourcesList = Method<Sources, JSONValue>(service, "sources.list", "News sources (English by default; language 'all'), marking the selected ones.")
    public static let headlinesList = Method<Headlines, JSONValue>(service, "headlines.list", "Headlines from the given or selected sources, newest first, a page at a time.")
    public static let flightsList = Method<Flights, JSONValue>(service, "flights.list", "Outbound and inbound flights, each with its airline.")
    public static let airlinesGet = Method<Airline, JSONValue>(service, "airlines.get", "One airline by id.")
    public static let indexesList = Method<NoParams, JSONValue>(service, "indexes.list", "The datasets indexed, with their versions and origins.")

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
        /// "lexical" (the apps' order) or "natural" (numbers by value).
        public var order: String?
        public var listId: Int?
        public init(order: String? = nil, listId: Int? = nil) { (self.order, self.listId) = (order, listId) }
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
        /// "outbound" or "inbound"; both when absent.
        public var direction: String?
        public init(direction: String? = nil) { self.direction = direction }
    }
    public struct Airline: Codable, Sendable {
        public var id: String
        public init(id: String) { self.id = id }
    }
}
