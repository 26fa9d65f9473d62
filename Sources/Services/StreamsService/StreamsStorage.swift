import BusProtocol
import Foundation
import Logging
import ServiceLifecycle
import Storage

/// Where the streams service keeps its data: a SQLite file (one process writes it at a time,
/// with group commit) or a PostgreSQL database several processes share. ``StreamsDatabase``'s
/// code runs unchanged in either's transactions.
enum StreamsStorage: Sendable {
    case sqlite(SQLiteWriter)
    case postgres(PostgresWriter)
    /// A database the configuration cannot name (its URL is not one): every call says why.
    case unusable(StorageFailure)

    init(_ configuration: StreamsConfiguration, logger: Logger) {
        guard let postgres = configuration.postgres else {
            self = .sqlite(SQLiteWriter(path: configuration.path, label: "streams", maxSizeBytes: configuration.maxSizeBytes, migrator: StreamsSchema.migrator,
                                        replyWindow: configuration.replyWindow, logger: logger))
            return
        }
        do {
            self = .postgres(try PostgresWriter(settings: postgres, schema: StreamsSchema.postgresSchema, migrations: StreamsSchema.postgresMigrations,
                                                lockKey: StreamsSchema.postgresMigrationLock, replyWindow: configuration.replyWindow, logger: logger))
        } catch {
            logger.error("cannot use the database", metadata: ["url": "\(postgres.redactedURL)", "problem": "\(error.detail)"])
            self = .unusable(error)
        }
    }

    /// Runs `apply` in a transaction, answered once durable; for a `request` written before,
    /// the result it had.
    func write(request: String?, _ apply: @escaping @Sendable (any SQLSession) throws -> JSONValue) async throws -> JSONValue {
        switch self {
        case .sqlite(let writer): try await writer.write(request: request) { db in try apply(db) }
        case .postgres(let writer): try await writer.write(request: request, apply)
        case .unusable(let failure): throw failure.rpcError
        }
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLSession) throws -> T) async throws -> T {
        switch self {
        case .sqlite(let writer): try await writer.read { db in try body(db) }
        case .postgres(let writer): try await writer.read(body)
        case .unusable(let failure): throw failure.rpcError
        }
    }

    /// The result written for `request`, if any.
    func remembered(_ request: String) async throws -> [UInt8]? {
        switch self {
        case .sqlite(let writer): try await writer.remembered(request)
        case .postgres(let writer): try await writer.remembered(request)
        case .unusable(let failure): throw failure.rpcError
        }
    }

    /// Returns once the database can serve: at once for SQLite; for PostgreSQL once it answers
    /// and its schema is in place (trying again meanwhile).
    func waitUntilReady() async {
        if case .postgres(let writer) = self { await writer.waitUntilReady() }
    }

    /// The parts of the process the database needs (PostgreSQL's connections).
    var parts: [any Service] {
        if case .postgres(let writer) = self { [writer.connections] } else { [] }
    }
}
