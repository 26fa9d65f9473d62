import Foundation
import FetcherService
import Kernel
import SwitchboardConfig
import Testing

@Suite("Config/switchboard.yaml")
struct ConfigFileTests {
    @Test("the shipped file parses to the defaults")
    func shippedFile() throws {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Config/switchboard.yaml")
        #expect(try ConfigFile.load(url) == ConfigFile())
    }

    @Test("values are read")
    func values() throws {
        let file = try ConfigFile.parse("""
            kernel:
              broker: tcp://0.0.0.0:6000
              heartbeat_ms: 1000
              liveness: 5
              no_retry: [store]
            """)
        #expect(file.kernel.brokerEndpoint == "tcp://0.0.0.0:6000")
        #expect(file.kernel.heartbeatInterval == .milliseconds(1000))
        #expect(file.kernel.heartbeatLiveness == 5)
        #expect(file.kernel.nonRetriableServices == ["store"])
    }

    @Test("the store and fetcher sections")
    func services() throws {
        let file = try ConfigFile.parse("""
            store:
              path: /var/lib/switchboard/store.sqlite
              history_limit: 20
              max_size_mb: 10
            fetcher:
              attempts: 5
              datasets:
                items:
                  url: file:///srv/hiring.json
                  refresh_seconds: 60
                  timeout_ms: 1500
                  max_mb: 2
                  headers: {X-Token: $TOKEN}
            """)
        #expect(file.store.path == "/var/lib/switchboard/store.sqlite" && file.store.historyLimit == 20)
        #expect(file.store.maxSizeBytes == 10 * 1_048_576)
        #expect(file.fetcher.attempts == 5)
        let items = file.fetcher.sources[.items]
        #expect(items?.url == URL(string: "file:///srv/hiring.json") && items?.refreshInterval == .seconds(60))
        #expect(items?.timeout == .milliseconds(1500) && items?.maxBytes == 2 * 1_048_576 && items?.headers == ["X-Token": "$TOKEN"])
        // Datasets not named keep their defaults.
        #expect(file.fetcher.sources[.countries] == FetcherConfiguration.defaults.sources[.countries])
    }

    @Test("bad files are rejected with the key's path and what was expected", arguments: [
        ("kernel:\n  hearbeat_ms: 10", "kernel.hearbeat_ms: unknown key"),
        ("kernels: {}", "kernels: unknown key"),
        ("kernel:\n  heartbeat_ms: fast", #"kernel.heartbeat_ms: expected a positive integer, got "fast""#),
        ("kernel:\n  liveness: -1", "kernel.liveness: expected a positive integer, got -1"),
        ("kernel:\n  broker: localhost:5555", #"kernel.broker: expected an endpoint such as tcp://127.0.0.1:5555, got "localhost:5555""#),
        ("kernel:\n  writable_prefixes: [client]", "kernel.writable_prefixes: expected key prefixes starting with '/'"),
        ("kernel: [1, 2]", "kernel: expected a mapping of keys to values, got a list"),
        ("kernel: {broker: [", "not valid YAML"),
        ("store:\n  history_limit: 0", "store.history_limit: expected a positive integer, got 0"),
        ("store:\n  path: [a]", "store.path: expected a file path, got a list"),
        ("store:\n  paht: x", "store.paht: unknown key"),
        ("fetcher:\n  datasets:\n    planets: {}", "fetcher.datasets.planets: unknown key"),
        ("fetcher:\n  datasets:\n    items: {url: 'ftp://x/y'}", #"fetcher.datasets.items.url: expected an http, https or file URL, got "ftp://x/y""#),
        ("fetcher:\n  datasets:\n    items: {timeout_ms: soon}", #"fetcher.datasets.items.timeout_ms: expected a positive integer, got "soon""#),
        ("fetcher:\n  attempts: -2", "fetcher.attempts: expected a positive integer, got -2"),
    ])
    func rejected(text: String, message: String) {
        let error = #expect(throws: ConfigError.self) { try ConfigFile.parse(text) }
        #expect(error?.description.hasPrefix(message) == true, "\(error?.description ?? "-")")
    }
}
