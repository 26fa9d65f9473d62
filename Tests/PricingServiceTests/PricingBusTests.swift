import BusKit
import BusProtocol
import Catalog
import Contracts
import FetcherService
import Foundation
import Kernel
@testable import PricingService
import StoreService
import SwitchboardTestSupport
import Testing

/// The pricing service on a ``DatasetBus`` (kernel, store, fetcher over files); every
/// piece can be stopped and started again on the same folder and endpoints (a restart of
/// every process).
struct PricingBus {
    let base: DatasetBus
    let pricing: PricingService
    let pricingHost: ServiceHost<PricingService>
    let pricingWork: Working
    let catalog: Subscription
    var client: BusClient { base.client }
    var kernel: TestKernel { base.kernel }
    var folder: URL { base.folder }

    static func start(folder: URL? = nil, kernel: TestKernel? = nil) async throws -> PricingBus {
        let base = try await DatasetBus.start(folder: folder, kernel: kernel, datasets: [.flights, .countries])
        let catalog = try await base.catalogSubscription()
        let pricing = PricingService(busTimeout: .seconds(10), client: base.client, publisher: StatePublisher(client: base.client), catalog: catalog)
        let pricingHost = try ServiceHost(service: pricing, options: DatasetBus.hostOptions(base.kernel, connections: 2))
        try await pricingHost.start()
        try await base.waitForWorkers(["store", "pricing"])
        let pricingWork = Working(pricing)
        await pricingWork.start()
        try await base.startFetcher()
        return PricingBus(base: base, pricing: pricing, pricingHost: pricingHost, pricingWork: pricingWork, catalog: catalog)
    }

    func request(_ method: String, _ params: JSONValue? = nil) async throws -> JSONValue {
        try await client.request(service: "pricing", method: method, params: params)
    }

    func error(_ method: String, _ params: JSONValue? = nil) async -> JSONRPCError? {
        await base.error("pricing", method, params)
    }

    /// Replaces the flights file and has the fetcher refresh it; pricing follows by itself.
    func replaceFlights(_ body: Data) async throws {
        try await base.replace(.flights, with: body)
    }

    /// Every process stopped; the kernel too unless kept.
    func stop(keepKernel: Bool = false) async {
        await pricingWork.stop()
        await catalog.cancel()
        await pricingHost.stop()
        await base.stop(keepKernel: keepKernel)
    }
}

@Suite("pricing: through the kernel, with the store and the fetcher", .serialized)
struct PricingBusTests {
    @Test("first run stores the cheapest route; a chosen route comes back after every process restarted")
    func currentRouteSurvivesRestart() async throws {
        let bus = try await PricingBus.start()
        // Nothing was stored: at start the service chose the cheapest route and stored it.
        let first = try await bus.request("route.current")
        #expect(first["outboundId"] == 1 && first["inboundId"] == 12 && first["status"] == "priced")
        #expect(first["total"] == ["amount": "45.00", "currency": "EUR"])
        let stored = try await bus.client.request(service: "store", method: "route.selected")
        #expect(stored["outboundId"] == 1 && stored["inboundId"] == 12)

        let chosen = try await bus.request("route.select", ["outboundId": 3, "inboundId": 14])
        #expect(chosen["status"] == "priced" && chosen["total"]?["amount"] == "55.00")
        let folder = bus.folder
        await bus.stop()

        // Every process again (a new kernel on the same endpoints, a new store on the same file).
        let kernel = try await bus.kernel.restarted()
        let again = try await PricingBus.start(folder: folder, kernel: kernel)
        let current = try await again.request("route.current")
        #expect(current["firstRun"] == false && current["outboundId"] == 3 && current["inboundId"] == 14 && current["total"]?["amount"] == "55.00")
        await again.stop()
    }

    @Test("route.select validates before storing: unrelated -32004, unknown -32003; an outbound alone is incomplete")
    func selectValidates() async throws {
        let bus = try await PricingBus.start()
        _ = try await bus.request("route.current")
        #expect(await bus.error("route.select", ["outboundId": 1, "inboundId": 13])?.code == -32004)
        #expect(await bus.error("route.select", ["outboundId": 42])?.code == -32003)
        #expect(await bus.error("route.select", ["outboundId": "one"])?.data?["field"] == "outboundId")
        #expect(try await bus.client.request(service: "store", method: "route.selected")["outboundId"] == 1)
        let alone = try await bus.request("route.select", ["outboundId": 5])
        #expect(alone["status"] == "incomplete" && alone["total"] == nil && alone["inbound"] == nil)
        #expect(try await bus.request("route.quote", ["outboundId": 2, "inboundId": 15])["total"]?["amount"] == "50.00")
        #expect(try await bus.request("route.cheapest")["cheapestOutbound"]?["inbound"]?["id"] == 12)
        await bus.stop()
    }

    @Test("two clients choosing a route at once: one wins, the other gets -32004 with the winner priced, and the published route is the winner's")
    func selectRace() async throws {
        let bus = try await PricingBus.start()
        let shown = try await bus.request("route.current")
        let revision = try #require(shown["revision"]?.intValue)
        async let first = bus.error("route.select", ["outboundId": 3, "inboundId": 14, "revision": .int(revision)])
        async let second = bus.error("route.select", ["outboundId": 2, "inboundId": 15, "revision": .int(revision)])
        let refusals = await [first, second]
        let lost = try #require(refusals.compactMap { $0 }.first, "one of the two must lose: \(refusals)")
        #expect(refusals.compactMap { $0 }.count == 1 && lost.code == -32004, "\(refusals)")
        let winner = refusals[0] == nil ? (3, 14) : (2, 15)
        let current = lost.data?["current"]
        #expect(current?["outboundId"] == .int(Int64(winner.0)) && current?["inboundId"] == .int(Int64(winner.1)) && current?["total"] != nil,
                "the loser sees the winner priced: \(current ?? .null)")
        #expect(current?["revision"] == .int(revision + 1) && lost.message.contains("chosen meanwhile"))
        let now = try await bus.request("route.current")
        #expect(now["outboundId"] == .int(Int64(winner.0)) && now["revision"] == .int(revision + 1))
        await bus.stop()
    }

    @Test("a flights refresh that changes the current route's price publishes the old and the new price; gone flights are reported, not failed")
    func repricedOnFlightsChange() async throws {
        let bus = try await PricingBus.start()
        _ = try await bus.request("route.current")
        let updates = try await Subscription.open(snapshot: bus.kernel.endpoints.snapshot, publisher: bus.kernel.endpoints.publisher,
                                                  prefixes: ["/pricing/route/current"])
        defer { Task { await updates.cancel() } }
        let initial = try await within(10, "the current route in the snapshot") { try await updates.nextUpdate() }
        #expect(initial?.json?["total"]?["amount"] == "45.00")

        let fixture = [(1, "BCN", "AMS", "15"), (2, "BCN", "AMS", "20"), (3, "GIR", "AMS", "25"), (4, "BCN", "AMS", "30"), (5, "BCN", "ROT", "30"), (6, "GIR", "AMS", "32")]
        try await bus.replaceFlights(flightsFile(outbound: fixture.map { ($0.0, $0.1, $0.2, $0.3) },
                                                 inbound: [(11, "AMS", "BCN", "50"), (12, "AMS", "BCN", "40.10"), (13, "AMS", "GIR", "25"),
                                                           (14, "AMS", "GIR", "30"), (15, "AMS", "BCN", "30")]))
        let changed = try await within(15, "the re-priced route") { try await updates.nextUpdate() }
        #expect(changed?.json?["total"]?["amount"] == "55.10" && changed?.json?["previousTotal"]?["amount"] == "45.00")
        #expect(try await bus.request("route.current")["total"]?["amount"] == "55.10")

        // Inbound 12 is withdrawn: the route is unavailable, said so, and the event carries it.
        try await bus.replaceFlights(flightsFile(outbound: fixture.map { ($0.0, $0.1, $0.2, $0.3) }, inbound: [(11, "AMS", "BCN", "50")]))
        let gone = try await within(15, "the route without its inbound flight") { try await updates.nextUpdate() }
        #expect(gone?.json?["status"] == "unavailable" && gone?.json?["total"] == nil && gone?.json?["previousTotal"]?["amount"] == "55.10")
        let current = try await bus.request("route.current")
        #expect(current["status"] == "unavailable" && current["message"]?.stringValue?.contains("inbound flight 12 is no longer offered") == true)
        await bus.stop()
    }

    @Test("the deal of the day is published at start and matches deals.today")
    func dealOfTheDay() async throws {
        let bus = try await PricingBus.start()
        let today = try await bus.request("deals.today")
        let key = PricingAPI.StateKeys.dealToday
        try await bus.kernel.state(key, "the deal published") { $0[key] == today }
        #expect(try await bus.request("deals.rollback", ["seed": 7]) == bus.request("deals.rollback", ["seed": 7]))
        await bus.stop()
    }

    @Test("a store not there yet: the wait is logged once, each attempt at debug, and its end when the store answers")
    func storeLate() async throws {
        let kernel = try await TestKernel.start(fixedPorts: true) { fastHeartbeats(&$0); $0.queueTimeout = .milliseconds(100) }
        let client = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(20), state: [kernel.stateEndpoints])
        let catalog = try await Subscription.open(snapshot: kernel.endpoints.snapshot, publisher: kernel.endpoints.publisher, prefixes: [FetcherAPI.catalogPrefix])
        let logs = LogLines()
        let pricing = PricingService(logger: logs.logger("pricing", level: .debug), busTimeout: .seconds(10), client: client,
                                     publisher: StatePublisher(client: client), catalog: catalog)
        let work = Working(pricing)
        await work.start()
        let waits = "the current route waits for the store"
        try await logs.lines.wait(within: 30, "three attempts without a store") { $0.filter { $0.hasPrefix("debug \(waits)") }.count >= 3 }
        #expect(logs.lines.value.filter { $0.hasPrefix("info \(waits)") }.count == 1, "\(logs.text)")
        let store = StoreService(configuration: StoreConfiguration(path: try temporaryDirectory("pricing-store-late").appendingPathComponent("store.sqlite").path))
        let storeHost = try ServiceHost(service: store, options: DatasetBus.hostOptions(kernel, connections: 1))
        try await storeHost.start()
        try await logs.waitFor("info the current route is settled", within: 30, "the route settled once the store answered")
        await work.stop()
        await storeHost.stop()
        await catalog.cancel()
        await client.close()
        await kernel.stop()
    }
}
