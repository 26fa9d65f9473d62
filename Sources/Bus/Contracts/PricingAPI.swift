public import BusProtocol
public import ContractKit

/// `pricing`: round-trip quotes, the current route (kept by the store) and the deals.
public enum PricingAPI {
    public static let service = "pricing"

    /// The CHP keys pricing publishes.
    public enum StateKeys {
        public static let routeCurrent = "/pricing/route/current"
        public static let dealToday = "/pricing/deal/today"
    }

    public static let routeQuote = Method<Quote, RouteQuote>(service, "route.quote", "The price of a round trip: an outbound and a related inbound flight.")
    public static let routeCheapest = Method<NoParams, Cheapest>(service, "route.cheapest", "The cheapest round trip.")
    public static let routeCurrent = Method<NoParams, CurrentRoute>(service, "route.current", "The chosen route with its current price.")
    public static let routeSelect = Method<Select, CurrentRoute>(service, "route.select", "Chooses the route (kept by the store) and publishes its price.", changesState: true)
    public static let dealsRollback = Method<Rollback, Deal>(service, "deals.rollback", "A Rollback Deal: a random country at a discount (the same seed, the same deal).")
    public static let dealsToday = Method<Today, Deal>(service, "deals.today", "The Deal of the Day (date YYYY-MM-DD, default today in UTC).")

    public struct Quote: Codable, Sendable {
        public var outboundId: Int
        public var inboundId: Int
        public init(outboundId: Int, inboundId: Int) { (self.outboundId, self.inboundId) = (outboundId, inboundId) }
    }
    public struct Select: Codable, Sendable {
        public var outboundId: Int
        public var inboundId: Int?
        public init(outboundId: Int, inboundId: Int?) { (self.outboundId, self.inboundId) = (outboundId, inboundId) }
    }
    public struct Rollback: Codable, Sendable {
        public var seed: Int64?
        public init(seed: Int64? = nil) { self.seed = seed }
    }
    public struct Today: Codable, Sendable {
        public var date: String?
        public init(date: String? = nil) { self.date = date }
    }

    // MARK: Results (flights as the search service shows them; money as {"amount", "currency"})

    public struct RouteQuote: ResultShape, Sendable {
        public var outbound: JSONValue
        public var inbound: JSONValue
        public var total: JSONValue
        public var flightsVersion: String?
    }
    public struct Cheapest: ResultShape, Sendable {
        public struct Outbound: Codable, Sendable {
            public var outbound: JSONValue
            public var inbound: JSONValue
            public var total: JSONValue
            /// Whether the outbound flight has a related inbound one.
            public var complete: Bool
            public var message: String?
        }
        public struct RoundTrip: Codable, Sendable {
            public var outbound: JSONValue
            public var inbound: JSONValue
            public var total: JSONValue
        }
        public var cheapestOutbound: Outbound?
        public var cheapestRoundTrip: RoundTrip?
    }
    public struct CurrentRoute: ResultShape, Sendable {
        public var outboundId: Int
        public var inboundId: Int?
        public var selectedAt: String?
        /// "priced", "incomplete" or "unavailable".
        public var status: String
        public var outbound: JSONValue
        public var inbound: JSONValue
        public var total: JSONValue
        public var message: String?
        /// True when the route is the cheapest one, chosen on the first start.
        public var firstRun: Bool?
    }
    public struct Deal: ResultShape, Sendable {
        public struct Country: Codable, Sendable {
            public var name: String
            public var code: String
            public var capital: String?
            public var flag: String?
            public var flagEmoji: String?
            public var region: String?
        }
        public var title: String
        /// deals.rollback: the seed that gives this deal again.
        public var seed: Int64?
        /// deals.today: the day.
        public var date: String?
        public var country: Country
        public var discountPercent: Int
        public var message: String
    }
}
