package import BusProtocol
import Foundation
package import GRDB
package import Logging
package import ServiceLifecycle
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A durable service's schema, as each engine takes it: SQLite's migrator, and PostgreSQL's
/// migrations, in the PostgreSQL schema `postgresSchema` (nil: the connection's default),
/// applied under the advisory lock `postgresLock`. Both must hold the `replies` table
/// (``SQLiteWriter/createRepliesTable(_:)``, ``PostgresWriter/repliesTable``).
package struct DatabaseSchema: Sendable {
    package var sqlite: DatabaseMigrator
    package var postgres: [String]
    package var postgresSchema: String?
    package var postgresLock: Int64

    package init(sqlite: DatabaseMigrator, postgres: [String], postgresSchema: String?, postgresLock: Int64) {
        (self.sqlite, self.postgres, self.postgresSchema, self.postgresLock) = (sqlite, postgres, postgresSchema, postgresLock)
    }
}

/// Where a durable service keeps its data: a SQLite file (one process writes it at a time,
/// with group commit) or a PostgreSQL database several processes share. The service's
/// database code, written once on ``SQLSession``, runs unchanged in either's transactions.
package enum ServiceDatabase: Sendable {
    case sqlite(SQLiteWriter)
    case postgres(PostgresWriter)
    /// A database the configuration cannot name (its URL is not one): every call says why.
    case unusable(StorageFailure)

    /// The SQLite file at `path` (`label` names its writer's queue), unless `postgres` names a
    /// database. A SQLite file that cannot be opened, or a PostgreSQL database that does not
    /// answer, is tried again later; every call meanwhile answers why.
    package init(path: String, label: String, maxSizeBytes: Int?, postgres: PostgresSettings?, schema: DatabaseSchema, replyWindow: Duration,
                 logger: Logger) {
        guard let postgres else {
            self = .sqlite(SQLiteWriter(path: path, label: label, maxSizeBytes: maxSizeBytes, migrator: schema.sqlite, replyWindow: replyWindow,
                                        logger: logger))
            return
        }
        do {
            self = .postgres(try PostgresWriter(settings: postgres, schema: schema.postgresSchema, migrations: schema.postgres,
                                                lockKey: schema.postgresLock, replyWindow: replyWindow, logger: logger))
        } catch {
            logger.error("cannot use the database", metadata: ["url": "\(postgres.redactedURL)", "problem": "\(error.detail)"])
            self = .unusable(error)
        }
    }

    /// Runs `apply` in a transaction, answered once durable; for a `request` written before,
    /// the result it had.
    package func write(request: String?, _ apply: @escaping @Sendable (any SQLSession) throws -> JSONValue) async throws -> JSONValue {
        switch self {
        case .sqlite(let writer): try await writer.write(request: request) { db in try apply(db) }
        case .postgres(let writer): try await writer.write(request: request, apply)
        case .unusable(let failure): throw failure.rpcError
        }
    }

    /// Whether writes that come together share a transaction already (SQLite's writer gathers
    /// them, each in a savepoint of its own); PostgreSQL's run each in its own.
    package var gathersWrites: Bool {
        if case .sqlite = self { true } else { false }
    }

    /// Writes for several requests in one transaction, answered once durable: `apply` is
    /// handed the indexes of those to do and answers an outcome for each, in that order (a
    /// refusal must leave nothing written for its request; it is not remembered). A request
    /// written before gets the result it had, and one named twice is done once.
    ///
    /// Throws when the batch fails as a whole (a request written meanwhile by another process,
    /// a lock another transaction took first, the database), and nothing of it is written:
    /// one transaction is what makes a batch cheaper, never what makes it right, so the caller
    /// then writes each request alone (``write(request:_:)``).
    package func write(requests: [String?], _ apply: @escaping @Sendable (any SQLSession, [Int]) throws -> [Result<JSONValue, JSONRPCError>]) async throws
        -> [Result<JSONValue, JSONRPCError>] {
        let answered = Mutex<[Result<JSONValue, JSONRPCError>]>([])
        _ = try await write(request: nil) { db in
            let remembered = try Self.remembered(db, requests.compactMap { $0 })
            var answers: [Int: Result<JSONValue, JSONRPCError>] = [:], todo: [Int] = []
            var first: [String: Int] = [:], repeats: [(index: Int, of: Int)] = []
            for (index, request) in requests.enumerated() {
                if let request {
                    if let result = remembered[request] {
                        answers[index] = .success(try JSONValue(parsing: result))
                        continue
                    }
                    if let earlier = first[request] {
                        repeats.append((index, earlier))
                        continue
                    }
                    first[request] = index
                }
                todo.append(index)
            }
            let outcomes = todo.isEmpty ? [] : try apply(db, todo)
            precondition(outcomes.count == todo.count, "a batch's write answered \(outcomes.count) outcomes for \(todo.count) requests")
            var results: [(request: String, result: JSONValue)] = []
            for (index, outcome) in zip(todo, outcomes) {
                answers[index] = outcome
                if case .success(let result) = outcome, let request = requests[index] { results.append((request, result)) }
            }
            try remember(db, results)
            for (index, earlier) in repeats { answers[index] = answers[earlier] }
            answered.withLock { $0 = requests.indices.map { answers[$0]! } }
            return .null
        }
        return answered.withLock { $0 }
    }

    /// The results kept for `requests`, by request.
    private static func remembered(_ db: any SQLSession, _ requests: [String]) throws -> [String: [UInt8]] {
        guard !requests.isEmpty else { return [:] }
        var found: [String: [UInt8]] = [:]
        for row in try db.rows("SELECT request, result FROM replies WHERE request IN " + SQLRows.placeholders(rows: 1, columns: requests.count), requests) {
            found[try row.text("request")] = try row.blob("result")
        }
        return found
    }

    /// Keeps each result as its request's, as this engine's writer keeps them.
    private func remember(_ db: any SQLSession, _ results: [(request: String, result: JSONValue)]) throws {
        switch self {
        case .sqlite: try SQLiteWriter.remember(db, results)
        case .postgres: try PostgresWriter.remember(db, results)
        case .unusable(let failure): throw failure.rpcError
        }
    }

    package func read<T: Sendable>(_ body: @escaping @Sendable (any SQLSession) throws -> T) async throws -> T {
        switch self {
        case .sqlite(let writer): try await writer.read { db in try body(db) }
        case .postgres(let writer): try await writer.read(body)
        case .unusable(let failure): throw failure.rpcError
        }
    }

    /// The result written for `request`, if any.
    package func remembered(_ request: String) async throws -> [UInt8]? {
        switch self {
        case .sqlite(let writer): try await writer.remembered(request)
        case .postgres(let writer): try await writer.remembered(request)
        case .unusable(let failure): throw failure.rpcError
        }
    }

    /// Runs `body` while no other process on the same database runs a body under the same
    /// `lock`: on SQLite, under a lock on the file `path.NAME` beside the database; on
    /// PostgreSQL, under the session advisory lock `key` (each try at it bounded as an
    /// operation is). A lock another process holds longer than `limit` (a process stopped
    /// while it held it) fails the call as `busy`, naming the lock, rather than holding the
    /// caller in silence.
    package func alone<T: Sendable>(_ lock: (name: String, key: Int64), waitingAtMost limit: Duration,
                                    _ body: @escaping @Sendable () async throws -> T) async throws -> T {
        switch self {
        case .sqlite(let writer):
            let file = writer.path + "." + lock.name
            let descriptor = open(file, O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
            guard descriptor >= 0 else { return try await body() }  // a read-only folder: no other writer either
            defer { close(descriptor) }
            let deadline = ContinuousClock.now + limit
            while flock(descriptor, LOCK_EX | LOCK_NB) != 0 {
                let code = errno
                guard code == EWOULDBLOCK || code == EINTR else {
                    throw StorageFailure(reason: "io", detail: "cannot lock \(file): \(String(cString: strerror(code)))", path: file).rpcError
                }
                guard ContinuousClock.now < deadline else { throw Self.heldTooLong("the lock \(file)", limit, path: file) }
                try await Task.sleep(for: .milliseconds(2))
            }
            defer { flock(descriptor, LOCK_UN) }
            return try await body()
        case .postgres(let writer): return try await writer.alone(lock.key, waitingAtMost: limit, body)
        case .unusable(let failure): throw failure.rpcError
        }
    }

    /// A lock (`lock` names it) another process has held past the wait's limit.
    static func heldTooLong(_ lock: String, _ limit: Duration, path: String) -> JSONRPCError {
        StorageFailure(reason: "busy", detail: "another process has held \(lock) for \(limit.formatted)", path: path).rpcError
    }

    /// Gives back to the disk the room deleted rows left, on SQLite (``SQLiteWriter/giveBackFreePages()``).
    /// PostgreSQL's autovacuum makes it room for later rows; giving it back takes `VACUUM
    /// FULL`, which locks the table while it rewrites it: an operator's call, not a service's.
    package func giveBackFreePages() async throws {
        if case .sqlite(let writer) = self { try await writer.giveBackFreePages() }
    }

    /// Returns once the database can serve: at once for SQLite; for PostgreSQL once it answers
    /// and its schema is in place (trying again meanwhile).
    package func waitUntilReady() async {
        if case .postgres(let writer) = self { await writer.waitUntilReady() }
    }

    /// The parts of the process the database needs (PostgreSQL's connections).
    package var parts: [any Service] {
        if case .postgres(let writer) = self { [writer.connections] } else { [] }
    }
}
