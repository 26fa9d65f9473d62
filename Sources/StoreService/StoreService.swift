public import BusKit
import BusProtocol
import Foundation
import GRDB
public import Logging
public import ContractKit
import Contracts

/// The `store` service: search history, saved articles, the news-source and route
/// selections, and the fetcher's last good copy of each dataset, in one SQLite database.
///
/// A write is answered only after its transaction is on disk (WAL, `synchronous = FULL`).
/// Writes that arrive together share one transaction and one fsync (group commit), each in
/// its own savepoint so one bad write does not fail the others. Each write's result is kept
/// with it, in the same savepoint, under the request's key: a request sent again (the kernel
/// re-sends one whose worker died; a client one it sent to a kernel that failed over) is
/// answered with that result and written once.
///
/// After a change, the matching CHP keys are published through the kernel (coalesced: a
/// burst of writes publishes each key once, with the value as it is after the burst).
public actor StoreService: BusService, ServiceWork {
    public static let name = StoreAPI.service

    public nonisolated let configuration: StoreConfiguration
    let logger: Logger
    private var database: DatabasePool?
    /// Why the database could not be opened, and when that was last tried.
    private var openFailure: (failure: StorageFailure, at: ContinuousClock.Instant)?

    private var pendingWrites: [PendingWrite] = []
    private var flushing = false
    /// When remembered results older than the window were last deleted.
    private var lastPruned = ContinuousClock.now

    private var publisher: StatePublisher?
    private var dirtyKeys: Set<String> = []
    private var publishTask: Task<Void, Never>?

    /// Where changes are published from ``start()`` on (nil: nowhere, for tests).
    private let statePublisher: StatePublisher?

    /// Opens the database now; when that fails the service still starts and answers every
    /// request with the reason (-32007), trying to open again at most once a second.
    public init(configuration: StoreConfiguration, logger: Logger? = nil, publisher: StatePublisher? = nil) {
        self.configuration = configuration
        statePublisher = publisher
        let logger = logger ?? Logger(label: "switchboard.store")
        self.logger = logger
        do {
            database = try StoreDatabase.open(configuration)
        } catch {
            let failure = StorageFailure(error, path: configuration.path)
            openFailure = (failure, .now)
            logger.error("cannot open the database", metadata: ["path": "\(configuration.path)", "problem": "\(failure.detail)"])
        }
    }

    /// Publishes every key, then each change from now on.
    public func start() async {
        await republish()
    }

    /// Publishes every key again (the kernel may be new: after it restarted).
    public func republish() async {
        guard let statePublisher else { return }
        publisher = statePublisher
        await markEverythingChanged()
    }

    /// Stops publishing (at shutdown).
    public func stop() {
        publishTask?.cancel()
        publishTask = nil
        publisher = nil
    }

    /// Results live in the database, beside the effects they answer for.
    public nonisolated func makeReplyMemory() -> any ReplyMemory { StoredReplies(store: self) }

    /// The result a write under `key` had, if it is remembered.
    func rememberedResult(_ key: RequestKey) async throws -> [UInt8]? {
        try await read { db in
            try Data.fetchOne(db, sql: "SELECT result FROM replies WHERE request = ?", arguments: [key.description]).map { Array($0) }
        }
    }

    // MARK: Methods

    public nonisolated func methods(_ table: inout MethodTable<StoreService>) {
        table.on(StoreAPI.historyAdd) { store, params in try await store.historyAdd(params.text) }
        table.on(StoreAPI.historyList) { store, params in try await store.historyList(limit: params.limit) }
        table.on(StoreAPI.historyClear) { store, _ in try await store.historyClear() }
        table.on(StoreAPI.articlesSave) { store, params in try await store.articlesSave(params.article) }
        table.on(StoreAPI.articlesList) { store, params in try await store.articlesList(offset: params.offset, limit: params.limit) }
        table.on(StoreAPI.articlesDelete) { store, params in try await store.articlesDelete(params.url) }
        table.on(StoreAPI.sourcesSelect) { store, params in try await store.sourcesSelect(params.ids) }
        table.on(StoreAPI.sourcesSelected) { store, _ in try await store.sourcesSelected() }
        table.on(StoreAPI.routeSelect) { store, params in try await store.routeSelect(params.outboundId, params.inboundId) }
        table.on(StoreAPI.routeSelected) { store, _ in try await store.routeSelected() }
        table.on(StoreAPI.snapshotsPut) { store, params in try await store.snapshotsPut(params) }
        table.on(StoreAPI.snapshotsGet) { store, params in try await store.snapshotsGet(params.name) }
        table.on(StoreAPI.snapshotsList) { store, _ in try await store.snapshotsList() }
    }

    // MARK: History

    static let maxTextLength = 1_000

    func historyAdd(_ raw: String) async throws -> JSONValue {
        let text = raw.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !text.isEmpty else { throw JSONRPCError.invalidParams(field: "text", "must not be empty or only whitespace") }
        guard text.count <= Self.maxTextLength else {
            throw JSONRPCError.invalidParams(field: "text", "must be at most \(Self.maxTextLength) characters")
        }
        let limit = configuration.historyLimit
        return try await write(changing: [Keys.history]) { db in
            let now = Date()
            // Re-adding moves the entry to the top: a new row gets the next id.
            try db.execute(sql: "DELETE FROM history WHERE text = ?", arguments: [text])
            try db.execute(sql: "INSERT INTO history (text, added_at) VALUES (?, ?)", arguments: [text, now.timeIntervalSince1970])
            try db.execute(sql: "DELETE FROM history WHERE id NOT IN (SELECT id FROM history ORDER BY id DESC LIMIT ?)",
                           arguments: [limit])
            let count = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM history") ?? 0
            return ["text": .string(text), "addedAt": .string(Timestamp.format(now)), "count": .int(Int64(count))]
        }
    }

    func historyList(limit: Int?) async throws -> JSONValue {
        let limit = try Validate.limit(limit, default: configuration.historyLimit, max: configuration.historyLimit)
        return try await read { db in try Self.history(db, limit: limit) }
    }

    func historyClear() async throws -> JSONValue {
        try await write(changing: [Keys.history]) { db in
            try db.execute(sql: "DELETE FROM history")
            return ["cleared": .int(Int64(db.changesCount))]
        }
    }

    static func history(_ db: Database, limit: Int) throws -> JSONValue {
        let rows = try Row.fetchAll(db, sql: "SELECT text, added_at FROM history ORDER BY id DESC LIMIT ?", arguments: [limit])
        let entries: [JSONValue] = rows.map { row in
            ["text": .string(row["text"]), "addedAt": .string(Timestamp.format(seconds: row["added_at"]))]
        }
        let count = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM history") ?? 0
        return ["entries": .array(entries), "count": .int(Int64(count))]
    }

    // MARK: Articles

    static let maxArticleBytes = 256 * 1024

    func articlesSave(_ article: JSONValue) async throws -> JSONValue {
        guard case .object(let fields) = article else { throw JSONRPCError.invalidParams(field: "article", "must be an object") }
        guard let url = fields["url"]?.stringValue else { throw JSONRPCError.invalidParams(field: "article.url", "is required (a string)") }
        try Validate.webURL(url, field: "article.url")
        if let title = fields["title"], title.stringValue == nil, !title.isNull {
            throw JSONRPCError.invalidParams(field: "article.title", "must be a string")
        }
        let text = article.jsonString
        guard text.utf8.count <= Self.maxArticleBytes else {
            throw JSONRPCError.tooLarge(text.utf8.count, limit: Self.maxArticleBytes)
        }
        let id = ArticleID.of(url)
        return try await write(changing: [Keys.article(id)]) { db in
            let now = Date()
            let created = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM articles WHERE url = ?", arguments: [url]) == 0
            try db.execute(sql: """
                INSERT INTO articles (url, id, saved_seq, saved_at, article)
                VALUES (?, ?, (SELECT IFNULL(MAX(saved_seq), 0) + 1 FROM articles), ?, ?)
                ON CONFLICT(url) DO UPDATE SET saved_seq = excluded.saved_seq, saved_at = excluded.saved_at, article = excluded.article
                """, arguments: [url, id, now.timeIntervalSince1970, text])
            return ["id": .string(id), "url": .string(url), "savedAt": .string(Timestamp.format(now)), "created": .bool(created)]
        }
    }

    func articlesList(offset: Int?, limit: Int?) async throws -> JSONValue {
        let offset = try Validate.offset(offset)
        let limit = try Validate.limit(limit, default: 100, max: 1_000)
        return try await read { db in
            let rows = try Row.fetchAll(db, sql: "SELECT id, url, saved_at, article FROM articles ORDER BY saved_seq DESC LIMIT ? OFFSET ?",
                                        arguments: [limit, offset])
            let total = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM articles") ?? 0
            return ["articles": .array(try rows.map(Self.savedArticle)), "total": .int(Int64(total)),
                    "offset": .int(Int64(offset))]
        }
    }

    func articlesDelete(_ url: String) async throws -> JSONValue {
        let id = ArticleID.of(url)
        return try await write(changing: [Keys.article(id)]) { db in
            try db.execute(sql: "DELETE FROM articles WHERE url = ?", arguments: [url])
            let deleted = db.changesCount > 0
            var result: [String: JSONValue] = ["deleted": .bool(deleted), "url": .string(url), "id": .string(id)]
            if !deleted { result["message"] = "no saved article has this URL" }
            return .object(result)
        }
    }

    static func savedArticle(_ row: Row) throws -> JSONValue {
        let text: String = row["article"]
        return ["id": .string(row["id"]), "url": .string(row["url"]),
                "savedAt": .string(Timestamp.format(seconds: row["saved_at"])),
                "article": try JSONValue(parsing: Array(text.utf8))]
    }

    static func article(_ db: Database, id: String) throws -> JSONValue? {
        try Row.fetchOne(db, sql: "SELECT id, url, saved_at, article FROM articles WHERE id = ?", arguments: [id]).map(savedArticle)
    }

    // MARK: Selections

    static let maxSources = 100

    func sourcesSelect(_ ids: [String]) async throws -> JSONValue {
        var unique: [String] = []
        for (index, id) in ids.enumerated() {
            let trimmed = id.trimmingCharacters(in: .whitespaces)
            guard !trimmed.isEmpty, trimmed.count <= 100 else {
                throw JSONRPCError.invalidParams(field: "ids[\(index)]", "must be a source id (1 to 100 characters)")
            }
            if !unique.contains(trimmed) { unique.append(trimmed) }
        }
        guard unique.count <= Self.maxSources else {
            throw JSONRPCError.invalidParams(field: "ids", "at most \(Self.maxSources) sources can be selected")
        }
        let value: JSONValue = .array(unique.map(JSONValue.string))
        return try await write(changing: [Keys.sourcesSelected]) { db in
            try Self.select(db, "sources", value)
            return try Self.selection(db, "sources") ?? .null
        }
    }

    func sourcesSelected() async throws -> JSONValue {
        try await read { db in try Self.selection(db, "sources") ?? ["ids": [], "selectedAt": nil] }
    }

    func routeSelect(_ outboundId: Int, _ inboundId: Int?) async throws -> JSONValue {
        guard outboundId >= 0 else { throw JSONRPCError.invalidParams(field: "outboundId", "must not be negative") }
        if let inboundId, inboundId < 0 { throw JSONRPCError.invalidParams(field: "inboundId", "must not be negative") }
        let value: JSONValue = ["outboundId": .int(Int64(outboundId)), "inboundId": inboundId.map { .int(Int64($0)) } ?? .null]
        return try await write(changing: [Keys.routeSelected]) { db in
            try Self.select(db, "route", value)
            return try Self.selection(db, "route") ?? .null
        }
    }

    /// The stored route, or null when none was ever selected.
    func routeSelected() async throws -> JSONValue {
        try await read { db in try Self.selection(db, "route") ?? .null }
    }

    static func select(_ db: Database, _ name: String, _ value: JSONValue) throws {
        try db.execute(sql: """
            INSERT INTO selections (name, value, selected_at) VALUES (?, ?, ?)
            ON CONFLICT(name) DO UPDATE SET value = excluded.value, selected_at = excluded.selected_at
            """, arguments: [name, value.jsonString, Date().timeIntervalSince1970])
    }

    /// A selection as answered and published: sources as `{ids, selectedAt}`, the route as
    /// `{outboundId, inboundId, selectedAt}`.
    static func selection(_ db: Database, _ name: String) throws -> JSONValue? {
        guard let row = try Row.fetchOne(db, sql: "SELECT value, selected_at FROM selections WHERE name = ?", arguments: [name]) else {
            return nil
        }
        let text: String = row["value"]
        let value = try JSONValue(parsing: Array(text.utf8))
        let selectedAt = JSONValue.string(Timestamp.format(seconds: row["selected_at"]))
        if case .object(var fields) = value {
            fields["selectedAt"] = selectedAt
            return .object(fields)
        }
        return ["ids": value, "selectedAt": selectedAt]
    }

    // MARK: Snapshots

    static let origins: Set<String> = ["remote", "cache", "bundled"]

    func snapshotsPut(_ params: StoreAPI.Snapshot) async throws -> JSONValue {
        let name = try Validate.datasetName(params.name)
        guard !params.version.isEmpty, params.version.count <= 200 else {
            throw JSONRPCError.invalidParams(field: "version", "must be 1 to 200 characters")
        }
        guard Self.origins.contains(params.origin) else {
            throw JSONRPCError.invalidParams(field: "origin", "must be one of remote, cache, bundled")
        }
        guard let fetchedAt = Timestamp.parse(params.fetchedAt) else {
            throw JSONRPCError.invalidParams(field: "fetchedAt", "must be an ISO 8601 time such as 2026-11-21T10:00:00Z")
        }
        let body = Data(params.body.utf8)
        return try await write(changing: []) { db in
            // A retried or late put never replaces a copy fetched later.
            try db.execute(sql: """
                INSERT INTO snapshots (name, body, version, origin, fetched_at, stored_at) VALUES (?, ?, ?, ?, ?, ?)
                ON CONFLICT(name) DO UPDATE SET body = excluded.body, version = excluded.version, origin = excluded.origin,
                    fetched_at = excluded.fetched_at, stored_at = excluded.stored_at
                WHERE excluded.fetched_at >= snapshots.fetched_at
                """, arguments: [name, body, params.version, params.origin, fetchedAt.timeIntervalSince1970, Date().timeIntervalSince1970])
            let stored = db.changesCount > 0
            let current = try String.fetchOne(db, sql: "SELECT version FROM snapshots WHERE name = ?", arguments: [name]) ?? params.version
            return ["name": .string(name), "stored": .bool(stored), "version": .string(current), "size": .int(Int64(body.count))]
        }
    }

    func snapshotsGet(_ rawName: String) async throws -> JSONValue {
        let name = try Validate.datasetName(rawName)
        let found = try await read { db -> JSONValue? in
            guard let row = try Row.fetchOne(db, sql: "SELECT body, version, origin, fetched_at FROM snapshots WHERE name = ?",
                                             arguments: [name]) else { return nil }
            let body: Data = row["body"]
            return ["name": .string(name), "body": .string(String(decoding: body, as: UTF8.self)), "version": .string(row["version"]),
                    "origin": .string(row["origin"]), "fetchedAt": .string(Timestamp.format(seconds: row["fetched_at"]))]
        }
        guard let found else {
            throw JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: no snapshot of '\(name)'", data: ["name": .string(name)])
        }
        return found
    }

    func snapshotsList() async throws -> JSONValue {
        try await read { db in
            let rows = try Row.fetchAll(db, sql: "SELECT name, version, origin, fetched_at, length(body) AS size FROM snapshots ORDER BY name")
            return .array(rows.map { row in
                ["name": .string(row["name"]), "version": .string(row["version"]), "origin": .string(row["origin"]),
                 "fetchedAt": .string(Timestamp.format(seconds: row["fetched_at"])), "size": .int(row["size"])]
            })
        }
    }

    // MARK: Reading and writing

    private func openDatabase() throws -> DatabasePool {
        if let database { return database }
        if let openFailure, ContinuousClock.now - openFailure.at < .seconds(1) {
            throw openFailure.failure.rpcError
        }
        do {
            let opened = try StoreDatabase.open(configuration)
            database = opened
            openFailure = nil
            logger.info("database opened", metadata: ["path": "\(configuration.path)"])
            return opened
        } catch {
            let failure = StorageFailure(error, path: configuration.path)
            openFailure = (failure, .now)
            throw failure.rpcError
        }
    }

    private func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        let database = try openDatabase()
        do {
            return try readNow(database, body)
        } catch let error as JSONRPCError {
            throw error
        } catch {
            throw StorageFailure(error, path: configuration.path).rpcError
        }
    }

    /// Reads on the calling thread: a read takes microseconds, less than the two thread
    /// hops of GRDB's async `read` (measured: see the README's store figures).
    private nonisolated func readNow<T>(_ database: DatabasePool, _ body: (Database) throws -> T) throws -> T {
        try database.read(body)
    }

    /// One write waiting for the next group commit.
    private struct PendingWrite: Sendable {
        let apply: @Sendable (Database) throws -> JSONValue
        let changing: [String]
        let continuation: CheckedContinuation<JSONValue, any Error>
    }

    /// Runs `apply` in the next group commit and returns its result once the commit is on
    /// disk; then marks `changing` for publication. The result is kept under the request's
    /// key (``RequestKey/current``) in the same savepoint as the write.
    private func write(changing keys: [String], _ apply: @escaping @Sendable (Database) throws -> JSONValue) async throws -> JSONValue {
        let database = try openDatabase()
        let request = RequestKey.current?.description
        let applyAndRemember: @Sendable (Database) throws -> JSONValue = { db in
            // Checked again in the transaction: another store process on the same database
            // may have written the same request since (each writes alone, so one sees it).
            if let request, let remembered = try Data.fetchOne(db, sql: "SELECT result FROM replies WHERE request = ?", arguments: [request]) {
                return try JSONValue(parsing: Array(remembered))
            }
            let result = try apply(db)
            if let request {
                try db.execute(sql: "INSERT OR REPLACE INTO replies (request, result, written_at) VALUES (?, ?, ?)",
                               arguments: [request, Data(result.jsonBytes), Date().timeIntervalSince1970])
            }
            return result
        }
        let result = try await withCheckedThrowingContinuation { continuation in
            pendingWrites.append(PendingWrite(apply: applyAndRemember, changing: keys, continuation: continuation))
            if !flushing {
                flushing = true
                Task { await self.flush(database) }
            }
        }
        return result
    }

    /// Commits pending writes, a batch at a time, until none is left.
    private func flush(_ database: DatabasePool) async {
        while !pendingWrites.isEmpty {
            let batch = pendingWrites
            pendingWrites.removeAll()
            let applies = batch.map(\.apply)
            let outcomes: [Result<JSONValue, any Error>]
            // Results older than the window go, at most once a minute, in a batch's transaction.
            let forgetBefore: Double? = ContinuousClock.now - lastPruned > .seconds(60)
                ? Date().timeIntervalSince1970 - configuration.replyWindow.seconds : nil
            if forgetBefore != nil { lastPruned = .now }
            do {
                outcomes = try await database.write { db in
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
                            // SQLite may have rolled back the whole transaction (say, on a
                            // full disk): then the batch fails as one, and nothing earlier in
                            // it is acknowledged.
                            guard db.isInsideTransaction else { throw error }
                            outcomes.append(.failure(error))
                        }
                    }
                    return outcomes
                }
            } catch {
                let failure = StorageFailure(error, path: configuration.path)
                logger.error("write failed", metadata: ["problem": "\(failure.detail)", "writes": "\(batch.count)"])
                for pending in batch { pending.continuation.resume(throwing: failure.rpcError) }
                continue
            }
            var changed: [String] = []
            for (pending, outcome) in zip(batch, outcomes) {
                switch outcome {
                case .success(let value):
                    changed += pending.changing
                    pending.continuation.resume(returning: value)
                case .failure(let error as JSONRPCError):
                    pending.continuation.resume(throwing: error)
                case .failure(let error):
                    pending.continuation.resume(throwing: StorageFailure(error, path: configuration.path).rpcError)
                }
            }
            markChanged(changed)
        }
        flushing = false
    }

    // MARK: Publishing

    private func markEverythingChanged() async {
        var keys = [Keys.history, Keys.sourcesSelected, Keys.routeSelected]
        if let ids = try? await read({ db in try String.fetchAll(db, sql: "SELECT id FROM articles") }) {
            keys += ids.map(Keys.article)
        }
        markChanged(keys)
    }

    private func markChanged(_ keys: [String]) {
        guard !keys.isEmpty else { return }
        dirtyKeys.formUnion(keys)
        guard let publisher, publishTask == nil else { return }
        publishTask = Task { await self.publishChanges(through: publisher) }
    }

    /// Publishes dirty keys, up to 200 in one batch to the kernel, each with its value as
    /// it is now (so a burst of writes costs one publication per key), retrying with
    /// back-off while the kernel does not answer.
    private func publishChanges(through publisher: StatePublisher) async {
        var failures = 0
        while !Task.isCancelled, !dirtyKeys.isEmpty {
            var keys: [String] = []
            while keys.count < 200, let key = dirtyKeys.popFirst() { keys.append(key) }
            var failed: [String] = []
            var problem: (any Error)?
            do {
                let values = try await currentValues(of: keys)
                let outcomes = await publisher.set(many: Array(zip(keys, values)).map { (key: $0.0, value: $0.1) })
                for (key, outcome) in zip(keys, outcomes) {
                    if case .failure(let error) = outcome { failed.append(key); problem = error }
                }
            } catch {
                failed = keys
                problem = error
            }
            guard let problem else {
                failures = 0
                continue
            }
            dirtyKeys.formUnion(failed)
            if Task.isCancelled { break }
            failures += 1
            if failures == 1 { logger.warning("cannot publish changes yet", metadata: ["keys": "\(failed.count)", "problem": "\(problem)"]) }
            try? await Task.sleep(for: .milliseconds(min(2_000, 50 << min(failures, 6))))
        }
        publishTask = nil
    }

    /// The published values of `keys` as the database holds them now (nil: deleted).
    private func currentValues(of keys: [String]) async throws -> [JSONValue?] {
        let limit = configuration.historyLimit
        return try await read { db -> [JSONValue?] in
            try keys.map { key in
                switch key {
                case Keys.history: return try Self.history(db, limit: limit)
                case Keys.sourcesSelected: return try Self.selection(db, "sources") ?? ["ids": [], "selectedAt": nil]
                case Keys.routeSelected: return try Self.selection(db, "route")
                default: return try Self.article(db, id: String(key.dropFirst(Keys.articlePrefix.count)))
                }
            }
        }
    }
}

/// The store's ``ReplyMemory``: results in the database, written with their effects.
struct StoredReplies: ReplyMemory {
    let store: StoreService

    func recall(_ key: RequestKey) async throws -> [UInt8]? { try await store.rememberedResult(key) }
    /// Nothing to do: ``StoreService`` wrote the result in the effect's transaction.
    func remember(_ key: RequestKey, result: [UInt8]) async {}
}

/// The CHP keys the store publishes.
enum Keys {
    static let history = "/store/history"
    static let articlePrefix = "/store/articles/"
    static let sourcesSelected = "/store/sources/selected"
    static let routeSelected = "/store/route/selected"
    static func article(_ id: String) -> String { articlePrefix + id }
}
