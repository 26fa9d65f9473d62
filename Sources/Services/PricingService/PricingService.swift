public import BusKit
import BusProtocol
public import Catalog
import CatalogFeed
import Foundation
public import Logging
import Synchronization
public import Contracts

/// The `pricing` service: round-trip quotes, the cheapest route, the current route (kept by
/// the store, so it survives restarts) and the countries app's deals.
///
/// It holds its own copies of the flights and countries, bundled at start and then as the
/// fetcher announces them. When the flights change, the current route is priced again and
/// `/pricing/route/current` is published with the old and the new price. The deal of the
/// day is published as `/pricing/deal/today` at start and at each midnight (UTC).
public actor PricingService: BusService, ServiceWork {
    public static let name = PricingAPI.service

    let logger: Logger
    let busTimeout: Duration
    private var book = RouteBook([])
    private var deals = DealMaker([])
    /// The versions of the copies held, readable without waiting for the actor.
    private nonisolated let versions = Mutex<[Dataset: String]>([:])

    private var client: BusClient?
    private var publisher: StatePublisher?
    /// The selection last read from or written to the store.
    private var knownSelection: Selection?
    /// What `/pricing/route/current` and `/pricing/deal/today` last carried.
    private var publishedRoute: RoutePrice?
    private var publishedDeal: PricingAPI.Deal?
    /// The value `/pricing/route/current` was last asked to hold.
    private var routeValue: JSONValue?

    private let catalog: Subscription?

    /// Loads the bundled flights and countries, so the service answers from the first
    /// request. `client` reaches the store, `publisher` publishes `/pricing/*`, `catalog`
    /// follows `/catalog/` (all nil: a service off the bus, for tests).
    public init(logger: Logger? = nil, busTimeout: Duration = .seconds(5), client: BusClient? = nil, publisher: StatePublisher? = nil,
                catalog: Subscription? = nil) {
        self.logger = logger ?? Logger(label: "switchboard.pricing")
        self.busTimeout = busTimeout
        self.client = client
        self.publisher = publisher
        self.catalog = catalog
        for dataset in [Dataset.flights, .countries] {
            do {
                let copy = try dataset.bundledCopy()
                switch copy.decoded.content {
                case .flights(let flights): book = RouteBook(flights)
                case .countries(let countries): deals = DealMaker(countries)
                default: break
                }
                versions.withLock { $0[dataset] = copy.version }
            } catch {
                self.logger.error("bundled copy unusable", metadata: ["dataset": "\(dataset)", "problem": "\(error)"])
            }
        }
    }

    /// Starts working on the bus: follows the catalog, settles the current route (storing the
    /// cheapest on first run) and publishes it with the deal of the day, then the deal at
    /// each day change.
    public func work() async {
        guard let client, let catalog else { return }
        let follower = CatalogFollower(datasets: [.flights, .countries], client: client, timeout: busTimeout, logger: logger,
                                       currentVersion: { [weak self] dataset in self?.version(of: dataset) },
                                       install: { [weak self] content, version, _ in await self?.load(content, version: version) })
        await withDiscardingTaskGroup { group in
            group.addTask { await follower.follow(catalog) }
            group.addTask { await self.settleCurrentRoute() }
            group.addTask {
                await self.publishDealOfTheDay()
                while !Task.isCancelled {
                    try? await Task.sleep(for: Day.untilNextDay())
                    await self.publishDealOfTheDay()
                }
            }
        }
    }

    /// The version of the copy of `dataset` held now.
    nonisolated func version(of dataset: Dataset) -> String? { versions.withLock { $0[dataset] } }

    /// Takes a new copy of the flights or the countries; re-prices the current route or
    /// re-publishes the deal of the day as needed. (Also for tests without a fetcher.)
    public func load(_ content: DatasetContent, version: String) async {
        switch content {
        case .flights(let flights):
            book = RouteBook(flights)
            versions.withLock { $0[.flights] = version }
            await repriceCurrentRoute()
        case .countries(let countries):
            deals = DealMaker(countries)
            versions.withLock { $0[.countries] = version }
            await publishDealOfTheDay()
        default:
            break
        }
    }

    // MARK: Methods


    public nonisolated func methods(_ table: inout MethodTable<PricingService>) {
        table.on(PricingAPI.routeQuote) { pricing, params in
            try await pricing.quote(params)
        }
        table.on(PricingAPI.routeCheapest) { pricing, _ in await pricing.cheapest() }
        table.on(PricingAPI.routeCurrent) { pricing, _ in try await pricing.current() }
        table.on(PricingAPI.routeSelect) { pricing, params in try await pricing.select(params) }
        table.on(PricingAPI.dealsRollback) { pricing, params in try await pricing.rollback(params) }
        table.on(PricingAPI.dealsToday) { pricing, params in try await pricing.today(params) }
    }

    func quote(_ params: PricingAPI.Quote) throws -> PricingAPI.RouteQuote {
        let quote = try book.quote(outboundId: params.outboundId, inboundId: params.inboundId)
        return PricingAPI.RouteQuote(outbound: quote.outbound.priced, inbound: quote.inbound?.priced, total: quote.total,
                                     flightsVersion: version(of: .flights))
    }

    func cheapest() -> PricingAPI.Cheapest {
        let first = book.cheapestOutbound().map { quote in
            PricingAPI.Cheapest.Outbound(
                outbound: quote.outbound.priced, inbound: quote.inbound?.priced, total: quote.total, complete: quote.inbound != nil,
                message: quote.inbound != nil ? nil
                    : "outbound \(quote.outbound.id) (\(quote.outbound.leg)) has no related inbound flight, so no round trip and no total")
        }
        let trip = book.cheapestRoundTrip().flatMap { quote in
            quote.inbound.map { PricingAPI.Cheapest.RoundTrip(outbound: quote.outbound.priced, inbound: $0.priced, total: quote.total) }
        }
        return PricingAPI.Cheapest(cheapestOutbound: first, cheapestRoundTrip: trip)
    }

    func current() async throws -> PricingAPI.CurrentRoute {
        let stored = try await store(StoreAPI.routeSelected, NoParams(), for: "the current route")
        var firstRun = false
        let selection: Selection
        if let found = stored.map(Selection.init) {
            selection = found
        } else {
            // First run: the cheapest outbound with its cheapest related inbound becomes the route.
            guard let cheapest = book.cheapestOutbound() else {
                throw JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: no route is stored and there are no outbound flights to choose one from")
            }
            selection = try await storeSelection(outboundId: cheapest.outbound.id, inboundId: cheapest.inbound?.id, for: "storing the first route")
            firstRun = true
        }
        knownSelection = selection
        let priced = price(selection)
        await publish(priced)
        var answer = priced.route
        answer.firstRun = firstRun
        return answer
    }

    func select(_ params: PricingAPI.Select) async throws -> PricingAPI.CurrentRoute {
        // Validate before storing: unknown ids -32003, an unrelated pair -32004.
        if let inboundId = params.inboundId {
            _ = try book.quote(outboundId: params.outboundId, inboundId: inboundId)
        } else {
            _ = try book.outboundFlight(params.outboundId)
        }
        let selection: Selection
        do {
            selection = try await storeSelection(outboundId: params.outboundId, inboundId: params.inboundId, revision: params.revision, for: "storing the route")
        } catch let error as JSONRPCError where error.code == JSONRPCError.conflictCode {
            // Someone chose first: say who won, priced, and change nothing.
            guard let current = error.data?["current"], !current.isNull,
                  let stored = try? decodeResult(StoreAPI.RouteSelection.self, current) else { throw error }
            let winner = price(Selection(stored))
            throw JSONRPCError(code: JSONRPCError.conflictCode,
                               message: "Conflict: the route was chosen meanwhile (outbound \(stored.outboundId)\(stored.inboundId.map { ", inbound \($0)" } ?? ""), revision \(stored.revision)); choose again to replace it",
                               data: ["revision": .int(Int64(stored.revision)), "expected": .int(Int64(params.revision ?? 0)),
                                      "current": (try? JSONValue(encoding: winner.route)) ?? .null])
        }
        knownSelection = selection
        let priced = price(selection)
        await publish(priced)
        return priced.route
    }

    func rollback(_ params: PricingAPI.Rollback) throws -> PricingAPI.Deal {
        let seed = params.seed ?? Int64.random(in: 0...Int64.max)
        guard let deal = deals.deal(seed: UInt64(bitPattern: seed)) else { throw noCountries() }
        return deal.answer(title: "Rollback Deal", seed: seed)
    }

    func today(_ params: PricingAPI.Today) throws -> PricingAPI.Deal {
        let date: String
        if let given = params.date {
            guard let valid = Day.parse(given) else {
                throw JSONRPCError.invalidParams(field: "date", "must be a calendar date written YYYY-MM-DD, not '\(given)'")
            }
            date = valid
        } else {
            date = Day.text(Date())
        }
        guard let deal = deals.deal(seed: DealMaker.seed(forDay: date)) else { throw noCountries() }
        return deal.answer(title: "Deal of the Day!", date: date)
    }

    private func noCountries() -> JSONRPCError {
        JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: there are no countries to make a deal with")
    }

    // MARK: The current route

    /// A stored route: the flight ids and when they were chosen.
    struct Selection: Sendable, Equatable {
        let outboundId: Int
        let inboundId: Int?
        let selectedAt: String?
        let revision: Int

        /// From the store's `route.selected` / `route.select` answer.
        init(_ stored: StoreAPI.RouteSelection) {
            outboundId = stored.outboundId
            inboundId = stored.inboundId
            selectedAt = stored.selectedAt
            revision = stored.revision
        }
    }

    /// A route with its price now, or why it has none.
    struct RoutePrice: Sendable, Equatable {
        enum Status: String, Sendable { case priced, incomplete, unavailable }
        let selection: Selection
        let status: Status
        let quote: Quote?
        let message: String?

        var total: Money? { quote?.total }

        /// As `route.current` answers it.
        var route: PricingAPI.CurrentRoute {
            PricingAPI.CurrentRoute(outboundId: selection.outboundId, inboundId: selection.inboundId, selectedAt: selection.selectedAt,
                                    status: status.rawValue, outbound: quote?.outbound.priced, inbound: quote?.inbound?.priced,
                                    total: total, message: message, revision: selection.revision)
        }

        /// Whether a subscriber would see a difference (a choice of the same route again is one:
        /// its revision, which the next compare-and-set needs, moved on).
        func differs(from other: RoutePrice?) -> Bool {
            guard let other else { return true }
            return (selection.outboundId, selection.inboundId, selection.revision, status, total)
                != (other.selection.outboundId, other.selection.inboundId, other.selection.revision, other.status, other.total)
        }
    }

    /// Prices `selection` against the flights held now; says so when its flights are gone.
    func price(_ selection: Selection) -> RoutePrice {
        guard let outbound = book.outbound[selection.outboundId] else {
            return RoutePrice(selection: selection, status: .unavailable, quote: nil,
                              message: "outbound flight \(selection.outboundId) is no longer offered; choose another route")
        }
        guard let inboundId = selection.inboundId else {
            return RoutePrice(selection: selection, status: .incomplete, quote: Quote(outbound: outbound, inbound: nil),
                              message: "no inbound flight chosen, so no round-trip total")
        }
        guard let inbound = book.inbound[inboundId] else {
            return RoutePrice(selection: selection, status: .unavailable, quote: Quote(outbound: outbound, inbound: nil),
                              message: "inbound flight \(inboundId) is no longer offered; choose another route")
        }
        guard RouteBook.isRelated(outbound: outbound, inbound: inbound) else {
            return RoutePrice(selection: selection, status: .unavailable, quote: Quote(outbound: outbound, inbound: nil),
                              message: "inbound flight \(inboundId) (\(inbound.leg)) no longer flies the reverse of outbound \(outbound.id) (\(outbound.leg))")
        }
        return RoutePrice(selection: selection, status: .priced, quote: Quote(outbound: outbound, inbound: inbound), message: nil)
    }

    /// Publishes `/pricing/route/current` when what it says changed, with the price before.
    private func publish(_ route: RoutePrice) async {
        guard route.differs(from: publishedRoute) else { return }
        let previous = publishedRoute
        publishedRoute = route
        guard let publisher else { return }
        var value = route.route
        value.previousTotal = previous?.total
        value.pricedAt = Timestamp.format(Date())
        do {
            routeValue = try JSONValue(encoding: value)
            // Publications can overlap: the kernel keeps the latest price, never an older one.
            try await publisher.set(PricingAPI.StateKeys.routeCurrent, toLatest: { await self.routeValue })
        } catch {
            logger.warning("cannot publish the current route", metadata: ["problem": "\(error)"])
        }
    }

    /// After the flights changed: the stored route priced again (and published if its price moved).
    private func repriceCurrentRoute() async {
        if let stored = try? await store(StoreAPI.routeSelected, NoParams(), for: "re-pricing the current route") {
            knownSelection = Selection(stored)
        }
        guard let selection = knownSelection else { return }
        let priced = price(selection)
        if priced.differs(from: publishedRoute) {
            logger.info("current route re-priced", metadata: ["status": "\(priced.status.rawValue)", "total": "\(priced.total?.description ?? "none")",
                                                              "before": "\(publishedRoute?.total?.description ?? "none")"])
        }
        await publish(priced)
    }

    /// At start: the current route settled (stored on first run) and published; retried
    /// while the store cannot be reached, which the log says at the first attempt and then
    /// once a minute (a store down for an hour is not seven hundred lines; each attempt is
    /// a debug line).
    private func settleCurrentRoute() async {
        var delay = Duration.milliseconds(250)
        var lastSaid: ContinuousClock.Instant?
        while !Task.isCancelled {
            do {
                _ = try await current()
                if lastSaid != nil { logger.info("the current route is settled: the store answered") }
                return
            } catch {
                let say = LogCadence.dueAgain(&lastSaid)
                logger.log(level: say ? .info : .debug, "the current route waits for the store", metadata: ["problem": "\(error)", "retry in": "\(delay.formatted)"])
                try? await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(5))
            }
        }
    }

    private func publishDealOfTheDay() async {
        guard let publisher, let deal = try? today(PricingAPI.Today()), deal != publishedDeal else { return }
        do {
            _ = try await publisher.set(PricingAPI.StateKeys.dealToday, try JSONValue(encoding: deal))
            publishedDeal = deal
        } catch {
            logger.warning("cannot publish the deal of the day", metadata: ["problem": "\(error)"])
        }
    }

    // MARK: The store

    private func storeSelection(outboundId: Int, inboundId: Int?, revision: Int? = nil, for purpose: String) async throws -> Selection {
        Selection(try await store(StoreAPI.routeSelect, StoreAPI.Route(outboundId: outboundId, inboundId: inboundId, revision: revision), for: purpose))
    }

    /// Calls the store on behalf of a request; a failure says what needed it.
    private func store<P, R>(_ method: Method<P, R>, _ params: P, for purpose: String) async throws -> R {
        guard let client else { throw JSONRPCError.notConnected(to: method.service, neededFor: purpose) }
        return try await client.call(method, params, timeout: busTimeout, neededFor: purpose)
    }
}
