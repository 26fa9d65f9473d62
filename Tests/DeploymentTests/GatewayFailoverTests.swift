import BusKit
import BusProtocol
import Foundation
import SwitchboardTestSupport
import Testing

private let haproxy = "/usr/sbin/haproxy"
/// Follows /events with curl, reconnecting with Last-Event-ID (Tests/Browser/follow_with_curl.py).
private let curlFollower = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .appendingPathComponent("Browser/follow_with_curl.py")
private let python = URL(fileURLWithPath: "/usr/bin/python3")

/// What a follower of /events received: each entry's key in order of arrival, the update
/// sequences in order, and the events that would mean a resume was not exact.
private struct Followed: CustomStringConvertible {
    var keys: [String] = []
    var sequences: [Int64] = []
    var resets = 0

    init(_ events: [JSONValue]) {
        for event in events {
            switch event["event"]?.stringValue {
            case "snapshot", "update":
                keys.append(event["data"]?["key"]?.stringValue ?? "?")
                if event["event"] == "update" { sequences.append(event["data"]?["sequence"]?.intValue ?? 0) }
            case "reset", "missed":
                resets += 1
            default:
                break
            }
        }
    }

    /// Every one of `expected` once, updates in sequence order, no reset.
    func isExact(_ expected: [String]) -> Bool {
        keys.count == expected.count && Set(keys) == Set(expected) && sequences == sequences.sorted() && resets == 0
    }

    var description: String {
        let counts = Dictionary(keys.map { ($0, 1) }, uniquingKeysWith: +)
        let repeated = counts.filter { $0.value > 1 }.keys.sorted()
        return "\(keys.count) entries, \(Set(keys).count) keys, \(repeated.count) repeated (\(repeated.prefix(3).joined(separator: ", "))), resets: \(resets)"
    }
}

@Suite("Browsers moved between gateways behind a real load balancer", .serialized)
struct GatewayFailoverTests {
    @Test("two gateways behind HAProxy; one killed, restarted, then the other killed, while Chromium's EventSource and a curl loop follow: every change exactly once",
          .enabled(if: FileManager.default.isExecutableFile(atPath: chromium) && FileManager.default.isExecutableFile(atPath: haproxy),
                   "skipped: no \(chromium) or \(haproxy) (Scripts/bootstrap --tests installs them)"))
    func browsersMoveBetweenGateways() async throws {
        let folder = try temporaryDirectory("lb")
        let kernel = try await TestKernel.start(fixedPorts: true)
        let endpoints = kernel.endpoints
        let ports = [freePort(), freePort()], balancerPort = freePort(), statsPort = freePort()
        let config = folder.appendingPathComponent("switchboard.yaml")
        try """
            kernel:
              broker: \(endpoints.broker)
              snapshot: \(endpoints.snapshot)
              publisher: \(endpoints.publisher)
              collector: \(endpoints.collector)
            gateway:
              heartbeat_seconds: 1
            security:
              curve: false
              keys_dir: \(folder.appendingPathComponent("keys").path)
            """.write(to: config, atomically: true, encoding: .utf8)
        func startGateway(_ index: Int) throws -> ChildProcess {
            try ChildProcess(switchboardExecutable(), ["gateway", "--config", config.path, "--listen", "127.0.0.1:\(ports[index])"])
        }
        var gateways = [try startGateway(0), try startGateway(1)]
        defer { for gateway in gateways { gateway.stop() } }
        @Sendable func get(_ url: String) async throws -> String {
            try await runCommand(URL(fileURLWithPath: "/usr/bin/curl"), ["-sf", "--max-time", "2", url], seconds: 5).stdout
        }
        /// A figure of a gateway's /metrics.
        @Sendable func metric(_ index: Int, _ name: String) async throws -> Int {
            let line = try await get("http://127.0.0.1:\(ports[index])/metrics").split(separator: "\n").first { $0.hasPrefix(name + " ") }
            return line.flatMap { Int($0.split(separator: " ").last ?? "") } ?? -1
        }
        for index in 0..<2 {
            try await eventually(60, "gateway \(index) ready") { try await get("http://127.0.0.1:\(ports[index])/healthz").contains("ok") }
        }

        // Every connection to the first gateway that is up (balance first), checked every 100 ms.
        let balancerConfig = folder.appendingPathComponent("haproxy.cfg")
        try """
            defaults
              mode http
              timeout connect 1s
              timeout client 60s
              timeout server 60s
              timeout tunnel 60s
              retries 3
              option redispatch
            frontend events
              bind 127.0.0.1:\(balancerPort)
              default_backend gateways
            frontend stats
              bind 127.0.0.1:\(statsPort)
              stats enable
              stats uri /stats
            backend gateways
              balance first
              option httpchk GET /healthz
              server g0 127.0.0.1:\(ports[0]) check inter 100 fall 1 rise 1
              server g1 127.0.0.1:\(ports[1]) check inter 100 fall 1 rise 1

            """.write(to: balancerConfig, atomically: true, encoding: .utf8)
        let balancer = try ChildProcess(watched: URL(fileURLWithPath: haproxy), ["-f", balancerConfig.path, "-db"])
        defer { balancer.stop() }
        @Sendable func balancerSees(_ server: String, _ status: String) async throws -> Bool {
            try await get("http://127.0.0.1:\(statsPort)/stats;csv").split(separator: "\n").contains { $0.hasPrefix("gateways,\(server),") && $0.contains(",\(status),") }
        }
        do {
            try await eventually(30, "HAProxy sees both gateways up") {
                let first = try await balancerSees("g0", "UP"), second = try await balancerSees("g1", "UP")
                return first && second
            }
        } catch {
            Issue.record("HAProxy said: \(balancer.outputSoFar)")
            throw error
        }

        let total = 400, lastKey = "/client/lb/k\(total)"
        let events = "http://127.0.0.1:\(balancerPort)/events?prefix=/client/lb/"
        let curl = Task { try await runCommand(python, [curlFollower.path, events, lastKey, "100"], seconds: 110) }
        let steps: [[String: Any]] = [["name": "follow /events to the last change", "js": """
            const received = [];
            let opens = 0;
            const source = new EventSource('/events?prefix=/client/lb/');
            source.onopen = () => { opens += 1; };
            for (const name of ['snapshot', 'update', 'reset', 'missed'])
              source.addEventListener(name, (event) => received.push({event: name, id: event.lastEventId, data: JSON.parse(event.data)}));
            const done = await waitFor(() => received.some((r) => r.data && r.data.key === '\(lastKey)') && {received, opens}, 'the last change', 55000);
            source.close();
            return JSON.stringify(done);
            """]]
        let stepsFile = folder.appendingPathComponent("steps.json"), screenshot = folder.appendingPathComponent("lb-failure.png")
        try JSONSerialization.data(withJSONObject: steps).write(to: stepsFile)
        let browser = Task {
            try await runCommand(python, [pageDriver.path, chromium, "http://127.0.0.1:\(balancerPort)/healthz", screenshot.path, stepsFile.path], seconds: 120)
        }

        let bus = try await BusClient(brokers: [endpoints.broker])
        func write(_ range: ClosedRange<Int>) async throws {
            for n in range { try await bus.publish(key: "/client/lb/k\(n)", value: .int(Int64(n))) }
        }
        try await eventually(60, "both followers on the first gateway") { try await metric(0, "switchboard_gateway_streams") >= 2 }
        try await write(1...100)
        // The first gateway dies: both move to the second, which saw every change.
        gateways[0].signal(SIGKILL)
        try await write(101...200)
        try await eventually(30, "both followers on the second gateway") { try await metric(1, "switchboard_gateway_streams") >= 2 }
        #expect(try await metric(1, "switchboard_gateway_resumes_total") >= 2)
        // Changes the followers do not follow: the state moves past where they stand, so a
        // gateway that starts now has not seen where they stand.
        for n in 1...10 { try await bus.publish(key: "/client/other/k", value: .int(Int64(n))) }
        // The first comes back with an empty memory; then the second dies: both move to the
        // restarted one, which resumes them from the kernel's history.
        gateways[0] = try startGateway(0)
        try await eventually(60, "the first gateway back, and HAProxy sending to it") {
            let ready = try await get("http://127.0.0.1:\(ports[0])/healthz").contains("ok")
            let balanced = try await balancerSees("g0", "UP")
            return ready && balanced
        }
        gateways[1].signal(SIGKILL)
        try await write(201...total)

        let expected = (1...total).map { "/client/lb/k\($0)" }
        let curlRun = try await curl.value
        #expect(curlRun.status == 0, "\(curlRun)")
        let curlEvents = curlRun.stdout.split(separator: "\n").compactMap { try? JSONValue(parsing: Array($0.utf8)) }
        let byCurl = Followed(curlEvents)
        #expect(byCurl.isExact(expected), "curl: \(byCurl)")
        #expect((curlEvents.last?["connections"]?.intValue ?? 0) >= 3, "curl reconnected at each kill: \(curlEvents.last.map(\.description) ?? "")")

        let browserRun = try await browser.value
        #expect(browserRun.status == 0, "the page failed (screenshot kept at \(screenshot.path)):\n\(browserRun)")
        let result = browserRun.stdout.split(separator: "\n").compactMap { try? JSONValue(parsing: Array($0.utf8)) }.first { $0["ok"] == true }
        let page = try JSONValue(parsing: Array((result?["value"]?.stringValue ?? "{}").utf8))
        let byBrowser = Followed(page["received"]?.arrayValue ?? [])
        #expect(byBrowser.isExact(expected), "browser: \(byBrowser)")
        #expect((page["opens"]?.intValue ?? 0) >= 3, "the EventSource reconnected at each kill: \(page["opens"] ?? .null)")
        #expect(try await metric(0, "switchboard_gateway_kernel_resumes_total") >= 2)

        await bus.close()
        for gateway in gateways { gateway.stop() }
        balancer.stop()
        await kernel.stop()
    }
}
