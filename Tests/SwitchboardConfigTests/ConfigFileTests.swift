import Foundation
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

    @Test("bad files are rejected with the key's path and what was expected", arguments: [
        ("kernel:\n  hearbeat_ms: 10", "kernel.hearbeat_ms: unknown key"),
        ("kernels: {}", "kernels: unknown key"),
        ("kernel:\n  heartbeat_ms: fast", #"kernel.heartbeat_ms: expected a positive integer, got "fast""#),
        ("kernel:\n  liveness: -1", "kernel.liveness: expected a positive integer, got -1"),
        ("kernel:\n  broker: localhost:5555", #"kernel.broker: expected an endpoint such as tcp://127.0.0.1:5555, got "localhost:5555""#),
        ("kernel:\n  writable_prefixes: [client]", "kernel.writable_prefixes: expected key prefixes starting with '/'"),
        ("kernel: [1, 2]", "kernel: expected a mapping of keys to values, got a list"),
        ("kernel: {broker: [", "not valid YAML"),
    ])
    func rejected(text: String, message: String) {
        let error = #expect(throws: ConfigError.self) { try ConfigFile.parse(text) }
        #expect(error?.description.hasPrefix(message) == true, "\(error?.description ?? "-")")
    }
}
