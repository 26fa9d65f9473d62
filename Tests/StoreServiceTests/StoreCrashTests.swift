import BusKit
import BusProtocol
import Catalog
import Foundation
import Kernel
import Synchronization
import SwitchboardTestSupport
import Testing

@Suite("store: kill -9 while a client writes, on SQLite and on PostgreSQL")
struct StoreCrashTests {
    /// A `switchboard serve store` process on `database` (a SQLite file) or on the PostgreSQL
    /// server at `postgres` (a URL), registered with `kernel`.
    static func storeProcess(_ kernel: TestKernel, database: String, postgres: String? = nil) throws -> ChildProcess {
        try ChildProcess(switchboardExecutable(), [
            "serve", "store", "--broker", kernel.endpoints.broker, "--db", database,
            "--heartbeat-ms", "100", "--liveness", "10", "--log-level", "error",
        ], environment: postgres.map { ["SWITCHBOARD_STORE_BACKEND": "postgres", "SWITCHBOARD_STORE_URL": $0, "SWITCHBOARD_STORE_TLS": "disable"] } ?? [:])
    }

    @Test("every acknowledged write is there after a restart, over 20 kills at random moments", arguments: Backend.available)
    func killNine(backend: Backend) async throws {
        let kernel = try await TestKernel.start(fixedPorts: true, fastHeartbeats)
        let folder = try temporaryDirectory("store-crash")
        let database = folder.appendingPathComponent("store.sqlite").path
        let server = backend == .postgres ? try await TestPostgres.start() : nil
        defer { server?.stop() }
        let postgres = server?.url()
        let client = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(10))
        var generator = SystemRandomNumberGenerator()
        let seed = UInt64.random(in: 0...UInt64.max, using: &generator)
        var random = SeededGenerator(seed: seed)
        var acknowledged: [String] = []
        var store = try Self.storeProcess(kernel, database: database, postgres: postgres)
        for round in 0..<20 {
            try await kernel.workers("store", "store registered (round \(round), seed \(seed))") { $0 >= 1 }
            // A writer that saves articles one after another, each acknowledged in turn.
            let stop = Atomic<Bool>(false)
            let writer = Task { () -> [String] in
                var done: [String] = []
                var index = 0
                while !stop.load(ordering: .relaxed) {
                    let url = "https://example.com/r\(round)/\(index)"
                    index += 1
                    do {
                        _ = try await client.request(service: "store", method: "articles.save",
                                                     params: ["article": ["url": .string(url), "title": "t"]])
                        done.append(url)
                    } catch {
                        // Not acknowledged (the store died under it): it may or may not be there.
                    }
                }
                return done
            }
            try await Task.sleep(for: .milliseconds(Int(random.next() % 250) + 20))
            store.signal(SIGKILL)
            #expect(await store.exit(within: 5), "the store process ended after kill -9")
            stop.store(true, ordering: .relaxed)
            // The request in flight when the store died is answered by the next one.
            store = try Self.storeProcess(kernel, database: database, postgres: postgres)
            acknowledged += try await within(30, "writer finished (round \(round), seed \(seed))") { await writer.value }
        }
        try await kernel.workers("store")
        let list = try await client.request(service: "store", method: "articles.list", params: ["limit": 1_000])
        var stored = Set(list["articles"]?.arrayValue?.compactMap { $0["url"]?.stringValue } ?? [])
        var offset = 1_000
        while let total = list["total"]?.intValue, offset < total {
            let page = try await client.request(service: "store", method: "articles.list", params: ["offset": .int(Int64(offset)), "limit": 1_000])
            stored.formUnion(page["articles"]?.arrayValue?.compactMap { $0["url"]?.stringValue } ?? [])
            offset += 1_000
        }
        print("store crash test (\(backend)): \(acknowledged.count) acknowledged writes over 20 kills (seed \(seed))")
        let missing = acknowledged.filter { !stored.contains($0) }
        #expect(acknowledged.count > 20, "writes were acknowledged between the kills")
        #expect(missing.isEmpty, "acknowledged but missing after kill -9 (seed \(seed)): \(missing.prefix(5))")
        store.stop()
        await client.close()
        await kernel.stop()
    }
}
