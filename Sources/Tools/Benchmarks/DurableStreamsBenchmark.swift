import ArgumentParser
import BusKit
import BusProtocol
import Contracts
import EchoService
import Foundation
import GRDB
import Histogram
import Kernel
import Logging
import Storage
import StreamsService
import SwitchboardTestSupport
import ZeroMQ

/// The streams service through the kernel: acknowledged publishes (each answered once its
/// transaction is durable) and fetch-and-acknowledge, beside what the same database takes
/// from a plain insert loop of its own, in the same run: on SQLite, a loop with one
/// transaction and fsync per insert on a file opened the same way; on PostgreSQL (a server the
/// benchmark starts, when installed), pgbench running a custom script of the same INSERT.
///
/// Two more rows bound a publish from above, in the same run: a request's round trip through
/// the same kernel and a host of the same connections (echo, with a publish's params), and on
/// PostgreSQL pgbench running a publish's own transaction on the service's tables (the
/// stream's row locked, the message, the counters, the request's result), which no client of
/// the database does faster one at a time; a fetch and its acknowledgement likewise, against
/// two echoes and pgbench running their two transactions.
struct DurableStreamsBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "streams",
        abstract: "Acknowledged publishes and fetch-and-acknowledge per second through the kernel, beside the database's own insert loop (SQLite, PostgreSQL)."
    )

    @Option(help: "Seconds each measurement runs.")
    var seconds = 3.0
    @Option(help: "Bytes of each message's data.")
    var size = 256
    @Option(help: "Worker connections of the streams service.")
    var connections = 8

    func run() async throws { printTable(try await measure()) }

    func measure() async throws -> [Row] {
        var rows = try await measureSQLite()
        if TestPostgres.available {
            let server = try await TestPostgres.start()
            defer { server.stop() }
            rows += try await measurePostgres(server)
        } else {
            progress("PostgreSQL is not installed (Debian's postgresql package): its rows are left out")
        }
        return rows
    }

    private var data: JSONValue { .string(String(repeating: "x", count: max(0, size - 2))) }

    private func measureSQLite() async throws -> [Row] {
        let folder = try temporaryDirectory("sb-bench-streams")
        defer { try? FileManager.default.removeItem(at: folder) }
        let data = self.data
        progress("Durable streams benchmark: SQLite WAL with synchronous=FULL in \(folder.path), \(size)-byte messages, \(connections) worker connections, \(seconds) s per row")
        var rows: [Row] = []
        var baseline: [Int: Double] = [:]
        for writers in [1, 8] {
            let plain = try await plainInserts(folder.appendingPathComponent("plain-\(writers).sqlite").path, writers: writers, data: data)
            baseline[writers] = plain.rate
            rows.append(Row("SQLite's own insert loop, a transaction each, \(writers) writer\(writers == 1 ? "" : "s")", rate: plain.rate,
                            latencies: plain.latencies, note: "the baseline"))
            let written = try await writerInserts(folder.appendingPathComponent("writer-\(writers).sqlite").path, writers: writers, data: data)
            rows.append(Row("the same through SQLiteWriter (group commit), \(writers) writer\(writers == 1 ? "" : "s")", rate: written.rate,
                            latencies: written.latencies, note: String(format: "%.2fx the loop; the service's storage alone", written.rate / plain.rate)))
        }

        rows += try await throughService(StreamsConfiguration(path: folder.appendingPathComponent("streams.sqlite").path), baseline: baseline,
                                         baselineName: "SQLite's own loop")
        return rows
    }

    /// pgbench and the service's ``PostgresWriter`` alone, then the service, on `server`.
    private func measurePostgres(_ server: TestPostgres) async throws -> [Row] {
        progress("Durable streams benchmark: PostgreSQL (fsync on) at 127.0.0.1:\(server.port), \(size)-byte messages, \(seconds) s per row")
        let settings = PostgresSettings(url: server.url(), poolSize: connections, tls: .disable)
        let writer = try PostgresWriter(settings: settings, schema: "bench", migrations: [Self.postgresTable + PostgresWriter.repliesTable], lockKey: 1,
                                        replyWindow: .seconds(600), logger: Logger(label: "bench"))
        let connectionsRun = Task { try await writer.connections.run() }
        defer { connectionsRun.cancel() }
        await writer.waitUntilReady()
        var rows: [Row] = []
        var baseline: [Int: Double] = [:]
        for writers in [1, 8] {
            let plain = try await pgbench(server, clients: writers)
            baseline[writers] = plain
            rows.append(Row("pgbench, a custom script of the same INSERT, \(writers) client\(writers == 1 ? "" : "s")", rate: plain, note: "the baseline"))
            let bytes = Array(data.jsonBytes)
            let written = try await measureRate(lanes: writers, seconds: seconds) { _, _ in
                _ = try await writer.write(request: nil) { db in
                    try db.execute("INSERT INTO messages (subject, data, published_at) VALUES (?, ?, ?)", ["bench.plain", bytes, Date().timeIntervalSince1970])
                    return .null
                }
            }
            rows.append(Row("the same through PostgresWriter, \(writers) writer\(writers == 1 ? "" : "s")", rate: written.rate, latencies: written.latencies,
                            note: String(format: "%.2fx pgbench; the service's storage alone", written.rate / plain)))
        }
        let ceilings = DatabaseCeilings(publish: { clients, stream in try await pgbenchPublishes(server, clients: clients, stream: stream) },
                                        fetchAndAck: { clients, stream, consumer in try await pgbenchFetchesAndAcks(server, clients: clients, stream: stream, consumer: consumer) })
        rows += try await throughService(StreamsConfiguration(postgres: settings), baseline: baseline, baselineName: "pgbench", ceilings: ceilings)
        return rows
    }

    /// The plain loop's table, in the schema `bench` (PostgreSQL).
    private static let postgresTable = """
        CREATE TABLE messages (seq BIGSERIAL PRIMARY KEY, subject TEXT NOT NULL, data BYTEA NOT NULL, published_at DOUBLE PRECISION NOT NULL);
        """

    /// pgbench's transactions a second with `clients` connections, each transaction one
    /// INSERT of a message as large as the service's (`-n -f`, `-T` seconds).
    private func pgbench(_ server: TestPostgres, clients: Int) async throws -> Double {
        try await pgbench(server, clients: clients, script: """
            INSERT INTO bench.messages (subject, data, published_at) VALUES ('bench.plain', convert_to(repeat('x', \(max(0, size - 2))), 'UTF8'), extract(epoch from now()));
            """)
    }

    /// pgbench's transactions a second running what the service does for one publish (with no
    /// message id, under no limit) to stream `stream` of subject prefix `prefix.`, on its tables:
    /// the lock shared with changes to subjects, the stream's row read and locked, the message,
    /// the stream's counters, the request's result, COMMIT; each statement a round trip
    /// (`-M extended`, as PostgresNIO sends them).
    private func pgbenchPublishes(_ server: TestPostgres, clients: Int, stream: String) async throws -> Double {
        let schema = "switchboard_streams", bytes = max(0, size - 2)
        return try await pgbench(server, clients: clients, protocol: "extended", script: """
            BEGIN;
            SELECT pg_advisory_xact_lock_shared(\(StreamsDatabase.addingStreams));
            SELECT streams.* FROM \(schema).subjects JOIN \(schema).streams ON streams.name = subjects.stream WHERE substr('\(stream).1', 1, length(subjects.prefix)) = subjects.prefix FOR UPDATE OF streams \\gset
            INSERT INTO \(schema).messages (stream, seq, subject, data, published_at, dead_letter) VALUES ('\(stream)', :last_seq + 1, '\(stream).1', convert_to(repeat('x', \(bytes)), 'UTF8'), extract(epoch from now()), NULL);
            UPDATE \(schema).streams SET messages = messages + 1, bytes = bytes + \(bytes), first_seq = first_seq, last_seq = :last_seq + 1 WHERE name = '\(stream)';
            INSERT INTO \(schema).replies (request, result, written_at) VALUES (md5(random()::text || :client_id), '{}', extract(epoch from now()));
            COMMIT;
            """)
    }

    /// pgbench's fetches and acknowledgements a second as the service writes each alone (the
    /// next message, no deadline passed, no limit): a transaction for the fetch (the stream's row
    /// locked, the consumer read, the messages due and the next one, its pending row, the
    /// consumer's counters, the request's result) and one for its acknowledgement (the stream's
    /// row locked, the consumer read, its pending row deleted, the consumer's count, the result).
    private func pgbenchFetchesAndAcks(_ server: TestPostgres, clients: Int, stream: String, consumer: String) async throws -> Double {
        let schema = "switchboard_streams", at = "extract(epoch from now())"
        return try await pgbench(server, clients: clients, protocol: "extended", script: """
            BEGIN;
            SELECT * FROM \(schema).streams WHERE name = '\(stream)' FOR UPDATE OF streams;
            SELECT next_seq, ack_wait FROM \(schema).consumers WHERE stream = '\(stream)' AND name = '\(consumer)' \\gset
            SELECT p.seq, p.deliveries, m.subject, m.data, m.published_at, m.dead_letter FROM \(schema).pending p JOIN \(schema).messages m ON m.stream = p.stream AND m.seq = p.seq WHERE p.stream = '\(stream)' AND p.consumer = '\(consumer)' AND p.deadline <= \(at) ORDER BY p.seq LIMIT 1;
            SELECT seq AS fresh, subject, data, published_at, dead_letter FROM \(schema).messages WHERE stream = '\(stream)' AND seq >= :next_seq ORDER BY seq LIMIT 1 \\gset
            INSERT INTO \(schema).pending (stream, consumer, seq, deliveries, deadline) VALUES ('\(stream)', '\(consumer)', :fresh, 1, \(at) + :ack_wait);
            UPDATE \(schema).consumers SET next_seq = :fresh + 1, delivered = delivered + 1, redelivered = redelivered + 0, dead_lettered = dead_lettered + 0, missed_told = missed WHERE stream = '\(stream)' AND name = '\(consumer)';
            INSERT INTO \(schema).replies (request, result, written_at) VALUES (md5(random()::text || :client_id), '{}', \(at));
            COMMIT;
            BEGIN;
            SELECT * FROM \(schema).streams WHERE name = '\(stream)' FOR UPDATE OF streams;
            SELECT * FROM \(schema).consumers WHERE stream = '\(stream)' AND name = '\(consumer)';
            DELETE FROM \(schema).pending WHERE stream = '\(stream)' AND consumer = '\(consumer)' AND seq IN (:fresh) RETURNING seq;
            UPDATE \(schema).consumers SET acknowledged = acknowledged + 1 WHERE stream = '\(stream)' AND name = '\(consumer)';
            INSERT INTO \(schema).replies (request, result, written_at) VALUES (md5(random()::text || :client_id), '{}', \(at));
            COMMIT;
            """)
    }

    private func pgbench(_ server: TestPostgres, clients: Int, protocol: String = "simple", script: String) async throws -> Double {
        guard let binaries = TestPostgres.binaries else { throw ValidationError("no PostgreSQL binaries") }
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("sb-bench-script-\(getpid()).sql")
        defer { try? FileManager.default.removeItem(at: file) }
        try script.write(to: file, atomically: true, encoding: .utf8)
        // runCommand starts it with no signal blocked: pgbench ends its -T run on SIGALRM.
        let run = max(1, Int(seconds.rounded()))
        let result = try await runCommand(binaries.appendingPathComponent("pgbench"),
                                          ["-n", "-M", `protocol`, "-f", file.path, "-c", "\(clients)", "-j", "\(min(clients, 2))", "-T", "\(run)",
                                           "-h", "127.0.0.1", "-p", "\(server.port)", "-U", TestPostgres.user, "postgres"],
                                          environment: ["PGPASSWORD": TestPostgres.password], seconds: Double(run) + 60)
        guard result.status == 0,
              let line = result.stdout.split(separator: "\n").first(where: { $0.hasPrefix("tps = ") }),
              let tps = Double(line.dropFirst(6).prefix { $0.isNumber || $0 == "." }) else {
            throw ValidationError("pgbench failed: \(result)")
        }
        return tps
    }

    /// What the database's own client does running the service's transactions, by clients, on
    /// a stream (and a consumer) it names.
    private struct DatabaseCeilings {
        /// A publish's transaction.
        var publish: (_ clients: Int, _ stream: String) async throws -> Double
        /// A fetch's transaction and its acknowledgement's (pairs a second).
        var fetchAndAck: (_ clients: Int, _ stream: String, _ consumer: String) async throws -> Double
    }

    /// Publishes, then fetches and acknowledges, through a kernel and a streams service on
    /// `configuration`'s database; ratios to `baseline` (its loop's rate by writers), to an echo
    /// through the same kernel, and to `ceilings` when there are some.
    private func throughService(_ configuration: StreamsConfiguration, baseline: [Int: Double], baselineName: String,
                                ceilings: DatabaseCeilings? = nil) async throws -> [Row] {
        let data = self.data
        var rows: [Row] = []
        let kernel = try await TestKernel.start()
        let service = StreamsService(configuration: configuration)
        let parts = service.requiredParts.map { part in Task { try await part.run() } }
        defer { for part in parts { part.cancel() } }
        await service.waitUntilReady()
        let host = try ServiceHost(service: service, options: .init(brokers: [kernel.endpoints.broker], connections: connections))
        try await host.start()
        let echoHost = try ServiceHost(service: EchoService(), options: .init(brokers: [kernel.endpoints.broker], connections: connections))
        try await echoHost.start()
        let loop = try SocketLoop(context: ZMQContext(), name: "bench-clients")
        var clients: [BusClient] = []
        for _ in 0..<8 { clients.append(try await BusClient(brokers: [kernel.endpoints.broker], loop: loop, timeout: .seconds(30))) }
        for service in [StreamsAPI.service, EchoAPI.service] {
            while !(try await clients[0].hasWorkers(service)) { try await Task.sleep(for: .milliseconds(20)) }
        }
        _ = try await clients[0].call(StreamsAPI.streamAdd, .init(name: "bench", subjects: ["bench."]))
        _ = try await clients[0].call(StreamsAPI.consumerAdd, .init(stream: "bench", name: "readers"))
        if ceilings != nil {
            _ = try await clients[0].call(StreamsAPI.streamAdd, .init(name: "shape", subjects: ["shape."]))
            _ = try await clients[0].call(StreamsAPI.consumerAdd, .init(stream: "shape", name: "readers"))
        }

        var echoRates: [Int: Double] = [:]
        for count in [1, 8] {
            let lanes = clients, plural = count == 1 ? "" : "s"
            let echoed = try await measureRate(lanes: count, seconds: seconds) { lane, _ in
                _ = try await lanes[lane].call(EchoAPI.echo, ["subject": .string("bench.\(lane)"), "data": data])
            }
            rows.append(Row("a request's round trip through the same kernel (echo, a publish's params), \(count) client\(plural)", rate: echoed.rate,
                            latencies: echoed.latencies,
                            note: String(format: "%.2fx \(baselineName) with as many writers: a publish's ceiling through the bus", echoed.rate / (baseline[count] ?? .nan))))
            echoRates[count] = echoed.rate
            var transactionRate: Double?
            if let ceilings {
                let rate = try await ceilings.publish(count, "shape")
                transactionRate = rate
                rows.append(Row("pgbench running a publish's own transaction (BEGIN, shared and row locks, 3 writes, COMMIT), \(count) client\(plural)", rate: rate,
                                note: String(format: "%.2fx \(baselineName) with as many writers: a publish's ceiling on this database", rate / (baseline[count] ?? .nan))))
            }
            let published = try await measureRate(lanes: count, seconds: seconds) { lane, _ in
                _ = try await lanes[lane].publish(to: "bench.\(lane)", data)
            }
            let ceilings = String(format: "; %.2fx the echo", published.rate / echoed.rate) + (transactionRate.map { String(format: ", %.2fx pgbench's publish", published.rate / $0) } ?? "")
            rows.append(Row("acknowledged publish (stream.publish), \(count) client\(plural)", rate: published.rate,
                            latencies: published.latencies, note: String(format: "%.2fx \(baselineName) with as many writers", published.rate / (baseline[count] ?? .nan)) + ceilings))
            // Exactly-once publishing: each message's id looked up in, and kept for, the duplicate window.
            let identified = try await measureRate(lanes: count, seconds: seconds) { lane, number in
                _ = try await lanes[lane].publish(to: "bench.\(lane)", data, id: "\(lane)-\(number)")
            }
            rows.append(Row("the same, each message with an id (exactly-once), \(count) client\(plural)", rate: identified.rate,
                            latencies: identified.latencies, note: String(format: "%.2fx without ids", identified.rate / published.rate)))
        }
        for count in [1, 8] {
            let lanes = clients
            let consumed = try await measureRate(lanes: count, seconds: seconds) { lane, _ in
                let fetched = try await lanes[lane].call(StreamsAPI.fetch, .init(stream: "bench", consumer: "readers"))
                guard let message = fetched.messages.first else { throw ValidationError("the stream ran out of messages: the publishing rows ran too short") }
                _ = try await lanes[lane].call(StreamsAPI.ack, .init(stream: "bench", consumer: "readers", sequences: [message.sequence]))
            }
            // Two requests, each a durable write: its ceiling through the bus is half the echo's rate.
            var ceiling = ""
            if let ceilings {
                // On the messages pgbench's publishes left in its stream.
                let rate = try await ceilings.fetchAndAck(count, "shape", "readers")
                rows.append(Row("pgbench running a fetch's and its acknowledgement's own transactions (row lock, 7 and 5 statements, COMMIT each), \(count) client\(count == 1 ? "" : "s")",
                                rate: rate, note: String(format: "%.2fx \(baselineName) with as many writers: a fetch and ack's ceiling on this database", rate / (baseline[count] ?? .nan))))
                ceiling = String(format: ", %.2fx pgbench's fetch and ack", consumed.rate / rate)
            }
            rows.append(Row("fetch and acknowledge one message, \(count) reader\(count == 1 ? "" : "s")", rate: consumed.rate,
                            latencies: consumed.latencies,
                            note: String(format: "%.2fx \(baselineName) with as many writers; %.2fx two echoes", consumed.rate / (baseline[count] ?? .nan),
                                         2 * consumed.rate / (echoRates[count] ?? .nan)) + ceiling))
        }
        rows += try await removals(by: clients, consumers: configuration.maxConsumers)
        for client in clients { await client.close() }
        await loop.shutdown()
        await echoHost.stop()
        await host.stop()
        await kernel.stop()
        return rows
    }

    /// A lowered limit removing many messages (one `stream.update`), with the most consumers a
    /// stream may have (`streams.max_consumers`) behind all of them, beside the same removal
    /// with none: what the consumers' missed counts add to it.
    private func removals(by clients: [BusClient], consumers: Int) async throws -> [Row] {
        let count = 20_000, data = self.data
        /// Seconds the removal takes on a stream of its own with `behind` consumers.
        func removal(behind: Int) async throws -> Double {
            let name = "cut\(behind)"
            _ = try await clients[0].call(StreamsAPI.streamAdd, .init(name: name, subjects: ["\(name)."]))
            for number in 0..<behind { _ = try await clients[0].call(StreamsAPI.consumerAdd, .init(stream: name, name: "c\(number)")) }
            try await withThrowingDiscardingTaskGroup { group in
                for (lane, client) in clients.enumerated() {
                    group.addTask { for _ in stride(from: lane, to: count, by: clients.count) { _ = try await client.publish(to: "\(name).x", data) } }
                }
            }
            let started = ContinuousClock.now
            _ = try await clients[0].call(StreamsAPI.streamUpdate, .init(name: name, maxMessages: 1))
            return (ContinuousClock.now - started).seconds
        }
        let alone = try await removal(behind: 0), followed = try await removal(behind: consumers)
        return [Row("a lowered limit removing \(count) messages (one stream.update), no consumer", rate: Double(count) / alone, note: "messages removed a second"),
                Row("the same with \(consumers) consumers behind, each counting them missed", rate: Double(count) / followed,
                    note: String(format: "%.2fx the time with none", followed / alone))]
    }

    /// A table of messages (and the writer's table of results).
    private var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(sql: "CREATE TABLE messages (seq INTEGER PRIMARY KEY, subject TEXT NOT NULL, data BLOB NOT NULL, published_at REAL NOT NULL)")
            try SQLiteWriter.createRepliesTable(db)
        }
        return migrator
    }

    /// The same INSERTs through the service's ``SQLiteWriter``: its actor, group commit and savepoints.
    private func writerInserts(_ path: String, writers: Int, data: JSONValue) async throws -> (rate: Double, latencies: Histogram<UInt64>) {
        let writer = SQLiteWriter(path: path, label: "bench", maxSizeBytes: nil, migrator: migrator, replyWindow: .seconds(600),
                                  logger: Logger(label: "bench"))
        let bytes = Data(data.jsonBytes)
        return try await measureRate(lanes: writers, seconds: seconds) { _, _ in
            _ = try await writer.write(request: nil) { db in
                try db.execute(sql: "INSERT INTO messages (subject, data, published_at) VALUES (?, ?, ?)",
                               arguments: ["bench.plain", bytes, Date().timeIntervalSince1970])
                return .null
            }
        }
    }

    /// One INSERT per transaction, `writers` tasks at once, on a file opened as the streams
    /// service opens its own.
    private func plainInserts(_ path: String, writers: Int, data: JSONValue) async throws -> (rate: Double, latencies: Histogram<UInt64>) {
        let pool = try SQLiteWriter.open(path: path, label: "bench", maxSizeBytes: nil, migrator: migrator)
        let bytes = Data(data.jsonBytes)
        return try await measureRate(lanes: writers, seconds: seconds) { _, _ in
            try await pool.write { db in
                try db.execute(sql: "INSERT INTO messages (subject, data, published_at) VALUES (?, ?, ?)",
                               arguments: ["bench.plain", bytes, Date().timeIntervalSince1970])
            }
        }
    }
}
