public import BusKit
import BusProtocol
public import Catalog
public import Foundation
public import Logging
import ZeroMQ
public import Contracts

/// The `fetcher` service: keeps each dataset loaded from the most trusted copy it has.
///
/// Order of trust: a fresh remote copy, else the last good remote copy kept in the store
/// (`cache`), else the copy bundled with the build (`bundled`). A download that fails or
/// does not decode never replaces what is loaded; it is reported as the dataset's last
/// error. Whenever a dataset's version (a hash of its bytes) or origin changes, it is
/// published as `/catalog/<name>`.
public actor FetcherService: BusService, ServiceWork {
    public static let name = FetcherAPI.service

    public enum Origin: String, Sendable, Codable { case remote, cache, bundled }

    struct Loaded: Sendable {
        let content: DatasetContent
        let dropped: Int
        let version: String
        let origin: Origin
        let fetchedAt: Date
        let etag: String?
        let lastModified: String?
    }

    struct State: Sendable {
        var loaded: Loaded?
        var lastError: String?
        var nextRefresh: Date?
    }

    public nonisolated let configuration: FetcherConfiguration
    let logger: Logger
    private let downloader = Downloader()
    private let environment: [String: String]
    private var states: [Dataset: State] = [:]
    /// Datasets being downloaded, and the callers of ``refresh(_:)`` waiting for the next
    /// download of each (the first of them runs it).
    private var downloading: Set<Dataset> = []
    private var waitingForNext: [Dataset: [CheckedContinuation<RefreshTurn, Never>]] = [:]
    private var client: BusClient?
    private var publisher: StatePublisher?
    /// The last publication failed (said once, until one succeeds).
    private var publishFailing = false

    /// Loads every bundled copy at once, so the service answers from the first request.
    /// `client` reaches the store (for the last good copies), `publisher` publishes
    /// `/catalog/*` (both nil: a service off the bus, for tests).
    public init(configuration: FetcherConfiguration = .defaults, environment: [String: String] = ProcessInfo.processInfo.environment,
                logger: Logger? = nil, client: BusClient? = nil, publisher: StatePublisher? = nil) {
        self.configuration = configuration
        self.client = client
        self.publisher = publisher
        self.environment = environment
        self.logger = logger ?? Logger(label: "switchboard.fetcher")
        for dataset in Dataset.allCases {
            do {
                let copy = try dataset.bundledCopy()
                states[dataset] = State(loaded: Loaded(content: copy.decoded.content, dropped: copy.decoded.dropped, version: copy.version,
                                                       origin: .bundled, fetchedAt: Self.bundleDate, etag: nil, lastModified: nil))
            } catch {
                states[dataset] = State(loaded: nil, lastError: "the bundled copy: \(error)")
                self.logger.error("bundled copy unusable", metadata: ["dataset": "\(dataset)", "problem": "\(error)"])
            }
        }
    }

    /// Starts working on the bus: brings back the last good remote copies from the store,
    /// publishes every dataset, then refreshes each from its source now and on its schedule.
    public func prepare() async {
        await restoreFromStore()
    }

    public func work() async {
        await withDiscardingTaskGroup { group in
            // Beside the refreshes: with the kernel slow to answer, publishing must not hold
            // them up.
            group.addTask { await self.republish() }
            for dataset in Dataset.allCases {
                guard let source = configuration.sources[dataset], source.url != nil else { continue }
                let interval = source.refreshInterval
                group.addTask {
                    while !Task.isCancelled {
                        await self.refresh(dataset)
                        try? await Task.sleep(for: interval)
                    }
                }
            }
        }
    }

    /// Closes the HTTP client (the refreshes ended with the work).
    public func finish() async {
        await downloader.shutdown()
    }

    /// Publishes every loaded dataset (at start, and after the kernel restarted).
    public func republish() async {
        for dataset in Dataset.allCases where !Task.isCancelled { await publish(dataset) }
    }

    // MARK: Methods

    public nonisolated func methods(_ table: inout MethodTable<FetcherService>) {
        table.on(FetcherAPI.datasetsList) { fetcher, _ in await fetcher.entries(Dataset.allCases) }
        table.on(FetcherAPI.datasetsGet) { fetcher, params in try await fetcher.get(params) }
        table.onStream(FetcherAPI.datasetsRefreshStream) { fetcher, params, parts in
            let datasets = try params.name.map { [try Self.dataset(named: $0)] } ?? Dataset.allCases
            try await withThrowingTaskGroup(of: Dataset.self) { group in
                for dataset in datasets {
                    group.addTask {
                        await fetcher.refresh(dataset)
                        return dataset
                    }
                }
                var done = 0
                for try await dataset in group {
                    done += 1
                    let entry = await fetcher.entries([dataset]).first
                    try await parts.send(.init(name: dataset.rawValue, done: done, total: datasets.count, lastError: entry?.lastError))
                }
            }
            return await fetcher.entries(datasets)
        }
    }

    static func dataset(named name: String) throws -> Dataset {
        guard let dataset = Dataset(rawValue: name) else {
            throw JSONRPCError.invalidParams(field: "name", "unknown dataset '\(name)'; known: \(Dataset.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        return dataset
    }

    func get(_ params: FetcherAPI.Get) throws -> FetcherAPI.DatasetPage {
        let dataset = try Self.dataset(named: params.name)
        let offset = params.offset ?? 0
        let limit = params.limit ?? 100
        guard offset >= 0 else { throw JSONRPCError.invalidParams(field: "offset", "must not be negative") }
        guard (1...1_000).contains(limit) else { throw JSONRPCError.invalidParams(field: "limit", "must be 1 to 1000") }
        guard let loaded = states[dataset]?.loaded else {
            throw JSONRPCError(code: JSONRPCError.upstreamFailedCode, message: "Upstream fetch failed: \(dataset) has no usable copy",
                               data: ["name": .string(dataset.rawValue), "lastError": states[dataset]?.lastError.map(JSONValue.string) ?? .null])
        }
        let records = try loaded.content.records(offset: offset, limit: limit)
        return FetcherAPI.DatasetPage(name: dataset.rawValue, version: loaded.version, origin: loaded.origin.rawValue, total: loaded.content.count,
                                      offset: offset, records: records)
    }

    /// One `datasets.list` entry per dataset.
    func entries(_ datasets: [Dataset]) -> [FetcherAPI.DatasetEntry] {
        datasets.map(entry)
    }

    /// Where `dataset` stands: its copy, last error, next refresh and source.
    func entry(_ dataset: Dataset) -> FetcherAPI.DatasetEntry {
        let state = states[dataset], loaded = state?.loaded
        return FetcherAPI.DatasetEntry(name: dataset.rawValue, origin: loaded?.origin.rawValue, version: loaded?.version,
                                       records: loaded?.content.count ?? 0, dropped: loaded?.dropped ?? 0,
                                       fetchedAt: loaded.map { Timestamp.format($0.fetchedAt) }, lastError: state?.lastError,
                                       nextRefresh: state?.nextRefresh.map { Timestamp.format($0) },
                                       url: configuration.sources[dataset]?.url?.absoluteString)
    }

    /// What `/catalog/<name>` carries: part of its ``entry(_:)``, null where there is nothing.
    func summary(_ dataset: Dataset) -> [String: JSONValue] {
        let entry = entry(dataset)
        return ["name": .string(entry.name), "origin": entry.origin.map(JSONValue.string) ?? .null,
                "version": entry.version.map(JSONValue.string) ?? .null, "records": .int(Int64(entry.records)),
                "fetchedAt": entry.fetchedAt.map(JSONValue.string) ?? .null, "lastError": entry.lastError.map(JSONValue.string) ?? .null]
    }

    // MARK: Refreshing

    /// What a caller waiting for the next download of a dataset is told.
    enum RefreshTurn: Sendable {
        /// The download it waited for ended.
        case done
        /// It runs the next download itself.
        case runNext
    }

    /// Fetches `dataset` from its source, with a download that starts after this call.
    /// While one is under way, callers wait for the next one, which the first of them runs
    /// (in its own task) for them all: a burst of calls costs at most two downloads.
    public func refresh(_ dataset: Dataset) async {
        if downloading.contains(dataset) {
            let turn = await withCheckedContinuation { waitingForNext[dataset, default: []].append($0) }
            guard case .runNext = turn else { return }
        } else {
            downloading.insert(dataset)
        }
        // Whoever waits now asked before this download starts: it answers them too.
        let joined = waitingForNext.removeValue(forKey: dataset) ?? []
        await fetchAndLoad(dataset)
        for caller in joined { caller.resume(returning: .done) }
        if var next = waitingForNext[dataset], !next.isEmpty {
            next.removeFirst().resume(returning: .runNext)
            waitingForNext[dataset] = next
        } else {
            downloading.remove(dataset)
        }
    }

    private func fetchAndLoad(_ dataset: Dataset) async {
        guard let source = configuration.sources[dataset], let url = source.url else { return }
        defer { states[dataset, default: State()].nextRefresh = Date().addingTimeInterval(source.refreshInterval.seconds) }
        let current = states[dataset]?.loaded
        let conditional = current?.origin == .remote
        let request = Downloader.Request(url: url, headers: FetcherConfiguration.resolvedHeaders(source.headers, environment: environment),
                                         timeout: source.timeout, maxBytes: source.maxBytes,
                                         etag: conditional ? current?.etag : nil, lastModified: conditional ? current?.lastModified : nil)
        let logger = self.logger
        do {
            let download = try await downloader.fetch(request, attempts: configuration.attempts, base: configuration.retryBase) { attempt, failure in
                logger.info("retrying a download", metadata: ["dataset": "\(dataset)", "attempt": "\(attempt)", "problem": "\(failure)"])
            }
            switch download {
            case .notModified:
                states[dataset, default: State()].lastError = nil
            case .body(let bytes, let etag, let lastModified):
                let decoded = try await dataset.decodeConcurrently(bytes)
                let loaded = Loaded(content: decoded.content, dropped: decoded.dropped, version: Dataset.version(of: bytes), origin: .remote,
                                    fetchedAt: Date(), etag: etag, lastModified: lastModified)
                states[dataset, default: State()].lastError = nil
                await install(loaded, for: dataset)
                await keepInStore(dataset, bytes: bytes, loaded: loaded)
            }
        } catch where Task.isCancelled {
            // The fetcher stopping (or whoever asked for this refresh gone): nothing failed,
            // and the copy it has stays, as its last error does.
        } catch {
            let problem = "\(error)"
            states[dataset, default: State()].lastError = problem
            logger.warning("refresh failed; keeping the current copy", metadata: ["dataset": "\(dataset)", "problem": "\(problem)",
                                                                                   "origin": "\(states[dataset]?.loaded?.origin.rawValue ?? "none")"])
        }
    }

    /// Makes `loaded` the dataset's copy; publishes it when its version or origin changed.
    private func install(_ loaded: Loaded, for dataset: Dataset) async {
        let previous = states[dataset]?.loaded
        states[dataset, default: State()].loaded = loaded
        if previous?.version != loaded.version || previous?.origin != loaded.origin {
            logger.info("dataset loaded", metadata: ["dataset": "\(dataset)", "origin": "\(loaded.origin.rawValue)",
                                                     "version": "\(loaded.version)", "records": "\(loaded.content.count)"])
            await publish(dataset)
        }
    }

    private func publish(_ dataset: Dataset) async {
        guard let publisher else { return }
        do {
            // Publications of one dataset can overlap (the start's republish beside a refresh
            // that installs a copy, or the re-registration's republish): the kernel keeps the
            // summary of the copy loaded last.
            try await publisher.set(FetcherAPI.catalogPrefix + dataset.rawValue, toLatest: { .object(await self.summary(dataset)) })
            if publishFailing {
                publishFailing = false
                logger.notice("publishing again", metadata: ["dataset": "\(dataset)"])
            }
        } catch .cancelled {
            // Stopping: the publisher's next start publishes every dataset anyway.
        } catch {
            // Said once until a publication succeeds: a kernel that stands by (its peer serves
            // the state) or is away fails every one, and every dataset is published again
            // when the service registers with a kernel anew.
            logger.log(level: publishFailing ? .debug : .warning, "cannot publish; every dataset is published again once the service registers with a kernel",
                       metadata: ["dataset": "\(dataset)", "problem": "\(error)"])
            publishFailing = true
        }
    }

    // MARK: The store's copies

    private func storeIsUp() async -> Bool {
        guard let client else { return false }
        return (try? await client.hasWorkers(StoreAPI.service, timeout: .seconds(1))) == true
    }

    /// Replaces bundled copies with the last good remote copies the store keeps.
    private func restoreFromStore() async {
        guard let client, await storeIsUp() else {
            logger.info("no store: starting from the bundled copies")
            return
        }
        for dataset in Dataset.allCases where states[dataset]?.loaded?.origin != .remote {
            guard let snapshot = try? await client.call(StoreAPI.snapshotsGet, StoreAPI.Name(name: dataset.rawValue), timeout: .seconds(5))
            else { continue }
            let bytes = Array(snapshot.body.utf8), version = snapshot.version
            guard let decoded = try? await dataset.decodeConcurrently(bytes) else {
                logger.warning("the store's copy does not decode; ignored", metadata: ["dataset": "\(dataset)"])
                continue
            }
            let fetchedAt = Timestamp.parse(snapshot.fetchedAt)
            let loaded = Loaded(content: decoded.content, dropped: decoded.dropped, version: version, origin: .cache,
                                fetchedAt: fetchedAt ?? Date(), etag: nil, lastModified: nil)
            states[dataset, default: State()].loaded = loaded
        }
    }

    /// Keeps a good remote copy in the store, as the fallback for the next start.
    private func keepInStore(_ dataset: Dataset, bytes: [UInt8], loaded: Loaded) async {
        guard let client, bytes.count <= configuration.maxSnapshotBytes, await storeIsUp() else { return }
        guard let body = String(validating: bytes, as: UTF8.self) else { return }
        let snapshot = StoreAPI.Snapshot(name: dataset.rawValue, body: body, version: loaded.version, origin: "remote",
                                         fetchedAt: Timestamp.format(loaded.fetchedAt))
        do {
            _ = try await client.call(StoreAPI.snapshotsPut, snapshot, timeout: .seconds(10))
        } catch {
            logger.warning("cannot keep the copy in the store", metadata: ["dataset": "\(dataset)", "problem": "\(error)"])
        }
    }

    // MARK: Helpers

    /// When the bundled copies are from (the fixtures' date).
    static let bundleDate = Date(timeIntervalSince1970: 1_795_219_200)  // 2026-11-21T00:00:00Z
}
