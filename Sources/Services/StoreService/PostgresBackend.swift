import BusKit
import BusProtocol
import Foundation
import Logging
import NIOSSL
import PostgresNIO
import Storage

/// Where the store's PostgreSQL database is and how to reach it.
public struct PostgresSettings: Sendable, Equatable {
    public enum TLSMode: String, Sendable, CaseIterable {
        /// Plain TCP (a database on the same machine or a private network).
        case disable
        /// TLS when the server offers it.
        case prefer
        /// TLS or no connection, the server's certificate checked against the system's roots
        /// or `caFile`.
        case require
    }

    /// `postgres://USER:PASSWORD@HOST:PORT/DATABASE`.
    public var url: String
    /// Connections the store keeps open at most.
    public var poolSize: Int
    public var tls: TLSMode
    /// A PEM file of the certificate authority that signed the server's certificate.
    public var caFile: String?
    /// How long one database operation (a connection from the pool, then the queries) may
    /// take before the caller is answered "unreachable": the pool waits for a database that
    /// is away for as long as it is away.
    public var operationTimeout: Duration

    public init(url: String, poolSize: Int = 8, tls: TLSMode = .prefer, caFile: String? = nil, operationTimeout: Duration = .seconds(4)) {
        self.url = url
        self.poolSize = poolSize
        self.tls = tls
        self.caFile = caFile
        self.operationTimeout = operationTimeout
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

/// The store's data in a PostgreSQL database that several store processes, on several
/// machines, share. Each write is one transaction; its result is kept in the same
/// transaction, so a request sent again, to this process or another, is written once. The
/// schema is created and migrated at start (`schema_version`), under an advisory lock so
/// workers starting together do it once.
actor PostgresBackend: StoreBackend {
    let settings: PostgresSettings
    let logger: Logger
    let replyWindow: Duration
    /// Its connections: a part of the store's process, run before the store's work and
    /// stopped after it (``StoreService/requiredParts``).
    nonisolated let client: PostgresClient
    /// Whether the schema is in place (checked before the first query and after a failure).
    private var migrated = false
    private var lastPruned = ContinuousClock.now

    init(settings: PostgresSettings, replyWindow: Duration, logger: Logger) throws {
        guard let parts = settings.parsed else {
            throw StorageFailure(reason: "cannot-open", detail: "store.postgres.url is not postgres://USER:PASSWORD@HOST:PORT/DATABASE",
                                 path: settings.redactedURL)
        }
        self.settings = settings
        self.logger = logger
        self.replyWindow = replyWindow
        var tlsConfiguration = TLSConfiguration.makeClientConfiguration()
        if let caFile = settings.caFile { tlsConfiguration.trustRoots = .file(caFile) }
        let tls: PostgresClient.Configuration.TLS = switch settings.tls {
        case .disable: .disable
        case .prefer: .prefer(tlsConfiguration)
        case .require: .require(tlsConfiguration)
        }
        var configuration = PostgresClient.Configuration(host: parts.host, port: parts.port, username: parts.user, password: parts.password,
                                                         database: parts.database, tls: tls)
        configuration.options.maximumConnections = max(1, settings.poolSize)
        configuration.options.connectTimeout = .seconds(5)
        client = PostgresClient(configuration: configuration, backgroundLogger: logger)
    }

    /// Waits until the database answers and its schema is in place, trying again with
    /// back-off (0.1 s doubling to 5 s), saying why (the URL without its password) the first
    /// time and every minute after.
    func waitUntilReady() async {
        var delay = Duration.milliseconds(100), lastSaid: ContinuousClock.Instant?
        while !Task.isCancelled {
            do {
                try await migrate()
                logger.info("database ready", metadata: ["url": "\(settings.redactedURL)"])
                return
            } catch {
                if lastSaid.map({ ContinuousClock.now - $0 > .seconds(60) }) ?? true {
                    lastSaid = .now
                    logger.error("cannot reach the database; trying again", metadata: ["url": "\(settings.redactedURL)", "problem": "\(failure(error).detail)"])
                }
                try? await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(5))
            }
        }
    }

    // MARK: Schema

    /// One migration per version; never edit a shipped one: add one.
    static let migrations: [String] = [
        """
        CREATE TABLE history (id BIGSERIAL PRIMARY KEY, text TEXT NOT NULL, added_at DOUBLE PRECISION NOT NULL);
        CREATE SEQUENCE articles_saved_seq;
        CREATE TABLE articles (url TEXT PRIMARY KEY, id TEXT NOT NULL, saved_seq BIGINT NOT NULL,
                               saved_at DOUBLE PRECISION NOT NULL, article TEXT NOT NULL);
        CREATE INDEX articles_by_seq ON articles(saved_seq);
        CREATE INDEX articles_by_id ON articles(id);
        CREATE TABLE selections (name TEXT PRIMARY KEY, value TEXT NOT NULL, selected_at DOUBLE PRECISION NOT NULL);
        CREATE TABLE snapshots (name TEXT PRIMARY KEY, body BYTEA NOT NULL, version TEXT NOT NULL, origin TEXT NOT NULL,
                                fetched_at DOUBLE PRECISION NOT NULL, stored_at DOUBLE PRECISION NOT NULL);
        """,
        """
        CREATE TABLE replies (request TEXT PRIMARY KEY, result TEXT NOT NULL, written_at DOUBLE PRECISION NOT NULL);
        CREATE INDEX replies_by_time ON replies(written_at);
        """,
        "ALTER TABLE selections ADD COLUMN revision BIGINT NOT NULL DEFAULT 1;",
    ]

    private func migrate() async throws {
        guard !migrated else { return }
        let client = self.client, logger = self.logger
        try await bounded { try await Self.migrate(client, logger: logger) }
        migrated = true
    }

    private static func migrate(_ client: PostgresClient, logger: Logger) async throws {
        try await client.withTransaction(logger: logger) { connection in
            // Workers starting together: one migrates, the others wait for it here.
            try await connection.query("SELECT pg_advisory_xact_lock(7214021)", logger: logger)
            try await connection.query("CREATE TABLE IF NOT EXISTS schema_version (version INT NOT NULL)", logger: logger)
            var version = 0
            for try await (found) in try await connection.query("SELECT COALESCE(MAX(version), 0) FROM schema_version", logger: logger).decode(Int.self) {
                version = found
            }
            for (index, migration) in Self.migrations.enumerated() where index + 1 > version {
                for statement in migration.split(separator: ";").map({ $0.trimmingCharacters(in: .whitespacesAndNewlines) }) where !statement.isEmpty {
                    try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                try await connection.query("INSERT INTO schema_version (version) VALUES (\(index + 1))", logger: logger)
                logger.notice("database schema migrated", metadata: ["version": "\(index + 1)"])
            }
        }
    }

    private struct TimedOut: Error, CustomStringConvertible {
        let after: Duration
        var description: String { "no answer within \(after.formatted)" }
    }

    /// Runs `body`, or gives up after ``PostgresSettings/operationTimeout`` (the body is cancelled: a
    /// transaction cut short is rolled back, or its outcome is unknown; either way the caller
    /// gets an error, never an acknowledgement). PostgresNIO's queries ignore cancellation,
    /// and one on a connection lost mid-flight was seen never to return, even after the pool
    /// shut down: the deadline abandons it rather than waits for it (``withDeadline``).
    private nonisolated func bounded<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let timeout = settings.operationTimeout
        return try await withDeadline(timeout, expired: { TimedOut(after: timeout) }, body)
    }

    // MARK: Writes

    func write(_ write: StoreWrite, request: String?) async throws -> JSONValue {
        do {
            try await migrate()
            let forgetBefore: Double? = ContinuousClock.now - lastPruned > .seconds(60) ? Date().timeIntervalSince1970 - replyWindow.seconds : nil
            if forgetBefore != nil { lastPruned = .now }
            let logger = self.logger, client = self.client
            return try await bounded { try await client.withTransaction(logger: logger) { connection in
                if let forgetBefore { try await connection.query("DELETE FROM replies WHERE written_at < \(forgetBefore)", logger: logger) }
                if let request, let remembered = try await Self.remembered(request, on: connection, logger: logger) {
                    return try JSONValue(parsing: Array(remembered.utf8))
                }
                let result = try await Self.apply(write, on: connection, logger: logger)
                if let request {
                    // A copy written meanwhile by another store process makes this insert
                    // fail, and the whole transaction with it: its result is answered below.
                    try await connection.query("INSERT INTO replies (request, result, written_at) VALUES (\(request), \(result.jsonString), \(Date().timeIntervalSince1970))",
                                               logger: logger)
                }
                return result
            } }
        } catch {
            // What went wrong inside the transaction comes wrapped in PostgresNIO's transaction error.
            let error = (error as? PostgresTransactionError)?.closureError ?? error
            if let refusal = error as? JSONRPCError {
                // Refused by the write itself (a compare-and-set that lost): rolled back, not a storage failure.
                throw refusal
            }
            if let request, let duplicate = error as? PSQLError, duplicate.serverInfo?[.sqlState] == "23505" {
                if let remembered = try? await remembered(request) { return try JSONValue(parsing: remembered) }
                throw failure(error).rpcError
            }
            migrated = false
            throw failure(error).rpcError
        }
    }

    private static func apply(_ write: StoreWrite, on connection: PostgresConnection, logger: Logger) async throws -> JSONValue {
        switch write {
        case .historyAdd(let text, let limit):
            let now = Date()
            // One history writer at a time, across processes: re-adding moves an entry to the top.
            try await connection.query("LOCK TABLE history IN SHARE ROW EXCLUSIVE MODE", logger: logger)
            try await connection.query("DELETE FROM history WHERE text = \(text)", logger: logger)
            try await connection.query("INSERT INTO history (text, added_at) VALUES (\(text), \(now.timeIntervalSince1970))", logger: logger)
            try await connection.query("DELETE FROM history WHERE id NOT IN (SELECT id FROM history ORDER BY id DESC LIMIT \(limit))", logger: logger)
            return StoreResults.historyAdded(text: text, at: now, count: try await count("SELECT COUNT(*) FROM history", on: connection, logger: logger))
        case .historyClear:
            let cleared = try await count("WITH gone AS (DELETE FROM history RETURNING 1) SELECT COUNT(*) FROM gone", on: connection, logger: logger)
            return StoreResults.cleared(cleared)
        case .articleSave(let url, let id, let article):
            let now = Date()
            var created = false
            for try await (inserted) in try await connection.query("""
                INSERT INTO articles (url, id, saved_seq, saved_at, article) VALUES (\(url), \(id), nextval('articles_saved_seq'), \(now.timeIntervalSince1970), \(article))
                ON CONFLICT (url) DO UPDATE SET saved_seq = nextval('articles_saved_seq'), saved_at = excluded.saved_at, article = excluded.article
                RETURNING (xmax = 0)
                """, logger: logger).decode(Bool.self) {
                created = inserted
            }
            return StoreResults.articleSaved(id: id, url: url, at: now, created: created)
        case .articleDelete(let url, let id):
            let deleted = try await count("WITH gone AS (DELETE FROM articles WHERE url = \(url) RETURNING 1) SELECT COUNT(*) FROM gone", on: connection, logger: logger)
            return StoreResults.articleDeleted(url: url, id: id, deleted: deleted > 0)
        case .select(let chosen, let value, let expected):
            let name = chosen.rawValue
            let now = Date().timeIntervalSince1970
            // Each statement decides alone (an UPDATE waits for a concurrent one and checks the
            // revision again after it): of two choosers at the same revision, one changes it.
            let changed: Int
            switch expected {
            case nil:
                changed = try await count("""
                    WITH put AS (INSERT INTO selections (name, value, selected_at, revision) VALUES (\(name), \(value), \(now), 1)
                    ON CONFLICT (name) DO UPDATE SET value = excluded.value, selected_at = excluded.selected_at, revision = selections.revision + 1
                    RETURNING 1) SELECT COUNT(*) FROM put
                    """, on: connection, logger: logger)
            case 0?:
                changed = try await count("""
                    WITH put AS (INSERT INTO selections (name, value, selected_at, revision) VALUES (\(name), \(value), \(now), 1)
                    ON CONFLICT (name) DO NOTHING RETURNING 1) SELECT COUNT(*) FROM put
                    """, on: connection, logger: logger)
            case let expected?:
                changed = try await count("""
                    WITH put AS (UPDATE selections SET value = \(value), selected_at = \(now), revision = revision + 1
                    WHERE name = \(name) AND revision = \(expected) RETURNING 1) SELECT COUNT(*) FROM put
                    """, on: connection, logger: logger)
            }
            let current = try await selection(name, on: connection, logger: logger)
            guard changed > 0 else { throw StoreResults.selectionConflict(chosen, current: current, expected: expected ?? 0) }
            return current ?? .null
        case .snapshotPut(let name, let body, let version, let origin, let fetchedAt):
            // A retried or late put never replaces a copy fetched later.
            let stored = try await count("""
                WITH put AS (
                    INSERT INTO snapshots (name, body, version, origin, fetched_at, stored_at)
                    VALUES (\(name), \(body), \(version), \(origin), \(fetchedAt), \(Date().timeIntervalSince1970))
                    ON CONFLICT (name) DO UPDATE SET body = excluded.body, version = excluded.version, origin = excluded.origin,
                        fetched_at = excluded.fetched_at, stored_at = excluded.stored_at
                    WHERE excluded.fetched_at >= snapshots.fetched_at
                    RETURNING 1)
                SELECT COUNT(*) FROM put
                """, on: connection, logger: logger) > 0
            var current = version
            for try await (found) in try await connection.query("SELECT version FROM snapshots WHERE name = \(name)", logger: logger).decode(String.self) {
                current = found
            }
            return StoreResults.snapshotStored(name: name, stored: stored, version: current, size: body.count)
        }
    }

    // MARK: Reads

    func read(_ read: StoreRead) async throws -> JSONValue? {
        do {
            try await migrate()
            let logger = self.logger, client = self.client
            return try await bounded { try await client.withConnection { connection in try await Self.read(read, on: connection, logger: logger) } }
        } catch let error as JSONRPCError {
            throw error
        } catch {
            migrated = false
            throw failure(error).rpcError
        }
    }

    private static func read(_ read: StoreRead, on connection: PostgresConnection, logger: Logger) async throws -> JSONValue? {
        switch read {
        case .history(let limit):
            var entries: [(text: String, addedAt: Double)] = []
            for try await (text, addedAt) in try await connection.query("SELECT text, added_at FROM history ORDER BY id DESC LIMIT \(limit)",
                                                                         logger: logger).decode((String, Double).self) {
                entries.append((text, addedAt))
            }
            return StoreResults.history(entries, count: try await count("SELECT COUNT(*) FROM history", on: connection, logger: logger))
        case .articles(let offset, let limit):
            var articles: [JSONValue] = []
            for try await (id, url, savedAt, article) in try await connection.query(
                "SELECT id, url, saved_at, article FROM articles ORDER BY saved_seq DESC LIMIT \(limit) OFFSET \(offset)", logger: logger
            ).decode((String, String, Double, String).self) {
                articles.append(try StoreResults.savedArticle(id: id, url: url, savedAt: savedAt, article: article))
            }
            return StoreResults.articles(articles, total: try await count("SELECT COUNT(*) FROM articles", on: connection, logger: logger), offset: offset)
        case .article(let id):
            for try await (id, url, savedAt, article) in try await connection.query(
                "SELECT id, url, saved_at, article FROM articles WHERE id = \(id)", logger: logger
            ).decode((String, String, Double, String).self) {
                return try StoreResults.savedArticle(id: id, url: url, savedAt: savedAt, article: article)
            }
            return nil
        case .selection(let chosen):
            return try await selection(chosen.rawValue, on: connection, logger: logger)
        case .snapshot(let name):
            for try await (body, version, origin, fetchedAt) in try await connection.query(
                "SELECT body, version, origin, fetched_at FROM snapshots WHERE name = \(name)", logger: logger
            ).decode((Data, String, String, Double).self) {
                return StoreResults.snapshot(name: name, body: body, version: version, origin: origin, fetchedAt: fetchedAt)
            }
            return nil
        case .snapshots:
            var entries: [JSONValue] = []
            for try await (name, version, origin, fetchedAt, size) in try await connection.query(
                "SELECT name, version, origin, fetched_at, length(body) FROM snapshots ORDER BY name", logger: logger
            ).decode((String, String, String, Double, Int).self) {
                entries.append(StoreResults.snapshotEntry(name: name, version: version, origin: origin, fetchedAt: fetchedAt, size: size))
            }
            return .array(entries)
        }
    }

    func remembered(_ request: String) async throws -> [UInt8]? {
        do {
            try await migrate()
            let logger = self.logger, client = self.client
            return try await bounded {
                try await client.withConnection { connection in
                    try await Self.remembered(request, on: connection, logger: logger).map { Array($0.utf8) }
                }
            }
        } catch {
            throw failure(error).rpcError
        }
    }

    func articleIDs() async throws -> [String] {
        do {
            try await migrate()
            let logger = self.logger, client = self.client
            return try await bounded { try await client.withConnection { connection in
                var ids: [String] = []
                for try await (id) in try await connection.query("SELECT id FROM articles", logger: logger).decode(String.self) { ids.append(id) }
                return ids
            } }
        } catch {
            throw failure(error).rpcError
        }
    }

    /// Publishes under a session advisory lock: store processes on several machines publish
    /// one at a time, each the values it reads under the lock, so a value read before another
    /// process's write is never published after that write's value.
    func publishing<T: Sendable>(_ body: @Sendable () async throws -> T) async throws -> T {
        let logger = self.logger
        // The lock is waited for no longer than an operation; the publisher tries again later.
        _ = try await bounded { try await self.client.withConnection { connection in
            try await connection.query("SELECT 1", logger: logger)
        } }
        return try await client.withConnection { connection in
            try await connection.query("SELECT pg_advisory_lock(7214022)", logger: logger)
            do {
                let result = try await body()
                try await connection.query("SELECT pg_advisory_unlock(7214022)", logger: logger)
                return result
            } catch {
                _ = try? await connection.query("SELECT pg_advisory_unlock(7214022)", logger: logger)
                throw error
            }
        }
    }

    private static func remembered(_ request: String, on connection: PostgresConnection, logger: Logger) async throws -> String? {
        for try await (result) in try await connection.query("SELECT result FROM replies WHERE request = \(request)", logger: logger).decode(String.self) {
            return result
        }
        return nil
    }

    private static func selection(_ name: String, on connection: PostgresConnection, logger: Logger) async throws -> JSONValue? {
        for try await (value, selectedAt, revision) in try await connection.query("SELECT value, selected_at, revision FROM selections WHERE name = \(name)",
                                                                                  logger: logger).decode((String, Double, Int).self) {
            return try StoreResults.selection(value: value, selectedAt: selectedAt, revision: revision)
        }
        return nil
    }

    private static func count(_ query: PostgresQuery, on connection: PostgresConnection, logger: Logger) async throws -> Int {
        for try await (count) in try await connection.query(query, logger: logger).decode(Int.self) { return count }
        return 0
    }

    /// A failure as callers see it: -32007 with the reason and the URL without its password.
    private func failure(_ error: any Error) -> StorageFailure {
        if let failure = error as? StorageFailure { return failure }
        if error is TimedOut {
            return StorageFailure(reason: "unreachable", detail: "the database did not answer within \(settings.operationTimeout.formatted)", path: settings.redactedURL)
        }
        if let error = error as? PSQLError {
            switch error.code {
            case .serverClosedConnection, .connectionError, .uncleanShutdown:
                return StorageFailure(reason: "unreachable", detail: "the connection to the database was lost or could not be made", path: settings.redactedURL)
            case .server:
                let message = error.serverInfo?[.message] ?? "an error"
                let state = error.serverInfo?[.sqlState] ?? "?"
                return StorageFailure(reason: state.hasPrefix("53") ? "full" : "other", detail: "the database answered: \(message) (SQLSTATE \(state))",
                                      path: settings.redactedURL)
            default:
                return StorageFailure(reason: "unreachable", detail: "cannot use the database: \(error.code)", path: settings.redactedURL)
            }
        }
        return StorageFailure(reason: "unreachable", detail: "\(error)", path: settings.redactedURL)
    }
}
