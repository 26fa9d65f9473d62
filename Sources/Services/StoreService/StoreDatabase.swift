import BusProtocol
import Foundation
import GRDB
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

/// Opens the SQLite database: WAL mode, `synchronous = FULL` (a commit is on disk before it
/// returns, which is what lets the store acknowledge a write only once it is durable), a
/// busy timeout so several store processes can share one file, and the schema migrations.
///
/// The users' data is theirs alone: a folder the store makes is 0700, and the database is
/// 0600 from the moment it exists (SQLite gives its -wal and -shm files the database's
/// mode); a database an older version left readable to others is made 0600 too.
enum StoreDatabase {
    static func open(_ configuration: StoreConfiguration) throws -> DatabasePool {
        let url = URL(fileURLWithPath: configuration.path)
        let folder = url.deletingLastPathComponent()
        do {
            try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw StorageFailure(reason: "cannot-open", detail: "cannot create the folder \(folder.path): \(StorageFailure.systemMessage(error))",
                                 path: configuration.path)
        }
        let descriptor = Glibc.open(url.path, O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        if descriptor >= 0 {
            for file in [url.path, url.path + "-wal", url.path + "-shm"] { chmod(file, 0o600) }
            close(descriptor)
        }
        var config = Configuration()
        config.label = "store"
        config.busyMode = .timeout(10)
        let maxPages = configuration.maxSizeBytes.map { max(1, $0 / 4096) }
        config.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = FULL")
            if let maxPages { try db.execute(sql: "PRAGMA max_page_count = \(maxPages)") }
        }
        let pool = try DatabasePool(path: url.path, configuration: config)
        try migrator.migrate(pool)
        return pool
    }

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
            try db.execute(sql: """
                CREATE TABLE replies (
                    request TEXT PRIMARY KEY,
                    result BLOB NOT NULL,
                    written_at REAL NOT NULL
                );
                CREATE INDEX replies_by_time ON replies(written_at);
                """)
        }
        migrator.registerMigration("v3: selection revisions") { db in
            // Each selection counts its changes: a chooser may replace it only at the revision it saw.
            try db.execute(sql: "ALTER TABLE selections ADD COLUMN revision INTEGER NOT NULL DEFAULT 1")
        }
        return migrator
    }
}

/// A storage failure as the store's callers see it: -32007 with the reason and the path,
/// e.g. "store: the database is read-only (/var/lib/switchboard/store.sqlite)".
struct StorageFailure: Error, Sendable {
    /// One of read-only, full, corrupt, io, cannot-open, busy, other.
    let reason: String
    let detail: String
    let path: String

    init(reason: String, detail: String, path: String) {
        (self.reason, self.detail, self.path) = (reason, detail, path)
    }

    init(_ error: any Error, path: String) {
        if let failure = error as? StorageFailure {
            self = failure
            return
        }
        self.path = path
        guard let error = error as? DatabaseError else {
            reason = "other"
            detail = Self.systemMessage(error)
            return
        }
        switch error.resultCode {
        case .SQLITE_READONLY, .SQLITE_PERM: (reason, detail) = ("read-only", "the database is read-only")
        case .SQLITE_FULL: (reason, detail) = ("full", "the disk or the database's size limit is full")
        case .SQLITE_CORRUPT, .SQLITE_NOTADB: (reason, detail) = ("corrupt", "the database file is corrupt or not a database")
        case .SQLITE_IOERR: (reason, detail) = ("io", "a disk I/O error occurred")
        case .SQLITE_CANTOPEN: (reason, detail) = ("cannot-open", "the database file cannot be opened")
        case .SQLITE_BUSY, .SQLITE_LOCKED: (reason, detail) = ("busy", "the database stayed locked by another process")
        default: (reason, detail) = ("other", error.message ?? "\(error)")
        }
    }

    /// The operating system's one-line reason ("Not a directory") rather than Foundation's
    /// dump of an error's domain, code and user info.
    static func systemMessage(_ error: any Error) -> String {
        let error = error as NSError
        for candidate in [error, error.userInfo[NSUnderlyingErrorKey] as? NSError].compactMap({ $0 }) where candidate.domain == NSPOSIXErrorDomain {
            return String(cString: strerror(Int32(candidate.code)))
        }
        return error.localizedDescription
    }

    var rpcError: JSONRPCError {
        JSONRPCError(code: JSONRPCError.storageFailedCode, message: "Storage failed: \(detail) (\(path))",
                     data: ["reason": .string(reason), "path": .string(path)])
    }
}
