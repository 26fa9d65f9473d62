public import BusKit
import BusProtocol
import Foundation
import Storage
public import Logging
public import ServiceLifecycle
public import Contracts

/// The `store` service: search history, saved articles, the news-source and route
/// selections, and the fetcher's last good copy of each dataset, in a SQLite file (the
/// default) or a PostgreSQL database several store processes share (``StoreDatabase``).
///
/// A write is answered only once it is durable. Each write's result is kept with it, in the
/// same transaction, under the request's key: a request sent again (the kernel re-sends one
/// whose worker died; a client one it sent to a kernel that failed over) is answered with
/// that result and written once.
///
/// After a change, the matching CHP keys are published through the kernel (coalesced: a
/// burst of writes publishes each key once, with the value as it is after the burst).
public actor StoreService: BusService, ServiceWork {
    public static let name = StoreAPI.service

    public nonisolated let configuration: StoreConfiguration
    let logger: Logger
    private let database: ServiceDatabase

    private var publisher: StatePublisher?
    private var dirtyKeys: Set<String> = []
    /// Whether every saved article's key is to be published again (``republish()``). They
    /// are listed by the publishing, so that a database away then delays them, as it delays
    /// every key, rather than leaves them out.
    private var articlesToList = false
    /// Told when keys are marked changed; ``work()`` publishes them (one signal stands for
    /// any number: the keys are in `dirtyKeys`).
    private let (changes, changed) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))

    /// Where changes are published from ``start()`` on (nil: nowhere, for tests).
    private let statePublisher: StatePublisher?

    /// Opens the database now; when that fails the service still starts and answers every
    /// request with the reason (-32007), trying to open again at most once a second.
    public init(configuration: StoreConfiguration, logger: Logger? = nil, publisher: StatePublisher? = nil) {
        self.configuration = configuration
        statePublisher = publisher
        let logger = logger ?? Logger(label: "switchboard.store")
        self.logger = logger
        database = ServiceDatabase(path: configuration.path, label: "store", maxSizeBytes: configuration.maxSizeBytes, postgres: configuration.postgres,
                                   schema: StoreDatabase.schema, replyWindow: configuration.replyWindow, logger: logger)
    }

    /// Returns once the database can serve: at once for SQLite (a file that cannot be opened
    /// is answered per request); for PostgreSQL once it answers and its schema is in place
    /// (its connections are ``requiredParts``, run by the process), trying again with back-off
    /// meanwhile. The store registers with the kernel after this.
    public func waitUntilReady() async {
        await database.waitUntilReady()
    }

    /// The database's connections on PostgreSQL (none on SQLite): a part of the store's
    /// process listed before the store, so it runs before the store can be ready and stops
    /// after its work, which may query until its end.
    public nonisolated var requiredParts: [any Service] { database.parts }

    /// Publishes every key, then (``work()``) each change from now on.
    public func prepare() async {
        await republish()
    }

    /// Publishes the keys marked changed, a batch at a time, until cancelled.
    public func work() async {
        for await _ in changes {
            guard let publisher else { continue }
            await publishChanges(through: publisher)
        }
    }

    /// Publishes every key again (the kernel may be new: after it restarted).
    public func republish() async {
        guard let statePublisher else { return }
        publisher = statePublisher
        markEverythingChanged()
    }

    /// Stops publishing (at shutdown).
    public func finish() async {
        publisher = nil
    }

    /// Results live in the database, beside the effects they answer for.
    public nonisolated func makeReplyMemory() -> any ReplyMemory {
        let database = database
        return StoredReplies { try await database.remembered($0) }
    }

    // MARK: Methods

    public nonisolated func methods(_ table: inout MethodTable<StoreService>) {
        table.on(StoreAPI.historyAdd) { store, params in try await store.historyAdd(params.text) }
        table.on(StoreAPI.historyList) { store, params in try await store.historyList(limit: params.limit) }
        table.on(StoreAPI.historyClear) { store, _ in try await store.historyClear() }
        table.on(StoreAPI.articlesSave) { store, params in try await store.articlesSave(params.article) }
        table.on(StoreAPI.articlesList) { store, params in try await store.articlesList(offset: params.offset, limit: params.limit) }
        table.on(StoreAPI.articlesDelete) { store, params in try await store.articlesDelete(params.url) }
        table.on(StoreAPI.sourcesSelect) { store, params in try await store.sourcesSelect(params.ids, revision: params.revision) }
        table.on(StoreAPI.sourcesSelected) { store, _ in try await store.sourcesSelected() }
        table.on(StoreAPI.routeSelect) { store, params in try await store.routeSelect(params.outboundId, params.inboundId, revision: params.revision) }
        table.on(StoreAPI.routeSelected) { store, _ in try await store.routeSelected() }
        table.on(StoreAPI.snapshotsPut) { store, params in try await store.snapshotsPut(params) }
        table.on(StoreAPI.snapshotsGet) { store, params in try await store.snapshotsGet(params.name) }
        table.on(StoreAPI.snapshotsList) { store, _ in try await store.snapshotsList() }
    }

    // MARK: History

    static let maxTextLength = 1_000

    func historyAdd(_ raw: String) async throws -> StoreAPI.HistoryAdded {
        let text = raw.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !text.isEmpty else { throw JSONRPCError.invalidParams(field: "text", "must not be empty or only whitespace") }
        guard text.count <= Self.maxTextLength else {
            throw JSONRPCError.invalidParams(field: "text", "must be at most \(Self.maxTextLength) characters")
        }
        return try await write(.historyAdd(text: text, limit: configuration.historyLimit), changing: [Keys.history])
    }

    func historyList(limit: Int?) async throws -> StoreAPI.History {
        let limit = try Validate.limit(limit, default: configuration.historyLimit, max: configuration.historyLimit)
        return try await read(.history(limit: limit)) ?? StoreAPI.History(entries: [], count: 0)
    }

    func historyClear() async throws -> StoreAPI.Cleared {
        try await write(.historyClear, changing: [Keys.history])
    }

    // MARK: Articles

    static let maxArticleBytes = 256 * 1024

    func articlesSave(_ article: JSONValue) async throws -> StoreAPI.ArticleSaved {
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
        return try await write(.articleSave(url: url, id: id, article: text), changing: [Keys.article(id)])
    }

    func articlesList(offset: Int?, limit: Int?) async throws -> StoreAPI.SavedArticles {
        let offset = try Validate.offset(offset)
        let limit = try Validate.limit(limit, default: 100, max: 1_000)
        return try await read(.articles(offset: offset, limit: limit)) ?? StoreAPI.SavedArticles(articles: [], total: 0, offset: offset)
    }

    func articlesDelete(_ url: String) async throws -> StoreAPI.ArticleDeleted {
        let id = ArticleID.of(url)
        return try await write(.articleDelete(url: url, id: id), changing: [Keys.article(id)])
    }

    // MARK: Selections

    static let maxSources = 100

    func sourcesSelect(_ ids: [String], revision: Int?) async throws -> StoreAPI.SourceSelection {
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
        return try await write(.select(.sources, value: value.jsonString, expected: revision), changing: [Keys.sourcesSelected])
    }

    func sourcesSelected() async throws -> StoreAPI.SourceSelection {
        try await read(.selection(.sources)) ?? decodeResult(StoreAPI.SourceSelection.self, Self.noSources)
    }

    /// The sources selection before any was made.
    static let noSources: JSONValue = ["ids": [], "selectedAt": nil, "revision": 0]

    func routeSelect(_ outboundId: Int, _ inboundId: Int?, revision: Int?) async throws -> StoreAPI.RouteSelection {
        guard outboundId >= 0 else { throw JSONRPCError.invalidParams(field: "outboundId", "must not be negative") }
        if let inboundId, inboundId < 0 { throw JSONRPCError.invalidParams(field: "inboundId", "must not be negative") }
        let value: JSONValue = ["outboundId": .int(Int64(outboundId)), "inboundId": inboundId.map { .int(Int64($0)) } ?? .null]
        return try await write(.select(.route, value: value.jsonString, expected: revision), changing: [Keys.routeSelected])
    }

    /// The stored route, or null when none was ever selected.
    func routeSelected() async throws -> StoreAPI.RouteSelection? {
        try await read(.selection(.route))
    }

    // MARK: Snapshots

    static let origins: Set<String> = ["remote", "cache", "bundled"]

    func snapshotsPut(_ params: StoreAPI.Snapshot) async throws -> StoreAPI.SnapshotStored {
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
        return try await write(.snapshotPut(name: name, body: Data(params.body.utf8), version: params.version, origin: params.origin,
                                            fetchedAt: fetchedAt.timeIntervalSince1970), changing: [])
    }

    /// Null when no copy is kept: the fetcher asks for every dataset at start, and a dataset
    /// never fetched is no error.
    func snapshotsGet(_ rawName: String) async throws -> StoreAPI.Snapshot? {
        try await read(.snapshot(name: Validate.datasetName(rawName)))
    }

    func snapshotsList() async throws -> [StoreAPI.SnapshotEntry] {
        try await read(.snapshots) ?? []
    }

    // MARK: Writing

    /// Runs `write` (kept under the request being answered, if it is named) and marks
    /// `keys` for publication once it is durable.
    private func write<Result: Decodable>(_ write: StoreWrite, changing keys: [String]) async throws -> Result {
        let result = try await database.write(request: RequestKey.current?.description, StoreDatabase.apply(write))
        markChanged(keys)
        return try decodeResult(Result.self, result)
    }

    /// What `read` finds, as the contract's type; nil when there is nothing.
    private func read<Result: Decodable>(_ read: StoreRead) async throws -> Result? {
        try await stored(read).map { try decodeResult(Result.self, $0) }
    }

    /// What `read` finds; nil when there is nothing.
    private func stored(_ read: StoreRead) async throws -> JSONValue? {
        try await database.read { db in try StoreDatabase.read(read, db) }
    }

    // MARK: Publishing

    private func markEverythingChanged() {
        articlesToList = true
        markChanged([Keys.history, Keys.sourcesSelected, Keys.routeSelected])
    }

    private func markChanged(_ keys: [String]) {
        guard !keys.isEmpty else { return }
        dirtyKeys.formUnion(keys)
        changed.yield()
    }

    /// Publishes dirty keys, up to 200 a round (the client sends them in batches the kernel
    /// takes, `kernel.max_batch_items`), each with its value as it is now (so a burst of
    /// writes costs one publication per key), retrying with back-off while the kernel or
    /// the database does not answer.
    private func publishChanges(through publisher: StatePublisher) async {
        var failures = 0
        while !Task.isCancelled, !dirtyKeys.isEmpty {
            var keys: [String] = []
            var failed: [String] = []
            var problem: (any Error)?
            do {
                if articlesToList {
                    dirtyKeys.formUnion(try await database.read(StoreDatabase.articleIDs).map(Keys.article))
                    articlesToList = false
                }
                while keys.count < 200, let key = dirtyKeys.popFirst() { keys.append(key) }
                // Store processes sharing a database publish one at a time, each the values
                // as they are then: none can publish an older value over a newer one.
                let batch = keys
                let outcomes = try await database.alone(StoreDatabase.publishing, waitingAtMost: configuration.publishingWait) {
                    let values = try await self.currentValues(of: batch)
                    return await publisher.set(many: Array(zip(batch, values)).map { (key: $0.0, value: $0.1) })
                }
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
            if failures == 1 { logger.warning("cannot publish changes yet", metadata: ["keys": "\(dirtyKeys.count)", "problem": "\(problem)"]) }
            try? await Task.sleep(for: .milliseconds(min(2_000, 50 << min(failures, 6))))
        }
    }

    /// The published values of `keys` as the database holds them now (nil: deleted).
    private func currentValues(of keys: [String]) async throws -> [JSONValue?] {
        var values: [JSONValue?] = []
        for key in keys {
            switch key {
            case Keys.history: values.append(try await stored(.history(limit: configuration.historyLimit)))
            case Keys.sourcesSelected: values.append(try await stored(.selection(.sources)) ?? Self.noSources)
            case Keys.routeSelected: values.append(try await stored(.selection(.route)))
            default: values.append(try await stored(.article(id: String(key.dropFirst(Keys.articlePrefix.count)))))
            }
        }
        return values
    }
}

/// The CHP keys the store publishes (declared in its contract).
typealias Keys = StoreAPI.StateKeys
