import BusKit
import BusProtocol
import ClientTLS
import Foundation
package import Logging
import NIOSSL
import ZeroMQ
package import PostgresNIO

/// Where a durable service's PostgreSQL database is and how to reach it.
public struct PostgresSettings: Sendable, Equatable {
    public enum TLSMode: String, Sendable, CaseIterable {
        /// Plain TCP (a database on the same machine or a private network).
        case disable
        /// TLS when the server offers it; its certificate checked only against `caFile`, when
        /// one is given.
        case prefer
        /// TLS or no connection, the server's certificate checked against the system's roots
        /// or `caFile`.
        case require
    }

    /// `postgres://USER:PASSWORD@HOST:PORT/DATABASE`.
    public var url: String
    /// Connections the service keeps open at most.
    public var poolSize: Int
    public var tls: TLSMode
    /// A PEM file of the certificate authority that signed the server's certificate.
    public var caFile: String?
    /// How long one database operation (a connection from the pool, then the queries) may
    /// take before the caller is answered "unreachable": the pool waits for a database that
    /// is away for as long as it is away. A transaction's commit sent in time is waited for
    /// as long again (``PostgresSession``).
    public var operationTimeout: Duration
    /// The configuration key that sets ``operationTimeout`` (`store.timeout_ms`), named in the
    /// errors of an operation that outlasted it: the setting to raise for a database that
    /// answers, slowly.
    public var operationTimeoutKey: String?

    public init(url: String, poolSize: Int = 8, tls: TLSMode = .prefer, caFile: String? = nil, operationTimeout: Duration = .seconds(4),
                operationTimeoutKey: String? = nil) {
        self.url = url
        self.poolSize = poolSize
        self.tls = tls
        self.caFile = caFile
        self.operationTimeout = operationTimeout
        self.operationTimeoutKey = operationTimeoutKey
    }

    /// The URL as errors and logs show it: without the password.
    public var redactedURL: String {
        guard var components = URLComponents(string: url), components.password != nil else { return url }
        components.password = "***"
        return components.string ?? url
    }

    /// The URL's parts; nil when it is not `postgres://` or `postgresql://` with a host.
    public var parsed: (host: String, port: Int, user: String, password: String?, database: String?)? {
        guard let components = URLComponents(string: url), ["postgres", "postgresql"].contains(components.scheme ?? ""),
              let host = components.host, !host.isEmpty, let user = components.user, !user.isEmpty else { return nil }
        let database = components.path.count > 1 ? String(components.path.dropFirst()) : nil
        return (host, components.port ?? 5432, user.removingPercentEncoding ?? user,
                components.password.map { $0.removingPercentEncoding ?? $0 }, database)
    }
}


extension PostgresSettings {
    /// A pool of connections to the database; `searchPath` names the schema its tables are
    /// in (each service keeps its own, so several can share one database).
    package func makeClient(logger: Logger, searchPath: String? = nil) throws(StorageFailure) -> PostgresClient {
        let (parts, tlsConfiguration) = try connectionParts()
        let tls: PostgresClient.Configuration.TLS = switch self.tls {
        case .disable: .disable
        case .prefer: .prefer(tlsConfiguration)
        case .require: .require(tlsConfiguration)
        }
        var configuration = PostgresClient.Configuration(host: parts.host, port: parts.port, username: parts.user, password: parts.password,
                                                         database: parts.database, tls: tls)
        configuration.options.maximumConnections = max(1, poolSize)
        // The pool makes a connection when one is asked for, or when it has fewer than this:
        // requests waiting for the last connection would otherwise wait on after it closed
        // (given up at a deadline, or lost) until their own deadline.
        configuration.options.minimumConnections = 1
        configuration.options.connectTimeout = .seconds(5)
        // A statement the service has given up on (its deadline passed, its connection closed)
        // would otherwise run on in the server, holding its locks, until it next writes to the
        // connection: the server ends it after the same time.
        configuration.options.additionalStartupParameters = [("statement_timeout", "\(operationTimeout.nanoseconds / 1_000_000)")]
        if let searchPath { configuration.options.additionalStartupParameters.append(("search_path", searchPath)) }
        // The pool logs each connection it fails to make at info, every few seconds while the
        // database is away; the service says so itself once a minute, with why. At info the
        // pool's lines are left out (at debug they are kept).
        var background = logger
        if background.logLevel == .info { background.logLevel = .notice }
        return PostgresClient(configuration: configuration, backgroundLogger: background)
    }

    /// Why one connection to the database cannot be made now, in a line; nil when it can.
    /// A pool tries again and again, so what stops it (a certificate refused, a password
    /// wrong) reaches a query only as a timeout: this asks once, alone.
    package func connectionProblem(logger: Logger) async -> String? {
        do throws(any Error) {
            let (parts, tlsConfiguration) = try connectionParts()
            let tls: PostgresConnection.Configuration.TLS = switch self.tls {
            case .disable: .disable
            case .prefer: .prefer(try NIOSSLContext(configuration: tlsConfiguration))
            case .require: .require(try NIOSSLContext(configuration: tlsConfiguration))
            }
            let configuration = PostgresConnection.Configuration(host: parts.host, port: parts.port, username: parts.user, password: parts.password,
                                                                 database: parts.database, tls: tls)
            let timeout = operationTimeout
            // Closed where it is made: one made after the deadline passed, or after the caller
            // was cancelled, is closed all the same, not dropped open.
            try await withDeadline(timeout, expired: { PostgresTimedOut(after: timeout) }) {
                let connection = try await PostgresConnection.connect(configuration: configuration, id: 0, logger: logger)
                try? await connection.close()
            }
            return nil
        } catch let error as PSQLError where error.code == .connectionError && error.underlying != nil {
            let cause = "\(error.underlying!)"
            guard ClientTLS.isUntrustedServer(error.underlying!) else { return "cannot connect: \(cause)" }
            return "cannot connect: the server's TLS certificate is not signed by a CA this service trusts (ca_file, else the system's): \(cause)"
        } catch {
            return failure(error).detail
        }
    }

    /// Where the database is, and the TLS its connections use when they use it (``tls``).
    private func connectionParts() throws(StorageFailure) -> (parts: (host: String, port: Int, user: String, password: String?, database: String?),
                                                               tls: TLSConfiguration) {
        guard let parts = parsed else {
            throw StorageFailure(reason: "cannot-open", detail: "the URL is not postgres://USER:PASSWORD@HOST:PORT/DATABASE", path: redactedURL)
        }
        var tlsConfiguration: TLSConfiguration
        do throws(ClientTLSError) {
            // A CA file is read only where TLS is used: beside `disable` it is refused at start.
            tlsConfiguration = try ClientTLS.configuration(caFile: self.tls == .disable ? nil : caFile)
        } catch {
            throw StorageFailure(reason: "cannot-open", detail: "the TLS file (ca_file) \(error)", path: redactedURL)
        }
        if caFile == nil, self.tls == .prefer {
            // Encrypted whenever the server offers TLS, whatever its certificate (Debian's own
            // cluster has one no CA signed): a connection that goes on in plain text when the
            // server offers none gains nothing from checking it, as libpq's sslmode=prefer
            // does not. `require` checks it.
            tlsConfiguration.certificateVerification = .none
        }
        return (parts, tlsConfiguration)
    }

    /// Runs `body`, or gives up after ``operationTimeout`` (the body is cancelled: a
    /// transaction cut short is rolled back, or its outcome is unknown; either way the caller
    /// gets an error, never an acknowledgement). PostgresNIO's queries ignore cancellation,
    /// and one on a connection lost mid-flight was seen never to return, even after the pool
    /// shut down: the deadline abandons it rather than waits for it (``withDeadline``).
    package func bounded<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let timeout = operationTimeout
        return try await withDeadline(timeout, expired: { PostgresTimedOut(after: timeout) }, body)
    }

    /// A failure as callers see it: -32007 with the reason and the URL without its password.
    package func failure(_ error: any Error) -> StorageFailure {
        if let failure = error as? StorageFailure { return failure }
        if error is PostgresTimedOut {
            return StorageFailure(reason: "unreachable", detail: "the database did not answer within \(operationTimeout.formatted)\(operationTimeoutKey.map { " (\($0))" } ?? "")",
                                  path: redactedURL)
        }
        if let unanswered = error as? PostgresCommitUnanswered {
            return StorageFailure(reason: "unreachable",
                                  detail: "the database did not answer the commit within \(unanswered.after.formatted): the write may have been made (the same request sent again is answered with its result, or made once)",
                                  path: redactedURL)
        }
        // The migration's transaction (PostgresNIO's) wraps what failed in it.
        if let transaction = error as? PostgresTransactionError,
           let cause = transaction.beginError ?? transaction.closureError ?? transaction.commitError {
            return failure(cause)
        }
        if let error = error as? PSQLError {
            switch error.code {
            case .serverClosedConnection, .clientClosedConnection, .connectionError, .uncleanShutdown:
                return StorageFailure(reason: "unreachable", detail: "the connection to the database was lost or could not be made", path: redactedURL)
            case .server:
                let message = error.serverInfo?[.message] ?? "an error"
                let state = error.serverInfo?[.sqlState] ?? "?"
                return StorageFailure(reason: state.hasPrefix("53") ? "full" : "other", detail: "the database answered: \(message) (SQLSTATE \(state))",
                                      path: redactedURL)
            default:
                return StorageFailure(reason: "unreachable", detail: "cannot use the database: \(error.code)", path: redactedURL)
            }
        }
        return StorageFailure(reason: "unreachable", detail: "\(error)", path: redactedURL)
    }
}

/// A database operation that did not end within ``PostgresSettings/operationTimeout``; a
/// write's transaction so ended was rolled back.
package struct PostgresTimedOut: Error, CustomStringConvertible {
    package let after: Duration
    package init(after: Duration) { self.after = after }
    package var description: String { "no answer within \(after.formatted)" }
}

/// A transaction's COMMIT, sent in time, was not answered `after` the session began: whether
/// the write was made is unknown.
package struct PostgresCommitUnanswered: Error, CustomStringConvertible {
    package let after: Duration
    package var description: String { "no answer to the commit within \(after.formatted)" }
}

extension PSQLError {
    /// A unique constraint refused the write (another connection wrote the same key first).
    package var isUniqueViolation: Bool { serverInfo?[.sqlState] == "23505" }
    /// The server ended the transaction to let another go on (chosen to break a deadlock, or
    /// not serializable beside it): the same transaction run again can succeed.
    package var isConflictWithAnother: Bool { ["40P01", "40001"].contains(serverInfo?[.sqlState]) }
}

/// A service's schema in a PostgreSQL database: one migration per version (never edit a
/// shipped one: add one), applied in order at start and recorded in `schema_version`.
package enum PostgresSchema {
    /// The version of the schema the database holds (0: none yet), on the connections' search path.
    package static func version(_ connection: PostgresConnection, logger: Logger) async throws -> Int {
        var made = false
        for try await found in try await connection.query("SELECT to_regclass('schema_version') IS NOT NULL", logger: logger).decode(Bool.self) {
            made = found
        }
        guard made else { return 0 }
        var version = 0
        for try await found in try await connection.query("SELECT COALESCE(MAX(version), 0) FROM schema_version", logger: logger).decode(Int.self) {
            version = found
        }
        return version
    }

    /// Applies the migrations not applied yet, in one transaction, under the advisory lock
    /// `lockKey`: workers starting together migrate once, the others wait for it. With a
    /// `schema` (the connections' search path), it is created first, and holds the version.
    /// Its statements, and the wait for another process's migration, may each take up to
    /// `statementTimeout` (the connection's own is an operation's).
    package static func migrate(_ connection: PostgresConnection, schema: String? = nil, migrations: [String], lockKey: Int64,
                                statementTimeout: Duration, logger: Logger) async throws {
        try await connection.withTransaction(logger: logger) { connection in
            try await connection.query(PostgresQuery(unsafeSQL: "SET LOCAL statement_timeout = \(statementTimeout.nanoseconds / 1_000_000)"), logger: logger)
            try await connection.query("SELECT pg_advisory_xact_lock(\(lockKey))", logger: logger)
            if let schema { try await connection.query(PostgresQuery(unsafeSQL: "CREATE SCHEMA IF NOT EXISTS \(schema)"), logger: logger) }
            try await connection.query("CREATE TABLE IF NOT EXISTS schema_version (version INT NOT NULL)", logger: logger)
            // Read again under the lock: another process may have migrated it meanwhile, and
            // only the one that migrates says so.
            let version = try await Self.version(connection, logger: logger)
            if version < migrations.count {
                logger.notice("migrating the database schema", metadata: ["from": "\(version)", "to": "\(migrations.count)"])
            }
            for (index, migration) in migrations.enumerated() where index + 1 > version {
                for statement in migration.split(separator: ";").map({ $0.trimmingCharacters(in: .whitespacesAndNewlines) }) where !statement.isEmpty {
                    try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                try await connection.query("INSERT INTO schema_version (version) VALUES (\(index + 1))", logger: logger)
                logger.notice("database schema migrated", metadata: ["version": "\(index + 1)"])
            }
        }
    }
}
