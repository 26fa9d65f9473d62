import BusProtocol
import Catalog
import Contracts

/// The flights as pricing sees them: outbound and inbound by id, which inbound flights
/// return from which outbound ones, and the prices of round trips.
///
/// An inbound flight is related to an outbound one when it flies the reverse leg: it
/// departs from the outbound's arrival airport and arrives at the outbound's departure.
struct RouteBook: Sendable {
    let outbound: [Int: Flight]
    let inbound: [Int: Flight]

    init(_ flights: [Flight]) {
        outbound = Dictionary(flights.filter { $0.direction == .outbound }.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        inbound = Dictionary(flights.filter { $0.direction == .inbound }.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
    }

    static func isRelated(outbound: Flight, inbound: Flight) -> Bool {
        inbound.departureAirportCode == outbound.arrivalAirportCode && inbound.arrivalAirportCode == outbound.departureAirportCode
    }

    /// The inbound flights that return from `outbound`, cheapest first (ties by id).
    func related(to outbound: Flight) -> [Flight] {
        inbound.values.filter { Self.isRelated(outbound: outbound, inbound: $0) }.sorted(by: Self.cheaper)
    }

    static func cheaper(_ a: Flight, _ b: Flight) -> Bool { a.price != b.price ? a.price < b.price : a.id < b.id }

    /// The outbound flight `id`, or -32003 naming the field.
    func outboundFlight(_ id: Int) throws(JSONRPCError) -> Flight {
        guard let flight = outbound[id] else {
            let hint = inbound[id] != nil ? " (\(id) is an inbound flight)" : ""
            throw JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: no outbound flight has id \(id)\(hint)",
                               data: ["field": "outboundId"])
        }
        return flight
    }

    /// The inbound flight `id`, or -32003 naming the field.
    func inboundFlight(_ id: Int) throws(JSONRPCError) -> Flight {
        guard let flight = inbound[id] else {
            let hint = outbound[id] != nil ? " (\(id) is an outbound flight)" : ""
            throw JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: no inbound flight has id \(id)\(hint)",
                               data: ["field": "inboundId"])
        }
        return flight
    }

    /// The round trip `outboundId` + `inboundId` priced; -32003 for an unknown id, -32004
    /// when the inbound flight does not return from the outbound one.
    func quote(outboundId: Int, inboundId: Int) throws(JSONRPCError) -> Quote {
        let outbound = try outboundFlight(outboundId)
        let inbound = try inboundFlight(inboundId)
        guard Self.isRelated(outbound: outbound, inbound: inbound) else {
            let related = self.related(to: outbound).map(\.id).sorted()
            let choice = related.isEmpty ? "it has no related inbound flight" : "its related inbound flights: \(related.map(String.init).joined(separator: ", "))"
            throw JSONRPCError(code: JSONRPCError.conflictCode,
                               message: "Conflict: inbound \(inbound.id) (\(inbound.leg)) does not fly the reverse of outbound \(outbound.id) (\(outbound.leg)); \(choice)",
                               data: ["field": "inboundId", "related": .array(related.map { .int(Int64($0)) })])
        }
        return Quote(outbound: outbound, inbound: inbound)
    }

    /// The cheapest outbound flight (ties by id) with its cheapest related inbound (nil
    /// when there is none); nil when there are no outbound flights.
    func cheapestOutbound() -> Quote? {
        guard let outbound = outbound.values.min(by: Self.cheaper) else { return nil }
        return Quote(outbound: outbound, inbound: related(to: outbound).first)
    }

    /// The cheapest complete round trip over every related pair (ties by outbound id, then
    /// inbound id); nil when no pair is related.
    func cheapestRoundTrip() -> Quote? {
        var best: Quote?
        for outbound in outbound.values.sorted(by: { $0.id < $1.id }) {
            guard let inbound = related(to: outbound).first else { continue }
            let quote = Quote(outbound: outbound, inbound: inbound)
            if let current = best, let total = quote.total, let bestTotal = current.total, total.amount >= bestTotal.amount { continue }
            best = quote
        }
        return best
    }
}

/// A priced route: an outbound flight, perhaps with an inbound one, and the total when
/// both are there.
struct Quote: Sendable, Equatable {
    let outbound: Flight
    let inbound: Flight?

    var total: Money? { inbound.flatMap { outbound.fare.adding($0.fare) } }
}

extension Flight {
    /// `BCN→AMS`.
    var leg: String { "\(departureAirportCode)→\(arrivalAirportCode)" }

    /// As pricing's answers show it.
    var priced: PricingAPI.PricedFlight {
        PricingAPI.PricedFlight(id: id, direction: direction.rawValue, airline: airline, departureAirportCode: departureAirportCode,
                                arrivalAirportCode: arrivalAirportCode, price: fare)
    }
}
