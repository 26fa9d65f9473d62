import BusProtocol
import Foundation
import GRDB
public import Storage

/// Where the store keeps its database and how big it may grow.
public struct StoreConfiguration: Sendable, Equatable {
    /// The SQLite file; its folder is created when missing.
    public var path: String = "data/store.sqlite"
    /// A PostgreSQL database instead of the SQLite file (nil: SQLite, the default).
    public var postgres: PostgresSettings?
    /// How many history entries are kept; the oldest are dropped beyond it.
    public var historyLimit = 100
    /// The largest the database may grow, in bytes (nil: no limit). Beyond it, writes fail
    /// with "full", as they would on a full disk.
    public var maxSizeBytes: Int?
    /// How long the result of each write is kept with it, so that a request sent again
    /// (after a failover) is answered with it instead of being written twice.
    public var replyWindow: Duration = .seconds(600)
    /// How long a store process waits for another one sharing its database to finish
    /// publishing (``StoreDatabase/publishing``) before it logs that it cannot publish yet
    /// and tries again: far longer than a publication takes, so only a process stopped
    /// while it held the lock makes it wait so long.
    public var publishingWait: Duration = .seconds(60)

    public init(path: String = "data/store.sqlite", historyLimit: Int = 100, maxSizeBytes: Int? = nil, replyWindow: Duration = .seconds(600),
                postgres: PostgresSettings? = nil) {
        self.path = path
        self.postgres = postgres
        self.historyLimit = historyLimit
        self.maxSizeBytes = maxSizeBytes
        self.replyWindow = replyWindow
    }
}

/// The store's data in a SQLite file or a PostgreSQL database (``ServiceDatabase``): its
/// schema in each engine, and each write and read in SQL both engines run.
///
/// Several store processes may share one PostgreSQL database: a write that reads before it
/// changes (the history's order, a selection's revision) first takes its table's advisory
/// lock (``SQLSession/lockAll(_:)``), so two of them never interleave; SQLite has one writer
/// at a time already.
enum StoreDatabase {
    static var schema: DatabaseSchema {
        DatabaseSchema(sqlite: migrator, postgres: postgresMigrations, postgresSchema: nil, postgresLock: 7_214_021)
    }

    /// The lock under which store processes publish one at a time (``ServiceDatabase/alone(_:_:)``).
    static let publishing = (name: "publishing", key: Int64(7_214_022))
    /// The advisory locks of the writes that read before they change, one per table.
    private static let historyLock: Int64 = 7_214_023, selectionsLock: Int64 = 7_214_025

    /// SQLite's schema, one migration per version. Never edit a shipped migration: add one.
    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            // `id` grows with every insert, so it orders entries by when they were (re-)added.
            try db.execute(sql: """
                CREATE TABLE history (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    text TEXT NOT NULL UNIQUE,
                    added_at REAL NOT NULL
                );
                CREATE TABLE articles (
                    url TEXT PRIMARY KEY,
                    id TEXT NOT NULL UNIQUE,
                    saved_seq INTEGER NOT NULL,
                    saved_at REAL NOT NULL,
                    article TEXT NOT NULL
                );
                CREATE INDEX articles_by_seq ON articles(saved_seq);
                CREATE TABLE selections (
                    name TEXT PRIMARY KEY,
                    value TEXT NOT NULL,
                    selected_at REAL NOT NULL
                );
                CREATE TABLE snapshots (
                    name TEXT PRIMARY KEY,
                    body BLOB NOT NULL,
                    version TEXT NOT NULL,
                    origin TEXT NOT NULL,
                    fetched_at REAL NOT NULL,
                    stored_at REAL NOT NULL
                );
                """)
        }
        migrator.registerMigration("v2: remembered replies") { db in
            // The result of each write, by request (its client's id and JSON-RPC id), written
            // in the write's own transaction: a request sent again finds it.
            try SQLiteWriter.createRepliesTable(db)
        }
        migrator.registerMigration("v3: selection revisions") { db in
            // Each selection counts its changes: a chooser may replace it only at the revision it saw.
            try db.execute(sql: "ALTER TABLE selections ADD COLUMN revision INTEGER NOT NULL DEFAULT 1")
        }
        return migrator
    }

    /// PostgreSQL's, in the connection's default schema, one per version. Never edit a
    /// shipped migration: add one. (`articles_saved_seq` is no longer used: an article's
    /// sequence is the largest one plus one, on both engines.)
    static let postgresMigrations: [String] = [
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
        PostgresWriter.repliesTable,
        "ALTER TABLE selections ADD COLUMN revision BIGINT NOT NULL DEFAULT 1;",
    ]

    // MARK: Writes

    /// The SQL of each write.
    static func apply(_ write: StoreWrite) -> @Sendable (any SQLSession) throws -> JSONValue {
        switch write {
        case .historyAdd(let text, let limit):
            return { db in
                let now = Date()
                // Re-adding moves the entry to the top: a new row gets the next id.
                try db.lockAll(historyLock)
                try db.execute("DELETE FROM history WHERE text = ?", [text])
                try db.execute("INSERT INTO history (text, added_at) VALUES (?, ?)", [text, now.timeIntervalSince1970])
                try db.execute("DELETE FROM history WHERE id NOT IN (SELECT id FROM history ORDER BY id DESC LIMIT ?)", [limit])
                return StoreResults.historyAdded(text: text, at: now, count: try db.int("SELECT COUNT(*) FROM history") ?? 0)
            }
        case .historyClear:
            return { db in StoreResults.cleared(try db.execute("DELETE FROM history", [])) }
        case .articleSave(let url, let id, let article):
            return { db in
                let now = Date()
                // Inserted, or (its URL saved before) updated: either way it moves to the top.
                // Each statement decides alone, so saves run side by side; two at the same
                // moment may share a sequence (the list orders those by URL).
                let sequence = "(SELECT COALESCE(MAX(saved_seq), 0) + 1 FROM articles)"
                let created = try db.execute("""
                    INSERT INTO articles (url, id, saved_seq, saved_at, article) VALUES (?, ?, \(sequence), ?, ?) ON CONFLICT (url) DO NOTHING
                    """, [url, id, now.timeIntervalSince1970, article]) > 0
                if !created {
                    try db.execute("UPDATE articles SET saved_seq = \(sequence), saved_at = ?, article = ? WHERE url = ?",
                                   [now.timeIntervalSince1970, article, url])
                }
                return StoreResults.articleSaved(id: id, url: url, at: now, created: created)
            }
        case .articleDelete(let url, let id):
            return { db in
                let deleted = try db.execute("DELETE FROM articles WHERE url = ?", [url])
                return StoreResults.articleDeleted(url: url, id: id, deleted: deleted > 0)
            }
        case .select(let chosen, let value, let expected):
            let name = chosen.rawValue
            return { db in
                // The revision read here is the one replaced: no other writer of selections
                // runs meanwhile.
                try db.lockAll(selectionsLock)
                if let expected {
                    let current = try selection(db, name)
                    guard (current?["revision"]?.intValue ?? 0) == expected else { throw StoreResults.selectionConflict(chosen, current: current, expected: expected) }
                }
                try db.execute("""
                    INSERT INTO selections (name, value, selected_at, revision) VALUES (?, ?, ?, 1)
                    ON CONFLICT (name) DO UPDATE SET value = excluded.value, selected_at = excluded.selected_at, revision = selections.revision + 1
                    """, [name, value, Date().timeIntervalSince1970])
                return try selection(db, name) ?? .null
            }
        case .snapshotPut(let name, let body, let version, let origin, let fetchedAt):
            return { db in
                // A retried or late put never replaces a copy fetched later.
                let stored = try db.execute("""
                    INSERT INTO snapshots (name, body, version, origin, fetched_at, stored_at) VALUES (?, ?, ?, ?, ?, ?)
                    ON CONFLICT (name) DO UPDATE SET body = excluded.body, version = excluded.version, origin = excluded.origin,
                        fetched_at = excluded.fetched_at, stored_at = excluded.stored_at
                    WHERE excluded.fetched_at >= snapshots.fetched_at
                    """, [name, [UInt8](body), version, origin, fetchedAt, Date().timeIntervalSince1970]) > 0
                let current = try db.texts("SELECT version FROM snapshots WHERE name = ?", [name]).first ?? version
                return StoreResults.snapshotStored(name: name, stored: stored, version: current, size: body.count)
            }
        }
    }

    // MARK: Reads

    /// nil: nothing there (no such snapshot, no selection yet, no such article).
    static func read(_ read: StoreRead, _ db: any SQLSession) throws -> JSONValue? {
        switch read {
        case .history(let limit):
            let rows = try db.rows("SELECT text, added_at FROM history ORDER BY id DESC LIMIT ?", [limit])
            return StoreResults.history(try rows.map { (try $0.text("text"), try $0.double("added_at")) },
                                        count: try db.int("SELECT COUNT(*) FROM history") ?? 0)
        case .articles(let offset, let limit):
            let rows = try db.rows("SELECT id, url, saved_at, article FROM articles ORDER BY saved_seq DESC, url DESC LIMIT ? OFFSET ?", [limit, offset])
            return StoreResults.articles(try rows.map(savedArticle), total: try db.int("SELECT COUNT(*) FROM articles") ?? 0, offset: offset)
        case .article(let id):
            return try db.row("SELECT id, url, saved_at, article FROM articles WHERE id = ?", [id]).map(savedArticle)
        case .selection(let chosen):
            return try selection(db, chosen.rawValue)
        case .snapshot(let name):
            return try db.row("SELECT body, version, origin, fetched_at FROM snapshots WHERE name = ?", [name]).map { row in
                StoreResults.snapshot(name: name, body: Data(try row.blob("body")), version: try row.text("version"), origin: try row.text("origin"),
                                      fetchedAt: try row.double("fetched_at"))
            }
        case .snapshots:
            return .array(try db.rows("SELECT name, version, origin, fetched_at, length(body) AS size FROM snapshots ORDER BY name", []).map { row in
                StoreResults.snapshotEntry(name: try row.text("name"), version: try row.text("version"), origin: try row.text("origin"),
                                           fetchedAt: try row.double("fetched_at"), size: try row.int("size"))
            })
        }
    }

    /// Every saved article's id (to publish them all).
    static func articleIDs(_ db: any SQLSession) throws -> [String] {
        try db.texts("SELECT id FROM articles", [])
    }

    private static func savedArticle(_ row: SQLRow) throws -> JSONValue {
        try StoreResults.savedArticle(id: try row.text("id"), url: try row.text("url"), savedAt: try row.double("saved_at"), article: try row.text("article"))
    }

    private static func selection(_ db: any SQLSession, _ name: String) throws -> JSONValue? {
        try db.row("SELECT value, selected_at, revision FROM selections WHERE name = ?", [name]).map { row in
            try StoreResults.selection(value: try row.text("value"), selectedAt: try row.double("selected_at"), revision: try row.int("revision"))
        }
    }
}
