import BusProtocol
import Foundation
import GRDB
public import Storage
#if canImport(Glibc)
import Glibc
#endif

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

    public init(path: String = "data/store.sqlite", historyLimit: Int = 100, maxSizeBytes: Int? = nil, replyWindow: Duration = .seconds(600),
                postgres: PostgresSettings? = nil) {
        self.path = path
        self.postgres = postgres
        self.historyLimit = historyLimit
        self.maxSizeBytes = maxSizeBytes
        self.replyWindow = replyWindow
    }
}

/// The store's SQLite schema (the file is opened by ``SQLiteWriter``).
enum StoreDatabase {
    /// The schema, one migration per version. Never edit a shipped migration: add one.
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
}
