package import BusProtocol
import SwitchboardConfig
import Foundation
package import GRDB
package import Logging
#if canImport(Glibc)
import Glibc
#endif

/// A durable service's SQLite file (GRDB): what the store and the streams service both
/// write through.
///
/// A write is answered only after its transaction is on disk (WAL, `synchronous = FULL`).
/// Writes that arrive together share one transaction and one fsync (``GroupCommit``), each in
/// its own savepoint so one bad write does not fail the others.
///
/// A write named by its request (``RequestKey``'s text) keeps its result in the `replies`
/// table in the same transaction as its effect, and a request kept before gets the result
/// it had, with no second effect: that is what makes a re-sent request run once, even on
/// processes sharing one file. Results older than the reply window are deleted now and then.
///
/// When the database cannot be opened, every call fails with the reason, and opening is
/// tried again at most once a second.
package actor SQLiteWriter {
    /// What a write does in its transaction: its result, as answered and remembered.
    package typealias Apply = @Sendable (Database) throws -> JSONValue

    package let path: String
    private let label: String
    private let maxSizeBytes: Int?
    private let migrator: DatabaseMigrator
    private let logger: Logger
    private var database: DatabasePool?
    /// Why the database could not be opened, and when that was last tried.
    private var openFailure: (failure: StorageFailure, at: ContinuousClock.Instant)?
    /// The writes that arrive while a batch is being committed wait for the next (group commit).
    private let writes = GroupCommit<Apply, JSONValue>()
    /// When remembered results older than the reply window are deleted.
    private var pruning: ReplyPruning

    /// Opens the database now; when that fails, the reason is logged and every call answers
    /// it. `migrator`'s schema must hold ``createRepliesTable(_:)``'s table.
    package init(path: String, label: String, maxSizeBytes: Int?, migrator: DatabaseMigrator, replyWindow: Duration, logger: Logger) {
        (self.path, self.label, self.maxSizeBytes, self.migrator, self.logger) = (path, label, maxSizeBytes, migrator, logger)
        pruning = ReplyPruning(window: replyWindow)
        do {
            database = try Self.open(path: path, label: label, maxSizeBytes: maxSizeBytes, migrator: migrator)
        } catch {
            let failure = StorageFailure(error, path: path)
            openFailure = (failure, .now)
            logger.error("cannot open the database", metadata: ["path": "\(path)", "problem": "\(failure.detail)"])
        }
    }

    /// The results of named writes, by request: a request sent again finds its result here.
    /// Shipped migrations call it: never change it (add a migration instead).
    package static func createRepliesTable(_ db: Database) throws {
        try db.execute(sql: """
            CREATE TABLE replies (
                request TEXT PRIMARY KEY,
                result BLOB NOT NULL,
                written_at REAL NOT NULL
            );
            CREATE INDEX replies_by_time ON replies(written_at);
            """)
    }

    /// Keeps each result as its request's, in the transaction of the requests' effects.
    package static func remember(_ db: any SQLSession, _ results: [(request: String, result: JSONValue)]) throws {
        guard !results.isEmpty else { return }
        let now = Date().timeIntervalSince1970
        try db.execute("INSERT OR REPLACE INTO replies (request, result, written_at) VALUES " + SQLRows.placeholders(rows: results.count, columns: 3),
                       results.flatMap { request, result -> [any SQLArgument] in [request, result.jsonBytes, now] })
    }

    // MARK: Writes

    /// Runs `apply` in the next committed batch and answers its result once that is on disk;
    /// for a `request` already written, the result it had (and `apply` does not run).
    package func write(request: String?, _ apply: @escaping Apply) async throws -> JSONValue {
        let applyAndRemember: Apply = { db in
            // Checked again in the transaction: another process on the same file may have
            // written the same request since (each writes alone, so one sees it).
            if let request, let remembered = try Data.fetchOne(db, sql: "SELECT result FROM replies WHERE request = ?", arguments: [request]) {
                return try JSONValue(parsing: Array(remembered))
            }
            let result = try apply(db)
            if let request { try Self.remember(db, [(request, result)]) }
            return result
        }
        let database = try openDatabase()
        return try await writes.submit(applyAndRemember) { applies in await self.commit(applies, database) }
    }

    /// One transaction for `applies`, each in its own savepoint: a failed savepoint is rolled
    /// back alone and fails its write; a failure that ends the transaction fails them all.
    private func commit(_ applies: [Apply], _ database: DatabasePool) async -> [Result<JSONValue, any Error>] {
        let forgetBefore = pruning.forgetBefore()
        do {
            let outcomes = try await database.write { db in
                if let forgetBefore { try db.execute(sql: "DELETE FROM replies WHERE written_at < ?", arguments: [forgetBefore]) }
                var outcomes: [Result<JSONValue, any Error>] = []
                for apply in applies {
                    var value = JSONValue.null
                    do {
                        try db.inSavepoint {
                            value = try apply(db)
                            return .commit
                        }
                        outcomes.append(.success(value))
                    } catch {
                        guard db.isInsideTransaction else { throw error }
                        outcomes.append(.failure(error))
                    }
                }
                return outcomes
            }
            return outcomes.map { outcome in outcome.mapError { error in error as? JSONRPCError ?? StorageFailure(error, path: path).rpcError } }
        } catch {
            let failure = StorageFailure(error, path: path)
            logger.error("write failed", metadata: ["problem": "\(failure.detail)", "writes": "\(applies.count)"])
            return applies.map { _ in .failure(failure.rpcError) }
        }
    }

    /// Gives the database's free pages back to the disk: what deleted rows left is otherwise
    /// kept in the file for later rows. 16 MB a transaction, so writes go on between them;
    /// then a checkpoint that copies the write-ahead log into the file, which is when the file
    /// is cut, and empties the log, which the deletes grew (SQLite overwrites what it deletes
    /// where it is built with `SECURE_DELETE`, as Debian's is). The checkpoint waits for the
    /// reads under way only a moment, not the busy timeout: every write waits with it. Where a
    /// read still needs what the log holds past that, it copies what it can, and a later
    /// checkpoint (SQLite's own, after a write) does the rest.
    /// A file made without auto-vacuum (``open(path:label:maxSizeBytes:migrator:)``) gives
    /// nothing back.
    package func giveBackFreePages() async throws {
        let incremental = 2
        guard try read({ db in try Int.fetchOne(db, sql: "PRAGMA auto_vacuum") }) == incremental else { return }
        let database = try openDatabase()
        var free = Int.max
        while free > 0 {
            let left = try await database.write { db in
                try db.execute(sql: "PRAGMA incremental_vacuum(\(Self.pagesGivenBackAtOnce))")
                return try Int.fetchOne(db, sql: "PRAGMA freelist_count") ?? 0
            }
            // Writes meanwhile may free pages as fast as they are given back: no turn without progress.
            guard left < free else { break }
            free = left
        }
        try await database.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA busy_timeout = 100")
            defer { try? db.execute(sql: "PRAGMA busy_timeout = \(Self.busyTimeoutMilliseconds)") }
            do {
                _ = try db.checkpoint(.truncate)
            } catch let error as DatabaseError where error.resultCode == .SQLITE_BUSY {
                // A read needs the log still; what could be copied was.
            }
        }
    }

    /// Pages ``giveBackFreePages()`` gives back a transaction (of 4 kB).
    static let pagesGivenBackAtOnce = 4_096

    // MARK: Reads

    /// Runs `body` in a read on the calling thread: a read takes microseconds, less than the
    /// two thread hops of GRDB's async `read`. A failure is answered as -32007.
    package func read<T: Sendable>(_ body: @Sendable (Database) throws -> T) throws -> T {
        let database = try openDatabase()
        do {
            return try database.read(body)
        } catch let error as JSONRPCError {
            throw error
        } catch {
            throw StorageFailure(error, path: path).rpcError
        }
    }

    /// The result kept for `request`, if any.
    package func remembered(_ request: String) throws -> [UInt8]? {
        try read { db in
            try Data.fetchOne(db, sql: "SELECT result FROM replies WHERE request = ?", arguments: [request]).map { Array($0) }
        }
    }

    // MARK: Opening

    private func openDatabase() throws -> DatabasePool {
        if let database { return database }
        if let openFailure, ContinuousClock.now - openFailure.at < .seconds(1) {
            throw openFailure.failure.rpcError
        }
        do {
            let opened = try Self.open(path: path, label: label, maxSizeBytes: maxSizeBytes, migrator: migrator)
            database = opened
            openFailure = nil
            logger.info("database opened", metadata: ["path": "\(path)"])
            return opened
        } catch {
            let failure = StorageFailure(error, path: path)
            openFailure = (failure, .now)
            throw failure.rpcError
        }
    }

    /// Opens the file: WAL mode, `synchronous = FULL` (a commit is on disk before it returns,
    /// which is what lets a service acknowledge a write only once it is durable), a busy
    /// timeout so several processes can share one file, at most `maxSizeBytes` (beyond it
    /// writes fail with "full", as on a full disk), the write-ahead log cut back to
    /// ``writeAheadLogLimit`` after each checkpoint, and the schema migrations.
    ///
    /// Processes that share the file open it one at a time, under an exclusive `flock` of the
    /// file `PATH.opening` beside it: a kernel pair's two services start together on a new
    /// file, and SQLite's busy timeout covers neither turning WAL on (refused as locked at
    /// once) nor the migrator, which reads what was applied before its transaction and would
    /// make a table the other just made.
    ///
    /// Nothing here opens the database file itself while SQLite may have it open: closing any
    /// descriptor of a file drops every `fcntl` lock the process holds on it, SQLite's among
    /// them. Another process closing the file (the old one of a rolling restart) would then
    /// take itself for its last user and delete the -wal and -shm this one goes on writing
    /// to, apart from the file: its writes lost, the file's pages mixed.
    ///
    /// The users' data is theirs alone: a folder made here is 0700, and the database is 0600
    /// from the moment it exists (made so before SQLite opens it; SQLite gives its -wal and
    /// -shm files the database's mode); a database an older version left readable to others
    /// is made 0600 too.
    package static func open(path: String, label: String, maxSizeBytes: Int?, migrator: DatabaseMigrator) throws -> DatabasePool {
        let url = URL(fileURLWithPath: path)
        try makeFolder(for: path)
        // Made only when it does not exist yet (O_EXCL), so no connection of this process has it open.
        let creation = Glibc.open(url.path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0o600)
        let made = creation >= 0
        if made { close(creation) }
        for file in [url.path, url.path + "-wal", url.path + "-shm"] { chmod(file, 0o600) }
        let descriptor = Glibc.open(url.path + ".opening", O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        defer { if descriptor >= 0 { close(descriptor) } }
        // A folder this process cannot write to: no other writer either, and SQLite says why it cannot open the file.
        if descriptor >= 0 { try lockForOpening(descriptor, path: path) }
        var config = Configuration()
        config.label = label
        config.busyMode = .timeout(TimeInterval(busyTimeoutMilliseconds) / 1000)
        let maxPages = maxSizeBytes.map { max(1, $0 / 4096) }
        config.prepareDatabase { db in
            // Free pages can be given back to the disk (``giveBackFreePages()``). SQLite takes
            // the setting only on a new file, before its first table and before WAL mode (which
            // the pool turns on after this), and from the pool's writer: its readers may not
            // write. A file made without it keeps its free pages for later rows.
            if made, !db.configuration.readonly { try db.execute(sql: "PRAGMA auto_vacuum = INCREMENTAL") }
            try db.execute(sql: "PRAGMA synchronous = FULL")
            try db.execute(sql: "PRAGMA journal_size_limit = \(writeAheadLogLimit)")
            if let maxPages { try db.execute(sql: "PRAGMA max_page_count = \(maxPages)") }
        }
        let pool = try DatabasePool(path: url.path, configuration: config)
        try migrator.migrate(pool)
        return pool
    }

    /// How long a write waits for another process's write to end before it fails as busy.
    static let busyTimeoutMilliseconds = 10_000

    /// The size the write-ahead log (the -wal file) is cut back to once a checkpoint has
    /// copied it into the database. SQLite otherwise keeps the file as large as it ever grew
    /// and writes over it from the start: one large transaction (a big purge, a burst of
    /// large messages) would hold that much disk for good, outside `maxSizeBytes`. Twice
    /// SQLite's automatic checkpoint (1000 pages), so a file in steady use is not cut and
    /// grown again at every checkpoint.
    package static let writeAheadLogLimit = 8 * 1024 * 1024

    /// Makes the folder of the database at `path` (0700) when it is missing.
    package static func makeFolder(for path: String) throws(StorageFailure) {
        let folder = URL(fileURLWithPath: path).deletingLastPathComponent()
        do {
            try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw StorageFailure(reason: "cannot-open", detail: "cannot create the folder \(folder.path): \(systemReason(error))", path: path)
        }
    }

    /// Checked before a service starts on the database at `path`: what would keep it from
    /// ever opening it (its folder cannot be made; a folder stands where the file should be).
    /// A file it may only read is not refused: a service on it answers reads.
    package static func checkPlace(for path: String) throws(StorageFailure) {
        try makeFolder(for: path)
        var isFolder: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isFolder), isFolder.boolValue else { return }
        throw StorageFailure(reason: "cannot-open", detail: "the database file cannot be opened" + StorageFailure.whyNotOpened(path), path: path)
    }

    /// How long an opener waits for another process to finish opening the file: as long as a
    /// write waits for another's transaction (the busy timeout).
    static let openingWait = Duration.milliseconds(busyTimeoutMilliseconds)

    /// Takes the exclusive lock the openers of one file take in turn (closing `descriptor`
    /// lets it go); waits at most ``openingWait``, then fails naming the file.
    private static func lockForOpening(_ descriptor: Int32, path: String) throws {
        let deadline = ContinuousClock.now + openingWait
        while flock(descriptor, LOCK_EX | LOCK_NB) != 0 {
            let code = errno
            guard code == EWOULDBLOCK || code == EINTR else {
                throw StorageFailure(reason: "cannot-open", detail: "cannot lock \(path) to open it: \(String(cString: strerror(code)))", path: path)
            }
            guard ContinuousClock.now < deadline else {
                throw StorageFailure(reason: "cannot-open",
                                     detail: "another process has been opening \(path) for \(openingWait.formatted): still locked", path: path)
            }
            usleep(10_000)
        }
    }
}
