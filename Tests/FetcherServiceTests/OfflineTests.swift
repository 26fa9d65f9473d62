import BusKit
import BusProtocol
import Catalog
import FetcherService
import Foundation
import Kernel
import SwitchboardTestSupport
import Testing

@Suite("fetcher: no network at all")
struct FetcherOfflineTests {
    @Test("no kernel answers its publications (one standing by, or away): said once as a warning, the rest at debug level")
    func publishingToNoKernel() async throws {
        let logs = LogLines()
        let client = try await BusClient(brokers: ["tcp://127.0.0.1:\(freePort())"], timeout: .milliseconds(200))
        let fetcher = FetcherService(configuration: FetcherConfiguration(sources: [:]), environment: [:],
                                     logger: logs.logger("fetcher", level: .debug), client: client, publisher: StatePublisher(client: client))
        await fetcher.republish()
        await fetcher.republish()
        await fetcher.finish()
        await client.close()
        // Each line is "LEVEL MESSAGE fields".
        let failures = logs.lines.value.filter { $0.split(separator: " ", maxSplits: 1).last?.hasPrefix("cannot publish") == true }
        #expect(failures.count == 2 * Dataset.allCases.count)
        #expect(failures.map { $0.prefix { $0 != " " } } == ["warning"] + Array(repeating: "debug", count: failures.count - 1))
    }

    /// `unshare -n` gives the fetcher a network namespace of its own with no interface up:
    /// the real URLs cannot be reached. The kernel listens on ipc:// (a Unix socket in a
    /// temporary folder), which crosses network namespaces.
    @Test("with the real URLs unreachable, every dataset comes up from its bundled copy")
    func offline() async throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare"),
              (try? runBriefly("/usr/bin/unshare", ["-n", "true"]).status) == 0 else {
            print("skipped: cannot create a network namespace here (needs root and unshare); the offline case is not checked")
            return
        }
        let folder = try temporaryDirectory("offline")
        let kernel = try await TestKernel.start { configuration in
            fastHeartbeats(&configuration)
            configuration.brokerEndpoint = "ipc://\(folder.path)/broker"
            configuration.snapshotEndpoint = "ipc://\(folder.path)/snapshot"
            configuration.publisherEndpoint = "ipc://\(folder.path)/publisher"
            configuration.collectorEndpoint = "ipc://\(folder.path)/collector"
        }
        // The default sources (the real URLs), tried once each.
        let config = folder.appendingPathComponent("switchboard.yaml")
        try Data("fetcher:\n  attempts: 1\n".utf8).write(to: config)
        let fetcher = try ChildProcess(URL(fileURLWithPath: "/usr/bin/unshare"), [
            "-n", switchboardExecutable().path, "serve", "fetcher", "--broker", kernel.endpoints.broker, "--config", config.path,
            "--heartbeat-ms", "100", "--liveness", "10", "--log-level", "error",
        ])
        let client = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(30))
        try await kernel.workers("fetcher", within: 15)
        // Every remote attempt fails at once (no route); wait until each was tried.
        try await eventually(30, "every dataset with a URL tried and failed") {
            let list = try await client.request(service: "fetcher", method: "datasets.list").arrayValue ?? []
            return list.allSatisfy { $0["url"] == nil || $0["lastError"] != nil }
        }
        let list = try await client.request(service: "fetcher", method: "datasets.list").arrayValue ?? []
        #expect(list.count == Dataset.allCases.count)
        for entry in list {
            #expect(entry["origin"] == "bundled", "\(entry)")
            #expect((entry["records"]?.intValue ?? 0) > 0, "\(entry)")
        }
        // And the records are served.
        let countries = try await client.request(service: "fetcher", method: "datasets.get", params: ["name": "countries", "limit": 1])
        #expect(countries["total"] == 249)
        fetcher.stop()
        await client.close()
        await kernel.stop()
    }
}
