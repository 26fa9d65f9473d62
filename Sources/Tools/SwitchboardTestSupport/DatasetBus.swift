public import BusKit
public import BusProtocol
public import Catalog
public import FetcherService
public import Foundation
public import StoreService
import Contracts

/// A kernel with a store and a fetcher that reads the datasets from files in a folder of
/// the test's own (`file://`, so no traffic beyond loopback): the bus the services that
/// follow the catalog (search, pricing) are tested on. Start the service under test, then
/// ``startFetcher()``.
public struct DatasetBus: Sendable {
    public let kernel: TestKernel
    public let folder: URL
    public let storeHost: ServiceHost<StoreService>
    public let fetcher: FetcherService
    public let fetcherHost: ServiceHost<FetcherService>
    /// The fetcher's work, started by ``startFetcher()``.
    public let fetcherWork: Working
    public let client: BusClient
    let datasets: [Dataset]

    /// A kernel (or `kernel`), the bundled copies written to `folder` (or a new folder), a
    /// store on `folder/store.sqlite` and a fetcher over the files of `datasets`, hosted.
    /// Given an existing folder, its files and database are used as they are (a restart).
    public static func start(folder existing: URL? = nil, kernel existingKernel: TestKernel? = nil,
                             datasets: [Dataset] = Dataset.allCases) async throws -> DatasetBus {
        let kernel = if let existingKernel { existingKernel } else { try await TestKernel.start(fixedPorts: true, fastHeartbeats) }
        let folder = try existing ?? temporaryDirectory("dataset-bus")
        if existing == nil { try writeBundledCopies(to: folder) }
        let store = StoreService(configuration: StoreConfiguration(path: folder.appendingPathComponent("store.sqlite").path))
        let storeHost = try ServiceHost(service: store, options: hostOptions(kernel, connections: 2))
        try await storeHost.start()
        var configuration = FetcherConfiguration(sources: [:])
        for dataset in datasets {
            configuration.sources[dataset] = .init(url: folder.appendingPathComponent(dataset.bundledFileName), refreshInterval: .seconds(3_600),
                                                   timeout: .seconds(5), maxBytes: 32 * 1_048_576)
        }
        let client = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(20), state: [kernel.stateEndpoints])
        let fetcher = FetcherService(configuration: configuration, environment: [:], client: client, publisher: StatePublisher(client: client))
        let fetcherHost = try ServiceHost(service: fetcher, options: hostOptions(kernel, connections: 2))
        try await fetcherHost.start()
        return DatasetBus(kernel: kernel, folder: folder, storeHost: storeHost, fetcher: fetcher, fetcherHost: fetcherHost, fetcherWork: Working(fetcher), client: client,
                          datasets: datasets)
    }

    /// Host options for a service on this kernel, with its fast heartbeats.
    public static func hostOptions(_ kernel: TestKernel, connections: Int) -> ServiceHostOptions {
        .init(brokers: [kernel.endpoints.broker], connections: connections, heartbeatInterval: kernel.configuration.heartbeatInterval,
              heartbeatLiveness: kernel.configuration.heartbeatLiveness)
    }

    /// Waits until each of `services` has a worker.
    public func waitForWorkers(_ services: [String]) async throws {
        for service in services { try await kernel.workers(service) }
    }

    /// A subscription to `/catalog/` on this kernel.
    public func catalogSubscription() async throws -> Subscription {
        try await Subscription.open(snapshot: kernel.endpoints.snapshot, publisher: kernel.endpoints.publisher, prefixes: [FetcherAPI.catalogPrefix])
    }

    /// Starts the fetcher on the bus and waits until it has read every file once (a test
    /// that changes a file afterwards is then sure its refresh reads the new one).
    public func startFetcher() async throws {
        try await waitForWorkers([StoreAPI.service, FetcherAPI.service])
        await fetcherWork.start()
        // Each dataset's catalog key says where its copy came from.
        let keys = datasets.map { FetcherAPI.catalogPrefix + $0.rawValue }
        try await kernel.state(FetcherAPI.catalogPrefix, within: 15, "the fetcher read every file") { state in
            keys.allSatisfy { state[$0]?["origin"] == "remote" }
        }
    }

    /// Replaces a dataset's file and has the fetcher refresh it.
    public func replace(_ dataset: Dataset, with body: Data) async throws {
        try body.write(to: folder.appendingPathComponent(dataset.bundledFileName), options: .atomic)
        _ = try await client.call(FetcherAPI.datasetsRefresh, FetcherAPI.Refresh(name: dataset.rawValue))
    }

    /// The JSON-RPC error `service` answers `method` with (nil when it succeeds or fails otherwise).
    public func error(_ service: String, _ method: String, _ params: JSONValue? = nil) async -> JSONRPCError? {
        do {
            _ = try await client.request(service: service, method: method, params: params)
            return nil
        } catch {
            if case .remote(_, let rpc) = error { return rpc }
            return nil
        }
    }

    /// Stops the fetcher, the store and the client; the kernel too unless kept.
    public func stop(keepKernel: Bool = false) async {
        // As a process's group: the hosts drain first, then the work stops.
        await fetcherHost.stop()
        await storeHost.stop()
        await fetcherWork.stop()
        await client.close()
        if !keepKernel { await kernel.stop() }
    }
}

/// Writes the bundled copy of every dataset into `folder` (under its bundled file name),
/// for a fetcher or an HTTP server to read; returns each file's URL.
@discardableResult
public func writeBundledCopies(to folder: URL) throws -> [Dataset: URL] {
    var files: [Dataset: URL] = [:]
    for dataset in Dataset.allCases {
        let file = folder.appendingPathComponent(dataset.bundledFileName)
        try dataset.bundledData().write(to: file)
        files[dataset] = file
    }
    return files
}

/// The JSON-RPC error `body` throws, itself or as a service's answer through the bus (nil
/// when it succeeds or throws something else).
public func rpcError<T>(_ body: () async throws -> T) async -> JSONRPCError? {
    do {
        _ = try await body()
        return nil
    } catch let error as BusError {
        guard case .remote(_, let rpc) = error else { return nil }
        return rpc
    } catch {
        return error as? JSONRPCError
    }
}

/// A configuration for a whole bus under `switchboard up` in `folder`: the kernel on free
/// loopback ports, the datasets read from copies of the bundled files there (no traffic
/// beyond loopback), the store's database and the CURVE key folder (`keys/`) there, fast
/// heartbeats. `services`, `supervisor` and `security` are the bodies of those sections;
/// `extra` is appended as is.
public func writeBusConfiguration(in folder: URL, logLevel: String = "info", heartbeatMs: Int = 200, liveness: Int = 10,
                                  services: String, supervisor: String, security: String? = nil,
                                  extra: String = "", ports given: [Int]? = nil, fileName: String = "switchboard.yaml") throws -> (config: URL, ports: [Int]) {
    let files = try writeBundledCopies(to: folder)
    // The kernel's four endpoints, then the gateway's.
    let ports = given ?? (0..<5).map { _ in freePort() }
    let datasets = Dataset.allCases.map { dataset in
        "    \(dataset.rawValue): {url: \"\(files[dataset]!.absoluteString)\", refresh_seconds: 3600}"
    }.joined(separator: "\n")
    let text = """
        log_level: \(logLevel)
        \(kernelSection(ports, "heartbeat_ms: \(heartbeatMs)", "liveness: \(liveness)"))
        services:
          \(services)
        store:
          path: \(folder.appendingPathComponent("store.sqlite").path)
        streams:
          path: \(folder.appendingPathComponent("streams.sqlite").path)
        fetcher:
          datasets:
        \(datasets)
        supervisor:
          \(supervisor)
        gateway:
          listen: 127.0.0.1:\(ports[4])
        security:
          \(security ?? "keys_dir: \(busKeyFolder(in: folder).path)")
        \(extra)
        """
    let url = folder.appendingPathComponent(fileName)
    try text.write(to: url, atomically: true, encoding: .utf8)
    return (url, ports)
}

/// A configuration's `kernel` section with its four endpoints on loopback `ports` (broker,
/// snapshot, publisher, collector), then `settings` (each a `key: value` line of the section).
public func kernelSection(_ ports: [Int], _ settings: String...) -> String {
    (["kernel:"] + zip(["broker", "snapshot", "publisher", "collector"], ports).map { "  \($0): tcp://127.0.0.1:\($1)" } + settings.map { "  " + $0 })
        .joined(separator: "\n")
}

/// The key folder of a bus configured by ``writeBusConfiguration(in:logLevel:heartbeatMs:liveness:services:supervisor:security:extra:)``.
public func busKeyFolder(in folder: URL) -> KeyFolder {
    KeyFolder(folder.appendingPathComponent("keys").path)
}

extension Subscription {
    /// The next update, past the `synced` marker; nil when the subscription ends or reports
    /// a gap (which a test of a healthy bus must not see).
    public func nextUpdate() async throws -> StateUpdate? {
        while let event = try await next() {
            if case .synced = event { continue }
            return event.update
        }
        return nil
    }
}

extension Encodable {
    /// A typed answer's field read as the JSON it is sent as (tests that call a service's
    /// methods in process compare with what the bus carries).
    public subscript(_ key: String) -> JSONValue? { (try? JSONValue(encoding: self))?[key] }
}
