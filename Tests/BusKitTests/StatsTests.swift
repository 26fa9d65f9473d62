import BusKit
import BusProtocol
import Foundation
import Kernel
import SwitchboardTestSupport
import Testing

@Suite("kernel stats and the Prometheus exposition")
struct StatsTests {
    @Test("requests, errors, workers and latencies per service; the same in Prometheus text")
    func statsAndMetrics() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let host = try await hostEcho(kernel)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        try await kernel.workers("echo")
        for index in 0..<5 { _ = try await bus.request(service: "echo", method: "echo", params: ["n": .int(Int64(index))]) }
        for _ in 0..<2 { _ = try? await bus.request(service: "echo", method: "nope") }
        // An "error" inside a result is not an error reply.
        _ = try await bus.request(service: "echo", method: "echo", params: ["error": ["code": 1]])

        // Error counts come with the workers' heartbeats (within 100 ms of an error reply).
        try await eventually(5, "errors reported") {
            try await bus.request(service: "kernel", method: "stats")["services"]?["echo"]?["errors"] == 2
        }
        let stats = try await bus.request(service: "kernel", method: "stats")
        let echo = try #require(stats["services"]?["echo"])
        #expect(echo["requests"] == 8 && echo["replies"] == 8 && echo["errors"] == 2)
        #expect(echo["workers"] == 2 && echo["queued"] == 0)
        let p50 = try #require(echo["p50LatencyMicroseconds"]?.intValue), p99 = try #require(echo["p99LatencyMicroseconds"]?.intValue)
        #expect(p50 > 0 && p99 >= p50)

        let metrics = try await bus.request(service: "kernel", method: "metrics")
        let text = try #require(metrics["text"]?.stringValue)
        #expect(metrics["contentType"] == "text/plain; version=0.0.4")
        #expect(text.contains("# TYPE switchboard_requests_total counter\n"))
        #expect(text.contains("switchboard_requests_total{service=\"echo\"} 8\n"))
        #expect(text.contains("switchboard_errors_total{service=\"echo\"} 2\n"))
        #expect(text.contains("switchboard_workers{service=\"echo\"} 2\n"))
        #expect(text.contains("switchboard_request_duration_seconds_bucket{service=\"echo\",le=\"+Inf\"} 8\n"))
        #expect(text.contains("switchboard_request_duration_seconds_count{service=\"echo\"} 8\n"))
        // Every sample line is NAME{labels} VALUE or NAME VALUE.
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            #expect(line.split(separator: " ").count == 2 && line.hasPrefix("switchboard_"), "\(line)")
        }
        await bus.close()
        await host.stop()
        await kernel.stop()
    }
}
