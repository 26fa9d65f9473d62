package import BusProtocol
import Foundation
package import GRDB
package import Logging
package import ServiceLifecycle
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
    /// PostgreSQL, under the session advisory lock `key` (waited for no longer than an
    /// operation).
    package func alone<T: Sendable>(_ lock: (name: String, key: Int64), _ body: @Sendable () async throws -> T) async throws -> T {
        switch self {
        case .sqlite(let writer):
            let descriptor = open(writer.path + "." + lock.name, O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
            guard descriptor >= 0 else { return try await body() }  // a read-only folder: no other writer either
            defer { close(descriptor) }
            while flock(descriptor, LOCK_EX | LOCK_NB) != 0 { try await Task.sleep(for: .milliseconds(2)) }
            defer { flock(descriptor, LOCK_UN) }
            return try await body()
        case .postgres(let writer): return try await writer.alone(lock.key, body)
        case .unusable(let failure): throw failure.rpcError
        }
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
