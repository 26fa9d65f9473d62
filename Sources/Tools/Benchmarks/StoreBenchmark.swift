import ArgumentParser
import BusBench
import BusKit
import BusProtocol
import Contracts
import Foundation
import Histogram
import Kernel
import Storage
import StoreService
import SwitchboardTestSupport
import ZeroMQ

/// The store through the kernel: durable writes (each acknowledged once its transaction is
/// on disk) and reads, from one client and from several at once, on SQLite and on a
/// PostgreSQL server the benchmark starts on loopback (when its binaries are installed).
struct StoreBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "store",
        abstract: "Durable writes and reads per second through the kernel, 1 and 8 clients, SQLite and PostgreSQL."
    )

    @Option(help: "Seconds each measurement runs.")
    var seconds = 3.0
    @Option(help: "Worker connections of the store (requests it handles at once).")
    var connections = 8
    @Option(help: "The folder for the database (default: a new temporary folder, removed afterwards).")
    var folder: String?

    func run() async throws { printTable(try await measure()) }

    /// The figures, as table rows: SQLite's, then PostgreSQL's.
    func measure() async throws -> [Row] {
        var rows = try await measure(postgres: nil)
        if TestPostgres.available {
            let server = try await TestPostgres.start()
            defer { server.stop() }
            rows += try await measure(postgres: server)
        } else {
            progress("PostgreSQL is not installed (Debian's postgresql package): its rows are left out")
        }
        return rows
    }

    /// The figures of one backend: SQLite in a folder, or the PostgreSQL server `postgres`.
    private func measure(postgres: TestPostgres?) async throws -> [Row] {
        // An in-process kernel on free loopback ports.
        let kernel = try await TestKernel.start()
        let endpoints = kernel.endpoints
        let directory = folder.map { URL(fileURLWithPath: $0) }
            ?? FileManager.default.temporaryDirectory.appendingPathComponent("sb-bench-store-\(getpid())")
        defer { if folder == nil { try? FileManager.default.removeItem(at: directory) } }
        let publisherClient = try await BusClient(brokers: [endpoints.broker])
        let publisher = StatePublisher(client: publisherClient)
        let configuration = StoreConfiguration(path: directory.appendingPathComponent("store.sqlite").path,
                                               postgres: postgres.map { PostgresSettings(url: $0.url(), poolSize: connections, tls: .disable) })
        let store = StoreService(configuration: configuration, publisher: publisher)
        // The work keeps the database's connections: it runs before the store can be ready.
        let work = Working(store)
        await work.start()
        await store.waitUntilReady()
        let host = try ServiceHost(service: store, options: .init(brokers: [endpoints.broker], connections: connections))
        try await host.start()
        let probe = try await BusClient(brokers: [endpoints.broker])
        while !(try await probe.hasWorkers(StoreAPI.service)) { try await Task.sleep(for: .milliseconds(20)) }
        await probe.close()

        let name = postgres == nil ? "SQLite" : "PostgreSQL"
        progress(postgres == nil
            ? "Store benchmark: SQLite WAL with synchronous=FULL in \(directory.path), store with \(connections) worker connections, \(ProcessInfo.processInfo.activeProcessorCount) cores, \(seconds) s per row"
            : "Store benchmark: PostgreSQL on loopback (fsync on, synchronous_commit on), a pool of \(connections) connections, \(connections) worker connections")
        var rows: [Row] = []
        for clients in [1, 8] {
            let writes = try await measure(endpoints.broker, clients: clients) { client, index in
                _ = try await client.call(StoreAPI.articlesSave, .init(article: ["url": .string("https://example.com/\(index)"), "title": "Benchmark"]))
            }
            rows.append(Row("\(name): durable write (articles.save), \(clients) client\(clients == 1 ? "" : "s")", rate: writes.rate,
                            latencies: writes.latencies, note: "acknowledged after fsync"))
        }
        let selector = try await BusClient(brokers: [endpoints.broker])
        _ = try await selector.call(StoreAPI.sourcesSelect, .init(ids: ["bbc-news", "cnn", "the-verge"]))
        await selector.close()
        for clients in [1, 8] {
            let reads = try await measure(endpoints.broker, clients: clients) { client, _ in
                _ = try await client.call(StoreAPI.sourcesSelected)
            }
            rows.append(Row("\(name): read (sources.selected), \(clients) client\(clients == 1 ? "" : "s")", rate: reads.rate, latencies: reads.latencies))
        }
        // Each client keeps several requests in flight (replies are matched by id).
        let pipelined = try await measure(endpoints.broker, clients: 8, inFlight: 8) { client, _ in
            _ = try await client.call(StoreAPI.sourcesSelected)
        }
        rows.append(Row("\(name): read (sources.selected), 8 clients x 8 in flight", rate: pipelined.rate, latencies: pipelined.latencies))
        await host.stop()
        await work.stop()
        await publisherClient.close()
        await kernel.stop()
        return rows
    }

    /// Runs `request` in a loop on `clients` clients (each its own socket) for the set time;
    /// returns the total rate and the latency of every request.
    private func measure(_ broker: String, clients count: Int, inFlight: Int = 1,
                         _ request: @escaping @Sendable (BusClient, Int) async throws -> Void) async throws -> (rate: Double, latencies: Histogram<UInt64>) {
        // Each client has its own socket (the kernel sees `count` clients); they share one
        // loop thread, as clients in one process would, instead of a thread each.
        let loop = try SocketLoop(context: ZMQContext(), name: "bench-clients")
        var clients: [BusClient] = []
        for _ in 0..<count { clients.append(try await BusClient(brokers: [broker], loop: loop, timeout: .seconds(30))) }
        // Each request's number is unique across lanes and runs (an article's URL).
        let run = Int(monotonicNanoseconds() % 1_000_000) * 100_000_000, lanes = clients
        let measured = try await measureRate(lanes: count * inFlight, seconds: seconds) { lane, done in
            try await request(lanes[lane / inFlight], lane * 10_000_000 + done + run)
        }
        for client in clients { await client.close() }
        await loop.shutdown()
        return measured
    }
}
