import BusProtocol
import Foundation
import Logging
import Storage
import SwitchboardTestSupport
import Testing

@Suite("PostgreSQL: a write the database ends for another transaction's sake",
       .enabled(if: TestPostgres.available, "skipped: no PostgreSQL server installed (the test bootstrap installs it)"))
struct PostgresConflictTests {
    @Test("chosen to break a deadlock, a write is run again and succeeds; the other transaction's changes stay")
    func deadlockVictim() async throws {
        try await withPostgresWriter(schema: "conflicts", migration: "CREATE TABLE counters (name TEXT PRIMARY KEY, n BIGINT NOT NULL); INSERT INTO counters VALUES ('a', 0), ('b', 0);",
                                     timeout: .seconds(4)) { writer, server in try await deadlock(writer, server) }
    }

    /// Another session and `writer` each lock one row, then want the other's.
    private func deadlock(_ writer: PostgresWriter, _ server: TestPostgres) async throws {
        // Another session holds b, and looks for deadlocks only long after the writer's server
        // process does (after deadlock_timeout, 1 s by default): the writer is the one ended.
        let other = try server.session()
        defer { other.stop() }
        other.send("SET deadlock_timeout = '60s'; BEGIN; UPDATE conflicts.counters SET n = n + 10 WHERE name = 'b'; SELECT 'holding b';\n")
        try await other.waitForOutput(containing: "holding b", within: 10)
        async let written = writer.write(request: "r1") { db in
            try db.execute("UPDATE counters SET n = n + 1 WHERE name = 'a'", [])
            try db.execute("UPDATE counters SET n = n + 1 WHERE name = 'b'", [])
            return .string("both")
        }
        let watcher = try server.session()
        defer { watcher.stop() }
        try await server.waitForLockWaiters(1, where: "locktype = 'transactionid'", on: watcher)
        // The other session now wants a, which the writer holds while it waits for b.
        other.send("UPDATE conflicts.counters SET n = n + 10 WHERE name = 'a'; COMMIT; SELECT 'committed';\n")
        try await other.waitForOutput(containing: "committed", within: 30)
        #expect(try await written == .string("both"))
        watcher.send("SELECT 'counters ' || string_agg(name || '=' || n, ',' ORDER BY name) FROM conflicts.counters;\n")
        try await watcher.waitForOutput(containing: "counters a=11,b=11", within: 10)
    }
}

@Suite("PostgreSQL: a write longer than the operation timeout",
       .enabled(if: TestPostgres.available, "skipped: no PostgreSQL server installed (the test bootstrap installs it)"))
struct PostgresSlowWriteTests {
    @Test("a write whose statements each answer in time but together outlast the timeout is answered -32007 naming the timeout's key and rolled back: nothing of it is kept, and the same request sent again is made once")
    func rolledBackPastTheTimeout() async throws {
        // One connection: what reads after the write waits until the write's session is over.
        try await withPostgresWriter(schema: "slow", migration: "CREATE TABLE counters (name TEXT PRIMARY KEY, n BIGINT NOT NULL);", timeout: .seconds(2)) { writer, _ in
            do {
                _ = try await writer.write(request: "r1") { db in
                    for _ in 0..<3 { try db.execute("SELECT pg_sleep(0.8)", []) }
                    try db.execute("INSERT INTO counters VALUES ('late', 1)", [])
                    return .string("written")
                }
                Issue.record("a write of 2.4 s answered within a timeout of 2 s")
            } catch let error as JSONRPCError {
                #expect(error.code == JSONRPCError.storageFailedCode && error.message.contains("did not answer within 2 s (store.timeout_ms)"), "\(error)")
            }
            #expect(try await writer.read { db in try db.int("SELECT COUNT(*) FROM counters", []) } == 0)
            #expect(try await writer.write(request: "r1") { db in
                try db.execute("INSERT INTO counters VALUES ('late', 1)", [])
                return .string("written again")
            } == .string("written again"))
            #expect(try await writer.read { db in try db.int("SELECT COUNT(*) FROM counters", []) } == 1)
        }
    }
    @Test("a statement given up on at the timeout does not run on in the server holding its locks: the server ends it after the same time")
    func givenUpStatementEnds() async throws {
        try await withPostgresWriter(schema: "given_up", migration: "CREATE TABLE counters (name TEXT PRIMARY KEY, n BIGINT NOT NULL); INSERT INTO counters VALUES ('a', 0);",
                                     timeout: .seconds(1)) { writer, server in
            await #expect(throws: JSONRPCError.self) {
                try await writer.write(request: nil) { db in
                    try db.execute("UPDATE counters SET n = n + 1 WHERE name = 'a'", [])
                    try db.execute("SELECT pg_sleep(60)", [])
                    return .null
                }
            }
            // The row the abandoned transaction locked is free well before its sleep would end,
            // and what it did was rolled back.
            let other = try server.session()
            defer { other.stop() }
            other.send("UPDATE given_up.counters SET n = n + 10 WHERE name = 'a'; SELECT 'counter ' || n FROM given_up.counters;\n")
            try await other.waitForOutput(containing: "counter 10", within: 20)
        }
    }
}

@Suite("PostgreSQL: the connection a request waits for, ended",
       .enabled(if: TestPostgres.available, "skipped: no PostgreSQL server installed (the test bootstrap installs it)"))
struct PostgresEndedConnectionTests {
    @Test("a request waiting for the connection a write past its timeout closes is answered on a new one, not handed the closed one nor left waiting")
    func waiterAnsweredAfterGivenUp() async throws {
        // One connection: the second write waits for the first's, which the first closes at
        // its deadline. It waits from when the first's last statement started, so a new
        // connection has half the timeout to be made. Whether the pool has seen the close
        // when the lease ends is a race: a few rounds.
        try await withPostgresWriter(schema: "after_given_up", migration: "CREATE TABLE counters (name TEXT PRIMARY KEY, n BIGINT NOT NULL);",
                                     timeout: .seconds(2)) { writer, _ in
            for round in 1...3 {
                let (lastStatement, started) = AsyncStream.makeStream(of: Void.self)
                async let givenUp = #expect(throws: JSONRPCError.self) {
                    try await writer.write(request: nil) { db in
                        try db.execute("SELECT pg_sleep(1)", [])
                        started.yield()
                        try db.execute("SELECT pg_sleep(10)", [])
                        return .null
                    }
                }
                for await _ in lastStatement { break }
                let waited = try await writer.write(request: "waited \(round)") { db in
                    try db.execute("INSERT INTO counters VALUES (?, 1)", ["waited \(round)"])
                    return .string("written")
                }
                #expect(waited == .string("written"))
                _ = await givenUp
            }
        }
    }

    @Test("a request waiting for the connection the server ends (its backend terminated) is answered on a new one, not left waiting")
    func waiterAnsweredAfterServerEnded() async throws {
        try await withPostgresWriter(schema: "ended", migration: "CREATE TABLE counters (name TEXT PRIMARY KEY, n BIGINT NOT NULL);",
                                     timeout: .seconds(5)) { writer, server in
            let admin = try server.session()
            defer { admin.stop() }
            // Whether the pool sees the close before the lease ends is a race: a few rounds.
            for round in 1...5 {
                let (asleep, started) = AsyncStream.makeStream(of: Void.self)
                async let ended = #expect(throws: JSONRPCError.self) {
                    try await writer.write(request: nil) { db in
                        started.yield()
                        try db.execute("SELECT pg_sleep(30)", [])
                        return .null
                    }
                }
                for await _ in asleep { break }
                async let waited = writer.write(request: "waited \(round)") { db in
                    try db.execute("INSERT INTO counters VALUES (?, 1)", ["waited \(round)"])
                    return .string("written")
                }
                // The sleep is ended once the server runs it (it shows in pg_stat_activity then;
                // a transaction sees that view as it first read it, unless told to read it again).
                admin.send("""
                    DO $$ BEGIN FOR i IN 1..2000 LOOP
                      EXIT WHEN EXISTS (SELECT 1 FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)' AND state = 'active');
                      PERFORM pg_sleep(0.01); PERFORM pg_stat_clear_snapshot(); END LOOP; END $$;
                    SELECT 'round \(round) ended ' || COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
                      WHERE query = 'SELECT pg_sleep(30)' AND state = 'active';\n
                    """)
                try await admin.waitForOutput(containing: "round \(round) ended 1", within: 30)
                #expect(try await waited == .string("written"))
                _ = await ended
            }
        }
    }
}

/// Runs `body` with a writer of one connection on a PostgreSQL server started for it, its
/// tables made by `migration` in `schema`; the connections run as a process's group runs
/// them, and everything is stopped however `body` ends.
private func withPostgresWriter(schema: String, migration: String, timeout: Duration,
                                _ body: (PostgresWriter, TestPostgres) async throws -> Void) async throws {
    let server = try await TestPostgres.start()
    defer { server.stop() }
    let writer = try PostgresWriter(settings: PostgresSettings(url: server.url(), poolSize: 1, tls: .disable, operationTimeout: timeout,
                                                                            operationTimeoutKey: "store.timeout_ms"), schema: schema,
                                    migrations: [migration + PostgresWriter.repliesTable], lockKey: 1, replyWindow: .seconds(600), logger: Logger(label: "test"))
    let connections = Task { try await writer.connections.run() }
    try await stopping(connections, with: { connections in
        connections.cancel()
        _ = await connections.result
    }) { _ in
        await writer.waitUntilReady()
        try await body(writer, server)
    }
}
