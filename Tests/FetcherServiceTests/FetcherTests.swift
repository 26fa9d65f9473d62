import BusKit
import BusProtocol
import Contracts
import Catalog
import FetcherService
import Foundation
import Kernel
import StoreService
import SwitchboardTestSupport
import Testing

/// The local HTTP server over a folder holding the fixtures and a few bad files.
struct FixtureServer {
    let server: FixtureHTTPServer
    var process: ChildProcess { server.process }

    static func start() async throws -> FixtureServer {
        let folder = try temporaryDirectory("fetcher-files")
        try writeBundledCopies(to: folder)
        try Data("{\"items\": [1, 2,".utf8).write(to: folder.appendingPathComponent("malformed.json"))
        try Data(#"{"status":"error","code":"apiKeyInvalid","message":"Your API key is invalid."}"#.utf8)
            .write(to: folder.appendingPathComponent("newsapi-error.json"))
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Interop/http_fixture_server.py")
        return FixtureServer(server: try await FixtureHTTPServer.start(script: script, serving: folder))
    }

    func url(_ path: String) -> URL { server.url(path) }

    /// How many requests `path` got.
    func count(_ path: String) async throws -> Int {
        let (data, _) = try await URLSessionless.get(url("/_count\(path)"))
        return Int(String(decoding: data, as: UTF8.self)) ?? -1
    }

    func stop() async { await server.stop() }
}

/// A tiny GET for the test's own questions to the server (not the code under test).
enum URLSessionless {
    static func get(_ url: URL) async throws -> (Data, Int) {
        let result = try await runCommand(URL(fileURLWithPath: "/usr/bin/python3"), [
            "-c", "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())", url.absoluteString])
        return (Data(result.stdout.utf8), Int(result.status))
    }
}

/// A kernel, a store and a fetcher (in this process) whose datasets point at `urls`.
struct FetcherBus {
    let kernel: TestKernel
    let storeHost: ServiceHost<StoreService>
    let fetcher: FetcherService
    let work: Working
    let host: ServiceHost<FetcherService>
    let client: BusClient
    let folder: URL

    static func start(_ urls: [Dataset: URL], timeout: Duration = .seconds(2), maxBytes: Int = 32 * 1_048_576, attempts: Int = 3,
                      kernel: TestKernel? = nil, folder: URL? = nil) async throws -> FetcherBus {
        let kernel = if let kernel { kernel } else { try await TestKernel.start(fixedPorts: true, fastHeartbeats) }
        let folder = try folder ?? temporaryDirectory("fetcher")
        let options = { (connections: Int) in
            (brokers: [kernel.endpoints.broker], connections: connections, heartbeat: kernel.configuration.heartbeatInterval,
             liveness: kernel.configuration.heartbeatLiveness)
        }
        let store = StoreService(configuration: StoreConfiguration(path: folder.appendingPathComponent("store.sqlite").path))
        let o = options(2)
        let storeHost = try ServiceHost(service: store, options: .init(brokers: o.brokers, connections: o.connections,
                                                                       heartbeatInterval: o.heartbeat, heartbeatLiveness: o.liveness))
        try await storeHost.start()
        var configuration = FetcherConfiguration(sources: [:])
        for dataset in Dataset.allCases {
            configuration.sources[dataset] = .init(url: urls[dataset], refreshInterval: .seconds(3_600), timeout: timeout, maxBytes: maxBytes)
        }
        configuration.attempts = attempts
        configuration.retryBase = .milliseconds(20)
        let client = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(20))
        let fetcher = FetcherService(configuration: configuration, environment: [:], client: client, publisher: StatePublisher(client: client))
        let host = try ServiceHost(service: fetcher, options: .init(brokers: o.brokers, connections: 4, heartbeatInterval: o.heartbeat,
                                                                    heartbeatLiveness: o.liveness))
        try await host.start()
        try await kernel.workers("store")
        try await kernel.workers("fetcher")
        let work = Working(fetcher)
        await work.start()
        return FetcherBus(kernel: kernel, storeHost: storeHost, fetcher: fetcher, work: work, host: host, client: client, folder: folder)
    }

    func entry(_ dataset: Dataset) async throws -> JSONValue {
        let list = try await client.request(service: "fetcher", method: "datasets.list")
        return list.arrayValue?.first { $0["name"] == .string(dataset.rawValue) } ?? .null
    }

    func refresh(_ dataset: Dataset) async throws -> JSONValue {
        try await client.request(service: "fetcher", method: "datasets.refresh", params: ["name": .string(dataset.rawValue)]).arrayValue?.first ?? .null
    }

    /// The kernel's entry for `/catalog/<dataset>`: its sequence changes only when published.
    func published(_ dataset: Dataset) async throws -> (sequence: Int64, value: JSONValue)? {
        let state = try await client.request(service: "kernel", method: "state.get", params: ["prefix": .string("/catalog/\(dataset.rawValue)")])
        guard let entry = state["entries"]?.arrayValue?.first, let sequence = entry["sequence"]?.intValue else { return nil }
        return (sequence, entry["value"] ?? .null)
    }

    /// Waits until `dataset`'s remote copy is the loaded one: its `/catalog/` entry says so
    /// (published once the copy is installed).
    func remoteCopy(_ dataset: Dataset, within seconds: Double = 10) async throws {
        let key = FetcherAPI.catalogPrefix + dataset.rawValue
        try await kernel.state(key, within: seconds, "\(dataset) loaded from the server") { $0[key]?["origin"] == "remote" }
    }

    /// Waits until the store keeps a copy of `dataset`, written after a good download: a
    /// refresh waits for the download under way, which writes the copy before it ends.
    func waitForSnapshot(_ dataset: Dataset) async throws {
        _ = try await refresh(dataset)
        let kept = try await client.request(service: "store", method: "snapshots.get", params: ["name": .string(dataset.rawValue)])
        #expect(kept != .null, "the store keeps \(dataset)")
    }

    func stop(keepKernel: Bool = false) async {
        await host.stop()
        await work.stop()
        await storeHost.stop()
        await client.close()
        if !keepKernel { await kernel.stop() }
    }
}

@Suite("fetcher: remote copies from a local HTTP server, and every fault")
struct FetcherTests {
    @Test("success: the remote copy replaces the bundled one and is published; datasets.get pages it")
    func success() async throws {
        let server = try await FixtureServer.start()
        let bus = try await FetcherBus.start([.items: server.url("/ok/hiring.json"), .countries: server.url("/redirect/countries.json")])
        try await bus.remoteCopy(.items)
        let items = try await bus.entry(.items)
        #expect(items["records"] == 1000 && items["lastError"] == nil && items["fetchedAt"]?.stringValue != nil)
        // Followed a redirect.
        try await bus.remoteCopy(.countries)
        // Published with the same version and origin.
        let published = try await bus.published(.items)
        #expect(published?.value["origin"] == "remote" && published?.value["version"] == items["version"])
        // Datasets without a URL stay bundled, with no error.
        let flights = try await bus.entry(.flights)
        #expect(flights["origin"] == "bundled" && flights["records"] == 11 && flights["lastError"] == nil)
        // Paged records.
        let page = try await bus.client.request(service: "fetcher", method: "datasets.get", params: ["name": "items", "offset": 998, "limit": 5])
        #expect(page["total"] == 1000 && page["records"]?.arrayValue?.count == 2 && page["origin"] == "remote")
        let bad = try? await bus.client.request(service: "fetcher", method: "datasets.get", params: ["name": "planets"])
        #expect(bad == nil)
        await bus.stop()
        await server.stop()
    }

    @Test("a refresh of every dataset in parts: one progress part as each download ends, a failed one says so, then the whole answer")
    func refreshInParts() async throws {
        let server = try await FixtureServer.start()
        let bus = try await FetcherBus.start([.items: server.url("/ok/hiring.json"), .countries: server.url("/status/500/countries.json")], attempts: 1)
        let refresh = bus.client.stream(FetcherAPI.datasetsRefreshStream, .init())
        var steps: [FetcherAPI.RefreshProgress] = []
        for try await step in refresh { steps.append(step) }
        let end = try await refresh.end()
        #expect(steps.map(\.done) == Array(1...Dataset.allCases.count) && steps.allSatisfy { $0.total == Dataset.allCases.count })
        #expect(Set(steps.map(\.name)) == Set(Dataset.allCases.map(\.rawValue)))
        #expect(steps.first { $0.name == "countries" }?.lastError != nil && steps.first { $0.name == "items" }?.lastError == nil)
        #expect(end.map(\.name) == Dataset.allCases.map(\.rawValue))
        await bus.stop()
        await server.stop()
    }

    @Test("500 twice, then success after retries")
    func retries() async throws {
        let server = try await FixtureServer.start()
        let bus = try await FetcherBus.start([.items: server.url("/flaky/2/hiring.json")])
        try await bus.remoteCopy(.items)
        #expect(try await server.count("/flaky/2/hiring.json") == 3)
        await bus.stop()
        await server.stop()
    }

    @Test("refreshes asked for during a download queue one more after it; a burst costs two downloads, not six")
    func refreshDuringDownload() async throws {
        let server = try await FixtureServer.start()
        let path = "/slow/1/hiring.json"
        let bus = try await FetcherBus.start([.items: server.url(path)], timeout: .seconds(10))
        try await bus.remoteCopy(.items, within: 15)
        let before = try await server.count(path)
        // On the service itself: through the bus, the worker connections would let only a few in at once.
        let first = Task { await bus.fetcher.refresh(.items) }
        // The first download is under way (the server counted it) before the burst.
        try await eventually(10, "the first download started") { try await server.count(path) == before + 1 }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<5 { group.addTask { await bus.fetcher.refresh(.items) } }
            try await group.waitForAll()
        }
        await first.value
        let downloads = try await server.count(path) - before
        #expect(downloads == 2)
        await bus.stop()
        await server.stop()
    }

    @Test("failures keep the good copy, report the error, and publish nothing", arguments: [
        ("/slow/5/hiring.json", "timed out"),
        ("/truncated/hiring.json", "closed the connection"),
        ("/ok/malformed.json", "items: not valid JSON"),
        ("/status/404/hiring.json", "HTTP 404"),
    ])
    func failure(path: String, error: String) async throws {
        let server = try await FixtureServer.start()
        // First a good remote copy, then the source turns bad.
        let good = try await FetcherBus.start([.items: server.url("/ok/hiring.json")], timeout: .milliseconds(500), attempts: 2)
        try await good.remoteCopy(.items)
        let before = try await good.entry(.items)
        let publishedBefore = try await good.published(.items)
        try await good.waitForSnapshot(.items)
        await good.stop(keepKernel: true)

        let bus = try await FetcherBus.start([.items: server.url(path)], timeout: .milliseconds(500), attempts: 2,
                                             kernel: good.kernel, folder: good.folder)
        let after = try await bus.refresh(.items)
        // The last good remote copy came back from the store and stays.
        #expect(after["origin"] == "cache")
        #expect(after["version"] == before["version"] && after["records"] == 1000)
        #expect(after["lastError"]?.stringValue?.contains(error) == true, "\(after["lastError"] ?? .null)")
        // Published once for the change of origin (remote -> cache) at start; not again for the failure.
        let publishedAfterStart = try await bus.published(.items)
        _ = try await bus.refresh(.items)
        #expect(try await bus.published(.items)?.sequence == publishedAfterStart?.sequence)
        #expect(publishedAfterStart?.sequence != publishedBefore?.sequence)
        await bus.stop()
        await server.stop()
    }

    @Test("a NewsAPI error body is refused with NewsAPI's message; the bundled copy stays")
    func newsAPIError() async throws {
        let server = try await FixtureServer.start()
        let bus = try await FetcherBus.start([.headlines: server.url("/ok/newsapi-error.json"),
                                              .sources: server.url("/status/401/newsapi-error.json")])
        let headlines = try await bus.refresh(.headlines)
        #expect(headlines["origin"] == "bundled" && headlines["records"] == 50)
        #expect(headlines["lastError"]?.stringValue?.contains("NewsAPI answered an error: apiKeyInvalid") == true)
        let sources = try await bus.refresh(.sources)
        #expect(sources["origin"] == "bundled")
        #expect(sources["lastError"]?.stringValue?.contains("HTTP 401") == true)
        #expect(sources["lastError"]?.stringValue?.contains("Your API key is invalid") == true)
        await bus.stop()
        await server.stop()
    }

    @Test("a 304 keeps the current copy and publishes nothing")
    func notModified() async throws {
        let server = try await FixtureServer.start()
        let bus = try await FetcherBus.start([.airlines: server.url("/ok/airlines.json")])
        // Loaded: a refresh asked while the first download is under way waits for it, then
        // runs the next (a 304). The service published every dataset once meanwhile, beside
        // the downloads.
        #expect(try await bus.refresh(.airlines)["origin"] == "remote")
        let published = try await bus.published(.airlines)
        let again = try await bus.refresh(.airlines)
        #expect(again["origin"] == "remote" && again["lastError"] == nil)
        #expect(try await server.count("/ok/airlines.json") == 3)
        #expect(try await bus.published(.airlines)?.sequence == published?.sequence)
        await bus.stop()
        await server.stop()
    }

    @Test("a body over the size limit is refused")
    func tooLarge() async throws {
        let server = try await FixtureServer.start()
        let bus = try await FetcherBus.start([.countries: server.url("/ok/countries.json")], maxBytes: 10_000)
        let countries = try await bus.refresh(.countries)
        #expect(countries["origin"] == "bundled")
        #expect(countries["lastError"]?.stringValue?.contains("over the limit of 10000") == true)
        await bus.stop()
        await server.stop()
    }

    @Test("the server goes away: the remote copy stays, the error says so; a restart brings back the store's copy")
    func serverGone() async throws {
        let server = try await FixtureServer.start()
        let bus = try await FetcherBus.start([.locations: server.url("/ok/locations.json")], timeout: .milliseconds(500), attempts: 1)
        try await bus.remoteCopy(.locations)
        let version = try await bus.entry(.locations)["version"]
        try await bus.waitForSnapshot(.locations)
        await server.stop()
        let after = try await bus.refresh(.locations)
        #expect(after["origin"] == "remote" && after["version"] == version)
        #expect(after["lastError"] != nil, "\(after)")
        #expect(!server.process.isRunning)
        await bus.stop(keepKernel: true)

        // A fetcher restart: the last good remote copy, from the store, not the bundled one.
        let restarted = try await FetcherBus.start([.locations: server.url("/ok/locations.json")], timeout: .milliseconds(500),
                                                   attempts: 1, kernel: bus.kernel, folder: bus.folder)
        let entry = try await restarted.entry(.locations)
        #expect(entry["origin"] == "cache" && entry["version"] == version)
        await restarted.stop()
    }

    @Test("a refresh cancelled under way (the fetcher stopping) is no failure: nothing is warned of")
    func cancelledRefresh() async throws {
        let server = try await FixtureServer.start()
        let logs = LogLines()
        var configuration = FetcherConfiguration(sources: [:])
        configuration.sources[.countries] = .init(url: server.url("/slow/30/countries.json"), timeout: .seconds(60))
        configuration.attempts = 1
        let fetcher = FetcherService(configuration: configuration, environment: [:], logger: logs.logger("fetcher"))
        let refreshing = Task { await fetcher.refresh(.countries) }
        refreshing.cancel()
        try await within(20, "the cancelled refresh ended (the server answers after 30 s)") { await refreshing.value }
        #expect(logs.lines.value.filter { $0.hasPrefix("warning") || $0.hasPrefix("error") }.isEmpty, "\(logs.text)")
        await fetcher.finish()
        await server.stop()
    }

    @Test("file:// URLs")
    func fileURL() async throws {
        let folder = try temporaryDirectory("fetcher-file")
        let file = folder.appendingPathComponent("flights.json")
        try Dataset.flights.bundledData().write(to: file)
        let bus = try await FetcherBus.start([.flights: file])
        let flights = try await bus.refresh(.flights)
        #expect(flights["origin"] == "remote" && flights["records"] == 11)
        await bus.stop()
        // A file is read no further than the limit, even one that never ends; one that
        // cannot be read says why.
        let limited = try await FetcherBus.start([.flights: URL(fileURLWithPath: "/dev/zero"), .airlines: folder.appendingPathComponent("none.json")],
                                                 maxBytes: 10_000)
        let endless = try await limited.refresh(.flights)
        #expect(endless["origin"] == "bundled" && endless["lastError"]?.stringValue?.contains("cannot read /dev/zero: it holds more than the limit of 10000 bytes") == true, "\(endless)")
        let missing = try await limited.refresh(.airlines)
        #expect(missing["lastError"]?.stringValue?.contains("none.json: No such file or directory") == true, "\(missing)")
        await limited.stop()
    }
}
