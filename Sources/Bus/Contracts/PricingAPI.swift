import BusProtocol
import Foundation

/// `pricing`: round-trip quotes, the current route (kept by the store) and the deals.
public enum PricingAPI {
    public static let service = "pricing"

    /// The CHP keys pricing publishes.
    public enum StateKeys {
        public static let routeCurrent = "/pricing/route/current"
        public static let dealToday = "/pricing/deal/today"
    }

    /// The stream (of the `streams` service) that keeps every published price of the chosen
    /// route, ``StateKeys/routeCurrent``'s changes: the bundled configuration has it capture
    /// `/pricing/route/` (`streams.capture`), and `sb flights history` reads it.
    public static let routeHistoryStream = "route-prices"

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
        /// Compare-and-set: the route's revision the chooser saw (``CurrentRoute/revision``; 0:
        /// none chosen yet). Chosen meanwhile by someone else: -32004 with the winner priced in
        /// `data.current`, nothing changed.
        public var revision: Int?
        public init(outboundId: Int, inboundId: Int?, revision: Int? = nil) {
            (self.outboundId, self.inboundId, self.revision) = (outboundId, inboundId, revision)
        }
    }
    public struct Rollback: Codable, Sendable {
        public var seed: Int64?
        public init(seed: Int64? = nil) { self.seed = seed }
    }
    public struct Today: Codable, Sendable {
        public var date: String?
        public init(date: String? = nil) { self.date = date }
    }

    // MARK: Results (money as {"amount", "currency"}, the amount a decimal string)

    /// A flight as pricing shows it, with its fare.
    public struct PricedFlight: Codable, Sendable, Equatable {
        public var id: Int
        /// "outbound" or "inbound".
        public var direction: String
        /// The airline's id in the airlines dataset.
        public var airline: String
        public var departureAirportCode: String
        public var arrivalAirportCode: String
        public var price: Money
        public init(id: Int, direction: String, airline: String, departureAirportCode: String, arrivalAirportCode: String, price: Money) {
            (self.id, self.direction, self.airline, self.departureAirportCode, self.arrivalAirportCode, self.price)
                = (id, direction, airline, departureAirportCode, arrivalAirportCode, price)
        }
    }
    public struct RouteQuote: Codable, Sendable {
        public var outbound: PricedFlight
        public var inbound: PricedFlight?
        /// Absent unless both flights are there (in one currency).
        public var total: Money?
        public var flightsVersion: String?
        public init(outbound: PricedFlight, inbound: PricedFlight?, total: Money?, flightsVersion: String?) {
            (self.outbound, self.inbound, self.total, self.flightsVersion) = (outbound, inbound, total, flightsVersion)
        }
    }
    public struct Cheapest: Codable, Sendable {
        public struct Outbound: Codable, Sendable {
            public var outbound: PricedFlight
            public var inbound: PricedFlight?
            public var total: Money?
            /// Whether the outbound flight has a related inbound one.
            public var complete: Bool
            public var message: String?
            public init(outbound: PricedFlight, inbound: PricedFlight?, total: Money?, complete: Bool, message: String?) {
                (self.outbound, self.inbound, self.total, self.complete, self.message) = (outbound, inbound, total, complete, message)
            }
        }
        public struct RoundTrip: Codable, Sendable {
            public var outbound: PricedFlight
            public var inbound: PricedFlight
            public var total: Money?
            public init(outbound: PricedFlight, inbound: PricedFlight, total: Money?) {
                (self.outbound, self.inbound, self.total) = (outbound, inbound, total)
            }
        }
        public var cheapestOutbound: Outbound?
        public var cheapestRoundTrip: RoundTrip?
        public init(cheapestOutbound: Outbound?, cheapestRoundTrip: RoundTrip?) {
            (self.cheapestOutbound, self.cheapestRoundTrip) = (cheapestOutbound, cheapestRoundTrip)
        }
    }
    /// The chosen route priced now; also the value published at ``StateKeys/routeCurrent``
    /// (there with `previousTotal` and `pricedAt`).
    public struct CurrentRoute: Codable, Sendable, Equatable {
        public var outboundId: Int
        public var inboundId: Int?
        public var selectedAt: String?
        /// Counts the choices made: what `route.select` takes to change it only if nobody else did.
        public var revision: Int?
        /// "priced", "incomplete" or "unavailable".
        public var status: String
        public var outbound: PricedFlight?
        public var inbound: PricedFlight?
        public var total: Money?
        public var message: String?
        /// True when the route is the cheapest one, chosen on the first start.
        public var firstRun: Bool?
        /// The total before the last change (published value only).
        public var previousTotal: Money?
        /// When it was priced (published value only).
        public var pricedAt: String?
        public init(outboundId: Int, inboundId: Int?, selectedAt: String?, status: String, outbound: PricedFlight?, inbound: PricedFlight?,
                    total: Money?, message: String?, firstRun: Bool? = nil, previousTotal: Money? = nil, pricedAt: String? = nil, revision: Int? = nil) {
            (self.outboundId, self.inboundId, self.selectedAt, self.status, self.outbound, self.inbound, self.total, self.message)
                = (outboundId, inboundId, selectedAt, status, outbound, inbound, total, message)
            self.revision = revision
            (self.firstRun, self.previousTotal, self.pricedAt) = (firstRun, previousTotal, pricedAt)
        }
    }
    public struct Deal: Codable, Sendable, Equatable {
        public struct Country: Codable, Sendable, Equatable {
            public var name: String
            public var code: String
            public var capital: String?
            public var flag: String?
            public var flagEmoji: String?
            public var region: String?
            public init(name: String, code: String, capital: String?, flag: String?, flagEmoji: String?, region: String?) {
                (self.name, self.code, self.capital, self.flag, self.flagEmoji, self.region) = (name, code, capital, flag, flagEmoji, region)
            }
        }
        public var title: String
        /// deals.rollback: the seed that gives this deal again.
        public var seed: Int64?
        /// deals.today: the day.
        public var date: String?
        public var country: Country
        public var discountPercent: Int
        public var message: String
        public init(title: String, seed: Int64? = nil, date: String? = nil, country: Country, discountPercent: Int, message: String) {
            (self.title, self.seed, self.date, self.country, self.discountPercent, self.message) = (title, seed, date, country, discountPercent, message)
        }
    }
}
