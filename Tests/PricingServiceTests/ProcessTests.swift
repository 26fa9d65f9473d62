import BusKit
import BusProtocol
import Catalog
import Contracts
import Foundation
import Kernel
import SwitchboardTestSupport
import Testing

/// The services as the separate processes users run (`switchboard serve NAME`), with the
/// datasets read from files (no traffic beyond loopback).
@Suite("search and pricing as processes: every method through the kernel, the route across a restart of every process")
struct ProcessTests {
    static func startServices(_ kernel: TestKernel, config: URL) throws -> [ChildProcess] {
        try ["store", "fetcher", "search", "pricing"].map { name in
            try ChildProcess(switchboardExecutable(), [
                "serve", name, "--config", config.path, "--broker", kernel.endpoints.broker,
                "--state", "\(kernel.endpoints.snapshot),\(kernel.endpoints.publisher),\(kernel.endpoints.collector)",
                "--heartbeat-ms", "100", "--liveness", "10", "--log-level", "error",
            ])
        }
    }

    @Test("switchboard serve store, fetcher, search and pricing answer through the kernel; the chosen route survives")
    func wholeBus() async throws {
        let folder = try temporaryDirectory("processes")
        var lines = ["store:", "  path: \(folder.appendingPathComponent("store.sqlite").path)", "fetcher:", "  datasets:"]
        let files = try writeBundledCopies(to: folder)
        for dataset in Dataset.allCases {
            lines += ["    \(dataset.rawValue):", "      url: \(files[dataset]!.absoluteString)"]
        }
        let config = folder.appendingPathComponent("switchboard.yaml")
        try lines.joined(separator: "\n").write(to: config, atomically: true, encoding: .utf8)

        var kernel = try await TestKernel.start(fixedPorts: true, fastHeartbeats)
        var services = try Self.startServices(kernel, config: config)
        let client = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(10))
        func ready() async throws {
            for name in ["store", "fetcher", "search", "pricing"] { try await kernel.workers(name, within: 30) }
        }
        try await ready()
        let search = { (method: String, params: JSONValue) in try await client.request(service: "search", method: method, params: params) }
        #expect(try await search("countries.search", ["query": "aland"])["countries"]?.arrayValue?.first?["name"] == "Åland Islands")
        #expect(try await search("locations.resolve", ["query": "52.3547498,4.8339215"])["name"] == "Amsterdam")
        #expect(try await search("items.grouped", [:])["groups"]?.arrayValue?.count == 4)
        #expect(try await search("flights.list", ["direction": "inbound"])["inbound"]?.arrayValue?.count == 5)
        #expect(try await search("airlines.get", ["id": "Iberia"])["name"] == "Iberia")
        _ = try await client.request(service: "store", method: "sources.select", params: ["ids": ["cnn"]])
        #expect(try await search("headlines.list", [:])["status"] == "ok")
        #expect(try await search("sources.list", [:])["selected"] == ["cnn"])
        let history = try await client.request(service: "store", method: "history.list")
        #expect(history["entries"]?.arrayValue?.first?["text"] == "52.3547498,4.8339215")

        let pricing = { @Sendable (method: String, params: JSONValue) in try await client.request(service: "pricing", method: method, params: params) }
        #expect(try await pricing("route.cheapest", [:])["cheapestOutbound"]?["total"]?["amount"] == "45.00")
        #expect(try await pricing("route.quote", ["outboundId": 4, "inboundId": 11])["total"]?["amount"] == "80.00")
        #expect(try await pricing("route.select", ["outboundId": 6, "inboundId": 13])["total"]?["amount"] == "57.00")
        #expect(try await pricing("deals.today", ["date": "2026-12-24"])["title"] == "Deal of the Day!")
        #expect(try await pricing("deals.rollback", ["seed": 3])["seed"] == 3)

        // Every process ends (services killed, the kernel stopped), then all start again.
        for service in services {
            service.signal(SIGKILL)
            #expect(await service.exit(within: 5))
        }
        await kernel.stop()
        kernel = try await kernel.restarted()
        services = try Self.startServices(kernel, config: config)
        try await ready()
        // Pricing reads the chosen route back from the store and publishes it.
        let routeKey = PricingAPI.StateKeys.routeCurrent
        try await kernel.state(routeKey, within: 15, "the chosen route published after the restart") { state in
            state[routeKey]?["outboundId"] == 6 && state[routeKey]?["inboundId"] == 13 && state[routeKey]?["total"]?["amount"] == "57.00"
        }
        let current = try await pricing("route.current", [:])
        #expect(current["outboundId"] == 6 && current["inboundId"] == 13 && current["total"]?["amount"] == "57.00", "\(current)")
        for service in services { service.stop() }
        await client.close()
        await kernel.stop()
    }
}
