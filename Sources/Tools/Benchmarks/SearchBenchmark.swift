import ArgumentParser
import BusBench
import BusKit
import Contracts
import BusProtocol
import Catalog
import Foundation
import Histogram
import Kernel
import SearchService
import SwitchboardTestSupport
import ZeroMQ

/// The search service: countries.search in process and through the kernel, the grouped
/// hiring list and the nearest place among a million generated records, and index rebuilds.
struct SearchBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "search",
        abstract: "countries.search p50/p99 (in process and through the kernel), items.grouped and nearest place at 1,000,000, index rebuilds."
    )

    @Option(help: "Seconds each latency measurement runs.")
    var seconds = 3.0
    @Option(help: "Records generated for the large-dataset rows.")
    var records = 1_000_000

    /// Queries like the app's: prefixes, a capital, a code, diacritics, the empty list.
    static let queries = ["a", "par", "united", "aland", "de", "ber", "", "tokyo", "zz", "saint", "republic", "nl"]

    func run() async throws { printTable(try await measure()) }

    /// The figures, as table rows.
    func measure() async throws -> [Row] {
        progress("Search benchmark: \(ProcessInfo.processInfo.activeProcessorCount) cores, \(seconds) s per latency row, \(records) generated records")
        var rows: [Row] = []
        let search = SearchService()
        let table = MethodTable(of: search)

        // countries.search in process: the method itself, with its JSON answer.
        let inProcess = try await measure { index in
            _ = try await table.call(SearchAPI.countriesSearch, SearchAPI.Countries(query: Self.queries[index % Self.queries.count], limit: 20), on: search)
        }
        rows.append(Row("countries.search in process", rate: inProcess.rate, latencies: inProcess.latencies, note: "12 queries in turn, limit 20; request and reply as JSON text, as on the bus"))

        // Through the kernel: one client, one request at a time.
        // An in-process kernel on free loopback ports.
        let kernel = try await TestKernel.start()
        let endpoints = kernel.endpoints
        let host = try ServiceHost(service: search, options: .init(brokers: [endpoints.broker], connections: 4))
        try await host.start()
        let client = try await BusClient(brokers: [endpoints.broker], timeout: .seconds(30))
        while !(try await client.hasWorkers(SearchAPI.service)) { try await Task.sleep(for: .milliseconds(20)) }
        let throughKernel = try await measure { index in
            _ = try await client.call(SearchAPI.countriesSearch, SearchAPI.Countries(query: Self.queries[index % Self.queries.count], limit: 20))
        }
        rows.append(Row("countries.search through the kernel", rate: throughKernel.rate, latencies: throughKernel.latencies,
                        note: "1 client, tcp loopback; target p99 < 1 ms"))
        await client.close()
        await host.stop()
        await kernel.stop()

        // Index rebuilds of the bundled datasets.
        for dataset in Dataset.allCases {
            let content = try dataset.decode(try dataset.bundledData()).content
            let took = await timed { await search.load(content, version: "bench") }
            rows.append(Row("rebuild \(dataset) index (\(content.count) records)", note: milliseconds(took)))
        }

        // A million generated hiring items: the rebuild groups and sorts them in both orders;
        // the method then answers from the sorted groups.
        progress("generating \(records) items and places")
        var generator = SystemRandomNumberGenerator()
        let items = (0..<records).map { id -> HiringItem in
            let roll = Int.random(in: 0..<100, using: &generator)
            let name: String? = roll < 33 ? nil : roll < 68 ? "" : "Item \(Int.random(in: 0..<records, using: &generator))"
            return HiringItem(id: id, listId: Int.random(in: 1...4, using: &generator), name: name)
        }
        let itemsBuild = await timed { await search.load(.items(items), version: "bench-items") }
        rows.append(Row("items.grouped: group + sort \(records) items", note: "\(milliseconds(itemsBuild)) (rebuild: both orders); target < 1 s"))
        for order in SearchAPI.Items.Order.allCases {
            let answer = try await timed { _ = try await table.call(SearchAPI.itemsGrouped, SearchAPI.Items(order: order), on: search) }
            rows.append(Row("items.grouped \(order), \(records) items in process", note: "\(milliseconds(answer)) (the answer as the bus carries it: JSON text, parsed back)"))
        }

        // A million generated places: the 3-d tree is built once; each lookup is a descent.
        let places = (0..<records).map { index in
            Location(name: index % 10 == 0 ? nil : "Place \(index)", latitude: .random(in: -90...90, using: &generator),
                     longitude: .random(in: -180...180, using: &generator))
        }
        let placesBuild = await timed { await search.load(.locations(places), version: "bench-places") }
        rows.append(Row("rebuild locations index (\(records) places)", note: milliseconds(placesBuild)))
        let nearest = try await measure { _ in
            let point = String(format: "%.4f, %.4f", Double.random(in: -90...90), Double.random(in: -180...180))
            _ = try await table.call(SearchAPI.locationsSearch, SearchAPI.Locations(query: point, limit: 1), on: search)
        }
        rows.append(Row("locations.search by coordinates among \(records) places", rate: nearest.rate, latencies: nearest.latencies,
                        note: "in process, limit 1; the method orders every place by distance (it pages through all of them)"))
        return rows
    }

    private func milliseconds(_ duration: Duration) -> String {
        String(format: "%.1f ms", duration.seconds * 1_000)
    }

    private func timed(_ body: () async throws -> Void) async rethrows -> Duration {
        let start = ContinuousClock.now
        try await body()
        return ContinuousClock.now - start
    }

    /// Runs `body` in a loop for the set time; the rate and every call's latency.
    private func measure(_ body: (Int) async throws -> Void) async throws -> (rate: Double, latencies: Histogram<UInt64>) {
        var latencies = latencyHistogram()
        let nanoseconds = UInt64(seconds * 1e9)
        let start = monotonicNanoseconds()
        var done = 0
        while monotonicNanoseconds() - start < nanoseconds {
            let sent = monotonicNanoseconds()
            try await body(done)
            _ = latencies.record(monotonicNanoseconds() - sent)
            done += 1
        }
        return (Double(done) / (Double(monotonicNanoseconds() - start) / 1e9), latencies)
    }
}
