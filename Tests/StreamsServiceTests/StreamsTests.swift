import BusKit
import BusProtocol
import Contracts
import Foundation
import GRDB
import Kernel
import Logging
import Storage
@testable import StreamsService
import Synchronization
import SwitchboardTestSupport
import Testing
import ZeroMQ

typealias API = StreamsAPI

/// The streams service's clock in these tests: wall time that moves only when a test says,
/// so ack deadlines, nak delays and ages pass without waiting for them.
final class TestTime: Sendable {
    private let seconds = Mutex(1_800_000_000.0)
    var now: Double { seconds.withLock { $0 } }
    func advance(_ by: Double) { seconds.withLock { $0 += by } }
}

/// The engines the streams service keeps its data in: SQLite always, PostgreSQL where its
/// server is installed (the test command's bootstrap installs it).
enum Backend: String, CaseIterable, CustomTestStringConvertible {
    case sqlite, postgres
    static var available: [Backend] { TestPostgres.available ? allCases : [.sqlite] }
    var testDescription: String { rawValue }
}

/// Runs `body` for each number of `0..<count`, 32 at a time side by side, as busy publishers
/// send: what comes together is written together.
func sideBySide(_ count: Int, _ body: @escaping @Sendable (Int) async throws -> Void) async throws {
    try await withThrowingDiscardingTaskGroup { group in
        for lane in 0..<32 {
            group.addTask { for number in stride(from: lane, to: count, by: 32) { try await body(number) } }
        }
    }
}

/// A kernel, a streams service hosted in this process on a database in a temporary folder
/// (or on a PostgreSQL server the test started), and two clients (two readers of one consumer).
struct StreamsBus {
    let kernel: TestKernel
    let service: StreamsService
    let host: ServiceHost<StreamsService>
    /// The service's work (capturing the kernel's state) and its database connections
    /// (PostgreSQL's), run as its process runs them, with the client the work uses.
    let working: Working
    let serviceClient: BusClient
    let client: BusClient
    let other: BusClient
    let folder: URL
    let time: TestTime
    let backend: Backend
    /// The PostgreSQL server of a `.postgres` bus (stopped with it unless kept).
    let postgres: TestPostgres?

    /// CURVE keys for a kernel that has them: the service's, `client`'s and `other`'s.
    struct Keys {
        var service: CurveClientKeys
        var client: CurveClientKeys
        var other: CurveClientKeys
    }

    static func start(folder: URL? = nil, kernel: TestKernel? = nil, keys: Keys? = nil, time: TestTime = TestTime(), backend: Backend = .sqlite,
                      postgres: TestPostgres? = nil, connections: Int = 2, window: Int = 16, logger: Logger? = nil,
                      _ configure: (inout StreamsConfiguration) -> Void = { _ in }) async throws -> StreamsBus {
        let kernel = if let kernel { kernel } else { try await TestKernel.start(fixedPorts: true, fastHeartbeats) }
        let folder = try folder ?? temporaryDirectory("streams")
        var server = postgres
        if backend == .postgres, server == nil { server = try await TestPostgres.start() }
        var configuration = StreamsConfiguration(path: folder.appendingPathComponent("streams.sqlite").path,
                                                 postgres: server.map { PostgresSettings(url: $0.url(), poolSize: 4, tls: .disable) })
        configure(&configuration)
        let serviceClient = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(10), curve: keys?.service, state: [kernel.stateEndpoints])
        let service = StreamsService(configuration: configuration, logger: logger, client: serviceClient, now: { time.now })
        let working = Working(service)
        await working.start()
        await service.waitUntilReady()
        let options = ServiceHost<StreamsService>.Options(brokers: [kernel.endpoints.broker], connections: connections, window: window,
                                                          heartbeatInterval: kernel.configuration.heartbeatInterval,
                                                          heartbeatLiveness: kernel.configuration.heartbeatLiveness, curve: keys?.service)
        let host = try ServiceHost(service: service, options: options)
        try await host.start()
        try await kernel.workers(API.service, curve: keys?.client)
        return StreamsBus(kernel: kernel, service: service, host: host, working: working, serviceClient: serviceClient,
                          client: try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(10), curve: keys?.client),
                          other: try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(10), curve: keys?.other), folder: folder,
                          time: time, backend: backend, postgres: server)
    }

    /// Stops the service, its clients and (unless kept) the kernel and the PostgreSQL server.
    func stop(keepKernel: Bool = false, keepDatabase: Bool = false) async {
        await host.stop()
        await client.close()
        await other.close()
        await working.stop()
        await serviceClient.close()
        if !keepKernel { await kernel.stop() }
        if !keepDatabase { postgres?.stop() }
    }

    /// Runs `body` on a new bus and stops it however `body` ends.
    static func with(_ backend: Backend = .sqlite, _ configure: (inout StreamsConfiguration) -> Void = { _ in }, _ body: (StreamsBus) async throws -> Void) async throws {
        try await stopping(try await start(backend: backend, configure), with: { await $0.stop() }, body)
    }

    /// The same database and kernel, a new service process (a restart), configured by `configure`.
    func restarted(_ configure: (inout StreamsConfiguration) -> Void = { _ in }) async throws -> StreamsBus {
        try await StreamsBus.start(folder: folder, kernel: kernel, time: time, backend: backend, postgres: postgres, configure)
    }

    @discardableResult
    func publish(_ subject: String, _ data: JSONValue, id: String? = nil) async throws -> API.Published {
        try await client.publish(to: subject, data, id: id)
    }

    func fetch(_ stream: String, _ consumer: String, batch: Int = 10, by reader: BusClient? = nil) async throws -> API.Fetched {
        try await (reader ?? client).call(API.fetch, .init(stream: stream, consumer: consumer, batch: batch))
    }

    func ack(_ stream: String, _ consumer: String, _ sequences: [Int], by reader: BusClient? = nil) async throws -> API.Acknowledged {
        try await (reader ?? client).call(API.ack, .init(stream: stream, consumer: consumer, sequences: sequences))
    }

    /// The JSON-RPC error a call fails with.
    func failure<P, R>(_ method: Method<P, R>, _ params: P, by caller: BusClient? = nil) async -> JSONRPCError? {
        do {
            _ = try await (caller ?? client).call(method, params)
            Issue.record("\(method.name) succeeded; expected an error")
            return nil
        } catch {
            if case .remote(_, let rpc) = error { return rpc }
            Issue.record("expected a JSON-RPC error, got \(error)")
            return nil
        }
    }
}

@Suite("streams: publishing, consumers in groups, acknowledgements")
struct StreamsTests {
    @Test("publish, then two readers of one consumer share its messages, each once; acknowledged ones are not handed out again", arguments: Backend.available)
    func group(backend: Backend) async throws {
        try await StreamsBus.with(backend) { bus in
            let added = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            #expect(added.deadLetters == "orders.dead" && added.lastSequence == 0)
            for number in 1...10 {
                let published = try await bus.publish("orders.new", ["n": .int(Int64(number))])
                #expect(published.sequence == number && published.stream == "orders" && !published.duplicate)
            }
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "orders", name: "billing"))
            let first = try await bus.fetch("orders", "billing", batch: 4)
            let second = try await bus.fetch("orders", "billing", batch: 4, by: bus.other)
            let third = try await bus.fetch("orders", "billing", batch: 4)
            #expect(first.messages.map(\.sequence) == [1, 2, 3, 4])
            #expect(second.messages.map(\.sequence) == [5, 6, 7, 8])
            #expect(third.messages.map(\.sequence) == [9, 10])
            #expect(first.messages[0].data == ["n": 1] && first.messages[0].subject == "orders.new" && first.messages[0].deliveries == 1)
            #expect(try await bus.fetch("orders", "billing").messages.isEmpty, "everything is pending with a reader")

            #expect(try await bus.ack("orders", "billing", [1, 2, 3, 4]).done == [1, 2, 3, 4])
            #expect(try await bus.ack("orders", "billing", [5, 6, 7, 8], by: bus.other).done == [5, 6, 7, 8])
            let twice = try await bus.ack("orders", "billing", [9, 10, 4])
            #expect(twice.done == [9, 10] && twice.notPending == [4], "an acknowledgement counts once")
            // Past every ack deadline: nothing comes back.
            bus.time.advance(3_600)
            #expect(try await bus.fetch("orders", "billing").messages.isEmpty)
            let info = try await bus.client.call(API.consumerInfo, .init(stream: "orders", name: "billing"))
            #expect(info.acknowledged == 10 && info.pending == 0 && info.waiting == 0 && info.delivered == 10 && info.redelivered == 0)
            // A second consumer has its own position: from the start.
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "orders", name: "audit", filter: "orders.new"))
            #expect(try await bus.fetch("orders", "audit", batch: 100).messages.count == 10)
            // The figures /metrics carries, per stream and consumer.
            let metrics = try await bus.client.call(API.metrics).text
            for line in ["switchboard_stream_messages{stream=\"orders\"} 10", "switchboard_stream_last_sequence{stream=\"orders\"} 10",
                         "switchboard_stream_consumer_acknowledged_total{stream=\"orders\",consumer=\"billing\"} 10",
                         "switchboard_stream_consumer_pending{stream=\"orders\",consumer=\"audit\"} 10",
                         "switchboard_stream_consumer_pending{stream=\"orders\",consumer=\"billing\"} 0"] {
                #expect(metrics.contains(line + "\n"), "\(line) in:\n\(metrics)")
            }
        }
    }

    @Test("a reader that takes messages and never acknowledges: after the ack deadline they go to another reader, none lost and none acknowledged twice; progress keeps them", arguments: Backend.available)
    func readerGone(backend: Backend) async throws {
        try await StreamsBus.with(backend) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "jobs", subjects: ["jobs."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "jobs", name: "workers", ackWait: 30))
            for number in 1...5 { try await bus.publish("jobs.run", .int(Int64(number))) }
            #expect(try await bus.fetch("jobs", "workers", batch: 3).messages.map(\.sequence) == [1, 2, 3])
            bus.time.advance(20)
            // Still working on 3: its deadline starts again.
            #expect(try await bus.client.call(API.progress, .init(stream: "jobs", consumer: "workers", sequences: [3])).done == [3])
            #expect(try await bus.fetch("jobs", "workers", batch: 10, by: bus.other).messages.map(\.sequence) == [4, 5])
            bus.time.advance(15)
            // 1 and 2 are past their deadline; 3 is not.
            let again = try await bus.fetch("jobs", "workers", batch: 10, by: bus.other)
            #expect(again.messages.map(\.sequence) == [1, 2] && again.messages.allSatisfy { $0.deliveries == 2 })
            #expect(try await bus.ack("jobs", "workers", [1, 2, 4, 5], by: bus.other).done == [1, 2, 4, 5])
            // The first reader's late acknowledgement of 1 finds it done; its 3 is still its own.
            let late = try await bus.ack("jobs", "workers", [1, 3])
            #expect(late.done == [3] && late.notPending == [1])
            let info = try await bus.client.call(API.consumerInfo, .init(stream: "jobs", name: "workers"))
            #expect(info.acknowledged == 5 && info.pending == 0 && info.redelivered == 2)
        }
    }

    @Test("nak with a delay: handed out again only once the delay has passed; without one, at the next fetch", arguments: Backend.available)
    func nak(backend: Backend) async throws {
        try await StreamsBus.with(backend) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "mail", subjects: ["mail."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "mail", name: "sender"))
            try await bus.publish("mail.out", "a")
            try await bus.publish("mail.out", "b")
            #expect(try await bus.fetch("mail", "sender").messages.map(\.sequence) == [1, 2])
            #expect(try await bus.client.call(API.nak, .init(stream: "mail", consumer: "sender", sequences: [1], delay: 10)).done == [1])
            #expect(try await bus.client.call(API.nak, .init(stream: "mail", consumer: "sender", sequences: [2])).done == [2])
            #expect(try await bus.fetch("mail", "sender").messages.map(\.sequence) == [2])
            bus.time.advance(5)
            #expect(try await bus.fetch("mail", "sender").messages.isEmpty)
            bus.time.advance(5)
            let back = try await bus.fetch("mail", "sender")
            #expect(back.messages.map(\.sequence) == [1] && back.messages[0].deliveries == 2)
        }
    }

    @Test("past max deliveries a message goes to the dead-letter stream with why, and is not handed out again; term drops one without dead-lettering; a whole batch past them at once goes together, on PostgreSQL well within the service's timeout (statements for each held it near the timeout)",
          arguments: Backend.available)
    func deadLetters(backend: Backend) async throws {
        try await StreamsBus.with(backend, { $0.postgres?.operationTimeout = .seconds(1.5) }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "pay", subjects: ["pay."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "pay", name: "charger", ackWait: 10, maxDeliver: 2))
            try await bus.publish("pay.card", ["amount": "12.50"])
            try await bus.publish("pay.card", ["amount": "99.00"])
            #expect(try await bus.fetch("pay", "charger").messages.count == 2)
            #expect(try await bus.client.call(API.term, .init(stream: "pay", consumer: "charger", sequences: [2])).done == [2])
            bus.time.advance(10)
            #expect(try await bus.fetch("pay", "charger").messages.map(\.deliveries) == [2])
            bus.time.advance(10)
            #expect(try await bus.fetch("pay", "charger").messages.isEmpty, "a third delivery is over max_deliver")
            let info = try await bus.client.call(API.consumerInfo, .init(stream: "pay", name: "charger"))
            #expect(info.deadLettered == 1 && info.terminated == 1 && info.pending == 0)

            _ = try await bus.client.call(API.consumerAdd, .init(stream: "pay.dead", name: "ops"))
            let dead = try await bus.fetch("pay.dead", "ops")
            let letter = try #require(dead.messages.first)
            #expect(dead.messages.count == 1 && letter.subject == "pay.card" && letter.data == ["amount": "12.50"])
            #expect(letter.deadLetter?.stream == "pay" && letter.deadLetter?.sequence == 1 && letter.deadLetter?.consumer == "charger"
                    && letter.deadLetter?.deliveries == 2 && letter.deadLetter?.reason.contains("max_deliver") == true)
            // The original stays in a limits stream: another consumer still reads it.
            #expect(try await bus.client.call(API.streamInfo, .init(name: "pay")).messages == 2)

            // As many as a fetch hands out, sent side by side as a busy publisher would.
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "pay", name: "once", deliver: .new, ackWait: 10, maxDeliver: 1))
            let batch = 1_000
            try await sideBySide(batch) { try await bus.publish("pay.card", .int(Int64($0))) }
            #expect(try await bus.fetch("pay", "once", batch: batch).messages.count == batch)
            bus.time.advance(10)
            #expect(try await bus.fetch("pay", "once", batch: batch).messages.isEmpty, "each is past max_deliver")
            #expect(try await bus.client.call(API.consumerInfo, .init(stream: "pay", name: "once")).deadLettered == batch)
            let letters = try await bus.client.call(API.streamMessages, .init(name: "pay.dead", from: 2, max: batch)).messages
            #expect(letters.map { $0.deadLetter?.sequence } == Array(3..<3 + batch))
            #expect(letters.allSatisfy { $0.deadLetter?.consumer == "once" && $0.deadLetter?.deliveries == 1 })
        }
    }

    @Test("a message id published again within the duplicate window is kept once; after the window, again", arguments: Backend.available)
    func duplicates(backend: Backend) async throws {
        try await StreamsBus.with(backend) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "events", subjects: ["ev."], duplicateWindow: 60))
            let first = try await bus.publish("ev.a", 1, id: "e-1")
            let again = try await bus.publish("ev.a", 1, id: "e-1")
            #expect(!first.duplicate && again.duplicate && again.sequence == first.sequence)
            #expect(try await bus.publish("ev.a", 2, id: "e-2").sequence == 2)
            bus.time.advance(61)
            let later = try await bus.publish("ev.a", 1, id: "e-1")
            #expect(!later.duplicate && later.sequence == 3)
            #expect(try await bus.client.call(API.streamInfo, .init(name: "events")).messages == 3)
        }
    }

    @Test("a stream remembers at most maxMessages ids, the newest, however long its duplicate window: an older one re-sent is kept anew; ids past the window go a transaction's worth at a time at the publishes with ids, one re-sent meanwhile kept anew, and from a stream nobody publishes to with ids at the service's look; the count each stream keeps of its ids stays right",
          arguments: Backend.available)
    func idsBounded(backend: Backend) async throws {
        try await StreamsBus.with(backend, { $0.removedPerTransaction = 7 }) { bus in
            @Sendable func remembered(_ stream: String) async throws -> (rows: Int, counted: Int) {
                try await bus.service.read { db in
                    (try db.int("SELECT COUNT(*) FROM message_ids WHERE stream = ?", [stream]) ?? -1,
                     try db.int("SELECT ids FROM streams WHERE name = ?", [stream]) ?? -1)
                }
            }
            _ = try await bus.client.call(API.streamAdd, .init(name: "events", subjects: ["ev."], maxMessages: 5, duplicateWindow: 86_400))
            for number in 1...8 {
                _ = try await bus.publish("ev.a", .int(Int64(number)), id: "e-\(number)")
                bus.time.advance(1)
            }
            #expect(try await remembered("events") == (5, 5))
            #expect(try await bus.publish("ev.a", 8, id: "e-8").duplicate, "among the newest five")
            let again = try await bus.publish("ev.a", 3, id: "e-3")
            #expect(!again.duplicate && again.sequence == 9, "forgotten: kept anew")
            #expect(try await remembered("events") == (5, 5))

            _ = try await bus.client.call(API.streamAdd, .init(name: "many", subjects: ["many"], maxMessages: 1_000, duplicateWindow: 60))
            for number in 1...20 {
                _ = try await bus.publish("many", .int(Int64(number)), id: "m-\(number)")
                bus.time.advance(1)
            }
            #expect(try await remembered("many") == (20, 20))
            bus.time.advance(60)
            // All 20 are past the window. m-3, still remembered, is kept anew, and the seven
            // oldest of the others forgotten.
            #expect(try await !bus.publish("many", 3, id: "m-3").duplicate)
            #expect(try await remembered("many") == (13, 13))
            _ = try await bus.publish("many", "no id")
            #expect(try await remembered("many") == (13, 13), "a publish without an id forgets none")
            #expect(try await bus.publish("many", 3, id: "m-3").duplicate, "within the window since it was kept anew")
            #expect(try await remembered("many") == (6, 6), "a duplicate's publish forgets seven more")
            _ = try await bus.publish("many", 100, id: "m-100")
            #expect(try await remembered("many") == (2, 2), "m-3 and m-100")
            _ = try await bus.publish("many", 101, id: "m-101")
            #expect(try await remembered("many") == (3, 3))

            // Nobody publishes with ids: the service's look forgets those past the window, all of
            // them, seven a transaction; a stream without an age limit is looked at too.
            bus.time.advance(62)
            try await within(30, "a look for ids past their window") { await bus.service.lookedForExpired() }
            #expect(try await remembered("many") == (0, 0))
            #expect(try await remembered("events") == (5, 5), "within its window of a day")
        }
    }

    @Test("ids past the window go by ranges PostgreSQL finds along their index however old its statistics: none of the steps reads the stream's ids whole",
          .enabled(if: TestPostgres.available, "skipped: no PostgreSQL server installed (the test bootstrap installs it)"))
    func forgettingIDsReadsAlongTheIndex() async throws {
        // Each statement's plan in the server's log (auto_explain), for the service's
        // connections, which start after.
        let server = try await TestPostgres.start()
        defer { server.stop() }
        let session = try server.session()
        defer { session.stop() }
        session.send("""
            LOAD 'auto_explain'; ALTER SYSTEM SET session_preload_libraries = 'auto_explain';
            ALTER SYSTEM SET auto_explain.log_min_duration = 0; SELECT pg_reload_conf(); SELECT 'explaining';\n
            """)
        _ = try await session.waitForOutput(containing: "explaining", within: 30)
        let bus = try await StreamsBus.start(backend: .postgres, postgres: server) { $0.removedPerTransaction = 5_000 }
        try await stopping(bus, with: { await $0.stop() }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "many", subjects: ["many"], duplicateWindow: 60))
            // 100,000 ids, a thousand a second, and statistics taken while all were there: as
            // the steps remove them, the statistics say that those left below a time are many.
            session.send("""
                SET search_path TO switchboard_streams;
                INSERT INTO message_ids SELECT 'many', 'id-' || n, n, \(bus.time.now) - 100 + n / 1000.0 FROM generate_series(1, 100000) n;
                UPDATE streams SET ids = 100000 WHERE name = 'many'; ANALYZE message_ids; SELECT 'loaded';\n
                """)
            _ = try await session.waitForOutput(containing: "loaded", within: 120)
            bus.time.advance(61)
            try await within(60, "a look for ids past their window") { await bus.service.lookedForExpired() }
            let plans = server.log.components(separatedBy: "LOG:  duration: ").filter { $0.contains("message_ids") }
            #expect(try await bus.service.read { db in try db.int("SELECT COUNT(*) FROM message_ids", []) } == 0)
            #expect(plans.contains { $0.contains("DELETE FROM message_ids") }, "the steps' plans are logged")
            let whole = plans.filter { $0.contains("Seq Scan on message_ids") }
            #expect(whole.isEmpty, "\(whole.count) of \(plans.count) read the ids whole; the first:\n\(whole.first ?? "")")
        }
    }

    @Test("streams made before each stream counted its ids count them as they open (schema v6)")
    func idsCountedOnMigration() throws {
        let queue = try DatabaseQueue()
        try StreamsSchema.migrator.migrate(queue, upTo: "v5")
        try queue.write { db in
            for name in ["quiet", "busy"] {
                try db.execute(sql: "INSERT INTO streams (name, retention, max_messages, max_bytes, duplicate_window, created_at) VALUES (?, 'limits', 10, 10, 60, 0)",
                               arguments: [name])
            }
            for id in ["a", "b", "c"] {
                try db.execute(sql: "INSERT INTO message_ids (stream, id, seq, published_at) VALUES ('busy', ?, 1, 0)", arguments: [id])
            }
        }
        try StreamsSchema.migrator.migrate(queue)
        let counted = try queue.read { db in try Row.fetchAll(db, sql: "SELECT name, ids FROM streams ORDER BY name").map { [$0["name"] as String: $0["ids"] as Int] } }
        #expect(counted == [["busy": 3], ["quiet": 0]])
    }

    @Test("publishes that come together are written as one, each kept as it would be alone: in order, an id met twice kept once, a subject no stream holds or a message over max_bytes refused alone, the limits kept; a request named twice is written once, one written before answers its first result",
          arguments: Backend.available)
    func publishedTogether(backend: Backend) async throws {
        try await StreamsBus.with(backend) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."], maxMessages: 3, maxBytes: 1_000))
            _ = try await bus.client.call(API.streamAdd, .init(name: "events", subjects: ["ev."], duplicateWindow: 60))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "orders", name: "billing"))
            func publication(_ subject: String, _ data: String, id: String? = nil, request: String?) -> StreamsDatabase.Publication {
                .init(subject: subject, data: Array(data.utf8), id: id, request: request)
            }
            #expect(try await bus.service.writeTogether([publication("ev.start", "0", request: "r0")])[0].get().sequence == 1)
            let outcomes = try await bus.service.writeTogether([
                publication("orders.1", "1", request: "r1"),
                publication("ev.a", "10", id: "e-1", request: "r2"),
                publication("nowhere.1", "2", request: "r3"),
                publication("orders.big", "\"" + String(repeating: "x", count: 1_000) + "\"", request: "r4"),
                publication("ev.b", "11", id: "e-1", request: "r5"),
                publication("orders.2", "3", request: "r1"),
                publication("ev.c", "12", request: "r0"),
                publication("orders.3", "4", request: nil),
                publication("orders.4", "5", request: "r6"),
                publication("orders.5", "6", request: "r7"),
            ])
            let published = outcomes.map { try? $0.get() }
            let refused = outcomes.map { outcome -> Int? in
                guard case .failure(let error) = outcome else { return nil }
                return error.code
            }
            #expect(published[0]?.stream == "orders" && published[0]?.sequence == 1)
            #expect(published[1]?.sequence == 2 && published[1]?.duplicate == false)
            #expect(refused[2] == JSONRPCError.notFoundCode && refused[3] == JSONRPCError.tooLargeCode)
            #expect(published[4]?.sequence == 2 && published[4]?.duplicate == true, "the same id earlier in the same batch")
            #expect(published[5]?.sequence == 1 && published[5]?.stream == "orders", "r1 again: written once")
            #expect(published[6]?.stream == "events" && published[6]?.sequence == 1, "r0, written before the batch")
            #expect(published[7]?.sequence == 2 && published[8]?.sequence == 3 && published[9]?.sequence == 4)
            let orders = try await bus.client.call(API.streamInfo, .init(name: "orders"))
            #expect(orders.messages == 3 && orders.firstSequence == 2 && orders.lastSequence == 4)
            #expect(try await bus.client.call(API.streamInfo, .init(name: "events")).messages == 2)
            let fetched = try await bus.fetch("orders", "billing")
            #expect(fetched.missed == 1 && fetched.messages.map(\.sequence) == [2, 3, 4])
            // Sent again alone, a request of the batch answers what the batch did.
            #expect(try await bus.service.writeTogether([publication("orders.9", "9", request: "r6")])[0].get().sequence == 3)
        }
    }

    @Test("fetches and settlements that come together are written as one, each answered as if alone: the readers of one consumer handed out messages in turn within their batches and bytes, the first told what the consumer missed; a sequence settled once; a request named twice done once; one naming a consumer or stream that is not there refused alone",
          arguments: Backend.available)
    func consumerWritesTogether(backend: Backend) async throws {
        try await StreamsBus.with(backend) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."], maxMessages: 6))
            _ = try await bus.client.call(API.streamAdd, .init(name: "queue", subjects: ["q."], retention: .workQueue))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "orders", name: "billing"))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "queue", name: "doers"))
            // Seven messages of 3 bytes each ("x"): the first goes for the count, missed by billing.
            for _ in 1...7 { try await bus.publish("orders.new", "x") }
            for _ in 1...2 { try await bus.publish("q.job", "y") }
            #expect(try await bus.fetch("queue", "doers").messages.map(\.sequence) == [1, 2])
            typealias Write = StreamsDatabase.ConsumerWrite
            func fetch(_ stream: String, _ consumer: String, batch: Int, maxBytes: Int = 1_000, request: String?) -> Write {
                .init(stream: stream, consumer: consumer, kind: .fetch(.init(batch: batch, maxBytes: maxBytes)), request: request)
            }
            func ack(_ stream: String, _ consumer: String, _ sequences: [Int], request: String?) -> Write {
                .init(stream: stream, consumer: consumer, kind: .settle(sequences: sequences, .ack), request: request)
            }
            let results = try await bus.service.writeTogether([
                fetch("orders", "billing", batch: 2, request: "f1"),
                ack("queue", "doers", [1, 3], request: "a1"),
                fetch("orders", "billing", batch: 1, maxBytes: 1, request: "f2"),
                fetch("orders", "billing", batch: 5, maxBytes: 7, request: "f3"),
                ack("queue", "doers", [1, 2], request: nil),
                fetch("orders", "billing", batch: 5, request: "f4"),
                fetch("orders", "billing", batch: 5, request: "f1"),
            ]).map { try $0.get() }
            let fetched = try [0, 2, 3, 5, 6].map { try results[$0].decode(as: API.Fetched.self) }
            #expect(fetched.map { $0.messages.map(\.sequence) } == [[2, 3], [4], [5, 6], [7], [2, 3]], "one message whatever its size; then as many as fit")
            #expect(fetched.map(\.missed) == [1, 0, 0, 0, 1])
            let acknowledged = try [1, 4].map { try results[$0].decode(as: API.Acknowledged.self) }
            #expect(acknowledged[0].done == [1] && acknowledged[0].notPending == [3])
            #expect(acknowledged[1].done == [2] && acknowledged[1].notPending == [1], "1 was settled by the first")
            let billing = try await bus.client.call(API.consumerInfo, .init(stream: "orders", name: "billing"))
            #expect(billing.pending == 6 && billing.delivered == 6 && billing.nextSequence == 8)
            #expect(try await bus.client.call(API.consumerInfo, .init(stream: "queue", name: "doers")).acknowledged == 2)
            #expect(try await bus.client.call(API.streamInfo, .init(name: "queue")).messages == 0, "a work queue's messages go once done")
            // Sent again alone, a request of the batch answers what the batch did.
            let again = try await bus.service.writeTogether([fetch("orders", "billing", batch: 9, request: "f3")])
            #expect(try again[0].get().decode(as: API.Fetched.self).messages.map(\.sequence) == [5, 6])

            // A consumer or stream that is not there: refused alone, the others written.
            try await bus.publish("orders.new", "x")
            let mixed = try await bus.service.writeTogether([fetch("orders", "nobody", batch: 1, request: "f5"),
                                                             fetch("orders", "billing", batch: 1, request: "f6"),
                                                             ack("nowhere", "billing", [1], request: "a3")])
            let refusals = mixed.map { outcome -> String? in
                guard case .failure(let refusal) = outcome else { return nil }
                return refusal.code == JSONRPCError.notFoundCode ? refusal.message : "\(refusal)"
            }
            #expect(refusals[0]?.contains("no consumer nobody") == true && refusals[2]?.contains("no stream nowhere") == true, "\(refusals)")
            #expect(try mixed[1].get().decode(as: API.Fetched.self).messages.map(\.sequence) == [8])
            #expect(try await bus.client.call(API.consumerInfo, .init(stream: "orders", name: "billing")).nextSequence == 9)
        }
    }

    @Test("publishes written together that fail as a whole (another process wrote one of their requests meanwhile) are written again one at a time: that one answers the other's result, the rest are kept once",
          .enabled(if: TestPostgres.available, "skipped: no PostgreSQL server installed (the test bootstrap installs it)"))
    func publishedTogetherFailing() async throws {
        try await StreamsBus.with(.postgres) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            let server = try #require(bus.postgres), service = bus.service
            // Another process writes request r1: its result is in the table, not yet committed.
            let written = try await server.whileAnotherTransaction("""
                INSERT INTO switchboard_streams.replies VALUES ('r1', '{"stream":"orders","sequence":41,"duplicate":false}', 0)
                """, commitsOnceWaiting: "locktype = 'transactionid'") {
                await service.write([.init(subject: "orders.1", data: Array("1".utf8), id: nil, request: "r1"),
                                     .init(subject: "orders.2", data: Array("2".utf8), id: nil, request: "r2")])
            }
            #expect(try written[0].get().sequence == 41, "r1: the other process's result")
            #expect(try written[1].get().sequence == 1, "r2, alone, after the batch was rolled back")
            #expect(try await bus.client.call(API.streamInfo, .init(name: "orders")).messages == 1)
        }
    }

    @Test("a publish that waits for its stream while another process changes the stream's subjects goes by the subjects as they are when it is written: refused once they no longer hold it",
          .enabled(if: TestPostgres.available, "skipped: no PostgreSQL server installed (the test bootstrap installs it)"))
    func publishWhileSubjectsChange() async throws {
        try await StreamsBus.with(.postgres) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            let server = try #require(bus.postgres), service = bus.service
            // Another process's stream.update, midway: orders holds invoices. instead.
            let written = try await server.whileAnotherTransaction("""
                SELECT pg_advisory_xact_lock(\(StreamsDatabase.addingStreams));
                SELECT name FROM switchboard_streams.streams WHERE name = 'orders' FOR UPDATE;
                DELETE FROM switchboard_streams.subjects WHERE stream = 'orders';
                INSERT INTO switchboard_streams.subjects (prefix, stream) VALUES ('invoices.', 'orders')
                """) {
                await service.write([.init(subject: "orders.1", data: Array("1".utf8), id: nil, request: "r1")])
            }
            guard case .failure(let failure) = try #require(written.first), let refusal = failure as? JSONRPCError else {
                Issue.record("kept by the subjects it began with: \(written)")
                return
            }
            #expect(refusal.code == JSONRPCError.notFoundCode && refusal.message.contains("no stream holds subject orders.1"), "\(refusal)")
            #expect(try await bus.client.call(API.streamInfo, .init(name: "orders")).messages == 0)
        }
    }

    @Test("limits by count, bytes and age remove the oldest; a consumer behind is told how many it missed; purge keeps the sequence", arguments: Backend.available)
    func limits(backend: Backend) async throws {
        try await StreamsBus.with(backend) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "ticks", subjects: ["tick"], maxMessages: 5, maxBytes: 100, maxAge: 60))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "ticks", name: "slow"))
            for number in 1...8 { try await bus.publish("tick", .int(Int64(number))) }
            var info = try await bus.client.call(API.streamInfo, .init(name: "ticks"))
            #expect(info.messages == 5 && info.firstSequence == 4 && info.lastSequence == 8)
            let behind = try await bus.fetch("ticks", "slow", batch: 100)
            #expect(behind.missed == 3 && behind.messages.map(\.sequence) == [4, 5, 6, 7, 8])
            _ = try await bus.ack("ticks", "slow", [4, 5, 6, 7, 8])
            // Bytes: each message is 30 bytes of JSON text; 100 bytes hold three.
            for _ in 1...4 { try await bus.publish("tick", .string(String(repeating: "x", count: 28))) }
            info = try await bus.client.call(API.streamInfo, .init(name: "ticks"))
            #expect(info.bytes <= 100 && info.messages == 3 && info.lastSequence == 12)
            #expect(await bus.failure(API.publish, .init(subject: "tick", data: .string(String(repeating: "y", count: 200))))?.code == JSONRPCError.tooLargeCode)
            // Age.
            bus.time.advance(61)
            #expect(try await bus.fetch("ticks", "slow").missed == 4, "9 went for its bytes, 10 to 12 for their age")
            #expect(try await bus.client.call(API.streamInfo, .init(name: "ticks")).messages == 0)
            try await bus.publish("tick", 13)
            #expect(try await bus.client.call(API.streamPurge, .init(name: "ticks")).messages == 1)
            info = try await bus.client.call(API.streamInfo, .init(name: "ticks"))
            #expect(info.messages == 0 && info.firstSequence == 14)
            #expect(try await bus.publish("tick", 14).sequence == 14)
        }
    }

    @Test("messages past their age go from a stream nobody publishes to or fetches from, a transaction's worth at a time however many: stream.info and stream.messages show only the newer ones, and a consumer behind is told each it missed",
          arguments: Backend.available)
    func expiredWithoutUse(backend: Backend) async throws {
        // Seven a transaction: the 50 past their age go in several.
        try await StreamsBus.with(backend, { $0.removedPerTransaction = 7 }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "idle", subjects: ["idle"], maxAge: 60))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "idle", name: "behind"))
            try await sideBySide(50) { try await bus.publish("idle", .int(Int64($0))) }
            bus.time.advance(30)
            for number in 51...53 { try await bus.publish("idle", .int(Int64(number))) }
            // The first 50 are past their age by more than a look's time; nothing is published or fetched.
            bus.time.advance(30 + 2 * Double(StreamsService.lookForExpired.components.seconds))
            try await within(30, "a look for messages past their age") { await bus.service.lookedForExpired() }
            let info = try await bus.client.call(API.streamInfo, .init(name: "idle"))
            #expect(info.messages == 3 && info.firstSequence == 51 && info.lastSequence == 53, "\(info)")
            let read = try await bus.client.call(API.streamMessages, .init(name: "idle"))
            #expect(read.messages.map(\.sequence) == [51, 52, 53])
            let fetched = try await bus.fetch("idle", "behind", batch: 100)
            #expect(fetched.missed == 50 && fetched.messages.map(\.sequence) == [51, 52, 53])
            // Past their age too, the last ones go; the stream is empty, its sequence goes on.
            bus.time.advance(60)
            try await within(30, "a look for messages past their age") { await bus.service.lookedForExpired() }
            let empty = try await bus.client.call(API.streamInfo, .init(name: "idle"))
            #expect(empty.messages == 0 && empty.bytes == 0 && empty.firstSequence == 54, "\(empty)")
            #expect(try await bus.publish("idle", "after").sequence == 54)
        }
    }

    @Test("more messages past their age than a transaction removes (the service was stopped while they reached it): a publish removes the oldest transaction's worth and is kept; each fetch removes another and hands out nothing until they are gone, then the newer ones, the consumer told of every one it missed; a waiting fetch finds nothing ready meanwhile",
          arguments: Backend.available)
    func pastItsAgeInSteps(backend: Backend) async throws {
        try await StreamsBus.with(backend, { $0.removedPerTransaction = 7 }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "old", subjects: ["old"], maxAge: 60))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "old", name: "behind"))
            try await sideBySide(30) { try await bus.publish("old", .int(Int64($0))) }
            // A minute and more later as the database is written (the bus's clock, which the
            // service's look for messages past their age goes by, stays where it is).
            let later = bus.time.now + 100
            let publication = StreamsDatabase.Publication(subject: "old", data: Array("31".utf8), id: nil, request: nil)
            let published = try await bus.service.write(request: nil) { db, _ in
                try StreamsDatabase.publish(db, [publication], removingAtMost: 7, now: later)[0].get()
            }
            #expect(published.sequence == 31)
            @Sendable func held(_ db: StreamsDatabase.Database) throws -> [Int] {
                try db.rows("SELECT seq FROM messages WHERE stream = 'old' ORDER BY seq", []).map { try $0.int("seq") }
            }
            #expect(try await bus.service.read(held) == Array(8...31), "1 to 7 went with the publish")
            let fetch = StreamsDatabase.ConsumerWrite(stream: "old", consumer: "behind", kind: .fetch(.init(batch: 100, maxBytes: 1_000)), request: nil)
            // What a waiting fetch looks at before it fetches: ready only when the fetch hands
            // something out, so that it waits on rather than end empty.
            @Sendable func ready(_ stream: String, _ consumer: String) async throws -> Bool {
                try await bus.service.read { db in
                    try StreamsDatabase.ready(db, stream: stream, consumer: consumer, mostPending: 1_000, removingAtMost: 7, now: later)
                }
            }
            var fetched: [API.Fetched] = [], left: [[Int]] = [], readiness: [Bool] = []
            while fetched.last?.messages.isEmpty ?? true, fetched.count < 10 {
                readiness.append(try await ready("old", "behind"))
                fetched.append(try await bus.service.write(request: nil) { db, _ in
                    try StreamsDatabase.write(db, [fetch], mostPending: 1_000, removingAtMost: 7, now: later)[0].get().decode(as: API.Fetched.self)
                })
                left.append(try await bus.service.read(held))
            }
            // The fourth finds 31 among the seven it looks at: what is before it goes, and 31 is handed out.
            #expect(fetched.map(\.messages.count) == [0, 0, 0, 1], "\(fetched)")
            #expect(left.map(\.first) == [15, 22, 29, 31], "7 a fetch: \(left)")
            #expect(fetched.last?.missed == 30 && fetched.last?.messages.map(\.sequence) == [31], "\(fetched)")
            #expect(readiness == [false, false, false, true])

            // Fewer past their age than a fetch removes, and nothing newer: nothing is ready.
            _ = try await bus.client.call(API.streamAdd, .init(name: "stale", subjects: ["stale"], maxAge: 60))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "stale", name: "reader"))
            for number in 1...3 { try await bus.publish("stale", .int(Int64(number))) }
            #expect(try await !ready("stale", "reader"))
        }
    }

    @Test("a burst of messages past their age at once goes at the next publish, however many: on PostgreSQL within the service's timeout (removed one by one they held it past the timeout, and every publish after it); the newer ones stay, and a consumer behind counts each it missed",
          arguments: Backend.available)
    func burstPastItsAge(backend: Backend) async throws {
        try await StreamsBus.with(backend, { $0.postgres?.operationTimeout = .seconds(1.5) }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "burst", subjects: ["burst"], maxAge: 60))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "burst", name: "behind"))
            try await sideBySide(2_000) { try await bus.publish("burst", .int(Int64($0))) }
            bus.time.advance(30)
            try await sideBySide(10) { try await bus.publish("burst", .int(Int64($0))) }
            bus.time.advance(31)
            // The first 2,000 are past their age, the ten after them are not.
            #expect(try await bus.publish("burst", "after").sequence == 2_011)
            let info = try await bus.client.call(API.streamInfo, .init(name: "burst"))
            #expect(info.messages == 11 && info.firstSequence == 2_001)
            let fetched = try await bus.fetch("burst", "behind", batch: 100)
            #expect(fetched.missed == 2_000)
            #expect(fetched.messages.map(\.sequence) == Array(2_001...2_011))
        }
    }

    @Test("stream.update changes the limits given, and the dead-letter stream's with them; lowered, the oldest past them go at once and a consumer behind counts them; maxAge 0 lifts the age limit; subjects given are all it holds from then on, none overlapping another stream's; a dead-letter stream's own, or nothing given, is refused", arguments: Backend.available)
    func update(backend: Backend) async throws {
        try await StreamsBus.with(backend) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "ticks", subjects: ["tick"], maxAge: 600))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "ticks", name: "slow"))
            for number in 1...10 { try await bus.publish("tick", .int(Int64(number))) }
            // 1 and 2 done, 3 pending, the rest not handed out yet.
            _ = try await bus.fetch("ticks", "slow", batch: 3)
            _ = try await bus.ack("ticks", "slow", [1, 2])
            var info = try await bus.client.call(API.streamUpdate, .init(name: "ticks", maxMessages: 4))
            #expect(info.maxMessages == 4 && info.messages == 4 && info.firstSequence == 7 && info.maxAge == 600, "the others stay: \(info)")
            let next = try await bus.fetch("ticks", "slow", batch: 10)
            #expect(next.missed == 4 && next.messages.map(\.sequence) == [7, 8, 9, 10], "3 (pending) to 6 missed: \(next)")
            #expect(try await bus.client.call(API.streamInfo, .init(name: "ticks.dead")).maxMessages == 4)
            // Bytes: the data of 7, 8, 9 and 10 is 1, 1, 1 and 2 bytes of JSON; 3 bytes hold the last two.
            info = try await bus.client.call(API.streamUpdate, .init(name: "ticks", maxBytes: 3))
            #expect(info.messages == 2 && info.bytes == 3 && info.firstSequence == 9 && info.maxMessages == 4, "\(info)")
            // Age, and the duplicate window (the dead letters keep none).
            bus.time.advance(100)
            info = try await bus.client.call(API.streamUpdate, .init(name: "ticks", maxAge: 50, duplicateWindow: 0))
            #expect(info.messages == 0 && info.firstSequence == 11 && info.maxAge == 50 && info.duplicateWindow == 0 && info.maxBytes == 3, "\(info)")
            let letters = try await bus.client.call(API.streamInfo, .init(name: "ticks.dead"))
            #expect(letters.maxAge == 50 && letters.maxBytes == 3 && letters.duplicateWindow == 0, "\(letters)")
            #expect(try await bus.publish("tick", 11).sequence == 11, "the sequence goes on")
            let cases: [(JSONRPCError?, Int, String)] = [
                (await bus.failure(API.streamUpdate, .init(name: "ticks")), JSONRPCError.invalidParamsCode, "give at least one setting"),
                (await bus.failure(API.streamUpdate, .init(name: "ticks.dead", maxAge: 5)), JSONRPCError.invalidParamsCode, "stream ticks's dead-letter stream"),
                (await bus.failure(API.streamUpdate, .init(name: "nothing", maxAge: 5)), JSONRPCError.notFoundCode, "no stream nothing"),
                (await bus.failure(API.streamUpdate, .init(name: "ticks", maxMessages: 0)), JSONRPCError.invalidParamsCode, "maxMessages"),
            ]
            for (error, code, words) in cases {
                #expect(error?.code == code && error?.message.contains(words) == true, "\(String(describing: error)): expected \(code) saying \(words)")
            }
            #expect(try await bus.client.call(API.streamInfo, .init(name: "ticks")).maxAge == 50, "nothing changed")
            // maxAge 0 lifts the age limit, the dead letters' with it: what is kept stays, however old.
            info = try await bus.client.call(API.streamUpdate, .init(name: "ticks", maxAge: 0))
            #expect(info.maxAge == nil && info.messages == 1 && info.maxBytes == 3, "the others stay: \(info)")
            #expect(try await bus.client.call(API.streamInfo, .init(name: "ticks.dead")).maxAge == nil)
            bus.time.advance(100)
            try await bus.publish("tick", 1)
            info = try await bus.client.call(API.streamInfo, .init(name: "ticks"))
            #expect(info.messages == 2 && info.firstSequence == 11, "11 is past the old age, and kept: \(info)")
            // As stream.add takes it: 0 is no age limit, as without one.
            #expect(try await bus.client.call(API.streamAdd, .init(name: "ages", subjects: ["age."], maxAge: 0)).maxAge == nil)
            // Subjects: every prefix it holds from then on; what it kept under one left out stays.
            info = try await bus.client.call(API.streamUpdate, .init(name: "ticks", subjects: ["tock.", "tick", "tock."]))
            #expect(info.subjects == ["tick", "tock."] && info.messages == 2 && info.maxBytes == 3, "the limits stay: \(info)")
            #expect(try await bus.publish("tock.a", 2).stream == "ticks")
            info = try await bus.client.call(API.streamUpdate, .init(name: "ticks", subjects: ["tock."]))
            #expect(info.subjects == ["tock."] && info.lastSequence == 13, "\(info)")
            #expect(await bus.failure(API.publish, .init(subject: "tick", data: 1))?.code == JSONRPCError.notFoundCode, "no stream holds tick now")
            let overlapping: [(JSONRPCError?, Int, String)] = [
                (await bus.failure(API.streamUpdate, .init(name: "ticks", subjects: ["age.old"])), JSONRPCError.conflictCode, "stream ages holds age."),
                (await bus.failure(API.streamUpdate, .init(name: "ticks", subjects: ["t", "tock."])), JSONRPCError.invalidParamsCode, "t and tock. overlap"),
                (await bus.failure(API.streamUpdate, .init(name: "ticks", subjects: [])), JSONRPCError.invalidParamsCode, "1 to 32"),
                (await bus.failure(API.streamUpdate, .init(name: "ticks.dead", subjects: ["dead."])), JSONRPCError.invalidParamsCode, "no subjects"),
            ]
            for (error, code, words) in overlapping {
                #expect(error?.code == code && error?.message.contains(words) == true, "\(String(describing: error)): expected \(code) saying \(words)")
            }
            // Its own subjects do not stand in its way.
            #expect(try await bus.client.call(API.streamUpdate, .init(name: "ticks", subjects: ["to"])).subjects == ["to"])
            #expect(try await bus.client.call(API.streamInfo, .init(name: "ages")).subjects == ["age."], "the other stream keeps its own")
        }
    }

    @Test("stream.update lowering limits takes the subjects given, and all else that could refuse it, before it removes what is past the lowered limits: a stream added between cannot take them, and the update's last transaction only lowers", arguments: Backend.available)
    func updateTakesSubjectsFirst(backend: Backend) async throws {
        try await StreamsBus.with(backend) { bus in
            let added = try await bus.client.call(API.streamAdd, .init(name: "ticks", subjects: ["tick"]))
            for number in 1...10 { try await bus.publish("tick", .int(Int64(number))) }
            let asked = API.StreamSettings(name: "ticks", subjects: ["tick", "tock."], maxMessages: 4)
            // The update's first transaction, which the service runs before its removal steps.
            let removals = try await bus.service.write(request: nil) { db, now in
                try StreamsDatabase.updateAllButLowered(db, asked, by: nil, quota: StreamsConfiguration().clientQuota, now: now)
            }
            #expect(removals.map { [$0.from, $0.before] } == [[1, 7]], "1 to 6 are past the lowered count")
            var info = try await bus.client.call(API.streamInfo, .init(name: "ticks"))
            #expect(info.subjects == ["tick", "tock."] && info.maxMessages == added.maxMessages && info.messages == 10, "not lowered yet: \(info)")
            let between = await bus.failure(API.streamAdd, .init(name: "tocks", subjects: ["tock."]))
            #expect(between?.code == JSONRPCError.conflictCode && between?.message == "Conflict: stream ticks holds tock.", "\(String(describing: between))")
            info = try await bus.client.call(API.streamUpdate, asked)
            #expect(info.subjects == ["tick", "tock."] && info.maxMessages == 4 && info.messages == 4 && info.firstSequence == 7, "\(info)")
        }
    }

    @Test("stream.purge with a subject deletes only its messages, with keep all but the last of them; the sequence goes on and a consumer counts what it had not had done; out of range is refused; the same all at once or a message a transaction", arguments: Backend.available, [StreamsConfiguration().removedPerTransaction, 1])
    func purgeSome(backend: Backend, removedPerTransaction: Int) async throws {
        try await StreamsBus.with(backend, { $0.removedPerTransaction = removedPerTransaction }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "events", subjects: ["ev."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "events", name: "reader"))
            for (number, subject) in ["ev.a", "ev.b", "ev.a", "ev.b", "ev.a"].enumerated() { try await bus.publish(subject, .int(Int64(number + 1))) }
            // 1 (ev.a) pending, 2 to 5 not handed out yet.
            #expect(try await bus.fetch("events", "reader", batch: 1).messages.map(\.sequence) == [1])
            #expect(try await bus.client.call(API.streamPurge, .init(name: "events", subject: "ev.a", keep: 1)).messages == 2)
            var info = try await bus.client.call(API.streamInfo, .init(name: "events"))
            #expect(info.messages == 3 && info.firstSequence == 2 && info.bytes == 3, "2, 4 and 5 stay: \(info)")
            let next = try await bus.fetch("events", "reader", batch: 10)
            #expect(next.missed == 2 && next.messages.map(\.sequence) == [2, 4, 5], "1 (pending) and 3 missed: \(next)")
            #expect(try await bus.client.call(API.streamPurge, .init(name: "events", subject: "ev.b")).messages == 2)
            #expect(try await bus.client.call(API.streamPurge, .init(name: "events", keep: 5)).messages == 0, "fewer than 5: none go")
            #expect(try await bus.client.call(API.streamPurge, .init(name: "events", subject: "ev.c")).messages == 0)
            info = try await bus.client.call(API.streamInfo, .init(name: "events"))
            #expect(info.messages == 1 && info.firstSequence == 5 && info.lastSequence == 5, "\(info)")
            #expect(try await bus.client.call(API.streamPurge, .init(name: "events", keep: 0)).messages == 1, "keep 0: all")
            #expect(try await bus.publish("ev.a", 6).sequence == 6, "the sequence goes on")
            // Gaps (a subject's messages purged from between the others'): a purge of all takes the rest.
            for number in 7...12 { try await bus.publish(number % 2 == 1 ? "ev.a" : "ev.b", .int(Int64(number))) }
            #expect(try await bus.client.call(API.streamPurge, .init(name: "events", subject: "ev.b")).messages == 3)
            #expect(try await bus.client.call(API.streamPurge, .init(name: "events")).messages == 4, "6, 7, 9 and 11")
            info = try await bus.client.call(API.streamInfo, .init(name: "events"))
            #expect(info.messages == 0 && info.bytes == 0 && info.firstSequence == 13, "\(info)")
            #expect(await bus.failure(API.streamPurge, .init(name: "events", keep: -1))?.code == JSONRPCError.invalidParamsCode)
            #expect(await bus.failure(API.streamPurge, .init(name: "events", subject: ""))?.message.contains("subject") == true)
        }
    }

    @Test("what the limits and purges remove, each consumer counts once as missed: those it had pending, and those from its position on under its filter, wherever it is (consumers at one position, ahead, past the cut, by subject); the same removed all at once or a message a transaction; consumer.list counts what waits for each as consumer.info does",
          arguments: Backend.available, [StreamsConfiguration().removedPerTransaction, 1])
    func missedByEach(backend: Backend, removedPerTransaction: Int) async throws {
        try await StreamsBus.with(backend, { $0.removedPerTransaction = removedPerTransaction }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "mix", subjects: ["ev."]))
            for name in ["all", "alsoAll", "ahead", "past"] { _ = try await bus.client.call(API.consumerAdd, .init(stream: "mix", name: name)) }
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "mix", name: "onlyA", filter: "ev.a"))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "mix", name: "onlyB", filter: "ev.b"))
            // 1 to 12: the odd ones ev.a, the even ones ev.b.
            for number in 1...12 { try await bus.publish(number % 2 == 1 ? "ev.a" : "ev.b", .int(Int64(number))) }
            // ahead: 1 to 4 handed out, 3 and 4 still pending; onlyB: 2 and 4, 4 pending; past: 1 to 10 done.
            #expect(try await bus.fetch("mix", "ahead", batch: 4).messages.count == 4)
            _ = try await bus.ack("mix", "ahead", [1, 2])
            #expect(try await bus.fetch("mix", "onlyB", batch: 2).messages.map(\.sequence) == [2, 4])
            _ = try await bus.ack("mix", "onlyB", [2])
            _ = try await bus.fetch("mix", "past", batch: 10)
            _ = try await bus.ack("mix", "past", Array(1...10))
            func missed() async throws -> [String: Int] {
                var counts: [String: Int] = [:]
                for name in ["all", "alsoAll", "ahead", "past", "onlyA", "onlyB"] {
                    counts[name] = try await bus.client.call(API.consumerInfo, .init(stream: "mix", name: name)).missed
                }
                return counts
            }
            // What waits for each, counted together by consumer.list as consumer.info counts it alone.
            func waiting() async throws -> [String: Int] {
                let listed = try await bus.client.call(API.consumerList, .init(stream: "mix")).consumers
                #expect(listed.map(\.name) == ["ahead", "all", "alsoAll", "onlyA", "onlyB", "past"])
                for info in listed {
                    let alone = try await bus.client.call(API.consumerInfo, .init(stream: "mix", name: info.name))
                    #expect(try JSONValue(encoding: info) == JSONValue(encoding: alone))
                }
                return Dictionary(uniqueKeysWithValues: listed.map { ($0.name, $0.waiting) })
            }
            #expect(try await waiting() == ["all": 12, "alsoAll": 12, "ahead": 8, "past": 2, "onlyA": 6, "onlyB": 4],
                    "ahead: 5 to 12; past: 11 and 12; onlyA: the odd ones; onlyB: 6, 8, 10 and 12")
            // 1 to 8 go for the count.
            _ = try await bus.client.call(API.streamUpdate, .init(name: "mix", maxMessages: 4))
            #expect(try await missed() == ["all": 8, "alsoAll": 8, "ahead": 6, "past": 0, "onlyA": 4, "onlyB": 3],
                    "ahead: 3 and 4 pending, 5 to 8 not handed out; onlyA: 1, 3, 5, 7; onlyB: 4 pending, 6 and 8")
            // ev.a's 9 and 11 go, by subject; then the rest, 10 and 12 (past had 10 done).
            #expect(try await bus.client.call(API.streamPurge, .init(name: "mix", subject: "ev.a")).messages == 2)
            #expect(try await missed() == ["all": 10, "alsoAll": 10, "ahead": 8, "past": 1, "onlyA": 6, "onlyB": 3])
            #expect(try await bus.client.call(API.streamPurge, .init(name: "mix")).messages == 2)
            #expect(try await missed() == ["all": 12, "alsoAll": 12, "ahead": 10, "past": 2, "onlyA": 6, "onlyB": 5])
            #expect(try await waiting() == ["all": 0, "alsoAll": 0, "ahead": 0, "past": 0, "onlyA": 0, "onlyB": 0])
            #expect(await bus.failure(API.consumerList, .init(stream: "none"))?.code == JSONRPCError.notFoundCode)
        }
    }

    @Test("on SQLite a stream deleted, purged or given a lower limit gives its messages' room back to the disk once answered; the other streams keep theirs, and go on")
    func deletedMessagesGiveTheirRoomBack() async throws {
        try await StreamsBus.with(.sqlite) { bus in
            let file = bus.folder.appendingPathComponent("streams.sqlite").path
            // The file and its write-ahead log, which the deletes grow.
            func fileBytes() throws -> Int {
                try [file, file + "-wal"].reduce(0) { try $0 + #require(FileManager.default.attributesOfItem(atPath: $1)[.size] as? Int) }
            }
            _ = try await bus.client.call(API.streamAdd, .init(name: "big", subjects: ["big."]))
            _ = try await bus.client.call(API.streamAdd, .init(name: "kept", subjects: ["kept."]))
            try await bus.publish("kept.first", "still here")
            // Twice the write-ahead log's automatic checkpoint: most of it is copied into the file.
            let data = JSONValue.string(String(repeating: "x", count: 100_000))
            for index in 0..<80 { try await bus.publish("big.\(index % 4)", data) }
            let full = try fileBytes()
            try #require(full > 4_000_000, "the messages are in the file: \(full) bytes")

            #expect(try await bus.client.call(API.streamDelete, .init(name: "big")).messages == 80)
            try await within(60, "the delete's room given back") { await bus.service.roomGivenBack(times: 2) }
            #expect(try fileBytes() < 1_000_000, "\(full) bytes before the delete")
            #expect(try await bus.client.call(API.streamMessages, .init(name: "kept")).messages.map(\.data) == ["still here"])

            for index in 0..<80 { try await bus.publish("kept.\(index)", data) }
            #expect(try await bus.client.call(API.streamPurge, .init(name: "kept", keep: 1)).messages == 80)
            try await within(60, "the purge's room given back") { await bus.service.roomGivenBack(times: 3) }
            #expect(try fileBytes() < 1_000_000)
            #expect(try await bus.publish("kept.last", "after").sequence == 82)

            for index in 0..<80 { try await bus.publish("kept.\(index)", data) }
            #expect(try await bus.client.call(API.streamUpdate, .init(name: "kept", maxMessages: 1)).messages == 1)
            try await within(60, "the lowered limit's room given back") { await bus.service.roomGivenBack(times: 4) }
            #expect(try fileBytes() < 1_000_000)
        }
    }

    @Test("a stream added again under the name of one deleted removes what is left of the old one's rows a transaction at a time, as the service's own removal does: however many are left, no statement runs past the database's timeout, and the other streams' publishes go on meanwhile",
          .enabled(if: TestPostgres.available, "skipped: no PostgreSQL server installed (the test bootstrap installs it)"))
    func addAgainRemovesTheOldRowsInSteps() async throws {
        try await StreamsBus.with(.postgres, { $0.removedPerTransaction = 7 }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            _ = try await bus.client.call(API.streamAdd, .init(name: "other", subjects: ["other."]))
            for number in 1...20 { try await bus.publish("orders.new", .int(Int64(number))) }
            // Deleted without the service's removal after it: its rows stay, listed as deleted.
            _ = try await bus.service.write(request: nil) { db, _ in try StreamsDatabase.deleteStream(db, "orders", by: nil) }
            let server = try #require(bus.postgres)
            // A session holding the old stream's 10th message, in the add's second step.
            let holder = try server.session()
            defer { holder.stop() }
            holder.send("BEGIN; SELECT seq FROM switchboard_streams.messages WHERE stream = 'orders' AND seq = 10 FOR UPDATE; SELECT 'holding';\n")
            _ = try await holder.waitForOutput(containing: "holding", within: 10)
            async let added = bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            let watcher = try server.session()
            defer { watcher.stop() }
            try await server.waitForLockWaiters(1, where: "true", on: watcher)
            // The first step is done, in a transaction of its own; the others' publishes go on.
            #expect(try await bus.service.read { db in try db.int("SELECT COUNT(*) FROM messages WHERE stream = 'orders'", []) } == 13)
            #expect(try await bus.publish("other.new", 2).sequence == 1)
            holder.send("COMMIT;\n")
            let again = try await added
            #expect(again.messages == 0 && again.lastSequence == 0, "\(again)")
            #expect(try await bus.service.read { db in try StreamsDatabase.deletedStreams(db) } == [])
            #expect(try await bus.publish("orders.new", 3).sequence == 1)
        }
    }

    @Test("stream.delete answers once the stream and its consumers are gone; its messages, ids and pending deliveries go after, a few at a time; added again under the name it starts empty from 1; what a stopped process left the next removes",
          arguments: Backend.available)
    func deletedStreamsRowsGoAfter(backend: Backend) async throws {
        /// The messages, ids and pending deliveries of `stream` in the database.
        @Sendable func rows(_ db: StreamsDatabase.Database, _ stream: String) throws -> [Int] {
            try ["messages", "message_ids", "pending"].map { try db.int("SELECT COUNT(*) FROM \($0) WHERE stream = ?", [stream]) ?? 0 }
        }
        /// A stream with five messages published with ids, three of them pending.
        func fill(_ bus: StreamsBus, _ stream: String) async throws {
            _ = try await bus.client.call(API.streamAdd, .init(name: stream, subjects: ["\(stream)."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: stream, name: "billing"))
            for number in 1...5 { try await bus.publish("\(stream).new", .int(Int64(number)), id: "\(stream)-\(number)") }
            #expect(try await bus.fetch(stream, "billing", batch: 3).messages.count == 3)
        }
        let bus = try await StreamsBus.start(backend: backend)
        try await stopping(bus, with: { await $0.stop(keepDatabase: true) }) { bus in
            // Deleted, then removed two rows of each table a transaction: what is left after each.
            try await fill(bus, "first")
            let steps: DeletionSteps = try await bus.service.write(request: nil) { db, _ in
                let answered = try StreamsDatabase.deleteStream(db, "first", by: nil).messages
                var steps = DeletionSteps(answered: answered, left: [try rows(db, "first")], listed: try StreamsDatabase.deletedStreams(db))
                var removed = StreamsDatabase.DeletedRowsRemoved()
                while let next = try StreamsDatabase.removeDeleted(db, "first", atMost: 2, after: removed) {
                    removed = next
                    steps.left.append(try rows(db, "first"))
                }
                steps.left.append(try rows(db, "first"))
                steps.listedAfter = try StreamsDatabase.deletedStreams(db)
                return steps
            }
            // The third step removes the last message, the fourth finds none after it.
            #expect(steps.answered == 5 && steps.left == [[5, 5, 3], [3, 3, 1], [1, 1, 0], [0, 0, 0], [0, 0, 0]])
            #expect(steps.listed == ["first", "first.dead"] && steps.listedAfter == ["first.dead"])

            // Each step looks after the keys removed; rows before them (a stream of the name
            // added, published to and deleted again meanwhile) are looked for from the first.
            let restarted: [StreamsDatabase.DeletedRowsRemoved?] = try await bus.service.write(request: nil) { db, _ in
                try db.execute("INSERT INTO deleted_streams (name) VALUES ('again')", [])
                try db.execute("INSERT INTO messages (stream, seq, subject, data, published_at) VALUES ('again', 1, 'again.new', ?, 0), ('again', 9, 'again.new', ?, 0)",
                               [Array("1".utf8), Array("9".utf8)])
                var steps = [try StreamsDatabase.removeDeleted(db, "again", atMost: 1, after: .init(messages: 5))]
                while let removed = steps.last!, steps.count < 6 { steps.append(try StreamsDatabase.removeDeleted(db, "again", atMost: 1, after: removed)) }
                return steps
            }
            #expect(restarted == [.init(messages: 9), .init(), .init(messages: 1), nil], "9, after 5; none after 9, but 1 before: from the first, 1; then none")
            #expect(try await bus.service.read { db in try rows(db, "again") } == [0, 0, 0])
            #expect(try await bus.service.read(StreamsDatabase.deletedStreams) == ["first.dead"])

            // Deleted and added again before its rows were removed: they go as it is added.
            try await fill(bus, "orders")
            _ = try await bus.service.write(request: nil) { db, _ in try StreamsDatabase.deleteStream(db, "orders", by: nil) }
            #expect(try await bus.service.read { db in try rows(db, "orders") } == [5, 5, 3])
            let again = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            #expect(again.messages == 0 && again.consumers.isEmpty)
            let published = try await bus.publish("orders.new", 6, id: "orders-1")
            #expect(published.sequence == 1 && !published.duplicate)
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "orders", name: "billing"))
            #expect(try await bus.fetch("orders", "billing").messages.map(\.data) == [6])
            #expect(try await bus.service.read { db in try rows(db, "orders") } == [1, 1, 1])

            // Deleted by a process that stopped before removing its rows.
            try await fill(bus, "left")
            _ = try await bus.service.write(request: nil) { db, _ in try StreamsDatabase.deleteStream(db, "left", by: nil) }
        }
        let restarted = try await StreamsBus.start(folder: bus.folder, time: bus.time, backend: backend, postgres: bus.postgres)
        try await stopping(restarted, with: { await $0.stop() }) { bus in
            try await within(60, "the deleted streams' rows removed at the start") { await bus.service.roomGivenBack(times: 1) }
            let left: [Int] = try await bus.service.read { db in try rows(db, "left") + rows(db, "first.dead") + [StreamsDatabase.deletedStreams(db).count] }
            #expect(left == [0, 0, 0, 0, 0, 0, 0])
            #expect(try await bus.client.call(API.streamList).streams.map(\.name) == ["orders", "orders.dead"])

            // And deleted as a client does: removed once answered.
            #expect(try await bus.client.call(API.streamDelete, .init(name: "orders")).messages == 1)
            try await within(60, "the deleted stream's rows removed") { await bus.service.roomGivenBack(times: 2) }
            let removed: [Int] = try await bus.service.read { db in try rows(db, "orders") + [StreamsDatabase.deletedStreams(db).count] }
            #expect(removed == [0, 0, 0, 0])
        }
    }

    @Test("a consumer's maxAckPending: with that many pending, fetches hand out only those due again; an acknowledgement makes room, for a fetch that waits too; consumer.update changes it, 0 making it the service's; adding it again matches it as it is now", arguments: Backend.available)
    func maxAckPending(backend: Backend) async throws {
        try await StreamsBus.with(backend) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "jobs", subjects: ["job."]))
            var info = try await bus.client.call(API.consumerAdd, .init(stream: "jobs", name: "workers", ackWait: 10, maxAckPending: 2))
            #expect(info.maxAckPending == 2)
            for number in 1...5 { try await bus.publish("job.a", .int(Int64(number))) }
            #expect(try await bus.fetch("jobs", "workers", batch: 10).messages.map(\.sequence) == [1, 2])
            #expect(try await bus.fetch("jobs", "workers", batch: 10).messages.isEmpty, "two pending: none more")
            // A fetch that waits gets the next one once an acknowledgement makes room.
            let waiting = Task { try await bus.client.call(API.fetch, .init(stream: "jobs", consumer: "workers", batch: 10, wait: 20), timeout: .seconds(30)) }
            _ = try await bus.ack("jobs", "workers", [1])
            #expect(try await waiting.value.messages.map(\.sequence) == [3])
            // Past their deadline, pending ones are handed out again, the limit notwithstanding.
            bus.time.advance(11)
            #expect(try await bus.fetch("jobs", "workers", batch: 10).messages.map(\.sequence) == [2, 3])
            info = try await bus.client.call(API.consumerUpdate, .init(stream: "jobs", name: "workers", maxAckPending: 3))
            #expect(info.maxAckPending == 3 && info.pending == 2 && info.ackWait == 10, "\(info)")
            #expect(try await bus.fetch("jobs", "workers", batch: 10).messages.map(\.sequence) == [4])
            info = try await bus.client.call(API.consumerUpdate, .init(stream: "jobs", name: "workers", maxAckPending: 0))
            #expect(info.maxAckPending == nil, "\(info)")
            #expect(try await bus.fetch("jobs", "workers", batch: 10).messages.map(\.sequence) == [5])
            // Added again as it is now: the service's most, given as 0 or left out.
            for most in [nil, 0] as [Int?] {
                #expect(try await bus.client.call(API.consumerAdd, .init(stream: "jobs", name: "workers", ackWait: 10, maxAckPending: most)).pending == 4)
            }
            let conflict = await bus.failure(API.consumerAdd, .init(stream: "jobs", name: "workers", ackWait: 10, maxAckPending: 7))
            #expect(conflict?.code == JSONRPCError.conflictCode && conflict?.message.contains("maxAckPending is none, asked 7") == true, "\(String(describing: conflict))")
            #expect(await bus.failure(API.consumerAdd, .init(stream: "jobs", name: "other", maxAckPending: -1))?.code == JSONRPCError.invalidParamsCode)
        }
    }

    @Test("the service's streams.max_ack_pending bounds every consumer: one added without a most of its own has it, one asking more is refused naming it, 0 is it, and one added before it was lowered is held to it", arguments: Backend.available)
    func servicePendingLimit(backend: Backend) async throws {
        let bus = try await StreamsBus.start(backend: backend)
        try await stopping(bus, with: { await $0.stop(keepKernel: true, keepDatabase: true) }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "jobs", subjects: ["job."]))
            #expect(try await bus.client.call(API.consumerAdd, .init(stream: "jobs", name: "older", maxAckPending: 8)).maxAckPending == 8)
            for number in 1...10 { try await bus.publish("job.a", .int(Int64(number))) }
        }
        let again = try await bus.restarted { $0.maxAckPending = 3 }
        try await stopping(again, with: { await $0.stop() }) { bus in
            #expect(try await bus.fetch("jobs", "older", batch: 10).messages.map(\.sequence) == [1, 2, 3], "its own 8 is over the service's 3")
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "jobs", name: "plain"))
            #expect(try await bus.fetch("jobs", "plain", batch: 10).messages.map(\.sequence) == [1, 2, 3])
            #expect(try await bus.fetch("jobs", "plain", batch: 10).messages.isEmpty, "three pending: none more")
            let greedy = await bus.failure(API.consumerAdd, .init(stream: "jobs", name: "greedy", maxAckPending: 4))
            #expect(greedy?.code == JSONRPCError.tooLargeCode && greedy?.message.contains("streams.max_ack_pending (3)") == true, "\(String(describing: greedy))")
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "jobs", name: "modest", maxAckPending: 2))
            #expect(try await bus.fetch("jobs", "modest", batch: 10).messages.map(\.sequence) == [1, 2])
            #expect(await bus.failure(API.consumerUpdate, .init(stream: "jobs", name: "modest", maxAckPending: 4))?.code == JSONRPCError.tooLargeCode)
            #expect(try await bus.client.call(API.consumerUpdate, .init(stream: "jobs", name: "modest", maxAckPending: 0)).maxAckPending == nil)
            #expect(try await bus.fetch("jobs", "modest", batch: 10).messages.map(\.sequence) == [3])
            #expect(try await bus.client.call(API.consumerList, .init(stream: "jobs")).consumers.map(\.name) == ["modest", "older", "plain"], "greedy was not added")
        }
    }

    @Test("consumer.update changes a consumer's ack wait, maximum deliveries and filter, keeping its position and pending messages (with their deadlines); adding it again matches its settings as they are now; no setting given, or no such consumer, is refused", arguments: Backend.available)
    func updateConsumer(backend: Backend) async throws {
        try await StreamsBus.with(backend) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "jobs", subjects: ["job."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "jobs", name: "workers", ackWait: 10, maxDeliver: 5))
            for number in 1...3 { try await bus.publish("job.a", .int(Int64(number))) }
            _ = try await bus.fetch("jobs", "workers", batch: 2)
            let info = try await bus.client.call(API.consumerUpdate, .init(stream: "jobs", name: "workers", ackWait: 60, maxDeliver: 1))
            #expect(info.ackWait == 60 && info.maxDeliver == 1 && info.pending == 2 && info.nextSequence == 3, "\(info)")
            // 1 and 2 keep their 10 s; past it, handed out once, the new maximum, they go to the dead letters.
            bus.time.advance(11)
            #expect(try await bus.fetch("jobs", "workers", batch: 10).messages.map(\.sequence) == [3])
            #expect(try await bus.client.call(API.streamInfo, .init(name: "jobs.dead")).messages == 2)
            // 3 was handed out with the new wait.
            bus.time.advance(30)
            #expect(try await bus.fetch("jobs", "workers", batch: 10).messages.isEmpty, "3 is pending for 60 s")
            // Added again: with its settings as they are now it is shown; with those it had, a conflict names them.
            #expect(try await bus.client.call(API.consumerAdd, .init(stream: "jobs", name: "workers", ackWait: 60, maxDeliver: 1)).pending == 1)
            let conflict = await bus.failure(API.consumerAdd, .init(stream: "jobs", name: "workers", ackWait: 10, maxDeliver: 5))
            #expect(conflict?.code == JSONRPCError.conflictCode && conflict?.message.contains("ackWait is 60, asked 10; maxDeliver is 1, asked 5") == true,
                    "\(String(describing: conflict))")
            let cases: [(JSONRPCError?, Int, String)] = [
                (await bus.failure(API.consumerUpdate, .init(stream: "jobs", name: "workers")), JSONRPCError.invalidParamsCode, "give at least one setting"),
                (await bus.failure(API.consumerUpdate, .init(stream: "jobs", name: "nobody", ackWait: 5)), JSONRPCError.notFoundCode, "no consumer nobody"),
                (await bus.failure(API.consumerUpdate, .init(stream: "jobs", name: "workers", maxDeliver: 0)), JSONRPCError.invalidParamsCode, "maxDeliver"),
            ]
            for (error, code, words) in cases {
                #expect(error?.code == code && error?.message.contains(words) == true, "\(String(describing: error)): expected \(code) saying \(words)")
            }
            #expect(try await bus.client.call(API.consumerInfo, .init(stream: "jobs", name: "workers")).ackWait == 60, "nothing changed")
            // A filter chooses among what it has not handed out yet; "" lifts it.
            for (number, subject) in ["job.b", "job.a", "job.b"].enumerated() { try await bus.publish(subject, .int(Int64(number + 4))) }
            var filtered = try await bus.client.call(API.consumerUpdate, .init(stream: "jobs", name: "workers", filter: "job.b"))
            #expect(filtered.filter == "job.b" && filtered.waiting == 2 && filtered.ackWait == 60 && filtered.pending == 1, "\(filtered)")
            #expect(try await bus.fetch("jobs", "workers", batch: 1).messages.map(\.sequence) == [4])
            filtered = try await bus.client.call(API.consumerUpdate, .init(stream: "jobs", name: "workers", filter: ""))
            #expect(filtered.filter == nil && filtered.waiting == 2, "\(filtered)")
            #expect(try await bus.fetch("jobs", "workers", batch: 10).messages.map(\.sequence) == [5, 6])
            #expect(try await bus.client.call(API.consumerAdd, .init(stream: "jobs", name: "workers", ackWait: 60, maxDeliver: 1)).filter == nil,
                    "added again as it is now: no filter")
            #expect(await bus.failure(API.consumerUpdate, .init(stream: "jobs", name: "workers", filter: "job. b"))?.code == JSONRPCError.invalidParamsCode)
        }
    }

    @Test("a work-queue stream: a message acknowledged or terminated is deleted; one consumer only; a whole batch acknowledged at once goes together, on PostgreSQL well within the service's timeout (a statement for each held it near the timeout)",
          arguments: Backend.available)
    func workQueue(backend: Backend) async throws {
        try await StreamsBus.with(backend, { $0.postgres?.operationTimeout = .seconds(1.5) }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "queue", subjects: ["q."], retention: .workQueue))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "queue", name: "doers"))
            #expect(await bus.failure(API.consumerAdd, .init(stream: "queue", name: "others"))?.code == JSONRPCError.conflictCode)
            for number in 1...3 { try await bus.publish("q.job", .int(Int64(number))) }
            #expect(try await bus.fetch("queue", "doers").messages.count == 3)
            _ = try await bus.ack("queue", "doers", [1, 3])
            var info = try await bus.client.call(API.streamInfo, .init(name: "queue"))
            #expect(info.messages == 1 && info.firstSequence == 2)
            _ = try await bus.client.call(API.term, .init(stream: "queue", consumer: "doers", sequences: [2]))
            info = try await bus.client.call(API.streamInfo, .init(name: "queue"))
            #expect(info.messages == 0 && info.bytes == 0 && info.lastSequence == 3 && info.firstSequence == 4)

            // As many as one acknowledgement names, and one more.
            let most = API.Sequences.most
            try await sideBySide(most + 1) { try await bus.publish("q.job", .int(Int64($0))) }
            let batch = try await bus.fetch("queue", "doers", batch: most).messages.map(\.sequence)
            #expect(batch == Array(4..<4 + most))
            _ = try await bus.ack("queue", "doers", batch)
            info = try await bus.client.call(API.streamInfo, .init(name: "queue"))
            #expect(info.messages == 1 && info.firstSequence == 4 + most && info.lastSequence == 4 + most)
        }
    }

    @Test("a fetch that waits is answered with a message published while it waited; a fetch, a purge, a publish and a delete sent again are answered as the first time and applied once", arguments: Backend.available)
    func waitingAndResent(backend: Backend) async throws {
        try await StreamsBus.with(backend, { $0.removedPerTransaction = 1 }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "news", subjects: ["news."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "news", name: "reader", deliver: .new))
            async let waited = bus.other.call(API.fetch, .init(stream: "news", consumer: "reader", wait: 30))
            try await bus.publish("news.flash", "hello")
            let fetched = try await waited
            #expect(fetched.messages.map(\.data) == ["hello"])

            try await bus.publish("news.flash", "again")
            // The same request (client and id) twice, as a client re-sends one after a kernel
            // failover: one batch, handed out once.
            let body = JSONRPCRequest(id: .number(900_007), method: API.fetch.name, params: ["stream": "news", "consumer": "reader"], client: "re-sender").jsonBytes
            var answers: [JSONValue] = []
            for _ in 0..<2 {
                let reply = try await bus.client.call(service: API.service, body: [Frame(body)])
                answers.append(try #require(try JSONRPC.parseResponses(reply[0].bytes).first).outcome.get())
            }
            #expect(answers[0] == answers[1] && answers[0]["messages"]?.arrayValue?.count == 1)
            let info = try await bus.client.call(API.consumerInfo, .init(stream: "news", name: "reader"))
            #expect(info.delivered == 2 && info.pending == 2)

            // A fetch that may wait a minute, sent again once answered: its first answer comes
            // back at once (nothing is ready for a second look), well within a 20 s timeout.
            try await bus.publish("news.flash", "late")
            let waiting = JSONRPCRequest(id: .number(900_010), method: API.fetch.name, params: ["stream": "news", "consumer": "reader", "wait": 60],
                                         client: "re-sender").jsonBytes
            var againAnswers: [JSONValue] = []
            for _ in 0..<2 {
                let reply = try await bus.client.call(service: API.service, body: [Frame(waiting)], timeout: .seconds(20))
                againAnswers.append(try #require(try JSONRPC.parseResponses(reply[0].bytes).first).outcome.get())
            }
            #expect(againAnswers[0] == againAnswers[1] && againAnswers[0]["messages"]?.arrayValue?.first?["data"] == "late")

            // A purge sent again once done (a transaction at a time, one message each here):
            // answered as the first time, and what came between the two stays.
            _ = try await bus.client.call(API.consumerDelete, .init(stream: "news", name: "reader"))
            let purge = JSONRPCRequest(id: .number(900_011), method: API.streamPurge.name, params: ["name": "news"], client: "re-sender").jsonBytes
            var purges: [JSONValue] = []
            for _ in 0..<2 {
                let reply = try await bus.client.call(service: API.service, body: [Frame(purge)])
                purges.append(try #require(try JSONRPC.parseResponses(reply[0].bytes).first).outcome.get())
                try await bus.publish("news.flash", "after the purge")
            }
            #expect(purges[0] == purges[1] && purges[0]["messages"] == 3, "\(purges)")
            #expect(try await bus.client.call(API.streamMessages, .init(name: "news")).messages.map(\.data) == ["after the purge", "after the purge"])

            // A publish and a delete sent again: the publish kept once, and the delete answered
            // as it was the first time (not "no stream"), the stream gone once. (Ids the
            // client's own calls never reach: it would take their replies for its own.)
            for (id, method, params) in [(900_008, API.publish.name, ["subject": "news.flash", "data": "once"] as JSONValue),
                                         (900_009, API.streamDelete.name, ["name": "news"] as JSONValue)] {
                let body = JSONRPCRequest(id: .number(Int64(id)), method: method, params: params, client: "re-sender").jsonBytes
                var answers: [JSONValue] = []
                for _ in 0..<2 {
                    let reply = try await bus.client.call(service: API.service, body: [Frame(body)])
                    answers.append(try #require(try JSONRPC.parseResponses(reply[0].bytes).first).outcome.get())
                }
                #expect(answers[0] == answers[1], "\(method): \(answers)")
            }
            #expect(try await bus.client.call(API.streamList).streams.isEmpty)
        }
    }

    @Test("push: a reader following a consumer gets each message as a part once it is published; what it leaves unacknowledged goes to the next reader after the ack wait")
    func push() async throws {
        try await StreamsBus.with { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "feed", subjects: ["feed."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "feed", name: "live", deliver: .new, ackWait: 30))
            let parts = bus.other.stream(API.next, .init(stream: "feed", consumer: "live", max: 3, expires: 60), timeout: .seconds(70))
            var iterator = parts.makeAsyncIterator()
            var received: [Int] = []
            // Each published once the one before has arrived: they come as they are published.
            for number in 1...3 {
                try await bus.publish("feed.item", .int(Int64(number)))
                received.append(try #require(try await iterator.next()).sequence)
            }
            #expect(received == [1, 2, 3])
            let end = try await parts.end()
            #expect(end.count == 3 && end.messages.isEmpty)
            // The reader acknowledged 1 and left with 2 and 3.
            _ = try await bus.ack("feed", "live", [1], by: bus.other)
            bus.time.advance(30)
            let whole = try await bus.client.call(API.nextMethod, .init(stream: "feed", consumer: "live", max: 2, expires: 5))
            #expect(whole.messages.map(\.sequence) == [2, 3] && whole.messages.allSatisfy { $0.deliveries == 2 } && whole.count == 2)
            // Gathered into one reply, the messages end at 1 MiB of data, whatever max says.
            let large = JSONValue.string(String(repeating: "x", count: 600_000))
            for _ in 1...3 { try await bus.publish("feed.large", large) }
            let bounded = try await bus.client.call(API.nextMethod, .init(stream: "feed", consumer: "live", max: 1_000, expires: 30))
            #expect(bounded.messages.map(\.sequence) == [4, 5], "the second passes 1 MiB and ends the reply; 6 waits")
        }
    }

    @Test("push: when a reader's stream ends while it is handed a batch, what it was not sent goes to the group's other readers at once, uncounted", arguments: Backend.available)
    func pushEndsMidBatch(backend: Backend) async throws {
        try await StreamsBus.with(backend) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "feed", subjects: ["feed."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "feed", name: "live", ackWait: 30))
            for number in 1...5 { try await bus.publish("feed.item", .int(Int64(number))) }
            // A reader whose parts stop reaching it after the first: the host's sender fails
            // as it does once the kernel said `stop` or the connection went.
            final class GoneAfterOnePart: PartOut {
                let sent = Mutex(0)
                func send(_ part: [UInt8]) async throws {
                    guard sent.withLock({ $0 += 1; return $0 }) == 1 else {
                        throw JSONRPCError.streamEnded("its client", parts: 1, reason: "stopped", service: API.service)
                    }
                }
                var isRead: Bool { true }
            }
            let reader = GoneAfterOnePart()
            let request = JSONRPCRequest(id: .number(1), method: API.nextMethod.name,
                                         paramsText: try JSONValue(encoding: API.Next(stream: "feed", consumer: "live", max: 5, expires: 5)).jsonBytes,
                                         stream: true)
            let answer = await MethodTable(of: bus.service).answer(body: request.jsonBytes, on: bus.service, parts: reader)
            #expect(answer.errors == 1 && reader.sent.withLock { $0 } == 2, "\(String(decoding: answer.reply, as: UTF8.self))")
            // No time has passed: without the give-back the other four would wait out the ack wait.
            let other = try await bus.fetch("feed", "live", by: bus.other)
            #expect(other.messages.map(\.sequence) == [2, 3, 4, 5] && other.messages.allSatisfy { $0.deliveries == 1 }, "\(other.messages.map(\.sequence))")
            let info = try await bus.client.call(API.consumerInfo, .init(stream: "feed", name: "live"))
            #expect(info.delivered == 5 && info.redelivered == 0 && info.pending == 5, "\(info)")
        }
    }

    /// When a push reader leaves its stream.
    enum Leaving: CaseIterable {
        case afterAMessage
        /// While its worker waits for the first message: the kernel finds the request the
        /// worker holds, which has sent no part.
        case beforeAnyMessage
    }

    @Test("reads that wait hold at most three quarters of the worker's places, as switchboard up bounds them: past that another is refused -32001 naming the limit, to ask again later, while publishes and acknowledgements are answered; a reader that ends makes room for another")
    func waitingReadsLeavePlaces() async throws {
        // One connection of four places: three may wait, one stays for everything else.
        let most = StreamsConfiguration.mostWaitingReads(connections: 1, window: 4)
        #expect(most == 3)
        #expect(StreamsConfiguration.mostWaitingReads(connections: .max, window: 16) > 0, "a product past Int saturates, not traps")
        let bus = try await StreamsBus.start(connections: 1, window: 4) { $0.mostWaitingReads = most }
        try await stopping(bus, with: { await $0.stop() }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "feed", subjects: ["feed."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "feed", name: "live", ackWait: 30))
            let next = API.Next(stream: "feed", consumer: "live", max: 1, expires: 60)
            let readers = (0..<3).map { _ in bus.other.stream(API.next, next, timeout: .seconds(70)) }
            try await within(30, "three readers waiting") { await bus.service.readsBeganWaiting(3) }
            do {
                _ = try await bus.client.call(API.fetch, .init(stream: "feed", consumer: "live", wait: 20))
                Issue.record("a fourth waiting read was taken")
            } catch let error as BusError {
                guard case .unavailable(_, let message) = error else { throw error }
                #expect(message.contains("3 reads waiting for messages"), "\(message)")
            }
            // The place left takes the publish, and its message goes to one of the readers; the
            // others leave, their places free for other readers.
            #expect(try await bus.publish("feed.item", 1).sequence == 1)
            let handed = try await withThrowingTaskGroup(of: Int?.self) { group in
                for reader in readers { group.addTask { for try await message in reader { return message.sequence }; return nil } }
                defer { group.cancelAll() }
                return try await group.next() ?? nil
            }
            #expect(handed == 1)
            #expect(try await bus.ack("feed", "live", [1], by: bus.other).done == [1])
            let fourth = bus.other.stream(API.next, next, timeout: .seconds(70))
            try await within(30, "a fourth reader waiting") { await bus.service.readsBeganWaiting(4) }
            withExtendedLifetime(fourth) {}
        }
    }

    @Test("push: a reader that leaves (its client cancels) frees its worker's place at once, not when its wait expires, and is handed nothing more",
          arguments: Leaving.allCases)
    func pushReaderLeaves(leaving: Leaving) async throws {
        // One place in all: the request after the reader's is served only once its place is free.
        try await stopping(try await StreamsBus.start(connections: 1, window: 1), with: { await $0.stop() }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "feed", subjects: ["feed."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "feed", name: "live", ackWait: 30))
            let next = API.Next(stream: "feed", consumer: "live", max: 10, expires: 600)
            switch leaving {
            case .afterAMessage:
                try await bus.publish("feed.item", .int(1))
                var parts = bus.other.stream(API.next, next, timeout: .seconds(610)).makeAsyncIterator()
                #expect(try await parts.next()?.sequence == 1)
                // Dropped unfinished after its first message: its client sends a CANCEL.
            case .beforeAnyMessage:
                let parts = bus.other.stream(API.next, next, timeout: .seconds(610)).makeAsyncIterator()
                // Asked after it on the same connection: the kernel answers once it has handed
                // the reader's request to the streams worker (its one place was free).
                let held = try await bus.other.call(KernelAPI.servicesList).services.first { $0.name == API.service }?.inFlight
                #expect(held == 1)
                withExtendedLifetime(parts) {}
                // Dropped unfinished before any message: its client sends a CANCEL.
            }
            // Within the client's 10 s, ten minutes before the wait would expire.
            let published = leaving == .afterAMessage ? 1 : 0
            #expect(try await bus.client.call(API.streamInfo, .init(name: "feed")).messages == published)
            try await bus.publish("feed.item", .int(2))
            let other = try await bus.fetch("feed", "live")
            #expect(other.messages.map(\.sequence) == [published + 1] && other.messages.allSatisfy { $0.deliveries == 1 }, "\(other.messages)")
        }
    }

    @Test("bad input is refused with a clear error and changes nothing")
    func refusals() async throws {
        try await StreamsBus.with { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "orders", name: "billing", ackWait: 1))
            let cases: [(JSONRPCError?, Int, String)] = [
                (await bus.failure(API.streamAdd, .init(name: "bad name", subjects: ["x."])), JSONRPCError.invalidParamsCode, "letters, digits"),
                (await bus.failure(API.streamAdd, .init(name: "a.b", subjects: ["x."])), JSONRPCError.invalidParamsCode, "letters, digits"),
                (await bus.failure(API.streamAdd, .init(name: "x", subjects: [])), JSONRPCError.invalidParamsCode, "1 to 32"),
                (await bus.failure(API.streamAdd, .init(name: "x", subjects: ["a.", "a.b"])), JSONRPCError.invalidParamsCode, "overlap"),
                (await bus.failure(API.streamAdd, .init(name: "x", subjects: ["orders.new"])), JSONRPCError.conflictCode, "stream orders holds"),
                (await bus.failure(API.streamAdd, .init(name: "orders", subjects: ["orders."], maxMessages: 5)), JSONRPCError.conflictCode, "other settings (maxMessages is "),
                (await bus.failure(API.streamAdd, .init(name: "orders", subjects: ["orders."], maxMessages: 5)), JSONRPCError.conflictCode, ", asked 5)"),
                // Each setting that differs, named.
                (await bus.failure(API.consumerAdd, .init(stream: "orders", name: "billing", filter: "orders.eu", ackWait: 10)), JSONRPCError.conflictCode,
                 "consumer billing with other settings (ackWait is 1, asked 10; filter is none, asked orders.eu)"),
                (await bus.failure(API.streamInfo, .init(name: "nothing")), JSONRPCError.notFoundCode, "no stream nothing"),
                (await bus.failure(API.publish, .init(subject: "nowhere.x", data: 1)), JSONRPCError.notFoundCode, "no stream holds subject nowhere.x"),
                (await bus.failure(API.publish, .init(subject: "has space", data: 1)), JSONRPCError.invalidParamsCode, "without spaces"),
                (await bus.failure(API.fetch, .init(stream: "orders", consumer: "nobody")), JSONRPCError.notFoundCode, "no consumer nobody"),
                (await bus.failure(API.consumerAdd, .init(stream: "orders", name: "c", deliver: .new, startSequence: 3)), JSONRPCError.invalidParamsCode, "at most one"),
                (await bus.failure(API.consumerAdd, .init(stream: "orders", name: "c", startTime: "yesterday")), JSONRPCError.invalidParamsCode, "ISO 8601"),
                (await bus.failure(API.ack, .init(stream: "orders", consumer: "c", sequences: [])), JSONRPCError.invalidParamsCode, "1 to 1000"),
                (await bus.failure(API.streamDelete, .init(name: "orders.dead")), JSONRPCError.invalidParamsCode, "goes when orders is deleted"),
            ]
            for (error, code, words) in cases {
                #expect(error?.code == code && error?.message.contains(words) == true, "\(String(describing: error)): expected \(code) saying \(words)")
            }
            // The same settings again is no error, and nothing above was made.
            _ = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            #expect(try await bus.client.call(API.streamList).streams.map(\.name) == ["orders", "orders.dead"])
            #expect(try await bus.client.call(API.streamDelete, .init(name: "orders")).messages == 0)
            #expect(try await bus.client.call(API.streamList).streams.isEmpty)
        }
    }
}

extension StreamsTests {
    @Test("the service holds at most max_streams streams and max_consumers consumers each: past them -32010 naming the setting; deleting one makes room")
    func counts() async throws {
        try await StreamsBus.with(.sqlite, { $0.maxStreams = 2; $0.maxConsumers = 1 }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "a", subjects: ["a."]))
            _ = try await bus.client.call(API.streamAdd, .init(name: "b", subjects: ["b."]))
            let third = await bus.failure(API.streamAdd, .init(name: "c", subjects: ["c."]))
            #expect(third?.code == JSONRPCError.tooLargeCode && third?.message.contains("streams.max_streams") == true, "\(String(describing: third))")
            _ = try await bus.client.call(API.streamAdd, .init(name: "a", subjects: ["a."]))  // the same again is no new stream
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "a", name: "one"))
            let second = await bus.failure(API.consumerAdd, .init(stream: "a", name: "two"))
            #expect(second?.code == JSONRPCError.tooLargeCode && second?.message.contains("streams.max_consumers") == true, "\(String(describing: second))")
            _ = try await bus.client.call(API.streamDelete, .init(name: "b"))
            _ = try await bus.client.call(API.streamAdd, .init(name: "c", subjects: ["c."]))
        }
    }
}

@Suite("streams: durability")
struct StreamsDurabilityTests {
    @Test("every process stopped and started again (the service, and PostgreSQL killed): every acknowledged message is there, and every consumer resumes at its position with what it had pending",
          arguments: Backend.available)
    func restart(backend: Backend) async throws {
        let bus = try await StreamsBus.start(backend: backend)
        try await stopping(bus, with: { await $0.stop(keepDatabase: true) }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "orders", name: "billing", ackWait: 30))
            for number in 1...6 { try await bus.publish("orders.new", .int(Int64(number)), id: "o-\(number)") }
            _ = try await bus.fetch("orders", "billing", batch: 4)
            _ = try await bus.ack("orders", "billing", [1, 2])
        }
        // PostgreSQL killed as a crash would (what it acknowledged is in its log), then started.
        try await bus.postgres?.restart()
        let again = try await StreamsBus.start(folder: bus.folder, time: bus.time, backend: backend, postgres: bus.postgres)
        try await stopping(again, with: { await $0.stop() }) { bus in
            let info = try await bus.client.call(API.streamInfo, .init(name: "orders"))
            #expect(info.messages == 6 && info.lastSequence == 6 && info.consumers == ["billing"])
            #expect(try await bus.publish("orders.new", 6, id: "o-6").duplicate, "ids are remembered across restarts")
            let consumer = try await bus.client.call(API.consumerInfo, .init(stream: "orders", name: "billing"))
            #expect(consumer.nextSequence == 5 && consumer.pending == 2 && consumer.acknowledged == 2)
            #expect(try await bus.fetch("orders", "billing").messages.map(\.sequence) == [5, 6])
            bus.time.advance(30)
            #expect(try await bus.fetch("orders", "billing").messages.map(\.sequence) == [3, 4, 5, 6])
        }
    }
}

@Suite("streams: the kernel's state captured")
struct StreamsStateCaptureTests {
    /// What the consumer `reader` of `stream` is handed, acknowledged, until `count` messages
    /// came (each fetch waits for the next capture); fails if the stream goes quiet first.
    static func take(_ count: Int, from stream: String, _ bus: StreamsBus) async throws -> [API.Message] {
        var taken: [API.Message] = []
        while taken.count < count {
            let fetched = try await bus.client.call(API.fetch, .init(stream: stream, consumer: "reader", batch: 100, wait: 15), timeout: .seconds(30))
            try #require(!fetched.messages.isEmpty, "the stream went quiet after \(taken.count) of \(count) messages")
            taken += fetched.messages
            _ = try await bus.ack(stream, "reader", fetched.messages.map(\.sequence))
        }
        return taken
    }

    /// Each message as "KEY=VALUE" ("KEY deleted"), checking the state's sequences only grow.
    static func changes(_ messages: [API.Message]) throws -> [String] {
        let kept = try messages.map { ($0.subject, try $0.data.decode(as: API.StateChange.self)) }
        #expect(zip(kept, kept.dropFirst()).allSatisfy { $0.1.sequence < $1.1.sequence }, "in the state's order, each once: \(kept.map(\.1.sequence))")
        return kept.map { subject, change in change.value.map { "\(subject)=\($0.jsonString)" } ?? "\(subject) deleted" }
    }

    @Test("a capturing stream keeps every change under its prefixes once and in order, deletions included, from the values there when it was added; it refuses publishes; stream.messages reads it; changes made while the service was down are kept after its restart, none twice; deleted and made again over other keys or the same, it starts from their values then",
          arguments: Backend.available)
    func capture(backend: Backend) async throws {
        let bus = try await StreamsBus.start(backend: backend)
        let state = try await BusClient(brokers: [bus.kernel.endpoints.broker], timeout: .seconds(10))
        try await stopping(bus, with: { await $0.stop(keepKernel: true, keepDatabase: true) }) { bus in
            try await state.publish(key: "/client/prices/a", value: 1)
            try await state.publish(key: "/client/other/x", value: 1)
            let info = try await bus.client.call(API.streamAdd, .init(name: "prices", subjects: ["/client/prices/"], captureState: true))
            #expect(info.captureState == true)
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "prices", name: "reader"))
            #expect(try Self.changes(try await Self.take(1, from: "prices", bus)) == ["/client/prices/a=1"])
            try await state.publish(key: "/client/prices/a", value: 2)
            try await state.publish(key: "/client/prices/b", value: ["eur": 10])
            try await state.publish(key: "/client/other/x", value: 2)
            let last = try await state.publish(key: "/client/prices/a", value: nil)
            #expect(try Self.changes(try await Self.take(3, from: "prices", bus)) == ["/client/prices/a=2", #"/client/prices/b={"eur":10}"#, "/client/prices/a deleted"])
            let captured = try await bus.client.call(API.streamInfo, .init(name: "prices"))
            #expect(captured.messages == 4 && captured.capturedSequence == Int(last) && captured.captureGaps == 0)

            let refused = await bus.failure(API.publish, .init(subject: "/client/prices/z", data: 1))
            #expect(refused?.code == JSONRPCError.invalidParamsCode && refused?.message.contains("state") == true)
            let bad = await bus.failure(API.streamAdd, .init(name: "bad", subjects: ["orders."], captureState: true))
            #expect(bad?.code == JSONRPCError.invalidParamsCode && bad?.message.contains("'/'") == true)

            let recent = try await bus.client.call(API.streamMessages, .init(name: "prices", last: 2))
            #expect(recent.messages.map(\.sequence) == [3, 4] && recent.messages.allSatisfy { $0.deliveries == 0 } && recent.next == 5)
            let onlyB = try await bus.client.call(API.streamMessages, .init(name: "prices", filter: "/client/prices/b"))
            #expect(onlyB.messages.map(\.sequence) == [3] && onlyB.next == 5)
            let paged = try await bus.client.call(API.streamMessages, .init(name: "prices", from: 2, max: 1))
            #expect(paged.messages.map(\.sequence) == [2] && paged.next == 3)
        }
        // Changes while no streams service runs: kept once it is back, from where it stopped.
        try await state.publish(key: "/client/prices/b", value: ["eur": 11])
        try await state.publish(key: "/client/prices/c", value: 5)
        let again = try await bus.restarted()
        try await stopping(again, with: { await $0.stop() }) { bus in
            #expect(try Self.changes(try await Self.take(2, from: "prices", bus)) == [#"/client/prices/b={"eur":11}"#, "/client/prices/c=5"])
            // Deleted and added again over other keys: captured from those keys' values on.
            _ = try await bus.client.call(API.streamDelete, .init(name: "prices"))
            _ = try await bus.client.call(API.streamAdd, .init(name: "prices", subjects: ["/client/other/"], captureState: true))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "prices", name: "reader"))
            #expect(try Self.changes(try await Self.take(1, from: "prices", bus)) == ["/client/other/x=2"])
            try await state.publish(key: "/client/other/x", value: 3)
            #expect(try Self.changes(try await Self.take(1, from: "prices", bus)) == ["/client/other/x=3"])
            // Made again over the same keys, or over others: each time from the values there then.
            for subjects in [["/client/prices/"], ["/client/prices/"]] {
                bus.time.advance(1)
                _ = try await bus.client.call(API.streamDelete, .init(name: "prices"))
                _ = try await bus.client.call(API.streamAdd, .init(name: "prices", subjects: subjects, captureState: true))
                _ = try await bus.client.call(API.consumerAdd, .init(stream: "prices", name: "reader"))
                #expect(try Self.changes(try await Self.take(2, from: "prices", bus)) == [#"/client/prices/b={"eur":11}"#, "/client/prices/c=5"])
            }
            guard backend == .postgres else { return }
            // A second service on the same database follows the same stream: each change once.
            let second = try await StreamsBus.start(kernel: bus.kernel, time: bus.time, backend: .postgres, postgres: bus.postgres)
            try await stopping(second, with: { await $0.stop(keepKernel: true, keepDatabase: true) }) { _ in
                for value in 1...20 { try await state.publish(key: "/client/prices/d", value: .int(Int64(value))) }
                let kept = try Self.changes(try await Self.take(20, from: "prices", bus))
                #expect(kept == (1...20).map { "/client/prices/d=\($0)" })
                #expect(try await bus.client.call(API.streamInfo, .init(name: "prices")).messages == 22)
            }
        }
        await state.close()
    }

    @Test("a capturing stream added over thousands of keys keeps each one's value, together: on PostgreSQL well within the service's timeout (statements for each held the write past it, tried again and again)",
          arguments: Backend.available)
    func captureManyKeys(backend: Backend) async throws {
        let bus = try await StreamsBus.start(backend: backend) { $0.postgres?.operationTimeout = .seconds(1.5) }
        let state = try await BusClient(brokers: [bus.kernel.endpoints.broker], timeout: .seconds(10))
        try await stopping(bus, with: { await $0.stop() }) { bus in
            let keys = 3_000
            try await sideBySide(keys) { try await state.publish(key: "/client/many/\($0)", value: .int(Int64($0))) }
            _ = try await bus.client.call(API.streamAdd, .init(name: "many", subjects: ["/client/many/"], captureState: true))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "many", name: "reader"))
            // The keys' values come as one sync, kept in one write.
            let first = try await bus.client.call(API.fetch, .init(stream: "many", consumer: "reader", batch: 10, wait: 15), timeout: .seconds(30))
            #expect(first.messages.count == 10)
            let info = try await bus.client.call(API.streamInfo, .init(name: "many"))
            #expect(info.messages == keys && info.captureGaps == 0)
            let subjects = try await bus.client.call(API.streamMessages, .init(name: "many", last: 1_000, max: 1_000)).messages.map(\.subject)
            #expect(Set(subjects).count == 1_000 && subjects.allSatisfy { $0.hasPrefix("/client/many/") })
        }
        await state.close()
    }

    @Test("a capturing stream's subjects stay as added: stream.update refuses others (who may read its messages is judged by them), and it goes on keeping the changes under them")
    func captureSubjectsStay() async throws {
        let bus = try await StreamsBus.start()
        let state = try await BusClient(brokers: [bus.kernel.endpoints.broker], timeout: .seconds(10))
        try await stopping(bus, with: { await $0.stop() }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "levels", subjects: ["/client/levels/"], captureState: true))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "levels", name: "reader"))
            let refused = await bus.failure(API.streamUpdate, .init(name: "levels", subjects: ["/client/"]))
            #expect(refused?.code == JSONRPCError.invalidParamsCode && refused?.message.contains("stay as added") == true, "\(String(describing: refused))")
            let info = try await bus.client.call(API.streamUpdate, .init(name: "levels", maxMessages: 5))
            #expect(info.subjects == ["/client/levels/"] && info.maxMessages == 5, "\(info)")
            try await state.publish(key: "/client/depths/a", value: 1)
            try await state.publish(key: "/client/levels/a", value: 2)
            #expect(try Self.changes(try await Self.take(1, from: "levels", bus)) == ["/client/levels/a=2"])
        }
        await state.close()
    }

    @Test("a stream streams.capture names, its limits changed (stream.update), keeps them when the service starts again, which logs no error over it")
    func configuredCaptureKeepsChangedLimits() async throws {
        // Added as the configuration adds it (with the defaults, by nobody's key), then changed.
        let first = try await StreamsBus.start()
        _ = try await first.client.call(API.streamAdd, .init(name: "levels", subjects: ["/client/levels/"], captureState: true))
        #expect(try await first.client.call(API.streamUpdate, .init(name: "levels", maxAge: 3_600)).maxAge == 3_600)
        await first.stop(keepKernel: true)
        let log = LogLines()
        let bus = try await StreamsBus.start(folder: first.folder, kernel: first.kernel, logger: log.logger("streams")) {
            $0.capture = ["levels": ["/client/levels/"]]
        }
        try await stopping(bus, with: { await $0.stop() }) { bus in
            // The configured streams are added before any is followed: a change captured is
            // one the second start followed, after it added them.
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "levels", name: "reader", deliver: .new))
            _ = try await bus.client.publish(key: "/client/levels/a", value: 1)
            _ = try await Self.take(1, from: "levels", bus)
            #expect(try await bus.client.call(API.streamInfo, .init(name: "levels")).maxAge == 3_600)
            #expect(!log.text.contains("cannot add the capturing stream"), "\(log.text)")
        }
    }

    @Test("when the kernel no longer holds every change since the stream's last (its history is bounded), the keys' latest values are kept and the stream counts a gap")
    func gap() async throws {
        let kernel = try await TestKernel.start(fixedPorts: true) { configuration in
            fastHeartbeats(&configuration)
            configuration.stateHistoryChanges = 4
        }
        let bus = try await StreamsBus.start(kernel: kernel)
        let state = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(10))
        try await stopping(bus, with: { await $0.stop(keepKernel: true) }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "counts", subjects: ["/client/counts/"], captureState: true))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "counts", name: "reader"))
            try await state.publish(key: "/client/counts/a", value: 0)
            #expect(try Self.changes(try await Self.take(1, from: "counts", bus)) == ["/client/counts/a=0"])
        }
        for value in 1...10 { try await state.publish(key: "/client/counts/\(value % 2 == 0 ? "a" : "b")", value: .int(Int64(value))) }
        let again = try await bus.restarted()
        try await stopping(again, with: { await $0.stop() }) { bus in
            let kept = try Self.changes(try await Self.take(2, from: "counts", bus))
            #expect(kept == ["/client/counts/b=9", "/client/counts/a=10"])
            #expect(try await bus.client.call(API.streamInfo, .init(name: "counts")).captureGaps == 1)
        }
        await state.close()
    }
}

@Suite("streams on PostgreSQL: several service processes on one database",
       .enabled(if: TestPostgres.available, "skipped: no PostgreSQL server installed (the test bootstrap installs it)"))
struct StreamsSharedDatabaseTests {
    @Test("two services on one database, four publishers and four readers at once: every message gets its own sequence, and each is handed out and acknowledged once")
    func twoServices() async throws {
        let first = try await StreamsBus.start(backend: .postgres)
        try await stopping(first, with: { await $0.stop() }) { first in
            let second = try await StreamsBus.start(kernel: first.kernel, time: first.time, backend: .postgres, postgres: first.postgres)
            try await stopping(second, with: { await $0.stop(keepKernel: true, keepDatabase: true) }) { second in
                _ = try await first.client.call(API.streamAdd, .init(name: "jobs", subjects: ["jobs."]))
                _ = try await second.client.call(API.consumerAdd, .init(stream: "jobs", name: "workers"))
                let clients = [first.client, first.other, second.client, second.other]
                let sequences = try await withThrowingTaskGroup(of: [Int].self) { group in
                    for (index, client) in clients.enumerated() {
                        group.addTask {
                            var sequences: [Int] = []
                            for number in 1...25 {
                                sequences.append(try await client.publish(to: "jobs.run", .int(Int64(index * 100 + number)), id: "job-\(index)-\(number)").sequence)
                            }
                            return sequences
                        }
                    }
                    return try await group.reduce(into: []) { $0 += $1 }
                }
                #expect(sequences.sorted() == Array(1...100), "each publish its own sequence, none skipped")

                let handedOut = try await withThrowingTaskGroup(of: [Int].self) { group in
                    for client in clients {
                        group.addTask {
                            var taken: [Int] = []
                            while true {
                                let fetched = try await client.call(API.fetch, .init(stream: "jobs", consumer: "workers", batch: 5))
                                guard !fetched.messages.isEmpty else { return taken }
                                let sequences = fetched.messages.map(\.sequence)
                                let acknowledged = try await client.call(API.ack, .init(stream: "jobs", consumer: "workers", sequences: sequences))
                                #expect(acknowledged.done == sequences)
                                taken += sequences
                            }
                        }
                    }
                    return try await group.reduce(into: []) { $0 += $1 }
                }
                #expect(handedOut.sorted() == Array(1...100), "each message to one reader, once")
                let info = try await first.client.call(API.consumerInfo, .init(stream: "jobs", name: "workers"))
                #expect(info.acknowledged == 100 && info.pending == 0 && info.delivered == 100 && info.redelivered == 0)
                #expect(try await second.client.call(API.streamInfo, .init(name: "jobs")).messages == 100)
            }
        }
    }
    @Test("the database killed under a running service: a publish is answered -32007 naming the database, never acknowledged; once it is back the service goes on, and nothing acknowledged is lost")
    func databaseKilled() async throws {
        try await StreamsBus.with(.postgres, { $0.postgres?.operationTimeout = .seconds(2) }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            for number in 1...3 { try await bus.publish("orders.new", .int(Int64(number)), id: "o-\(number)") }
            guard let postgres = bus.postgres else { return }
            await postgres.kill()
            let refused = await bus.failure(API.publish, .init(subject: "orders.new", data: 4, id: "o-4"))
            #expect(refused?.code == JSONRPCError.storageFailedCode && refused?.data?["reason"] == "unreachable", "\(String(describing: refused))")
            #expect(refused?.message.contains("127.0.0.1:\(postgres.port)") == true && refused?.message.contains(TestPostgres.password) == false)
            try await postgres.restart()
            // The service finds the database again on its own (as its host's readiness does).
            await bus.service.waitUntilReady()
            #expect(try await bus.publish("orders.new", 4, id: "o-4").sequence == 4)
            let info = try await bus.client.call(API.streamInfo, .init(name: "orders"))
            #expect(info.messages == 4 && info.lastSequence == 4)
        }
    }
}

@Suite("streams on SQLite: the processes of a rolling restart on one file, and one that dies")
struct StreamsRollingRestartTests {
    /// The `switchboard serve streams` processes of a test, on one SQLite file, each stopped
    /// with the test's kernel and folder.
    final class Processes {
        let kernel: TestKernel
        let client: BusClient
        let folder: URL
        var started: [ChildProcess] = []

        init() async throws {
            kernel = try await TestKernel.start(fastHeartbeats)
            folder = try temporaryDirectory("streams-processes")
            client = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(30))
        }

        var database: String { folder.appendingPathComponent("streams.sqlite").path }

        /// Starts another process on the file; it serves once `kernel.workers` counts it.
        @discardableResult
        func start() throws -> ChildProcess {
            let process = try ChildProcess(switchboardExecutable(), ["serve", "streams", "--broker", kernel.endpoints.broker, "--state", kernel.endpoints.snapshot,
                                                                     "--db", database, "--connections", "1", "--heartbeat-ms", "200", "--log-level", "warning"])
            started.append(process)
            return process
        }

        func stop() async {
            await client.close()
            for process in started { process.stop() }
            await kernel.stop()
            try? FileManager.default.removeItem(at: folder)
        }
    }

    @Test("a new process opens the file while the old one serves, then the old one stops, twice: the -wal the new one writes to stays, and every acknowledged message is kept")
    func rollingRestarts() async throws {
        try await stopping(try await Processes(), with: { await $0.stop() }) { processes in
            let (kernel, client, database) = (processes.kernel, processes.client, processes.database)
            try processes.start()
            try await kernel.workers("streams", within: 30, "the first process registered") { $0 == 1 }
            _ = try await client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            var acknowledged = [try await client.publish(to: "orders.new", 1).sequence]
            for round in 2...3 {
                // As `switchboard up` restarts a service: the new process first, then the old one stops.
                let old = processes.started[processes.started.count - 1]
                try processes.start()
                try await kernel.workers("streams", within: 30, "the new process registered") { $0 == 2 }
                old.signal(SIGTERM)
                #expect(await old.exit(within: 30), "round \(round): the old process stopped")
                try await kernel.workers("streams", within: 30, "the old process gone") { $0 == 1 }
                // The old process closing the file must not take itself for its last user: it would
                // delete the -wal and -shm the new one goes on writing to, apart from the file.
                #expect(FileManager.default.fileExists(atPath: database + "-wal"), "round \(round): the -wal was deleted under the running process")
                acknowledged.append(try await client.publish(to: "orders.new", .int(Int64(round))).sequence)
            }
            #expect(acknowledged == [1, 2, 3])
            // Everything acknowledged is in the file, as a process that opens it next reads it.
            let last = processes.started[processes.started.count - 1]
            try processes.start()
            try await kernel.workers("streams", within: 30, "the reading process registered") { $0 == 2 }
            last.signal(SIGTERM)
            #expect(await last.exit(within: 30))
            try await kernel.workers("streams", within: 30, "the last writer gone") { $0 == 1 }
            let messages = try await client.call(API.streamMessages, .init(name: "orders"))
            #expect(messages.messages.map(\.sequence) == [1, 2, 3] && messages.messages.map(\.data) == [1, 2, 3], "\(messages.messages)")
        }
    }

    @Test("sb stream sub outlives a streams process that dies while it hands out messages: it says so on stderr, and takes the rest from the next process")
    func subOutlivesCrash() async throws {
        try await stopping(try await Processes(), with: { await $0.stop() }) { processes in
            let (kernel, client) = (processes.kernel, processes.client)
            let first = try processes.start()
            try await kernel.workers("streams", within: 30, "the first process registered") { $0 == 1 }
            _ = try await client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            _ = try await client.call(API.consumerAdd, .init(stream: "orders", name: "billing", ackWait: 60))
            _ = try await client.publish(to: "orders.new", 1)
            let sub = try ChildProcess(sbExecutable(), ["stream", "sub", "orders", "billing", "--count", "2", "--expires", "120", "--ack"],
                                       environment: ["SB_ENDPOINT": kernel.endpoints.broker, "NO_COLOR": ""])
            defer { sub.stop() }
            try await sub.waitForOutput(containing: "1 orders.new (delivery 1) 1", within: 30)
            try processes.start()
            try await kernel.workers("streams", within: 30, "the second process registered") { $0 == 2 }
            // The one handing the sub its messages dies (as a crash: nothing drains).
            first.signal(SIGKILL)
            #expect(await first.exit(within: 30))
            _ = try await client.publish(to: "orders.new", 2)
            #expect(await sub.exit(within: 60), "sb stream sub took the second message: \(sub.outputSoFar)")
            #expect(sub.terminationStatus == 0 && sub.outputSoFar.contains("2 orders.new (delivery 1) 2")
                    && sub.outputSoFar.contains("the streams worker handing these messages out died; going on with another"),
                    "\(sub.outputSoFar)")
        }
    }
}

@Suite("streams with CURVE: what each key may add, and change")
struct StreamsRightsTests {
    /// A CURVE kernel admitting a key for the service, two client keys (the bus's `client` and
    /// `other`) and an operator's, and a streams service bound by small quotas; the body gets
    /// the operator's client and a key folder for sb, whose client key is `other`'s.
    static func with(_ backend: Backend, _ body: (StreamsBus, BusClient, URL) async throws -> Void) async throws {
        let kernelKeys = try CurveKeyPair.generate(), serviceKey = try CurveKeyPair.generate()
        let first = try CurveKeyPair.generate(), second = try CurveKeyPair.generate(), operatorKey = try CurveKeyPair.generate()
        let kernel = try await TestKernel.start(fixedPorts: true) {
            fastHeartbeats(&$0)
            $0.security = KernelSecurity(secretKey: kernelKeys.secretKey, clientKeys: [first.publicKey, second.publicKey],
                                         serviceKeys: [serviceKey.publicKey: API.service], operatorKeys: [operatorKey.publicKey])
        }
        func keys(_ pair: CurveKeyPair) throws -> CurveClientKeys { try CurveClientKeys(serverKey: kernelKeys.publicKey, secretKey: pair.secretKey) }
        let bus = try await StreamsBus.start(kernel: kernel, keys: .init(service: try keys(serviceKey), client: try keys(first), other: try keys(second)),
                                             backend: backend) { configuration in
            (configuration.clientMaxStreams, configuration.clientMaxBytes, configuration.clientMaxConsumers) = (2, 3_000, 2)
        }
        let folder = try temporaryDirectory("streams-keys")
        defer { try? FileManager.default.removeItem(at: folder) }
        for (pair, name) in [(kernelKeys, KeyFolder.kernel), (second, KeyFolder.client), (operatorKey, KeyFolder.operator)] {
            try KeyFolder.write(pair, to: folder.appendingPathComponent(name).path)
        }
        try await stopping(bus, with: { await $0.stop() }) { bus in
            let operatorClient = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(10), curve: try keys(operatorKey))
            try await stopping(operatorClient, with: { await $0.close() }) { try await body(bus, $0, folder) }
        }
    }

    @Test("a client key changes only what it added; an operator's key changes anything; a forged client member changes nothing", arguments: Backend.available)
    func rights(backend: Backend) async throws {
        try await Self.with(backend) { bus, operatorClient, keys in
            _ = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."], maxBytes: 1_000))
            try await bus.publish("orders.new", 1)
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "orders", name: "billing"))
            _ = try await bus.other.call(API.consumerAdd, .init(stream: "orders", name: "audit"))
            // Each says which key added it.
            let stream = try await bus.client.call(API.streamInfo, .init(name: "orders"))
            let audit = try await bus.client.call(API.consumerInfo, .init(stream: "orders", name: "audit"))
            #expect(stream.addedBy != nil && audit.addedBy != nil && stream.addedBy != audit.addedBy, "\(stream.addedBy ?? "-") \(audit.addedBy ?? "-")")

            // The other key reads and publishes, but cannot purge, delete, change limits, or take a consumer away.
            #expect(try await bus.other.publish(to: "orders.new", 2).sequence == 2)
            #expect(await bus.failure(API.streamPurge, .init(name: "orders"), by: bus.other)?.code == JSONRPCError.forbiddenCode)
            #expect(await bus.failure(API.streamDelete, .init(name: "orders"), by: bus.other)?.code == JSONRPCError.forbiddenCode)
            #expect(await bus.failure(API.streamUpdate, .init(name: "orders", maxMessages: 1), by: bus.other)?.code == JSONRPCError.forbiddenCode)
            #expect(await bus.failure(API.consumerDelete, .init(stream: "orders", name: "billing"), by: bus.other)?.code == JSONRPCError.forbiddenCode)
            #expect(await bus.failure(API.consumerUpdate, .init(stream: "orders", name: "billing", maxDeliver: 1), by: bus.other)?.code == JSONRPCError.forbiddenCode)
            #expect(try await bus.other.call(API.consumerUpdate, .init(stream: "orders", name: "audit", maxDeliver: 2)).maxDeliver == 2, "its own")
            // sb, refused so, says the operator's key may; with it, it does.
            let environment = ["SB_ENDPOINT": bus.kernel.endpoints.broker, "SB_KEY_DIR": keys.path, "NO_COLOR": ""]
            let refused = try await runCommand(sbExecutable(), ["stream", "edit", "orders", "--max-age", "1h"], environment: environment)
            #expect(refused.status == 1 && refused.stderr.contains("error -32011")
                    && refused.stderr.contains("\nNote: --as-operator sends it with the operator's key"), "\(refused)")
            let asOperator = try await runCommand(sbExecutable(), ["stream", "edit", "orders", "--max-age", "1h", "--as-operator"], environment: environment)
            #expect(asOperator.status == 0 && asOperator.stdout.contains("kept 1h"), "\(asOperator)")
            // Naming itself the stream's client in the request's own member counts for nothing.
            let forged: JSONValue = ["jsonrpc": "2.0", "id": 900_031, "method": .string(API.streamPurge.name), "params": ["name": "orders"],
                                     "client": .string(bus.client.clientID)]
            let reply = try await bus.other.call(service: API.service, body: [Frame(forged.jsonBytes)])
            let answer = try JSONValue(parsing: reply[0].bytes)
            #expect(answer["error"]?["code"] == .int(Int64(JSONRPCError.forbiddenCode)))
            #expect(try await bus.client.call(API.streamInfo, .init(name: "orders")).messages == 2, "nothing was purged")

            // Its own consumer it deletes; the stream's key deletes any consumer of its stream.
            #expect(try await bus.other.call(API.consumerDelete, .init(stream: "orders", name: "audit")).messages == 0)
            _ = try await bus.other.call(API.consumerAdd, .init(stream: "orders", name: "audit"))
            _ = try await bus.client.call(API.consumerDelete, .init(stream: "orders", name: "audit"))
            #expect(try await bus.client.call(API.streamPurge, .init(name: "orders")).messages == 2)

            // What an operator's key added is not a client key's to change; an operator's key changes anything.
            _ = try await operatorClient.call(API.streamAdd, .init(name: "audit-log", subjects: ["audit."]))
            #expect(await bus.failure(API.streamDelete, .init(name: "audit-log"))?.code == JSONRPCError.forbiddenCode)
            #expect(try await operatorClient.call(API.streamDelete, .init(name: "orders")).messages == 0)
            #expect(try await operatorClient.call(API.streamDelete, .init(name: "audit-log")).messages == 0)
        }
    }

    @Test("each client key has its own quota of streams, bytes and consumers; deleting frees room; operators are not bound", arguments: Backend.available)
    func quotas(backend: Backend) async throws {
        try await Self.with(backend) { bus, operatorClient, _ in
            _ = try await bus.client.call(API.streamAdd, .init(name: "a", subjects: ["a."], maxBytes: 1_000))
            _ = try await bus.client.call(API.streamAdd, .init(name: "b", subjects: ["b."], maxBytes: 1_000))
            let third = await bus.failure(API.streamAdd, .init(name: "c", subjects: ["c."], maxBytes: 1_000))
            #expect(third?.code == JSONRPCError.tooLargeCode && third?.message.contains("streams.client_max_streams") == true)
            // The other key has room of its own, in streams and in bytes.
            let big = await bus.failure(API.streamAdd, .init(name: "c", subjects: ["c."], maxBytes: 3_001), by: bus.other)
            #expect(big?.code == JSONRPCError.tooLargeCode && big?.message.contains("streams.client_max_mb") == true)
            _ = try await bus.other.call(API.streamAdd, .init(name: "c", subjects: ["c."], maxBytes: 2_000))
            let over = await bus.failure(API.streamAdd, .init(name: "d", subjects: ["d."], maxBytes: 1_001), by: bus.other)
            #expect(over?.message.contains("may be 1000 at most") == true)
            _ = try await bus.other.call(API.streamAdd, .init(name: "d", subjects: ["d."], maxBytes: 1_000))
            // Raised limits count against the quota as added ones do, its other streams' bytes with them.
            let raised = await bus.failure(API.streamUpdate, .init(name: "d", maxBytes: 1_001), by: bus.other)
            #expect(raised?.code == JSONRPCError.tooLargeCode && raised?.message.contains("its other streams take 2000") == true
                    && raised?.message.contains("may be 1000 at most") == true, "\(String(describing: raised))")
            #expect(try await bus.other.call(API.streamUpdate, .init(name: "d", maxBytes: 500)).maxBytes == 500)
            #expect(try await operatorClient.call(API.streamUpdate, .init(name: "d", maxBytes: 5_000)).maxBytes == 5_000)
            // Lowered, though the key's streams are still past its quota: it then holds less.
            #expect(try await bus.other.call(API.streamUpdate, .init(name: "d", maxBytes: 4_000)).maxBytes == 4_000)
            // Adding the same stream again is no second stream.
            _ = try await bus.client.call(API.streamAdd, .init(name: "a", subjects: ["a."], maxBytes: 1_000))

            _ = try await bus.client.call(API.streamDelete, .init(name: "b"))
            _ = try await bus.client.call(API.streamAdd, .init(name: "e", subjects: ["e."], maxBytes: 1_000))

            // Consumers count over every stream.
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "a", name: "one"))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "c", name: "two"))
            let consumer = await bus.failure(API.consumerAdd, .init(stream: "e", name: "three"))
            #expect(consumer?.code == JSONRPCError.tooLargeCode && consumer?.message.contains("streams.client_max_consumers") == true)
            _ = try await bus.other.call(API.consumerAdd, .init(stream: "e", name: "three"))

            // The operator's key is bound by the service's limits only.
            for name in ["f", "g", "h"] {
                _ = try await operatorClient.call(API.streamAdd, .init(name: name, subjects: [name + "."], maxBytes: 1_000_000))
            }
            #expect(try await operatorClient.call(API.streamList).streams.count == 2 * 7)
        }
    }
}

@Suite("sb stream: the verbs against a live streams service")
struct StreamVerbTests {
    @Test("sb stream sub interrupted (Ctrl-C) exits 130 at once, and leaves the consumer's next message to another reader rather than take it")
    func subInterrupted() async throws {
        // One place in all: the fetch after the interrupted reader is served only once its place is free.
        try await stopping(try await StreamsBus.start(connections: 1, window: 1), with: { await $0.stop() }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "orders", name: "billing", ackWait: 60))
            try await bus.publish("orders.new", 1)
            let sub = try ChildProcess(sbExecutable(), ["stream", "sub", "orders", "billing", "--expires", "600"],
                                       environment: ["SB_ENDPOINT": bus.kernel.endpoints.broker, "NO_COLOR": ""])
            defer { sub.stop() }
            try await sub.waitForOutput(containing: "1 orders.new (delivery 1) 1", within: 30)
            sub.signal(SIGINT)
            #expect(await sub.exit(within: 30))
            #expect(sub.terminationStatus == 130, "\(sub.outputSoFar)")
            try await bus.publish("orders.new", 2)
            let other = try await bus.fetch("orders", "billing")
            #expect(other.messages.map(\.sequence) == [2] && other.messages.allSatisfy { $0.deliveries == 1 }, "\(other.messages)")
        }
    }

    @Test("sb stream sub and fetch --wait go on through a rolling restart: the old worker ends their waits as it drains, unannounced, and they take the rest from the worker that takes over")
    func readersOutliveDrain() async throws {
        try await stopping(try await StreamsBus.start(connections: 1), with: { await $0.stop() }) { first in
            _ = try await first.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            _ = try await first.client.call(API.consumerAdd, .init(stream: "orders", name: "billing", ackWait: 60))
            try await first.publish("orders.new", 1)
            _ = try await first.client.call(API.consumerAdd, .init(stream: "orders", name: "audit", deliver: .new, ackWait: 60))
            let environment = ["SB_ENDPOINT": first.kernel.endpoints.broker, "NO_COLOR": ""]
            let sub = try ChildProcess(sbExecutable(), ["stream", "sub", "orders", "billing", "--count", "2", "--expires", "120"], environment: environment)
            defer { sub.stop() }
            try await sub.waitForOutput(containing: "1 orders.new (delivery 1) 1", within: 30)
            // A reader of another consumer waiting for a message that is not there yet.
            let fetch = try ChildProcess(sbExecutable(), ["stream", "fetch", "orders", "audit", "--wait", "60"], environment: environment)
            defer { fetch.stop() }
            // Another process's request: no event says it reached the worker.
            try await eventually(30, "the fetch waits in the old worker beside the sub") {
                try await first.client.call(KernelAPI.servicesList).services.first { $0.name == API.service }?.inFlight == 2
            }
            // As `switchboard up` restarts a service: the new worker first (on the same file), then the old one stops.
            let second = try await StreamsBus.start(folder: first.folder, kernel: first.kernel, time: first.time, connections: 1)
            try await stopping(second, with: { await $0.stop(keepKernel: true) }) { second in
                await first.host.stop()
                try await second.publish("orders.new", 2)
                #expect(await sub.exit(within: 60), "sb stream sub took the second message: \(sub.outputSoFar)")
                #expect(sub.terminationStatus == 0 && sub.outputSoFar.contains("2 orders.new (delivery 1) 2") && !sub.outputSoFar.contains("died"),
                        "\(sub.outputSoFar)")
                #expect(await fetch.exit(within: 60), "sb stream fetch took the second message: \(fetch.outputSoFar)")
                #expect(fetch.terminationStatus == 0 && fetch.outputSoFar == "2 orders.new (delivery 1) 2\n", "\(fetch.outputSoFar)")
                // Each handed out once, and pending for the reader it went to.
                let info = try await second.client.call(API.consumerInfo, .init(stream: "orders", name: "billing"))
                #expect(info.pending == 2 && info.waiting == 0, "\(info)")
            }
        }
    }

    @Test("sb stream sub goes on through a kernel restart: it says the connection dropped, and takes the rest once the kernel is back")
    func subOutlivesKernelRestart() async throws {
        try await stopping(try await StreamsBus.start(connections: 1), with: { await $0.stop() }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "orders", name: "billing", ackWait: 60))
            try await bus.publish("orders.new", 1)
            let sub = try ChildProcess(sbExecutable(), ["stream", "sub", "orders", "billing", "--count", "2", "--expires", "120", "--ack"],
                                       environment: ["SB_ENDPOINT": bus.kernel.endpoints.broker, "NO_COLOR": ""])
            defer { sub.stop() }
            try await sub.waitForOutput(containing: "1 orders.new (delivery 1) 1", within: 30)
            await bus.kernel.stop()
            try await stopping(try await bus.kernel.restarted(), with: { await $0.stop() }) { kernel in
                try await kernel.workers(API.service, within: 30)
                try await bus.publish("orders.new", 2)
                #expect(await sub.exit(within: 60), "sb stream sub took the second message: \(sub.outputSoFar)")
                #expect(sub.terminationStatus == 0 && sub.outputSoFar.contains("2 orders.new (delivery 1) 2")
                        && sub.outputSoFar.contains("the connection to the kernel dropped (a restart?); going on once it is back"), "\(sub.outputSoFar)")
                let info = try await bus.client.call(API.consumerInfo, .init(stream: "orders", name: "billing"))
                #expect(info.acknowledged == 2 && info.pending == 0, "\(info)")
            }
        }
    }

    @Test("sb stream sub whose reader leaves (| head -n 1) ends at once, and the message it printed, never acknowledged, goes to the next reader")
    func subReaderLeaves() async throws {
        try await stopping(try await StreamsBus.start(), with: { await $0.stop() }) { bus in
            _ = try await bus.client.call(API.streamAdd, .init(name: "orders", subjects: ["orders."]))
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "orders", name: "billing", ackWait: 1))
            try await bus.publish("orders.new", 1)
            let firstLine = try await runFirstLine(sbExecutable(), ["stream", "sub", "orders", "billing", "--expires", "600"],
                                                   environment: ["SB_ENDPOINT": bus.kernel.endpoints.broker, "NO_COLOR": ""])
            #expect(firstLine.stdout == "1 orders.new (delivery 1) 1\n141 0\n", "\(firstLine)")
            bus.time.advance(2)
            let again = try await bus.fetch("orders", "billing")
            #expect(again.messages.map(\.sequence) == [1] && again.messages.allSatisfy { $0.deliveries == 2 }, "\(again.messages)")
        }
    }

    @Test("sb stream add (--capture-state too), pub (JSON or text, with an id, from standard input), consumer, fetch --ack, read, info, ls, progress, nak, consumer rm, rm; errors exit 1 naming the problem")
    func verbs() async throws {
        try await StreamsBus.with { bus in
            let environment = ["SB_ENDPOINT": bus.kernel.endpoints.broker, "NO_COLOR": ""]
            func sb(_ arguments: [String], input: String? = nil) async throws -> CommandResult {
                try await runCommand(sbExecutable(), arguments, environment: environment, input: input.map { Data($0.utf8) })
            }
            func sb(_ arguments: String..., input: String? = nil) async throws -> CommandResult { try await sb(arguments, input: input) }
            var result = try await sb("stream", "add", "orders", "orders.", "--max-age", "1d", "--duplicate-window", "90s")
            #expect(result.status == 0 && result.stdout.contains("stream orders: subjects orders.") && result.stdout.contains("orders.dead"), "\(result)")
            result = try await sb("stream", "pub", "orders.new", #"{"id": 7}"#, "--id", "o-7")
            #expect(result.status == 0 && result.stdout == "orders 1\n", "\(result)")
            result = try await sb("stream", "pub", "orders.new", #"{"id": 7}"#, "--id", "o-7")
            #expect(result.stdout.contains("duplicate"), "\(result)")
            result = try await sb("stream", "pub", "orders.note", "plain words")
            #expect(result.stdout == "orders 2\n", "\(result)")
            result = try await sb("stream", "consumer", "orders", "billing", "--ack-wait", "1m")
            #expect(result.status == 0 && result.stdout.contains("waiting 2"), "\(result)")
            // A span of time is seconds, or a number with a unit, as --timeout takes it.
            #expect(try await bus.client.call(API.consumerInfo, .init(stream: "orders", name: "billing")).ackWait == 60)
            #expect(try await bus.client.call(API.streamInfo, .init(name: "orders")).duplicateWindow == 90)
            result = try await sb("stream", "fetch", "orders", "billing", "--wait", "5 s")
            #expect(result.status == 64 && result.stderr.contains("'5 s' is not a span of time such as 30 (seconds), 500ms, 5s, 2m, 12h or 7d"), "\(result)")
            result = try await sb("stream", "fetch", "orders", "billing", "--batch", "10", "--ack")
            #expect(result.stdout == "1 orders.new (delivery 1) {\"id\":7}\n2 orders.note (delivery 1) \"plain words\"\n", "\(result)")
            result = try await sb("stream", "info", "orders")
            // Spans of time as the flags took them; each consumer's settings.
            #expect(result.status == 0 && result.stdout.contains(", kept 1d, ") && result.stdout.contains("  duplicate window 90s, "), "\(result)")
            #expect(result.stdout.contains("  consumer billing: every subject, ack wait 1m, dead-lettered after 5 deliveries\n"), "\(result)")
            let row = result.stdout.split(separator: "\n").first { $0.hasPrefix("billing") }.map { $0.split(separator: " ", omittingEmptySubsequences: true) }
            #expect(row?[6] == "2", "acknowledged: \(result.stdout)")
            result = try await sb("stream", "edit", "orders", "--max-age", "2d")
            #expect(result.status == 0 && result.stdout.contains(", kept 2d, duplicate window 90s; holds 2 messages"), "\(result)")
            result = try await sb("stream", "edit", "orders", "--max-age", "none")
            #expect(result.status == 0 && result.stdout.contains(" bytes, duplicate window 90s; holds 2 messages"), "no age limit: \(result)")
            result = try await sb("stream", "consumer", "edit", "orders", "billing", "--ack-wait", "2m")
            #expect(result.status == 0 && result.stdout.hasPrefix("consumer billing of orders: every subject, ack wait 2m, dead-lettered after 5 deliveries; next "), "\(result)")
            result = try await sb("stream", "consumer", "edit", "orders", "billing")
            #expect(result.status == 64 && result.stderr.contains("give the settings to change: --filter, --ack-wait, --max-deliver or --max-pending"), "\(result)")
            result = try await sb("stream", "consumer", "edit", "orders", "billing", "--max-pending", "3")
            #expect(result.status == 0 && result.stdout.contains("dead-lettered after 5 deliveries, at most 3 pending; next "), "\(result)")
            result = try await sb("stream", "info", "orders")
            #expect(result.status == 0 && result.stdout.contains("  consumer billing: every subject, ack wait 2m, dead-lettered after 5 deliveries, at most 3 pending\n"), "\(result)")
            result = try await sb("stream", "consumer", "edit", "orders", "billing", "--max-pending", "-1")
            #expect(result.status == 64 && result.stderr.contains("--max-pending must be 0 to 1000000"), "\(result)")
            result = try await sb("stream", "consumer", "edit", "orders", "billing", "--max-pending", "0")
            #expect(result.status == 0 && result.stdout.contains("dead-lettered after 5 deliveries; next "), "no limit: \(result)")
            result = try await sb("stream", "consumer", "edit", "orders", "billing", "--filter", "orders.eu.")
            #expect(result.status == 0 && result.stdout.hasPrefix("consumer billing of orders: subjects orders.eu., ack wait 2m"), "\(result)")
            result = try await sb("stream", "consumer", "edit", "orders", "billing", "--filter", "")
            #expect(result.status == 0 && result.stdout.hasPrefix("consumer billing of orders: every subject, "), "\(result)")
            result = try await sb("stream", "edit", "orders", "--max-age", "forever")
            #expect(result.status == 64 && result.stderr.contains("'forever' is neither none nor a span of time"), "\(result)")
            result = try await sb("stream", "edit", "orders")
            #expect(result.status == 64 && result.stderr.contains("give what to change: --subjects"), "\(result)")
            result = try await sb("stream", "purge", "orders", "--subject", "orders.none.", "--keep", "1")
            #expect(result.status == 0 && result.stdout == "purged stream orders (0 messages)\n", "\(result)")
            result = try await sb("stream", "purge", "orders", "--keep", "-2")
            #expect(result.status == 64 && result.stderr.contains("--keep must be 0 to 1000000000"), "\(result)")
            result = try await sb("stream", "edit", "orders", "--subjects", "orders.", "returns.")
            #expect(result.status == 0 && result.stdout.hasPrefix("stream orders: subjects orders. returns., at most "), "\(result)")
            result = try await sb("stream", "ls", "--json")
            #expect(result.status == 0 && result.stdout.contains("\"name\":\"orders\""), "\(result)")
            try await bus.publish("orders.new", 3)
            _ = try await sb("stream", "fetch", "orders", "billing")
            result = try await sb("stream", "progress", "orders", "billing", "3")
            #expect(result.status == 0 && result.stdout == "in progress 3\n", "\(result)")
            result = try await sb("stream", "nak", "orders", "billing", "3", "9", "--delay", "5000ms")
            #expect(result.status == 1 && result.stdout == "given back 3\n" && result.stderr.contains("not pending (done before, or never handed out): 9"), "\(result)")
            result = try await sb("stream", "ack", "orders", "billing", "1", "--json")
            #expect(result.status == 1 && result.stdout.contains(#""notPending":[1]"#) && result.stderr.contains("not pending"), "a late ack is told: \(result)")
            // Any number of sequences (sent a thousand a request); none below 1.
            result = try await sb(["stream", "ack", "orders", "billing"] + (100..<2_600).map(String.init) + ["--json"])
            let acked = try jsonLines(result.stdout).first
            #expect(result.status == 1 && acked?["notPending"]?.arrayValue?.count == 2_500 && result.stderr.contains("not pending"), "\(result.stderr.prefix(300))")
            result = try await sb("stream", "nak", "orders", "billing", "0")
            #expect(result.status == 64 && result.stderr.contains("sequences are 1 or more (sb stream fetch prints them), got 0"), "\(result)")
            try await bus.publish("orders.new", 4)
            result = try await sb("stream", "sub", "orders", "billing", "--count", "1", "--ack")
            #expect(result.status == 0 && result.stdout == "4 orders.new (delivery 1) 4\n", "\(result)")
            result = try await sb("stream", "pub", "elsewhere", "1")
            #expect(result.status == 1 && result.stderr.contains("no stream holds subject elsewhere"), "\(result)")
            // '-': the data on standard input, JSON when it is JSON, else text less its final newlines.
            result = try await sb("stream", "pub", "orders.piped", "-", input: "{\"id\": 8}\n")
            #expect(result.stdout == "orders 5\n", "\(result)")
            result = try await sb("stream", "pub", "orders.piped", "-", input: "piped words\r\n")
            #expect(result.stdout == "orders 6\n", "\(result)")
            result = try await sb("stream", "read", "orders", "--last", "2", "--json")
            #expect(try jsonLines(result.stdout).first?["messages"]?.arrayValue?.map { $0["data"] } == [["id": 8], "piped words"], "\(result)")
            result = try await sb("stream", "add", "levels", "/client/levels/", "--capture-state")
            #expect(result.status == 0, "\(result)")
            _ = try await bus.client.call(API.consumerAdd, .init(stream: "levels", name: "reader"))
            let level = try await bus.client.publish(key: "/client/levels/a", value: 1)
            _ = try await StreamsStateCaptureTests.take(1, from: "levels", bus)
            result = try await sb("stream", "read", "levels", "--last", "1")
            #expect(result.status == 0 && result.stdout.hasPrefix("1 /client/levels/a ") && result.stdout.hasSuffix(#" {"sequence":\#(level),"value":1}"# + "\n"), "\(result)")
            result = try await sb("stream", "info", "levels")
            #expect(result.stdout.contains("captures the state under its subjects: changes to sequence \(level) kept"), "\(result)")
            // `rm` is also `delete` (as a user coming from other tools types it), not a stream
            // named so for the default verb, `add`.
            result = try await sb("stream", "consumer", "delete", "orders", "billing")
            #expect(result.status == 0 && result.stdout == "deleted consumer billing of orders\n", "\(result)")
            result = try await sb("stream", "fetch", "orders", "billing")
            #expect(result.status == 1 && result.stderr.contains("stream orders has no consumer billing"), "\(result)")
            result = try await sb("stream", "consumer", "add", "orders", "billing")
            #expect(result.status == 0 && result.stdout.contains("consumer billing of orders"), "\(result)")
            // Empty, a stream says which sequence comes next; a dead-letter stream, whose it is.
            result = try await sb("stream", "info", "orders.dead")
            #expect(result.status == 0 && result.stdout.hasPrefix("stream orders.dead (limits): the dead letters of stream orders\n")
                     && result.stdout.contains(", next sequence 1\n"), "\(result)")
            result = try await sb("stream", "rm", "orders")
            #expect(result.status == 0 && result.stdout.contains("deleted stream orders (6 messages)"), "\(result)")
            for (verb, flag) in [("fetch", "--wait"), ("sub", "--expires")] {
                let refused = try await sb("stream", verb, "orders", "billing", flag, "1e300")
                #expect(refused.status == 64 && refused.stderr.contains(flag), "\(refused)")
            }
            // A word that names no verb is refused naming the verbs (not as an argument the
            // default verb, `ls`, did not expect).
            result = try await sb("stream", "lss")
            #expect(result.status == 64 && result.stderr.contains("sb stream has no verb 'lss'; its verbs: ls, info, add, edit, rm, "), "\(result)")
            let help = try await sb("stream", "fetch", "--help")
            #expect(help.status == 0 && help.stdout.contains("Example"))
        }
    }

    @Test("sb stream ack of more sequences than one request carries, a later request failing: what the first applied to is printed, the sequences left are named, the failure is the exit status")
    func settleFailsPartWay() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let host = try ServiceHost(service: FailsAfterFirst(), options: DatasetBus.hostOptions(kernel, connections: 1))
        try await stopping((kernel, host), with: { await $0.1.stop(); await $0.0.stop() }) { _ in
            try await host.start()
            let result = try await runCommand(sbExecutable(), ["stream", "ack", "orders", "billing"] + (1...1_500).map(String.init),
                                              environment: ["SB_ENDPOINT": kernel.endpoints.broker, "NO_COLOR": ""])
            #expect(result.status == 1, "\(result.stderr)")
            #expect(result.stdout == "acknowledged \((1...1_000).map(String.init).joined(separator: " "))\n", "\(result.stdout.prefix(200))")
            #expect(result.stderr.contains("not known to be acknowledged, as the request for them failed (below): the last 500 of the 1500 sequences given, from 1001 on")
                    && result.stderr.contains("the database is away"), "\(result.stderr)")
        }
    }
}

/// A streams service whose `consumer.ack` applies the first request it gets and fails the
/// others, as one whose database went away between two would.
private actor FailsAfterFirst: BusService {
    static let name = API.service
    private var answered = 0

    nonisolated func methods(_ table: inout MethodTable<FailsAfterFirst>) {
        table.on(API.ack) { service, params in try await service.ack(params.sequences) }
    }

    func ack(_ sequences: [Int]) throws -> API.Acknowledged {
        answered += 1
        guard answered == 1 else { throw JSONRPCError(code: JSONRPCError.storageFailedCode, message: "Storage failed: the database is away") }
        return API.Acknowledged(done: sequences, notPending: [])
    }
}

/// What a stream's deletion left after each step (``StreamsTests/deletedStreamsRowsGoAfter(backend:)``).
struct DeletionSteps: Codable {
    var answered: Int
    var left: [[Int]]
    var listed: [String]
    var listedAfter: [String] = []
}
