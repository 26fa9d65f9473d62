import BusKit
import BusProtocol
import Foundation
import Kernel
import Storage
import StoreService
import Synchronization
import SwitchboardTestSupport
import Testing

@Suite("store on PostgreSQL: the database away at start, lost mid-run, restarted",
       .enabled(if: TestPostgres.available, "skipped: no PostgreSQL server installed (the test bootstrap installs it)"))
struct PostgresFaultTests {
    @Test("unreachable at start: said with the URL but not its password, registered only once the database answers; killed: writes fail, never a false acknowledgement; restarted: the store reconnects and nothing acknowledged is lost")
    func databaseAwayAndBack() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let port = freePort()
        let url = "postgres://\(TestPostgres.user):\(TestPostgres.password)@127.0.0.1:\(port)/postgres"
        let log = LogLines()
        // A deadline of 1 s (store.timeout_ms) rather than the default 4: the database being
        // away is what is waited for, twice.
        let store = StoreService(configuration: StoreConfiguration(postgres: PostgresSettings(url: url, tls: .disable, operationTimeout: .seconds(1))),
                                 logger: log.logger("store"))
        let host = try ServiceHost(service: store, options: .init(brokers: [kernel.endpoints.broker], connections: 2, heartbeatInterval: .milliseconds(100),
                                                                   heartbeatLiveness: 10))
        // The store's work keeps its connections; as ServiceHost.run does with its `ready`,
        // the host registers once the database can serve.
        let work = Working(store)
        await work.start()
        let registering = Task {
            await store.waitUntilReady()
            try await host.start()
        }
        // A second part waiting for the database as well (as the streams service's work does).
        let alsoWaiting = Task { await store.waitUntilReady() }
        let client = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(5))
        try await log.waitFor("cannot reach the database", within: 10, "the store said it cannot reach the database")
        #expect(log.text.contains("127.0.0.1:\(port)") && !log.text.contains(TestPostgres.password), "\(log.text)")
        // Said by the store, not by its pool at each connection it tries (every few seconds).
        #expect(!log.text.contains("Connection creation failed"), "\(log.text)")
        #expect(try await client.hasWorkers("store") == false, "not registered while the database is away")

        let server = try await TestPostgres.start(port: port)
        defer { server.stop() }
        try await kernel.workers("store", within: 15)
        try await registering.value
        await alsoWaiting.value
        // Said once, however many parts waited for the database.
        for said in ["cannot reach the database", "database ready"] {
            #expect(log.lines.value.filter { $0.contains(said) }.count == 1, "\(said): \(log.text)")
        }
        var acknowledged: [String] = []
        for n in 1...5 {
            _ = try await client.request(service: "store", method: "history.add", params: ["text": .string("before \(n)")])
            acknowledged.append("before \(n)")
        }

        // The database goes (as in a crash) while a writer writes: what was acknowledged before
        // must be there afterwards; what was in flight failed (or was acknowledged, and is there too).
        let written = Observed(0)
        let writing = Task { () -> [String] in
            var done: [String] = []
            for n in 0..<2_000 {
                let text = "during \(n)"
                do {
                    _ = try await client.request(service: "store", method: "history.add", params: ["text": .string(text)], timeout: .seconds(6))
                    done.append(text)
                    written.update { $0 += 1 }
                } catch {
                    break
                }
            }
            return done
        }
        try await written.wait(within: 10, "writes on their way") { $0 > 20 }
        let saidBeforeKill = log.lines.value.count
        await server.kill()
        acknowledged += await writing.value
        do {
            _ = try await client.request(service: "store", method: "history.add", params: ["text": "while away"])
            Issue.record("a write was acknowledged with the database down")
        } catch {
            guard case .remote(_, let rpc) = error else { throw error }
            #expect(rpc.code == JSONRPCError.storageFailedCode && rpc.data?["reason"] == "unreachable", "\(rpc)")
            #expect(!rpc.message.contains(TestPostgres.password) && rpc.message.contains("127.0.0.1:\(port)"), "\(rpc.message)")
        }
        // Why, as one connection made alone finds it (the pool itself only times out): said in
        // the store's log, and in what callers get from then on.
        try await log.lines.wait(within: 15, "the store said why it cannot reach the database") { lines in
            lines.dropFirst(saidBeforeKill).contains { $0.contains("cannot reach the database") && $0.contains("cannot connect") }
        }
        do {
            _ = try await client.request(service: "store", method: "history.add", params: ["text": "still away"])
            Issue.record("a write was acknowledged with the database down")
        } catch {
            guard case .remote(_, let rpc) = error else { throw error }
            #expect(rpc.data?["reason"] == "unreachable" && rpc.message.contains("a connection made alone: cannot connect"), "\(rpc.message)")
        }

        // Back: the store reconnects by itself; everything acknowledged is there.
        try await server.restart()
        try await eventually(20, "writes succeed again") {
            (try? await client.request(service: "store", method: "history.add", params: ["text": "after"], timeout: .seconds(2))) != nil
        }
        try await log.waitFor("the database can be reached again", within: 15, "the store said the database is back")
        let history = try await client.request(service: "store", method: "history.list", params: ["limit": 100])
        let texts = Set(history["entries"]?.arrayValue?.compactMap { $0["text"]?.stringValue } ?? [])
        // The history keeps the last 100: the latest acknowledged writes are all there (a few
        // places left for writes in flight at the kill, which may or may not have been made).
        #expect(texts.isSuperset(of: (acknowledged + ["after"]).suffix(90)), "\(texts)")

        await host.stop()
        await work.stop()
        await client.close()
        await kernel.stop()
    }

    @Test("the kernel restarted while the database is away: once the database is back, the store publishes every key to the new kernel, its saved articles with them")
    func republishedOnceBack() async throws {
        let log = LogLines()
        var bus = try await StoreBus.start(backend: .postgres, logger: log.logger("store")) { $0.postgres?.operationTimeout = .seconds(1) }
        let postgres = try #require(bus.postgres)
        _ = try await bus.call("history.add", ["text": "Paris"])
        _ = try await bus.call("articles.save", article("https://example.com/kept"))
        _ = try await bus.kernel.state("/store/", within: 15, "the store's keys published") { state in
            state["/store/history"] != nil && state.keys.contains { $0.hasPrefix("/store/articles/") }
        }

        await postgres.kill()
        await bus.kernel.stop()
        let restarted = try await bus.kernel.restarted()
        bus = StoreBus(kernel: restarted, store: bus.store, host: bus.host, work: bus.work, client: bus.client,
                       publisherClient: bus.publisherClient, folder: bus.folder, backend: bus.backend, postgres: bus.postgres)
        try await log.waitFor("cannot publish changes yet", within: 30, "the store said it cannot publish to the new kernel yet")
        try await postgres.restart()
        _ = try await restarted.state("/store/", within: 30, "every key published to the new kernel once the database is back") { state in
            state["/store/history"] != nil && state["/store/sources/selected"] != nil && state.keys.contains { $0.hasPrefix("/store/articles/") }
        }
        await bus.stop()
    }

    @Test("switchboard serve store (and streams) with its database away: a SIGTERM while it waits for the database ends it")
    func stoppedWhileWaiting() async throws {
        let folder = try temporaryDirectory("postgres-away")
        let config = folder.appendingPathComponent("switchboard.yaml")
        let url = "postgres://\(TestPostgres.user)@127.0.0.1:\(freePort())/postgres"
        let ports = (0..<4).map { _ in freePort() }
        try Data("""
            \(kernelSection(ports))
            store: {backend: postgres, url: "\(url)", tls: disable, timeout_ms: 1000}
            streams: {backend: postgres, url: "\(url)", tls: disable, timeout_ms: 1000}
            security: {curve: false}
            """.utf8).write(to: config)
        for service in ["store", "streams"] {
            let process = try ChildProcess(switchboardExecutable(), ["serve", service, "--config", config.path])
            defer { process.stop() }
            try await process.waitForOutput(containing: "cannot reach the database", within: 60)
            process.signal(SIGTERM)
            #expect(await process.exit(within: 20), "\(service): \(process.outputSoFar)")
            #expect(process.terminationStatus == 0, "\(service): \(process.outputSoFar)")
        }
    }
}

@Suite("store on PostgreSQL: a role the database does not let create the schema",
       .enabled(if: TestPostgres.available, "skipped: no PostgreSQL server installed (the test bootstrap installs it)"))
struct SchemaRefusedTests {
    @Test("a role without the right to create the service's schema: each request is answered -32007 with what the database said, as an operator can act on it")
    func refusalSaid() async throws {
        let server = try await TestPostgres.start()
        defer { server.stop() }
        let admin = try server.session()
        defer { admin.stop() }
        admin.send("CREATE ROLE limited LOGIN PASSWORD 'l1mited'; SELECT 'role made';\n")
        try await admin.waitForOutput(containing: "role made", within: 20)
        let writer = try PostgresWriter(settings: PostgresSettings(url: "postgres://limited:l1mited@127.0.0.1:\(server.port)/postgres", poolSize: 1,
                                                                   tls: .disable, operationTimeout: .seconds(10)),
                                        schema: "refused", migrations: [PostgresWriter.repliesTable], lockKey: 1, replyWindow: .seconds(60),
                                        logger: LogLines().logger("store"))
        let connections = Task { try await writer.connections.run() }
        let error = await #expect(throws: JSONRPCError.self) { try await writer.write(request: nil) { _ in .null } }
        #expect(error?.message.contains("the database answered: permission denied for database postgres (SQLSTATE 42501)") == true,
                "\(String(describing: error))")
        #expect(error?.data?["reason"] == .string("other"))
        connections.cancel()
        _ = await connections.result
    }
}

extension PostgresFaultTests {
    @Test("an upgrade's migration that takes longer than an operation's timeout is made once and said, and the service is then ready: it is not failed at every start by that timeout")
    func longMigration() async throws {
        let server = try await TestPostgres.start()
        defer { server.stop() }
        let log = LogLines()
        func ready(_ migrations: [String]) async throws {
            try await Self.withWriter(server, migrations, log) { writer in
                try await within(30, "the database ready at version \(migrations.count)") { await writer.waitUntilReady() }
            }
        }
        try await ready([PostgresWriter.repliesTable])
        // Version 2 takes twice the operations' timeout, as counting a large table would.
        let upgraded = [PostgresWriter.repliesTable, "CREATE TABLE counted (n INT); SELECT pg_sleep(2)"]
        try await ready(upgraded)
        try await ready(upgraded)
        let lines = log.lines.value
        #expect(lines.filter { $0.contains("migrating the database schema") }.count == 2, "once at each version: \(log.text)")
        #expect(lines.contains { $0.contains("migrating the database schema") && $0.contains("from=1") && $0.contains("to=2") }, "\(log.text)")
        #expect(!log.text.contains("cannot reach the database"), "\(log.text)")
    }

    @Test("processes starting together at an upgrade migrate once, and only the one that migrates says it does; the other waits for it and finds it done")
    func upgradeStartedTogether() async throws {
        let server = try await TestPostgres.start()
        defer { server.stop() }
        let log = LogLines()
        try await Self.withWriter(server, [PostgresWriter.repliesTable], log) { writer in
            try await within(30, "the database ready at version 1") { await writer.waitUntilReady() }
        }
        // The migration's lock held meanwhile: both find version 1 before either can migrate.
        let holder = try server.session()
        defer { holder.stop() }
        holder.send("SELECT pg_advisory_lock(1); SELECT 'holding';\n")
        _ = try await holder.waitForOutput(containing: "holding", within: 10)
        let upgraded = [PostgresWriter.repliesTable, "CREATE TABLE counted (n INT)"]
        try await Self.withWriter(server, upgraded, log) { first in
            try await Self.withWriter(server, upgraded, log) { second in
                async let firstReady: Void = within(60, "the first ready at version 2") { await first.waitUntilReady() }
                async let secondReady: Void = within(60, "the second ready at version 2") { await second.waitUntilReady() }
                do {
                    // Let go however the wait ends: the two wait for the lock, not for a timeout.
                    defer { holder.send("SELECT pg_advisory_unlock(1);\n") }
                    let watcher = try server.session()
                    defer { watcher.stop() }
                    try await server.waitForLockWaiters(2, where: "locktype = 'advisory'", on: watcher)
                }
                _ = try await (firstReady, secondReady)
            }
        }
        let migrating = log.lines.value.filter { $0.contains("migrating the database schema") }
        #expect(migrating.count == 2 && migrating.last?.contains("from=1") == true && migrating.last?.contains("to=2") == true,
                "once from 0 to 1, once from 1 to 2: \(log.text)")
    }

    @Test("operations that run past their timeout on a database that answers: the log says it is slow or busy, not that it cannot be reached, and later errors say a connection made alone was answered")
    func slowDatabaseSaid() async throws {
        let server = try await TestPostgres.start()
        defer { server.stop() }
        let log = LogLines()
        try await Self.withWriter(server, [PostgresWriter.repliesTable], log) { writer in
            try await within(30, "the database ready") { await writer.waitUntilReady() }
            // Three statements, each within the statement timeout (1 s), together past the operation's.
            let slow = { @Sendable (session: any SQLSession) throws -> JSONValue in
                for _ in 0..<3 { try session.execute("SELECT pg_sleep(0.4)", []) }
                return .null
            }
            let first = await #expect(throws: JSONRPCError.self) { try await writer.write(request: nil, slow) }
            #expect(first?.data?["reason"] == "unreachable" && first?.message.contains("did not answer within 1") == true, "\(String(describing: first))")
            try await log.waitFor("the database answers, but operations ran past their timeout", within: 15, "the writer said the database is slow")
            let second = await #expect(throws: JSONRPCError.self) { try await writer.write(request: nil, slow) }
            #expect(second?.message.contains("a connection made alone was answered: the database is up, slow or busy") == true, "\(String(describing: second))")
            #expect(try await writer.write(request: nil) { _ in .string("done") } == .string("done"))
            #expect(!log.text.contains("cannot reach the database"), "\(log.text)")
        }
    }

    /// `body` with a writer of the schema `upgraded` at version `migrations.count`, its
    /// connections running until it returns.
    private static func withWriter(_ server: TestPostgres, _ migrations: [String], _ log: LogLines,
                                   _ body: (PostgresWriter) async throws -> Void) async throws {
        let settings = PostgresSettings(url: server.url(), poolSize: 2, tls: .disable, operationTimeout: .seconds(1))
        let writer = try PostgresWriter(settings: settings, schema: "upgraded", migrations: migrations, lockKey: 1, replyWindow: .seconds(60),
                                        logger: log.logger("store"))
        let connections = Task { try await writer.connections.run() }
        defer { connections.cancel() }
        try await body(writer)
        connections.cancel()
        _ = await connections.result
    }
}

@Suite("store on PostgreSQL: a database that never answers")
struct SilentDatabaseTests {
    @Test("a server that accepts connections and then answers no query: each operation gives up at its deadline and says so, and the store still stops")
    func silentDatabase() async throws {
        let silent = try SilentPostgres()
        defer { silent.stop() }
        let log = LogLines()
        let store = StoreService(configuration: StoreConfiguration(postgres: PostgresSettings(url: "postgres://someone:secret@127.0.0.1:\(silent.port)/db",
                                                                                           tls: .disable, operationTimeout: .seconds(1))),
                                 logger: log.logger("store"))
        let work = Working(store)
        await work.start()
        // PostgresNIO's queries do not end when their task is cancelled: an operation that
        // awaited its query would wait here for ever.
        let waiting = Task { await store.waitUntilReady() }
        try await log.waitFor("did not answer within 1", within: 15, "the store gave up waiting for the database's answer")
        #expect(silent.connections > 0, "the store connected and sent its query")
        waiting.cancel()
        await waiting.value
        await work.stop()
    }
}

extension SilentDatabaseTests {
    @Test("operations that time out against a database that takes connections but answers nothing: the looks at why are paced, not one new connection per failure")
    func looksPaced() async throws {
        let silent = try SilentPostgres()
        defer { silent.stop() }
        let poolSize = 2
        let writer = try PostgresWriter(settings: PostgresSettings(url: "postgres://someone:secret@127.0.0.1:\(silent.port)/db", poolSize: poolSize,
                                                                   tls: .disable, operationTimeout: .milliseconds(300)),
                                        schema: nil, migrations: [PostgresWriter.repliesTable], lockKey: 1, replyWindow: .seconds(60), logger: LogLines().logger("store"))
        // The test owns the connections' life, as a process's group would.
        let connections = Task { try await writer.connections.run() }
        let started = ContinuousClock.now
        for _ in 0..<6 {
            await withTaskGroup { group in
                for _ in 0..<8 { group.addTask { _ = try? await writer.read { _ in 1 } } }
            }
        }
        let elapsed = ContinuousClock.now - started
        // The pool's own connections (each held by a query never answered), and at most one
        // look at once and one each interval after.
        let allowed = poolSize + 1 + Int(elapsed / PostgresConnections.lookInterval)
        #expect(silent.connections <= allowed, "\(silent.connections) connections in \(elapsed), at most \(allowed) expected")
        connections.cancel()
        _ = await connections.result
    }
}

extension SilentDatabaseTests {
    @Test("a connection that a look at why gave up on (its deadline passed) and that is made after all is closed, not left open")
    func lateConnectionClosed() async throws {
        let silent = try SilentPostgres(holdingStartUps: true)
        defer { silent.stop() }
        let settings = PostgresSettings(url: "postgres://someone:secret@127.0.0.1:\(silent.port)/db", tls: .disable, operationTimeout: .milliseconds(300))
        let problem = await settings.connectionProblem(logger: LogLines().logger("store"))
        #expect(problem?.contains("did not answer within") == true, "\(String(describing: problem))")
        // Its start-up completes now, with no one waiting for the connection.
        silent.completeStartUps()
        try await within(10, "the client closed the connection made late") { _ = await silent.ends.first { true } }
    }
}

extension SilentDatabaseTests {
    @Test("a lock one process asks for that the database does not answer in time may be taken later all the same: the connection that asked is closed, so it cannot hold the lock for good")
    func unansweredLockClosed() async throws {
        let silent = try SilentPostgres()
        defer { silent.stop() }
        let writer = try PostgresWriter(settings: PostgresSettings(url: "postgres://someone:secret@127.0.0.1:\(silent.port)/db", poolSize: 1,
                                                                   tls: .disable, operationTimeout: .milliseconds(300)),
                                        schema: nil, migrations: [PostgresWriter.repliesTable], lockKey: 1, replyWindow: .seconds(60), logger: LogLines().logger("store"))
        let connections = Task { try await writer.connections.run() }
        await #expect(throws: JSONRPCError.self) { try await writer.alone(9, waitingAtMost: .seconds(5)) {} }
        try await within(10, "the connection that asked for the lock closed") { _ = await silent.ends.first { true } }
        connections.cancel()
        _ = await connections.result
    }
}

/// A PostgreSQL server that completes the start-up of every connection (trust, no TLS) and
/// then reads and drops whatever is sent: a database that hangs mid-query. Holding start-ups,
/// it completes them only once told to.
private final class SilentPostgres: Sendable {
    let port: Int
    private let listener: Int32
    private let accepted = Accepted()
    /// Entered while start-ups are held (`held`).
    private let startUpsHeld = DispatchGroup(), held = Mutex(false)
    /// One element each time a connection ends after its start-up (the client closed it).
    let ends: AsyncStream<Void>
    private let ended: AsyncStream<Void>.Continuation

    var connections: Int { accepted.withLock { $0.count } }

    func completeStartUps() {
        if held.withLock({ held in defer { held = false }; return held }) { startUpsHeld.leave() }
    }

    /// The connections accepted so far, shared with the accepting thread.
    final class Accepted: Sendable {
        private let sockets = Mutex<[Int32]>([])
        func withLock<R>(_ body: (inout [Int32]) -> R) -> R { sockets.withLock { body(&$0) } }
    }

    init(holdingStartUps: Bool = false) throws {
        (ends, ended) = AsyncStream.makeStream()
        if holdingStartUps {
            startUpsHeld.enter()
            held.withLock { $0 = true }
        }
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                bind(listener, address, length) == 0 && listen(listener, 8) == 0 && getsockname(listener, address, &length) == 0
            }
        }
        guard bound else {
            close(listener)
            throw POSIXError(.EADDRNOTAVAIL)
        }
        self.listener = listener
        port = Int(UInt16(bigEndian: address.sin_port))
        Thread.detachNewThread { [self] in
            while case let connection = accept(listener, nil, nil), connection >= 0 {
                accepted.withLock { $0.append(connection) }
                Thread.detachNewThread { [self] in
                    if Self.serve(connection, startUpsHeld: startUpsHeld) { ended.yield() }
                }
            }
        }
    }

    /// Whether the connection ended after its start-up.
    private static func serve(_ connection: Int32, startUpsHeld: DispatchGroup) -> Bool {
        // The start-up message (length, protocol, parameters), then: authentication OK,
        // the backend's key, ready for a query.
        var buffer = [UInt8](repeating: 0, count: 4096)
        guard read(connection, &buffer, buffer.count) > 0 else { return false }
        startUpsHeld.wait()
        let hello: [UInt8] = [UInt8(ascii: "R"), 0, 0, 0, 8, 0, 0, 0, 0,
                              UInt8(ascii: "K"), 0, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0, 2,
                              UInt8(ascii: "Z"), 0, 0, 0, 5, UInt8(ascii: "I")]
        _ = write(connection, hello, hello.count)
        while read(connection, &buffer, buffer.count) > 0 {}
        return true
    }

    func stop() {
        completeStartUps()
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        for connection in accepted.withLock({ $0 }) {
            shutdown(connection, Int32(SHUT_RDWR))
            close(connection)
        }
    }
}
