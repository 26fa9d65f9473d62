import BusProtocol
import Contracts
import Foundation
import SwitchboardTestSupport
import Testing

/// `Tests/Interop/otlp_receiver.py`: an OTLP/HTTP endpoint that decodes what it is sent with
/// the official protobuf definitions (PyPI's opentelemetry-proto, in the virtual environment
/// `Scripts/bootstrap --tests` makes) and prints each span as a JSON line.
struct OTLPReceiver {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    let process: ChildProcess
    let endpoint: String

    /// With `tls`, over HTTPS with its server certificate, taking only clients with a
    /// certificate its CA signed.
    static func start(tls: TestCertificates? = nil) async throws -> OTLPReceiver {
        let python = root.appendingPathComponent(".build/python-otlp/bin/python")
        let files = tls.map { [$0.path("server.pem"), $0.path("server.key"), $0.path("ca.pem")] } ?? []
        let process = try ChildProcess(python, ["-u", root.appendingPathComponent("Tests/Interop/otlp_receiver.py").path, "0"] + files)
        let first = try await process.waitForOutput(containing: "\n", within: 20)
        let port = try #require(try JSONValue(parsing: Array(first.prefix { $0 != "\n" }.utf8))["listening"]?.intValue, "the receiver said: \(first)")
        return OTLPReceiver(process: process, endpoint: "\(tls == nil ? "http" : "https")://127.0.0.1:\(port)")
    }

    /// The spans received so far.
    var spans: [JSONValue] { received.filter { $0["spanId"] != nil } }

    /// The metric data points received so far.
    var metrics: [JSONValue] { received.filter { $0["metric"] != nil } }

    /// Waits until `condition` holds of the spans and metric data points received (asked
    /// again each time the receiver prints one).
    func waitFor(_ what: String, within seconds: Double = 20, _ condition: @escaping @Sendable (_ spans: [JSONValue], _ metrics: [JSONValue]) -> Bool) async throws {
        try await process.waitForOutput(what, within: seconds) { output in
            let received = Self.received(output)
            return condition(received.filter { $0["spanId"] != nil }, received.filter { $0["metric"] != nil })
        }
    }

    private var received: [JSONValue] { Self.received(process.outputSoFar) }

    private static func received(_ output: String) -> [JSONValue] {
        output.split(separator: "\n").dropFirst().compactMap { try? JSONValue(parsing: Array($0.utf8)) }
    }
}

@Suite("OpenTelemetry: every process's spans of a request reach a real OTLP receiver as one trace; the kernel's figures as metrics", .serialized)
struct TelemetryTests {
    @Test("one traced sb request through switchboard up: sb's request, the kernel's dispatch, search's handler, its request to the store and the store's handler, in one trace, each parented by the span that caused it; a request answered in parts (a dataset's refresh, a stream followed) is a span too, not failed when its reader lets go")
    func oneTrace() async throws {
        let receiver = try await OTLPReceiver.start()
        defer { receiver.process.stop() }
        let folder = try temporaryDirectory("telemetry")
        let (config, broker) = try writeDeploymentConfig(in: folder, extra: """
            telemetry:
              endpoint: \(receiver.endpoint)
              resource: {deployment.environment: test}
            """)
        // Metrics every half second instead of every minute (a standard OpenTelemetry variable).
        let up = try ChildProcess(switchboardExecutable(), ["up", "--config", config.path], environment: ["OTEL_METRIC_EXPORT_INTERVAL": "500"])
        defer { up.stop(grace: 15) }
        try await up.waitForOutput(containing: "Stop with Ctrl-C", within: 120)

        let traced = try await runCommand(sbExecutable(), ["request", "search", "locations.resolve", #"{"query":"Amsterdam"}"#, "--trace",
                                                           "--endpoint", broker, "--key-dir", busKeyFolder(in: folder).path],
                                          environment: ["OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint])
        let traceID = try #require(traced.stderr.split(separator: "\n").first { $0.hasPrefix("sb: trace ") }?.split(separator: " ").last, "\(traced)")
        #expect(traced.status == 0, "\(traced)")
        // sb sent its spans before it exited; the bus's processes send theirs within a second.
        let expected: Set = ["sb trace", "sb search/locations.resolve", "switchboard-kernel kernel dispatch search", "switchboard-search search/locations.resolve",
                             "switchboard-search store/history.add", "switchboard-kernel kernel dispatch store", "switchboard-store store/history.add"]
        @Sendable func ofTrace(_ spans: [JSONValue]) -> [JSONValue] { spans.filter { $0["traceId"]?.stringValue == String(traceID) } }
        try await receiver.waitFor("every process's spans of the trace") { spans, _ in
            Set(ofTrace(spans).map { "\($0["service"]?.stringValue ?? "") \($0["name"]?.stringValue ?? "")" }).isSuperset(of: expected)
        }
        let spans = ofTrace(receiver.spans)
        func span(_ service: String, _ name: String) throws -> JSONValue {
            try #require(spans.first { $0["service"]?.stringValue == service && $0["name"]?.stringValue == name }, "\(spans)")
        }
        func id(_ span: JSONValue) -> String { span["spanId"]?.stringValue ?? "" }
        func parent(_ span: JSONValue) -> String { span["parentSpanId"]?.stringValue ?? "" }
        let root = try span("sb", "trace"), client = try span("sb", "search/locations.resolve")
        let searchHandler = try span("switchboard-search", "search/locations.resolve")
        let storeCall = try span("switchboard-search", "store/history.add"), storeHandler = try span("switchboard-store", "store/history.add")
        let searchDispatch = try span("switchboard-kernel", "kernel dispatch search"), storeDispatch = try span("switchboard-kernel", "kernel dispatch store")
        #expect(parent(root).isEmpty && parent(client) == id(root))
        #expect(parent(searchHandler) == id(client) && parent(searchDispatch) == id(client))
        #expect(parent(storeCall) == id(searchHandler))
        #expect(parent(storeHandler) == id(storeCall) && parent(storeDispatch) == id(storeCall))
        #expect(client["kind"] == "SPAN_KIND_CLIENT" && searchHandler["kind"] == "SPAN_KIND_SERVER" && searchHandler["attributes"]?["rpc.method"] == "locations.resolve")
        #expect(spans.allSatisfy { $0["status"] != 2 }, "no span failed: \(spans)")
        // Each process names the build's version; the bus's beside what the deployment's
        // resource names (sb reads no configuration file).
        #expect(spans.allSatisfy { $0["resource"]?["service.version"] == .string(SwitchboardVersion.current)
                    && ($0["service"] == "sb" || $0["resource"]?["deployment.environment"] == "test") },
                "\(spans.map { $0["resource"] ?? .null })")

        // A request answered in parts (a dataset's refresh, a bar moved on by each) is a span
        // too, from when it is sent until its end: the fetcher's is its child.
        let refreshed = try await runCommand(sbExecutable(), ["datasets", "refresh", "items", "--endpoint", broker, "--key-dir", busKeyFolder(in: folder).path],
                                             environment: ["OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint])
        #expect(refreshed.status == 0, "\(refreshed)")
        try await receiver.waitFor("the refresh's spans in sb and the fetcher") { spans, _ in
            spans.contains { $0["service"] == "sb" && $0["name"] == "fetcher/datasets.refresh" }
                && spans.contains { $0["service"] == "switchboard-fetcher" && $0["name"] == "fetcher/datasets.refresh" }
        }
        let refresh = try #require(receiver.spans.first { $0["service"] == "sb" && $0["name"] == "fetcher/datasets.refresh" })
        let refreshHandler = try #require(receiver.spans.first { $0["service"] == "switchboard-fetcher" && $0["name"] == "fetcher/datasets.refresh" })
        #expect(refresh["kind"] == "SPAN_KIND_CLIENT" && parent(refresh).isEmpty && refresh["status"] != 2, "\(refresh)")
        #expect(parent(refreshHandler) == id(refresh) && refreshHandler["traceId"] == refresh["traceId"], "\(refreshHandler)")
        // A stream followed until its reader lets go (Ctrl-C) ends as it should: not failed.
        let keyDir = busKeyFolder(in: folder).path
        for words in [["stream", "add", "traced", "traced."], ["stream", "consumer", "traced", "reader"], ["stream", "pub", "traced.one", "1"]] {
            let done = try await runCommand(sbExecutable(), words + ["--endpoint", broker, "--key-dir", keyDir])
            #expect(done.status == 0, "\(words): \(done)")
        }
        let following = try ChildProcess(sbExecutable(), ["stream", "sub", "traced", "reader", "--endpoint", broker, "--key-dir", keyDir],
                                         environment: ["OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "NO_COLOR": ""])
        defer { following.stop() }
        try await following.waitForOutput(containing: "1 traced.one (delivery 1) 1", within: 30)
        following.signal(SIGINT)
        #expect(await following.exit(within: 30))
        try await receiver.waitFor("the followed stream's span in sb") { spans, _ in
            spans.contains { $0["service"] == "sb" && $0["name"] == "streams/consumer.next" }
        }
        let followed = try #require(receiver.spans.first { $0["service"] == "sb" && $0["name"] == "streams/consumer.next" })
        #expect(followed["kind"] == "SPAN_KIND_CLIENT" && followed["status"] != 2, "\(followed)")

        // sb without an endpoint sends its requests in unsampled traces: no process records a
        // span of them. Then a request that fails is a failed span, in sb and in the service;
        // once those have come, the unsampled request's would have come before them.
        let quiet = try await runCommand(sbExecutable(), ["request", "echo", "echo", "--endpoint", broker, "--key-dir", busKeyFolder(in: folder).path])
        #expect(quiet.status == 0, "\(quiet)")
        let failing = try await runCommand(sbExecutable(), ["request", "echo", "fail", "--endpoint", broker, "--key-dir", busKeyFolder(in: folder).path],
                                           environment: ["OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint])
        #expect(failing.status == 1, "\(failing)")
        try await receiver.waitFor("the failed request's spans") { spans, _ in
            spans.contains { $0["service"] == "sb" && $0["name"] == "echo/fail" && $0["status"] == 2 }
                && spans.contains { $0["service"] == "switchboard-echo" && $0["name"] == "echo/fail" && $0["status"] == 2 }
                && spans.contains { $0["service"] == "switchboard-kernel" && $0["name"] == "kernel dispatch echo" }
        }
        #expect(!receiver.spans.contains { $0["name"] == "echo/echo" }, "an unsampled request made a span")

        // The kernel's figures (`kernel stats`) as metrics: the requests it routed to search.
        try await receiver.waitFor("the kernel's request count for search as a metric") { _, metrics in
            metrics.contains { $0["service"] == "switchboard-kernel" && $0["metric"] == "switchboard.requests"
                && $0["attributes"]?["service"] == "search" && ($0["value"]?.doubleValue ?? 0) >= 1 }
        }
        #expect(receiver.metrics.contains { $0["service"] == "switchboard-kernel" && $0["metric"] == "switchboard.workers"
            && $0["attributes"]?["service"] == "store" && ($0["value"]?.doubleValue ?? 0) >= 1 }, "\(receiver.metrics.prefix(20))")
        // The metrics exporter's own calls are not traced (each would be a span for the next export to send).
        #expect(!receiver.spans.contains { $0["attributes"]?["url.path"] != nil }, "\(receiver.spans.filter { $0["attributes"]?["url.path"] != nil }.prefix(3))")

        // A bad section stops a process before it starts, naming the key.
        let bad = folder.appendingPathComponent("bad.yaml")
        try "telemetry:\n  sampling: 2\n".write(to: bad, atomically: true, encoding: .utf8)
        let refused = try await runCommand(switchboardExecutable(), ["kernel", "--config", bad.path])
        #expect(refused.status == 78 && refused.stderr.contains("telemetry.sampling"), "\(refused)")
    }

    @Test("to a collector over HTTPS that asks for a client certificate: a kernel on etcd sends its figures and its spans with telemetry's ca_file, cert_file and key_file, sb with OTEL_EXPORTER_OTLP_CERTIFICATE and the like; no span of an export or of a call to etcd; an export to a collector whose certificate is not trusted logged with why; TLS files that cannot apply are refused",
          .enabled(if: TestEtcd.available, "needs etcd-server (Scripts/bootstrap --tests installs it)"))
    func overTLS() async throws {
        let certificates = try await TestCertificates.make()
        defer { certificates.remove() }
        let receiver = try await OTLPReceiver.start(tls: certificates)
        defer { receiver.process.stop() }
        let cluster = try await TestEtcd.start()
        defer { cluster.stop() }
        // A short lease: the kernel renews it with etcd several times a second.
        let (kernel, broker) = try kernelOnEtcd(cluster, leaseSeconds: 2, environment: [
            "SWITCHBOARD_TELEMETRY_ENDPOINT": receiver.endpoint, "SWITCHBOARD_TELEMETRY_CA_FILE": certificates.path("ca.pem"),
            "SWITCHBOARD_TELEMETRY_CERT_FILE": certificates.path("client.pem"), "SWITCHBOARD_TELEMETRY_KEY_FILE": certificates.path("client.key"),
            "OTEL_METRIC_EXPORT_INTERVAL": "300",
        ])
        defer { kernel.stop() }
        let echo = try ChildProcess(switchboardExecutable(), ["serve", "echo", "--broker", broker, "--connections", "1"])
        defer { echo.stop() }
        try await receiver.waitFor("the kernel's figures, exported several times") { _, metrics in
            metrics.filter { $0["service"] == "switchboard-kernel" && $0["metric"] == "switchboard.workers" && $0["attributes"]?["service"] == "echo" }.count >= 3
        }

        let traced = try await runCommand(sbExecutable(), ["request", "echo", "echo", "--trace", "--endpoint", broker], environment: [
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_CERTIFICATE": certificates.path("ca.pem"),
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certificates.path("client.pem"), "OTEL_EXPORTER_OTLP_CLIENT_KEY": certificates.path("client.key"),
        ])
        #expect(traced.status == 0, "\(traced)")
        try await receiver.waitFor("sb's spans and the kernel's dispatch") { spans, _ in
            spans.contains { $0["service"] == "sb" && $0["name"] == "echo/echo" }
                && spans.contains { $0["service"] == "switchboard-kernel" && $0["name"] == "kernel dispatch echo" }
        }
        // The kernel's spans of the time before came in the same batches as its dispatch.
        let untraced = receiver.spans.filter { $0["attributes"]?["url.path"] != nil }
        #expect(untraced.isEmpty, "spans of the exporters' or the etcd client's own calls: \(untraced.prefix(3))")

        // Not told the CA: the request is answered, and the export that fails says why.
        let untrusting = try await runCommand(sbExecutable(), ["request", "echo", "echo", "--trace", "--endpoint", broker],
                                              environment: ["OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint])
        #expect(untrusting.status == 0 && untrusting.stderr.contains("CERTIFICATE_VERIFY_FAILED"), "\(untrusting)")

        let folder = try temporaryDirectory("telemetry-tls")
        defer { try? FileManager.default.removeItem(at: folder) }
        for (yaml, key) in [("telemetry:\n  endpoint: http://127.0.0.1:4318\n  ca_file: \(certificates.path("ca.pem"))\n", "telemetry.ca_file"),
                            ("telemetry:\n  endpoint: \(receiver.endpoint)\n  cert_file: \(certificates.path("client.pem"))\n", "telemetry.key_file")] {
            let config = folder.appendingPathComponent("bad.yaml")
            try yaml.write(to: config, atomically: true, encoding: .utf8)
            let refused = try await runCommand(switchboardExecutable(), ["kernel", "--config", config.path])
            #expect(refused.status == 78 && refused.stderr.contains(key), "\(refused)")
        }
    }

    @Test("an endpoint variable that is not a URL (127.0.0.1:4318, its scheme left out) is refused at the start, naming it: by the pieces and check (78), and by sb (64, as its other OTEL_* mistakes)")
    func endpointVariableNotAURL() async throws {
        let folder = try temporaryDirectory("telemetry-variable")
        defer { try? FileManager.default.removeItem(at: folder) }
        let config = folder.appendingPathComponent("plain.yaml")
        try "log_level: info\n".write(to: config, atomically: true, encoding: .utf8)
        for variable in ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] {
            let environment = [variable: "127.0.0.1:4318"]
            for arguments in [["check"], ["serve", "echo", "--broker", "tcp://127.0.0.1:\(freePort())"]] {
                let refused = try await runCommand(switchboardExecutable(), arguments + ["--config", config.path], environment: environment, seconds: 20)
                #expect(refused.status == 78 && refused.stderr.contains("\(variable): expected an http:// or https:// URL"), "\(arguments): \(refused)")
            }
            let sb = try await runCommand(sbExecutable(), ["ping", "--endpoint", "tcp://127.0.0.1:\(freePort())", "--timeout", "300ms"], environment: environment)
            #expect(sb.status == 64 && sb.stderr.contains("telemetry (OTEL_* variables): \(variable): expected an http:// or https:// URL"), "\(sb)")
        }
    }
}
