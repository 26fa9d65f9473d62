import BusProtocol
import Foundation
import GRDB
import Logging
import Storage
#if canImport(Glibc)
import Glibc
#endif

/// The store's data in one SQLite file (GRDB), the default: each write through the file's
/// ``SQLiteWriter`` (durable before it is answered, group-committed, its result kept under
/// its request), each read on the calling thread.
struct SQLiteBackend: StoreBackend {
    let configuration: StoreConfiguration
    private let writer: SQLiteWriter

    /// Opens the database now; when that fails, the reason is logged and every call answers it.
    init(configuration: StoreConfiguration, logger: Logger) {
        self.configuration = configuration
        writer = SQLiteWriter(path: configuration.path, label: "store", maxSizeBytes: configuration.maxSizeBytes,
                              migrator: StoreDatabase.migrator, replyWindow: configuration.replyWindow, logger: logger)
    }

    // MARK: Writes

    func write(_ write: StoreWrite, request: String?) async throws -> JSONValue {
        try await writer.write(request: request, Self.apply(write))
    }

    /// The SQL of each write.
    private static func apply(_ write: StoreWrite) -> @Sendable (Database) throws -> JSONValue {
        switch write {
        case .historyAdd(let text, let limit):
            return { db in
                let now = Date()
                // Re-adding moves the entry to the top: a new row gets the next id.
                try db.execute(sql: "DELETE FROM history WHERE text = ?", arguments: [text])
                try db.execute(sql: "INSERT INTO history (text, added_at) VALUES (?, ?)", arguments: [text, now.timeIntervalSince1970])
                try db.execute(sql: "DELETE FROM history WHERE id NOT IN (SELECT id FROM history ORDER BY id DESC LIMIT ?)", arguments: [limit])
                return StoreResults.historyAdded(text: text, at: now, count: try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM history") ?? 0)
            }
        case .historyClear:
            return { db in
                try db.execute(sql: "DELETE FROM history")
                return StoreResults.cleared(db.changesCount)
            }
        case .articleSave(let url, let id, let article):
            return { db in
                let now = Date()
                let created = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM articles WHERE url = ?", arguments: [url]) == 0
                try db.execute(sql: """
                    INSERT INTO articles (url, id, saved_seq, saved_at, article)
                    VALUES (?, ?, (SELECT IFNULL(MAX(saved_seq), 0) + 1 FROM articles), ?, ?)
                    ON CONFLICT(url) DO UPDATE SET saved_seq = excluded.saved_seq, saved_at = excluded.saved_at, article = excluded.article
                    """, arguments: [url, id, now.timeIntervalSince1970, article])
                return StoreResults.articleSaved(id: id, url: url, at: now, created: created)
            }
        case .articleDelete(let url, let id):
            return { db in
                try db.execute(sql: "DELETE FROM articles WHERE url = ?", arguments: [url])
                return StoreResults.articleDeleted(url: url, id: id, deleted: db.changesCount > 0)
            }
        case .select(let chosen, let value, let expected):
            let name = chosen.rawValue
            return { db in
                // One writer at a time (this transaction holds the database's write lock): the
                // revision read here is the one replaced.
                if let expected {
                    let current = try selection(db, name)
                    guard (current?["revision"]?.intValue ?? 0) == expected else { throw StoreResults.selectionConflict(chosen, current: current, expected: expected) }
                }
                try db.execute(sql: """
                    INSERT INTO selections (name, value, selected_at, revision) VALUES (?, ?, ?, 1)
                    ON CONFLICT(name) DO UPDATE SET value = excluded.value, selected_at = excluded.selected_at, revision = selections.revision + 1
                    """, arguments: [name, value, Date().timeIntervalSince1970])
                return try selection(db, name) ?? .null
            }
        case .snapshotPut(let name, let body, let version, let origin, let fetchedAt):
            return { db in
                // A retried or late put never replaces a copy fetched later.
                try db.execute(sql: """
                    INSERT INTO snapshots (name, body, version, origin, fetched_at, stored_at) VALUES (?, ?, ?, ?, ?, ?)
                    ON CONFLICT(name) DO UPDATE SET body = excluded.body, version = excluded.version, origin = excluded.origin,
                        fetched_at = excluded.fetched_at, stored_at = excluded.stored_at
                    WHERE excluded.fetched_at >= snapshots.fetched_at
                    """, arguments: [name, body, version, origin, fetchedAt, Date().timeIntervalSince1970])
                let stored = db.changesCount > 0
                let current = try String.fetchOne(db, sql: "SELECT version FROM snapshots WHERE name = ?", arguments: [name]) ?? version
                return StoreResults.snapshotStored(name: name, stored: stored, version: current, size: body.count)
            }
        }
    }

    /// One write waiting for the next group commit; `waiter` is nil for the write of the
    /// caller that commits the batch.
    // MARK: Reads

    func read(_ read: StoreRead) async throws -> JSONValue? {
        switch read {
        case .history(let limit):
            return try await reading { db in try Self.history(db, limit: limit) }
        case .articles(let offset, let limit):
            return try await reading { db in
                let rows = try Row.fetchAll(db, sql: "SELECT id, url, saved_at, article FROM articles ORDER BY saved_seq DESC LIMIT ? OFFSET ?",
                                            arguments: [limit, offset])
                let total = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM articles") ?? 0
                return StoreResults.articles(try rows.map(Self.savedArticle), total: total, offset: offset)
            }
        case .article(let id):
            return try await reading { db in
                try Row.fetchOne(db, sql: "SELECT id, url, saved_at, article FROM articles WHERE id = ?", arguments: [id]).map(Self.savedArticle)
            }
        case .selection(let chosen):
            return try await reading { db in try Self.selection(db, chosen.rawValue) }
        case .snapshot(let name):
            return try await reading { db in
                try Row.fetchOne(db, sql: "SELECT body, version, origin, fetched_at FROM snapshots WHERE name = ?", arguments: [name]).map { row in
                    StoreResults.snapshot(name: name, body: row["body"], version: row["version"], origin: row["origin"], fetchedAt: row["fetched_at"])
                }
            }
        case .snapshots:
            return try await reading { db in
                let rows = try Row.fetchAll(db, sql: "SELECT name, version, origin, fetched_at, length(body) AS size FROM snapshots ORDER BY name")
                return .array(rows.map { row in
                    StoreResults.snapshotEntry(name: row["name"], version: row["version"], origin: row["origin"], fetchedAt: row["fetched_at"], size: row["size"])
                })
            }
        }
    }

    func remembered(_ request: String) async throws -> [UInt8]? {
        try await writer.remembered(request)
    }

    func articleIDs() async throws -> [String] {
        try await reading { db in try String.fetchAll(db, sql: "SELECT id FROM articles") }
    }

    /// Store processes sharing the file (two on one machine, say a kernel pair's) publish one
    /// at a time, under a lock on a file beside the database: each publishes the values it
    /// reads under the lock, so none publishes an older value over a newer one.
    func publishing<T: Sendable>(_ body: @Sendable () async throws -> T) async throws -> T {
        let descriptor = open(configuration.path + ".publishing", O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { return try await body() }  // a read-only folder: no other writer either
        defer { close(descriptor) }
        while flock(descriptor, LOCK_EX | LOCK_NB) != 0 { try await Task.sleep(for: .milliseconds(2)) }
        defer { flock(descriptor, LOCK_UN) }
        return try await body()
    }

    private static func history(_ db: Database, limit: Int) throws -> JSONValue {
        let rows = try Row.fetchAll(db, sql: "SELECT text, added_at FROM history ORDER BY id DESC LIMIT ?", arguments: [limit])
        return StoreResults.history(rows.map { ($0["text"], $0["added_at"]) }, count: try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM history") ?? 0)
    }

    private static func savedArticle(_ row: Row) throws -> JSONValue {
        try StoreResults.savedArticle(id: row["id"], url: row["url"], savedAt: row["saved_at"], article: row["article"])
    }

    private static func selection(_ db: Database, _ name: String) throws -> JSONValue? {
        try Row.fetchOne(db, sql: "SELECT value, selected_at, revision FROM selections WHERE name = ?", arguments: [name]).map { row in
            try StoreResults.selection(value: row["value"], selectedAt: row["selected_at"], revision: row["revision"])
        }
    }

    private func reading<T: Sendable>(_ body: @Sendable (Database) throws -> T) async throws -> T {
        try await writer.read(body)
    }
}
