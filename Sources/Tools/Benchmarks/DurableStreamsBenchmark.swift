import ArgumentParser
import BusKit
import BusProtocol
import Contracts
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
/// transaction is on disk) and fetch-and-acknowledge, beside what the same SQLite file takes
/// from a plain insert loop of its own (one transaction and fsync per insert, the same file
/// settings), in the same run.
struct DurableStreamsBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "streams",
        abstract: "Acknowledged publishes and fetch-and-acknowledge per second through the kernel, beside SQLite's own insert loop."
    )

    @Option(help: "Seconds each measurement runs.")
    var seconds = 3.0
    @Option(help: "Bytes of each message's data.")
    var size = 256
    @Option(help: "Worker connections of the streams service.")
    var connections = 8

    func run() async throws { printTable(try await measure()) }

    func measure() async throws -> [Row] {
        let folder = try temporaryDirectory("sb-bench-streams")
        defer { try? FileManager.default.removeItem(at: folder) }
        let data = JSONValue.string(String(repeating: "x", count: max(0, size - 2)))
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

        let kernel = try await TestKernel.start()
        let service = StreamsService(configuration: StreamsConfiguration(path: folder.appendingPathComponent("streams.sqlite").path))
        let host = try ServiceHost(service: service, options: .init(brokers: [kernel.endpoints.broker], connections: connections))
        try await host.start()
        let loop = try SocketLoop(context: ZMQContext(), name: "bench-clients")
        var clients: [BusClient] = []
        for _ in 0..<8 { clients.append(try await BusClient(brokers: [kernel.endpoints.broker], loop: loop, timeout: .seconds(30))) }
        while !(try await clients[0].hasWorkers(StreamsAPI.service)) { try await Task.sleep(for: .milliseconds(20)) }
        _ = try await clients[0].call(StreamsAPI.streamAdd, .init(name: "bench", subjects: ["bench."]))
        _ = try await clients[0].call(StreamsAPI.consumerAdd, .init(stream: "bench", name: "readers"))

        for count in [1, 8] {
            let lanes = clients
            let published = try await measureRate(lanes: count, seconds: seconds) { lane, _ in
                _ = try await lanes[lane].publish(to: "bench.\(lane)", data)
            }
            let ratio = published.rate / (baseline[count] ?? .nan)
            rows.append(Row("acknowledged publish (stream.publish), \(count) client\(count == 1 ? "" : "s")", rate: published.rate,
                            latencies: published.latencies, note: String(format: "%.2fx SQLite's own loop with as many writers", ratio)))
        }
        for count in [1, 8] {
            let lanes = clients
            let consumed = try await measureRate(lanes: count, seconds: seconds) { lane, _ in
                let fetched = try await lanes[lane].call(StreamsAPI.fetch, .init(stream: "bench", consumer: "readers"))
                guard let message = fetched.messages.first else { throw ValidationError("the stream ran out of messages: the publishing rows ran too short") }
                _ = try await lanes[lane].call(StreamsAPI.ack, .init(stream: "bench", consumer: "readers", sequences: [message.sequence]))
            }
            rows.append(Row("fetch and acknowledge one message, \(count) reader\(count == 1 ? "" : "s")", rate: consumed.rate,
                            latencies: consumed.latencies, note: "two durable writes each"))
        }
        for client in clients { await client.close() }
        await loop.shutdown()
        await host.stop()
        await kernel.stop()
        return rows
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
