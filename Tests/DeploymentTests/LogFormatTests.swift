import BusProtocol
import Foundation
import Kernel
import SwitchboardTestSupport
import Testing

@Suite("Log lines as JSON: --log-format json, or log_format in the configuration")
struct LogFormatTests {
    @Test("serve with --log-format json writes one JSON object per line, a traced request's lines with its trace_id and span_id, a failed export of its spans too; log_format: xml is refused naming the key")
    func jsonLines() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        // Telemetry to a port where nothing listens: the export that fails is a JSON line too.
        let echo = try ChildProcess(switchboardExecutable(), ["serve", "echo", "--broker", kernel.endpoints.broker, "--log-format", "json",
                                                              "--heartbeat-ms", "100", "--liveness", "10"],
                                    environment: ["SWITCHBOARD_TELEMETRY_ENDPOINT": "http://127.0.0.1:\(freePort())"])
        defer { echo.stop() }
        try await kernel.workers("echo")
        let traced = try await runCommand(sbExecutable(), ["request", "echo", "echo", #"{"hello":"log"}"#, "--trace", "--endpoint", kernel.endpoints.broker])
        let traceID = try #require(traced.stderr.split(separator: "\n").first { $0.hasPrefix("sb: trace ") }?.split(separator: " ").last, "\(traced)")
        try await echo.waitForOutput(containing: String(traceID), within: 10)
        echo.signal(SIGTERM)
        #expect(await echo.exit(within: 30))

        let lines = echo.outputSoFar.split(separator: "\n")
        #expect(lines.count >= 2, "\(lines)")
        var objects: [JSONValue] = []
        for line in lines {
            let object = try JSONValue(parsing: Array(line.utf8))
            #expect(object["time"]?.stringValue.flatMap(Timestamp.parse) != nil && object["level"]?.stringValue != nil
                    && object["label"]?.stringValue?.hasPrefix("switchboard.") == true && object["message"]?.stringValue != nil, "\(line)")
            objects.append(object)
        }
        let tracedLine = try #require(objects.first { $0["trace_id"]?.stringValue == String(traceID) }, "\(lines)")
        #expect(tracedLine["span_id"]?.stringValue?.count == 16 && tracedLine["metadata"]?["trace_id"] == nil, "\(tracedLine)")
        #expect(objects.contains { $0["message"] == "service hosted" && $0["metadata"]?["service"] == "echo" }, "\(lines)")
        #expect(objects.contains { $0["label"] == "switchboard.telemetry" && $0["level"] == "warning"
                    && $0["metadata"]?["error.message"]?.stringValue?.contains("Connection refused") == true }, "\(lines)")

        let folder = try temporaryDirectory("log-format")
        let config = folder.appendingPathComponent("bad.yaml")
        try "log_format: xml\n".write(to: config, atomically: true, encoding: .utf8)
        let refused = try await runCommand(switchboardExecutable(), ["kernel", "--config", config.path])
        #expect(refused.status == 78 && refused.stderr.contains("log_format"), "\(refused)")
        await kernel.stop()
    }
}
