import BusKit
import BusProtocol
import Foundation
import Logging
import PostgresNIO
import Storage

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
        self.settings = settings
        self.logger = logger
        self.replyWindow = replyWindow
        client = try settings.makeClient(logger: logger)
    }

    /// Waits until the database answers and its schema is in place, trying again with
    /// back-off meanwhile.
    func waitUntilReady() async {
        await PostgresSchema.waitUntilReady(settings, logger: logger) { try await migrate() }
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
        try await bounded { try await PostgresSchema.migrate(client, migrations: Self.migrations, lockKey: 7214021, logger: logger) }
        migrated = true
    }

    private nonisolated func bounded<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        try await settings.bounded(body)
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
            if let request, let duplicate = error as? PSQLError, duplicate.isUniqueViolation {
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
    private func failure(_ error: any Error) -> StorageFailure { settings.failure(error) }
}
