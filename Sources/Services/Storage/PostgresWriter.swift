import BusKit
package import BusProtocol
import Foundation
package import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import ServiceLifecycle
import Synchronization
import ZeroMQ

/// A durable service's PostgreSQL database, written by code it shares with its SQLite file
/// (``SQLSession``): what several service processes, on several machines, share.
///
/// Each write is one transaction, answered once committed (durable); its result is kept in
/// `replies` in the same transaction, so a request sent again, to this process or another,
/// is written once and answered with that result (``RepliesCheckedByWrites``). The code of a
/// write is synchronous, as SQLite's is: it runs on a thread of its own
/// (``PostgresConnections``), one per connection, waiting for each statement's answer.
/// Writes that change the same rows wait for each other by the locks their code takes
/// (``SQLSession/lockingRead(of:)``); the others run side by side.
///
/// The schema (`migrations`, in the PostgreSQL schema `schema`, so several services can share
/// one database) is put in place before the first write, and again after a failure.
package actor PostgresWriter {
    package let settings: PostgresSettings
    /// The PostgreSQL schema its tables are in (nil: the connection's default).
    private let schema: String?
    private let migrations: [String]
    private let lockKey: Int64
    private let logger: Logger
    /// The connections and the threads writes run on: a part of the service's process, run
    /// before its work and stopped after it.
    package nonisolated let connections: PostgresConnections
    private var migrated = false
    /// When remembered results older than the reply window are deleted.
    private var pruning: ReplyPruning
    /// Why the database cannot be reached, as one connection made alone last found it: the
    /// pool only ever times out, whatever stops it (the server down, a password changed, a
    /// certificate refused). Said in the log when it changes, and added to the errors
    /// callers get while it is fresh.
    private var unreachable: (problem: String, seen: ContinuousClock.Instant)?
    /// When a look last found the database answering a connection made alone after an
    /// operation ran past the timeout: the database is up, and slow or busy (its locks, its
    /// load), or the timeout is short for the work. Added to the timeouts callers get while
    /// fresh, as what the look found away is; the latest look's finding replaces the other.
    private var answeredAlone: ContinuousClock.Instant?
    /// When the log last said so (at most once a minute while it goes on).
    private var slowSaid: ContinuousClock.Instant?
    /// A timeout failed an operation since the last look began.
    private var timedOutSinceLook = false
    /// A look is under way; something failed since it started (it may have connected to a
    /// database on its way down, and found nothing).
    private var looking = false, failedWhileLooking = false

    /// `migrations` must create a `replies (request TEXT PRIMARY KEY, result TEXT, written_at
    /// DOUBLE PRECISION)` table (``repliesTable``); `lockKey` is the advisory lock migrating takes.
    package init(settings: PostgresSettings, schema: String?, migrations: [String], lockKey: Int64, replyWindow: Duration, logger: Logger) throws(StorageFailure) {
        (self.settings, self.schema, self.migrations, self.lockKey, self.logger) = (settings, schema, migrations, lockKey, logger)
        pruning = ReplyPruning(window: replyWindow)
        connections = PostgresConnections(client: try settings.makeClient(logger: logger, searchPath: schema), threads: max(1, settings.poolSize))
    }

    /// The table of remembered results, for a service's first migration.
    package static let repliesTable = """
        CREATE TABLE replies (request TEXT PRIMARY KEY, result TEXT NOT NULL, written_at DOUBLE PRECISION NOT NULL);
        CREATE INDEX replies_by_time ON replies(written_at);
        """

    /// Waits until the database answers and its schema is in place, trying again with back-off
    /// (0.1 s doubling to 5 s), saying why (the URL without its password) the first time and
    /// every minute after, however many wait (the host to register, the service's work).
    package func waitUntilReady() async {
        await connections.started()
        var delay = Duration.milliseconds(100)
        while !Task.isCancelled {
            do {
                try await migrate()
                if !readySaid {
                    readySaid = true
                    logger.info("database ready", metadata: ["url": "\(settings.redactedURL)"])
                }
                return
            } catch {
                if LogCadence.dueAgain(&awaySaid) {
                    // A timeout says nothing of why: one connection made alone does.
                    let problem = error is PostgresTimedOut ? await settings.connectionProblem(logger: logger) ?? settings.failure(error).detail
                        : settings.failure(error).detail
                    logger.error("cannot reach the database; trying again", metadata: ["url": "\(settings.redactedURL)", "problem": "\(problem)"])
                }
                try? await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(5))
            }
        }
    }

    /// When ``waitUntilReady()`` last said the database cannot be reached, and whether it
    /// said it is ready.
    private var awaySaid: ContinuousClock.Instant?, readySaid = false

    private func migrate() async throws {
        guard !migrated else { return }
        let connections = connections, schema = schema, migrations = migrations, lockKey = lockKey, logger = logger, timeout = settings.operationTimeout
        // Every start but an upgrade's finds the schema up to date: looked at as an operation
        // is, so a database away is said as soon.
        let current = try await settings.bounded {
            try await connections.withConnection(leasedWithin: timeout) { connection in try await PostgresSchema.version(connection, logger: logger) }
        }
        if current < migrations.count {
            // An upgrade's migration may count or rewrite large tables, and another process
            // may be making it: it has ``migrationLimit``, not an operation's timeout, which
            // would fail it at every start for good.
            let limit = Self.migrationLimit, url = settings.redactedURL
            let tooLong = { @Sendable in StorageFailure(reason: "busy", detail: "migrating the schema to version \(migrations.count) did not end within \(limit.formatted)", path: url) }
            try await withDeadline(limit, expired: tooLong) {
                try await connections.withConnection(leasedWithin: timeout) { connection in
                    try await PostgresSchema.migrate(connection, schema: schema, migrations: migrations, lockKey: lockKey, statementTimeout: limit, logger: logger)
                }
            }
        }
        migrated = true
    }

    /// How long migrating the schema at an upgrade may take.
    static let migrationLimit = Duration.seconds(600)

    /// Keeps each result as its request's, in the transaction of the requests' effects: a
    /// second copy of a request fails on the table's key.
    package static func remember(_ db: any SQLSession, _ results: [(request: String, result: JSONValue)]) throws {
        guard !results.isEmpty else { return }
        let now = Date().timeIntervalSince1970
        try db.execute("INSERT INTO replies (request, result, written_at) VALUES " + SQLRows.placeholders(rows: results.count, columns: 3),
                       results.flatMap { request, result -> [any SQLArgument] in [request, String(decoding: result.jsonBytes, as: UTF8.self), now] })
    }

    // MARK: Writes and reads

    /// Runs `apply` in a transaction and answers its result once committed; for a `request`
    /// already written, the result it had (what `apply` did again is rolled back).
    package func write(request: String?, _ apply: @escaping @Sendable (any SQLSession) throws -> JSONValue) async throws -> JSONValue {
        let forgetBefore = pruning.forgetBefore()
        do {
            try await migrate()
            let transaction = { @Sendable (session: any SQLSession) throws -> JSONValue in
                if let forgetBefore { try session.execute("DELETE FROM replies WHERE written_at < ?", [forgetBefore]) }
                // A request already written is not looked up first: its second effect makes this
                // insert fail on its key (waiting, if it is being written, for that to commit),
                // and the whole transaction with it; or the effect is refused (what it deletes
                // is gone). Either way the result written first is answered, below.
                let result = try apply(session)
                if let request { try Self.remember(session, [(request, result)]) }
                return result
            }
            let result = try await runAgainOnConflict { try await connections.session(settings, logger: logger, transaction: true, transaction) }
            reachedAgain()
            return result
        } catch let refusal as JSONRPCError {
            // Refused by the write itself: rolled back, not a storage failure. The same
            // request written first, by another process, may be what refused it (a stream it
            // deleted): then it is answered with that one's result.
            if let request, refusal.code != JSONRPCError.storageFailedCode, let remembered = try? await remembered(request) {
                return try JSONValue(parsing: remembered)
            }
            throw refusal
        } catch let duplicate as PSQLError where duplicate.isUniqueViolation && request != nil {
            if let request, let remembered = try await remembered(request) { return try JSONValue(parsing: remembered) }
            throw settings.failure(duplicate).rpcError
        } catch {
            migrated = false
            throw failed(error)
        }
    }

    /// Runs `body` (a transaction) again when the database ended it for another's sake (a
    /// deadlock, which locks taken in another order make; two attempts more at most).
    private func runAgainOnConflict<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        var attempts = 1
        while true {
            do {
                return try await body()
            } catch let conflict as PSQLError where conflict.isConflictWithAnother && attempts < 3 {
                attempts += 1
                logger.notice("a transaction ended for another's sake is run again", metadata: ["problem": "\(settings.failure(conflict).detail)"])
            }
        }
    }

    /// Runs `body` on a connection of its own, outside a write: each statement alone (read
    /// committed, as in a transaction, without the round trips that begin and end one).
    package func read<T: Sendable>(_ body: @escaping @Sendable (any SQLSession) throws -> T) async throws -> T {
        do {
            try await migrate()
            let result = try await connections.session(settings, logger: logger, transaction: false, body)
            reachedAgain()
            return result
        } catch let error as JSONRPCError {
            throw error
        } catch {
            migrated = false
            throw failed(error)
        }
    }

    /// `error` as callers get it. A database that could not be reached names what the last
    /// connection made alone found, and asks for another such look (one at a time, paced by
    /// ``PostgresConnections/lookAtWhy(_:)``).
    private func failed(_ error: any Error) -> JSONRPCError {
        let failure = settings.failure(error)
        guard failure.reason == "unreachable" else { return failure.rpcError }
        let timedOut = error is PostgresTimedOut || error is PostgresCommitUnanswered
        if timedOut { timedOutSinceLook = true }
        if looking { failedWhileLooking = true } else { lookAtWhy() }
        if timedOut, let answeredAlone, ContinuousClock.now - answeredAlone < Self.findingSaid {
            return StorageFailure(reason: failure.reason, detail: "\(failure.detail); a connection made alone was answered: the database is up, slow or busy",
                                  path: failure.path).rpcError
        }
        guard let unreachable, ContinuousClock.now - unreachable.seen < Self.findingSaid else { return failure.rpcError }
        return StorageFailure(reason: failure.reason, detail: "\(failure.detail); a connection made alone: \(unreachable.problem)", path: failure.path).rpcError
    }

    /// How long what a look found is added to the errors callers get.
    private static let findingSaid = Duration.seconds(30)

    /// `found`: why a connection made alone could not be made; nil when it could (the
    /// database is slow or busy, not away).
    private func lookedAtWhy(found problem: String?, afterTimeouts timedOut: Bool) {
        looking = false
        guard let problem else {
            if timedOut { answeredAfterTimeouts() }
            if failedWhileLooking { return lookAtWhy() }
            return reachedAgain()
        }
        if unreachable?.problem != problem {
            logger.error("cannot reach the database", metadata: ["url": "\(settings.redactedURL)", "problem": "\(problem)"])
        }
        unreachable = (problem, .now)
        answeredAlone = nil
    }

    /// A look answered after operations ran past the timeout: said in the log at most once a
    /// minute, naming the timeout's key, as it is what to raise for a database that is busy
    /// by design.
    private func answeredAfterTimeouts() {
        answeredAlone = .now
        guard LogCadence.dueAgain(&slowSaid) else { return }
        logger.warning("the database answers, but operations ran past their timeout: it is slow or busy",
                       metadata: ["url": "\(settings.redactedURL)",
                                  "timeout": "\(settings.operationTimeout.formatted)\(settings.operationTimeoutKey.map { " (\($0))" } ?? "")"])
    }

    private func lookAtWhy() {
        let timedOut = timedOutSinceLook
        (looking, failedWhileLooking, timedOutSinceLook) = (true, false, false)
        let settings = settings, logger = logger
        connections.lookAtWhy {
            let found = await settings.connectionProblem(logger: logger)
            // Cut short as the connections stop: what it found is the stopping, not the database.
            guard !Task.isCancelled else { return }
            await self.lookedAtWhy(found: found, afterTimeouts: timedOut)
        }
    }

    /// Said once when an operation succeeds after the database was found away; nothing otherwise.
    private func reachedAgain() {
        guard unreachable != nil else { return }
        logger.notice("the database can be reached again", metadata: ["url": "\(settings.redactedURL)"])
        unreachable = nil
    }

    /// The result kept for `request`, if any.
    package func remembered(_ request: String) async throws -> [UInt8]? {
        try await read { session in try session.row("SELECT result FROM replies WHERE request = ?", [request]).map { try $0.blob("result") } }
    }

    /// Runs `body` holding the session advisory lock `key` on a connection of its own, so the
    /// processes sharing the database run such bodies one at a time. The connection is leased
    /// and the lock tried every 2 ms, each within the operation timeout, for `limit` at most,
    /// as the SQLite file's lock is (``ServiceDatabase/alone(_:waitingAtMost:_:)``); `body`
    /// bounds its own work.
    package nonisolated func alone<T: Sendable>(_ key: Int64, waitingAtMost limit: Duration, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let settings = settings, logger = logger, closing = connections.closing
        // What the database answers is a storage failure; what `body` throws is its own, and
        // comes back as its outcome.
        let outcome: Result<T, any Error>
        do {
            outcome = try await connections.withConnection(leasedWithin: settings.operationTimeout) { connection in
                let deadline = ContinuousClock.now + limit
                while try await !Self.tryLock(key, on: connection, settings: settings, closing: closing, logger: logger) {
                    guard ContinuousClock.now < deadline else {
                        throw ServiceDatabase.heldTooLong("the advisory lock \(key)", limit, path: settings.redactedURL)
                    }
                    try await Task.sleep(for: .milliseconds(2))
                }
                let outcome: Result<T, any Error>
                do { outcome = .success(try await body()) } catch { outcome = .failure(error) }
                // Let go on the way out, whatever `body` did: a lock left on a pooled connection
                // would hold every other process back. A connection that broke lets it go
                // itself; one whose unlock goes unanswered (bounded: such a query was seen never
                // to return) is closed, which lets it go too.
                do {
                    _ = try await settings.bounded { try await connection.query("SELECT pg_advisory_unlock(\(key))", logger: logger) }
                } catch {
                    closing.close(connection)
                }
                return outcome
            }
        } catch where error is JSONRPCError || error is CancellationError {
            throw error
        } catch {
            throw settings.failure(error).rpcError
        }
        return try outcome.get()
    }

    /// Whether the session advisory lock `key` was taken, asked within the operation timeout.
    /// Unanswered in time, it may be taken all the same, later, on a connection that would then
    /// hold it with no one to let it go: that connection is closed, which lets go of it.
    private static func tryLock(_ key: Int64, on connection: PostgresConnection, settings: PostgresSettings, closing: PostgresConnections.Closing,
                                logger: Logger) async throws -> Bool {
        do {
            return try await settings.bounded {
                for try await (taken) in try await connection.query("SELECT pg_try_advisory_lock(\(key))", logger: logger).decode(Bool.self) { return taken }
                return false
            }
        } catch {
            closing.close(connection)
            throw error
        }
    }
}

/// A PostgreSQL service's connections, and a thread for each to run a transaction's
/// synchronous code on: a part of the service's process (its `ServiceGroup`, or a test's).
package struct PostgresConnections: Service {
    private let client: PostgresClient
    let threads: NIOThreadPool
    let closing = Closing()
    /// Opened once ``run()`` has started the threads (and is starting the connections).
    private let running = Latch()
    /// Looks at why the database cannot be reached (``PostgresWriter``), run one at a time
    /// by ``run()``: apart from the request that found it away, within the process's life.
    /// Each starts at least ``lookInterval`` after the one before, however many requests
    /// fail: each is a new connection, to a database that may be away or only overloaded.
    private let looks: AsyncStream<@Sendable () async -> Void>
    private let lookAsked: AsyncStream<@Sendable () async -> Void>.Continuation

    init(client: PostgresClient, threads: Int) {
        self.client = client
        self.threads = NIOThreadPool(numberOfThreads: threads)
        (looks, lookAsked) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// Keeps the connections and threads until graceful shutdown (or cancellation).
    package func run() async throws {
        threads.start()
        running.open()
        let looks = looks
        await withDiscardingTaskGroup { group in
            group.addTask {
                var last: ContinuousClock.Instant?
                for await look in looks {
                    if let last { try? await Task.sleep(until: last + Self.lookInterval) }
                    guard !Task.isCancelled else { return }
                    last = .now
                    await look()
                }
            }
            await client.run()
            lookAsked.finish()
            group.cancelAll()
        }
        try await threads.shutdownGracefully()
    }

    /// Runs `look` after those asked for before it (dropped once the connections stopped).
    func lookAtWhy(_ look: @escaping @Sendable () async -> Void) {
        lookAsked.yield(look)
    }

    package static let lookInterval = Duration.seconds(5)

    /// Returns once ``run()`` has started: the process's group starts its parts together, and
    /// a connection asked for before is refused.
    func started() async {
        await running.wait()
    }

    /// Runs `body` on a connection of the pool, or fails with ``PostgresTimedOut`` when none
    /// is leased within `timeout` (the pool waits for a database that is away for as long as
    /// it tries to reach it). `body` itself is not bounded here: it bounds its own work.
    func withConnection<T: Sendable>(leasedWithin timeout: Duration,
                                     _ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        let client = client, closing = closing, leased = LeaseTaken()
        return try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask {
                // A closed connection, or one this process is closing, is given back once its
                // close is complete (``Closing``), and another asked for.
                while true {
                    let outcome: T? = try await client.withConnection { connection in
                        guard await !closing.waitedForClose(of: connection) else { return nil }
                        leased.taken.store(true, ordering: .relaxed)
                        return try await body(connection)
                    }
                    if let outcome { return outcome }
                    try Task.checkCancellation()
                }
            }
            group.addTask {
                try await Task.sleep(for: timeout)
                guard leased.taken.load(ordering: .relaxed) else { throw PostgresTimedOut(after: timeout) }
                return nil
            }
            // The first to end: the body's outcome, the timeout, or the lease taken in time
            // (then the body's outcome is next). The waiter left is cancelled: a lease asked
            // for is given up, a timer stops.
            defer { group.cancelAll() }
            while let ended = try await group.next() {
                if let outcome = ended { return outcome }
            }
            throw CancellationError()
        }
    }

    private final class LeaseTaken: Sendable {
        let taken = Atomic(false)
    }

    /// Runs `body` on a connection of the pool, on a thread of its own, within the settings'
    /// operation timeout; as one `transaction` (committed when it returns, rolled back when it
    /// throws), or each statement alone.
    ///
    /// The session bounds itself (``PostgresSession``), not a deadline around it: one abandoned
    /// by its caller would go on, and commit a write its caller was told had failed. Past the
    /// timeout its statement is given up and its connection closed, which rolls it back; only
    /// a commit sent in time is waited for longer, as its answer says whether the write was made.
    func session<T: Sendable>(_ settings: PostgresSettings, logger: Logger, transaction: Bool,
                              _ body: @escaping @Sendable (any SQLSession) throws -> T) async throws -> T {
        let threads = threads, closing = closing, timeout = settings.operationTimeout
        let deadline = ContinuousClock.now + timeout
        return try await withConnection(leasedWithin: timeout) { connection in
            try await threads.runIfActive {
                let session = PostgresSession(connection: connection, timeout: timeout, deadline: deadline, closing: closing, logger: logger)
                do {
                    guard transaction else { return try body(session) }
                    try session.execute("BEGIN", [])
                    let result = try body(session)
                    try session.commit()
                    return result
                } catch {
                    if transaction { session.rollBack() } else { session.closeIfBroken() }
                    throw error
                }
            }
        }
    }

    /// Waiters let go once it opens (or once they are cancelled); open for good after.
    fileprivate final class Latch: Sendable {
        private struct State {
            var open = false
            var next = 0
            var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
        }
        private let state = Mutex(State())

        func open() {
            let waiters = state.withLock { state in
                state.open = true
                defer { state.waiters = [:] }
                return state.waiters.values
            }
            for waiter in waiters { waiter.resume() }
        }

        func wait() async {
            let id = state.withLock { state in
                defer { state.next += 1 }
                return state.next
            }
            await withTaskCancellationHandler {
                await withCheckedContinuation { waiter in
                    let letGo = state.withLock { state in
                        if !state.open && !Task.isCancelled { state.waiters[id] = waiter }
                        return state.open || Task.isCancelled
                    }
                    if letGo { waiter.resume() }
                }
            } onCancel: {
                state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
            }
        }
    }

    /// The connections this process closed whose close the pool has not seen yet. The pool
    /// learns of a close once it is complete (over TLS, once the server answered it or NIOSSL's
    /// shutdown timeout passed), and until then hands the connection out again as open: a
    /// lease of one, or of one closed by the server, waits for its close and asks again
    /// (``withConnection(leasedWithin:_:)``); a query sent on it would never be answered.
    /// The caller that gave up on the connection does not wait: its answer is due at its deadline.
    final class Closing: Sendable {
        private let closing = Mutex<[PostgresConnection.ID: Latch]>([:])

        /// Closes `connection`; returns at once.
        func close(_ connection: PostgresConnection) {
            let closed = Latch()
            closing.withLock { $0[connection.id] = closed }
            // The pool's own callback on this future was added when it made the connection, and
            // runs first: waiters let go here find it has seen the close.
            connection.closeFuture.whenComplete { _ in
                self.closing.withLock { $0[connection.id] = nil }
                closed.open()
            }
            connection.close().whenComplete { _ in }
        }

        /// False for an open connection that is not being closed; otherwise true, once its
        /// close is complete (or the task is cancelled).
        func waitedForClose(of connection: PostgresConnection) async -> Bool {
            if let closed = closing.withLock({ $0[connection.id] }) {
                await closed.wait()
                return true
            }
            guard connection.isClosed else { return false }
            // Closed already (by the server, or by this process just before): its close
            // completes at once, the pool told first.
            await withCheckedContinuation { closed in connection.closeFuture.whenComplete { _ in closed.resume() } }
            return true
        }
    }
}

/// A transaction on one PostgreSQL connection, for code written against ``SQLSession``: each
/// statement waits, on the calling thread (never one of Swift's concurrency pool), for its
/// answer until `deadline` (the operation `timeout` after the session was asked for), then
/// gives up and closes the connection, which rolls back what the transaction did. A COMMIT
/// sent before the deadline is waited for a `timeout` past it.
final class PostgresSession: SQLSession {
    let connection: PostgresConnection
    let timeout: Duration
    let deadline: ContinuousClock.Instant
    let closing: PostgresConnections.Closing
    let logger: Logger
    /// Set once a statement timed out or the connection failed: nothing more is sent on it.
    private var broken = false

    init(connection: PostgresConnection, timeout: Duration, deadline: ContinuousClock.Instant, closing: PostgresConnections.Closing, logger: Logger) {
        (self.connection, self.timeout, self.deadline, self.closing, self.logger) = (connection, timeout, deadline, closing, logger)
    }

    /// Commits the transaction; past the wait for its answer, whether it was made is unknown
    /// (``PostgresCommitUnanswered``).
    func commit() throws {
        _ = try run("COMMIT", [], answeredBy: deadline + timeout)
    }

    func lockingRead(of table: String) -> String { " FOR UPDATE OF \(table)" }

    func lockAll(_ key: Int64) throws {
        try execute("SELECT pg_advisory_xact_lock(?)", [Int(key)])
    }

    func shareLock(_ key: Int64) throws {
        try execute("SELECT pg_advisory_xact_lock_shared(?)", [Int(key)])
    }

    @discardableResult
    func execute(_ sql: String, _ arguments: [any SQLArgument]) throws -> Int {
        Int(try run(sql, arguments).metadata.rows ?? 0)
    }

    func rows(_ sql: String, _ arguments: [any SQLArgument]) throws -> [SQLRow] {
        try run(sql, arguments).rows.map { row in
            var columns: [String] = [], values: [SQLValue] = []
            for cell in row {
                columns.append(cell.columnName)
                values.append(try Self.value(cell))
            }
            return SQLRow(columns: columns, values: values)
        }
    }

    /// Ends a failed transaction (a connection that broke, or whose deadline passed, is closed
    /// instead: the server rolls back what it had).
    func rollBack() {
        if !broken { _ = try? execute("ROLLBACK", []) }
        closeIfBroken()
    }

    /// Closes a connection that broke: a statement given up on may still be answered on it.
    /// It goes back to the pool for no one else (``PostgresConnections/Closing``).
    func closeIfBroken() {
        if broken { closing.close(connection) }
    }

    /// `answeredBy`: how long the answer is waited for, the deadline unless given.
    private func run(_ sql: String, _ arguments: [any SQLArgument], answeredBy: ContinuousClock.Instant? = nil) throws -> PostgresQueryResult {
        guard !broken else { throw ConnectionLost() }
        guard ContinuousClock.now < deadline else {
            broken = true
            throw PostgresTimedOut(after: timeout)
        }
        var bindings = PostgresBindings(capacity: arguments.count)
        for argument in arguments {
            switch argument.sqlValue {
            case .null: bindings.appendNull()
            case .integer(let value): bindings.append(value)
            case .real(let value): bindings.append(value)
            case .text(let value): bindings.append(value)
            case .blob(let value): bindings.append(ByteBuffer(bytes: value))
            }
        }
        let query = PostgresQuery(unsafeSQL: Self.numbered(sql), binds: bindings)
        let answered = DispatchSemaphore(value: 0)
        let outcome = Mutex<Result<PostgresQueryResult, any Error>?>(nil)
        connection.query(query, logger: logger).whenComplete { result in
            outcome.withLock { $0 = result }
            answered.signal()
        }
        let waited = (answeredBy ?? deadline) - .now
        guard answered.wait(timeout: .now() + .nanoseconds(Int(waited.nanoseconds))) == .success else {
            broken = true
            if answeredBy != nil { throw PostgresCommitUnanswered(after: timeout + timeout) }
            throw PostgresTimedOut(after: timeout)
        }
        let result = outcome.withLock { $0 }!
        // The connection is gone when it failed, or when the server ended it with its error
        // (FATAL: an administrator's command, the server shutting down): a ROLLBACK sent on
        // it would not be answered.
        if case .failure(let error as PSQLError) = result, error.code != .server || ["FATAL", "PANIC"].contains(error.serverInfo?[.severity]) {
            broken = true
        }
        return try result.get()
    }

    private struct ConnectionLost: Error, CustomStringConvertible {
        var description: String { "the connection to the database was lost" }
    }

    /// `?` placeholders as PostgreSQL numbers them (`$1`, `$2`, ...), outside quoted text.
    static func numbered(_ sql: String) -> String {
        var out = "", number = 0, quoted = false
        out.reserveCapacity(sql.utf8.count + 16)
        for character in sql {
            if character == "'" { quoted.toggle() }
            if character == "?", !quoted {
                number += 1
                out += "$\(number)"
            } else {
                out.append(character)
            }
        }
        return out
    }

    private static func value(_ cell: PostgresCell) throws -> SQLValue {
        guard cell.bytes != nil else { return .null }
        switch cell.dataType {
        case .int2, .int4, .int8: return .integer(try cell.decode(Int64.self))
        case .float4, .float8: return .real(try cell.decode(Double.self))
        case .bool: return .integer(try cell.decode(Bool.self) ? 1 : 0)
        case .bytea: return .blob(Array(buffer: try cell.decode(ByteBuffer.self)))
        default: return .text(try cell.decode(String.self))
        }
    }
}
