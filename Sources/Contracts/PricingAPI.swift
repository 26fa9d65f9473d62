public import BusProtocol
public import ContractKit

/// `pricing`: round-trip quotes, the current route (kept by the store) and the deals.
public enum PricingAPI {
    public static let service = "pricing"

    public static let routeQuote = Method<Quote, JSONValue>(service, "route.quote", "The price of a round trip: an outbound and a related inbound flight.")
    public static let routeCheapest = Method<NoParams, JSONValue>(service, "route.cheapest", "The cheapest round trip.")
    public static let routeCurrent = Method<NoParams, JSONValue>(service, "route.current", "The chosen route with its current price.")
    public static let routeSelect = Method<Select, JSONValue>(service, "route.select", "Chooses the route (kept by the store) and publishes its price.")
    public static let dealsRollback = Method<Rollback, JSONValue>(service, "deals.rollback", "A Rollback Deal: a random country at a discount (the same seed, the same deal).")
    public static let dealsToday = Method<Today, JSONValue>(service, "deals.today", "The Deal of the Day (date YYYY-MM-DD, default today in UTC).")

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
}
