public import BusKit
public import BusProtocol
public import Catalog
import Foundation
public import Logging
import Contracts

/// Keeps a service's copies of some datasets in step with the fetcher.
///
/// It reads `/catalog/<name>` announcements from a subscription; when one names a version
/// the service does not have, it reads that dataset page by page over the bus (`fetcher`
/// `datasets.get`) and hands the whole copy to `install`, never part of one. While the
/// fetcher cannot be reached it retries with back-off; a newer announcement during a read
/// is picked up by the next round.
public actor CatalogFollower {
    /// What the service has: the version of its copy of a dataset (nil: none).
    public typealias CurrentVersion = @Sendable (Dataset) -> String?
    /// Takes a complete copy: its content, version and origin (`remote`, `cache`, `bundled`).
    public typealias Install = @Sendable (DatasetContent, _ version: String, _ origin: String) async -> Void
    /// Hears that the copy with this version now has this origin (no new bytes).
    public typealias OriginChanged = @Sendable (Dataset, _ version: String, _ origin: String) async -> Void

    private let datasets: Set<Dataset>
    private let client: BusClient
    private let timeout: Duration
    private let logger: Logger
    private let currentVersion: CurrentVersion
    private let install: Install
    private let originChanged: OriginChanged
    /// The latest version the fetcher announced, per dataset.
    private var announced: [Dataset: String] = [:]
    /// Datasets being read now (each by one child task of ``follow(_:)``).
    private var loading: Set<Dataset> = []

    public init(datasets: Set<Dataset>, client: BusClient, timeout: Duration = .seconds(10), logger: Logger,
                currentVersion: @escaping CurrentVersion, install: @escaping Install,
                originChanged: @escaping OriginChanged = { _, _, _ in }) {
        self.datasets = datasets
        self.client = client
        self.timeout = timeout
        self.logger = logger
        self.currentVersion = currentVersion
        self.install = install
        self.originChanged = originChanged
    }

    /// Follows `catalog`, a subscription to `/catalog/`, until it ends or the task is
    /// cancelled; each dataset is read by a child task that ends with this call.
    public func follow(_ catalog: Subscription) async {
        await withDiscardingTaskGroup { group in
            do {
                for try await event in catalog {
                    if let update = event.update, let dataset = await announcement(update) {
                        group.addTask { await self.load(dataset) }
                    }
                }
            } catch where !Task.isCancelled {
                logger.warning("the catalog subscription ended", metadata: ["problem": "\(error)"])
            } catch {}
            group.cancelAll()
        }
    }

    /// Takes an announcement; returns the dataset to read when none is being read and the
    /// version is new.
    private func announcement(_ update: StateUpdate) async -> Dataset? {
        guard let value = update.json, let name = value["name"]?.stringValue, let dataset = Dataset(rawValue: name),
              datasets.contains(dataset), let version = value["version"]?.stringValue else { return nil }
        announced[dataset] = version
        if currentVersion(dataset) == version, let origin = value["origin"]?.stringValue {
            await originChanged(dataset, version, origin)
        }
        guard !loading.contains(dataset), currentVersion(dataset) != version else { return nil }
        loading.insert(dataset)
        return dataset
    }

    /// Loads `dataset` until the service has the version last announced.
    private func load(_ dataset: Dataset) async {
        var failures = 0
        while !Task.isCancelled, let wanted = announced[dataset], currentVersion(dataset) != wanted {
            do {
                let started = ContinuousClock.now
                let copy = try await Self.read(dataset, through: client, timeout: timeout)
                let content = try await dataset.contentConcurrently(fromRecords: copy.records)
                await install(content, copy.version, copy.origin)
                logger.info("dataset followed", metadata: ["dataset": "\(dataset)", "version": "\(copy.version)", "origin": "\(copy.origin)",
                                                           "records": "\(copy.records.count)", "took": "\((ContinuousClock.now - started).formatted)"])
                // A newer copy than the one announced: its announcement is on the way.
                if copy.version != wanted { announced[dataset] = copy.version }
                failures = 0
            } catch {
                failures += 1
                let delay = Duration.milliseconds(min(30_000, 250 << min(failures, 7)))
                logger.warning("cannot read a dataset from the fetcher; keeping the current copy", metadata: [
                    "dataset": "\(dataset)", "problem": "\(error)", "retry in": "\(delay.formatted)"])
                try? await Task.sleep(for: delay)
            }
        }
        loading.remove(dataset)
    }

    /// One dataset as read from the fetcher.
    public struct Copy: Sendable {
        public var records: [JSONValue] = []
        public var version = ""
        public var origin = ""
    }

    /// Reads every record of `dataset` from the fetcher, one page at a time. When the
    /// version changes between pages it starts again, so the copy is always one version.
    public static func read(_ dataset: Dataset, through client: BusClient, timeout: Duration) async throws -> Copy {
        let pageSize = 1_000
        for _ in 0..<3 {
            var copy = Copy()
            var total = 1
            var consistent = true
            while copy.records.count < total {
                let page = try await client.call(FetcherAPI.datasetsGet, FetcherAPI.Get(name: dataset.rawValue, offset: copy.records.count, limit: pageSize),
                                                 timeout: timeout)
                if copy.records.isEmpty {
                    copy.version = page.version
                    copy.origin = page.origin
                } else if page.version != copy.version {
                    consistent = false
                    break
                }
                total = page.total
                if page.records.isEmpty { break }
                copy.records += page.records
            }
            if consistent { return copy }
        }
        throw BusError.protocolViolation("fetcher datasets.get: \(dataset) kept changing while it was read")
    }
}
