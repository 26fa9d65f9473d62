import BusProtocol
import Contracts
import Foundation
import SwitchboardTestSupport
import Testing

/// Two "machines": network namespaces joined by a veth pair, made and removed by the test.
struct TwoHosts: Sendable {
    let kernelHost: String
    let serviceHost: String
    let kernelAddress: String
    let kernelLink: String
    let serviceLink: String

    static func make() throws -> TwoHosts {
        let tag = String(UInt32.random(in: 0..<UInt32.max), radix: 36)
        let subnet = "10.\(Int.random(in: 200...250)).\(Int.random(in: 1...250))"
        let hosts = TwoHosts(kernelHost: "sbk-\(tag)", serviceHost: "sbs-\(tag)", kernelAddress: "\(subnet).1",
                             kernelLink: "vk-\(tag)", serviceLink: "vs-\(tag)")
        do {
            try NetworkNamespaces.ip(["netns", "add", hosts.kernelHost])
            try NetworkNamespaces.ip(["netns", "add", hosts.serviceHost])
            try NetworkNamespaces.addLink(hosts.kernelLink, peer: hosts.serviceLink)
            try NetworkNamespaces.ip(["link", "set", hosts.kernelLink, "netns", hosts.kernelHost])
            try NetworkNamespaces.ip(["link", "set", hosts.serviceLink, "netns", hosts.serviceHost])
            for (host, link, address) in [(hosts.kernelHost, hosts.kernelLink, "\(subnet).1/24"), (hosts.serviceHost, hosts.serviceLink, "\(subnet).2/24")] {
                try NetworkNamespaces.ip(["-n", host, "addr", "add", address, "dev", link])
                try NetworkNamespaces.ip(["-n", host, "link", "set", link, "up"])
                try NetworkNamespaces.ip(["-n", host, "link", "set", "lo", "up"])
            }
        } catch {
            hosts.remove()
            throw error
        }
        return hosts
    }

    var broker: String { "tcp://\(kernelAddress):5555" }

    /// A kernel on the kernel's host with quick heartbeats (a silent worker is dropped after a second).
    func startKernel(config: URL) throws -> ChildProcess {
        try NetworkNamespaces.start(in: kernelHost, switchboardExecutable(), [
            "kernel", "--config", config.path, "--broker", broker, "--snapshot", "tcp://\(kernelAddress):5556",
            "--publisher", "tcp://\(kernelAddress):5557", "--collector", "tcp://\(kernelAddress):5558", "--heartbeat-ms", "200", "--liveness", "5",
        ])
    }

    /// An echo service on `host` registering with that kernel, with the same heartbeats.
    func startEcho(in host: String, config: URL, _ more: [String]) throws -> ChildProcess {
        try NetworkNamespaces.start(in: host, switchboardExecutable(), [
            "serve", "echo", "--config", config.path, "--broker", broker, "--state", "tcp://\(kernelAddress):5556",
            "--heartbeat-ms", "200", "--liveness", "5",
        ] + more)
    }

    /// Cuts (or restores) the service host's side of the link.
    func setLink(up: Bool) throws {
        try NetworkNamespaces.ip(["-n", serviceHost, "link", "set", serviceLink, up ? "up" : "down"])
    }

    /// Each host sends to the other at `rate` (as tc writes it: 2mbit) at most.
    func limitLink(rate: String) throws {
        for (host, link) in [(kernelHost, kernelLink), (serviceHost, serviceLink)] {
            try NetworkNamespaces.tc(["-n", host, "qdisc", "add", "dev", link, "root", "tbf", "rate", rate, "burst", "32kbit", "latency", "30s"])
        }
    }

    /// Removing a namespace removes its end of the veth pair, and with it the pair.
    func remove() {
        for host in [kernelHost, serviceHost] { _ = try? NetworkNamespaces.ip(["netns", "del", host]) }
    }
}

@Suite("Two hosts: the kernel and a service in separate network namespaces")
struct TwoHostTests {
    @Test("requests cross between the hosts; after the link is cut and restored the worker registers again",
          .enabled(if: NetworkNamespaces.available, "skipped: needs root, iproute2 and network namespaces (ip netns add failed)"))
    func acrossHosts() async throws {
        let hosts = try TwoHosts.make()
        defer { hosts.remove() }
        let folder = try temporaryDirectory("two-hosts")
        let emptyConfig = folder.appendingPathComponent("empty.yaml")
        try "".write(to: emptyConfig, atomically: true, encoding: .utf8)
        let broker = hosts.broker
        let kernel = try hosts.startKernel(config: emptyConfig)
        defer { kernel.stop() }
        let echo = try hosts.startEcho(in: hosts.serviceHost, config: emptyConfig, ["--instance", "far-away"])
        defer { echo.stop() }

        // A client on the kernel's host reaches the worker on the other host.
        @Sendable func whoami() async throws -> CommandResult {
            try await NetworkNamespaces.run(in: hosts.kernelHost, sbExecutable(), ["request", "echo", "whoami", "--endpoint", broker, "--timeout", "2s", "--json"])
        }
        // echo's worker count as the kernel publishes it (`sb sub` on the kernel's host prints
        // each change): each wait ends at the change it waits for.
        let echoKey = KernelAPI.StateKeys.service("echo")
        let watch = try NetworkNamespaces.start(in: hosts.kernelHost, sbExecutable(), ["sub", echoKey, "--endpoint", broker, "--timeout", "30s", "--key-dir", folder.path])
        defer { watch.stop() }
        @Sendable func echoWorkers(_ count: Int64, within seconds: Double, _ what: String) async throws {
            try await watch.waitForOutput(what, within: seconds) { output in
                let lines = output.split(separator: "\n", omittingEmptySubsequences: false).dropLast().filter { $0.hasPrefix("{") }
                let last = lines.last.flatMap { try? JSONValue(parsing: Array($0.utf8)) }
                return last?["key"]?.stringValue == echoKey && (last?["value"]?["workers"]?.intValue ?? 0) == count
            }
        }
        try await echoWorkers(2, within: 30, "the far worker registered")
        let answer = try await whoami()
        #expect(answer.status == 0 && answer.stdout.contains("far-away"), "\(answer)")

        try hosts.setLink(up: false)
        try await echoWorkers(0, within: 30, "the kernel dropped the unreachable workers")
        let cut = try await whoami()
        #expect(cut.status != 0, "no worker while the link is down")

        try hosts.setLink(up: true)
        try await echoWorkers(2, within: 60, "the worker registered again")
        let again = try await whoami()
        #expect(again.status == 0 && again.stdout.contains("far-away"), "\(again)")
    }

    @Test("a request and its reply that each take longer to cross a slow link than heartbeat x liveness: the heartbeats wait behind them, but their bytes arrive, so neither the worker nor the kernel takes the other for silent",
          .enabled(if: NetworkNamespaces.available, "skipped: needs root, iproute2 and network namespaces (ip netns add failed)"))
    func largeRequestOverSlowLink() async throws {
        let hosts = try TwoHosts.make()
        defer { hosts.remove() }
        let folder = try temporaryDirectory("slow-link-request")
        let emptyConfig = folder.appendingPathComponent("empty.yaml")
        try "".write(to: emptyConfig, atomically: true, encoding: .utf8)
        let kernel = try hosts.startKernel(config: emptyConfig)
        defer { kernel.stop() }
        let echo = try hosts.startEcho(in: hosts.serviceHost, config: emptyConfig, ["--connections", "1"])
        defer { echo.stop() }
        try await kernel.waitForOutput(containing: "worker registered", within: 30)
        // 1 MB at 2 Mbit/s: four seconds each way, against a second of heartbeats (200 ms x 5).
        try hosts.limitLink(rate: "2mbit")
        let script = folder.appendingPathComponent("large.jsonl")
        try #"{"service":"echo","method":"echo","params":{"a":"\#(String(repeating: "x", count: 1_000_000))"}}"#
            .write(to: script, atomically: true, encoding: .utf8)
        let started = ContinuousClock.now
        let answer = try await NetworkNamespaces.run(in: hosts.kernelHost, sbExecutable(), [
            "run", script.path, "--endpoint", hosts.broker, "--timeout", "60s",
        ], seconds: 90)
        #expect(answer.status == 0 && answer.stdout.utf8.count > 1_000_000, "\(answer.status) \(answer.stderr)")
        print("a 1 MB request and reply over 2 Mbit/s: answered in \(ContinuousClock.now - started)")
        #expect(!echo.outputSoFar.contains("the kernel is silent"), "\(echo.outputSoFar)")
        #expect(!kernel.outputSoFar.contains("no heartbeat for"), "\(kernel.outputSoFar)")
    }

    @Test("a client whose link is cut is dropped after peer_timeout: the stream it waited on ends and frees its worker's place; a quiet client that is there stays",
          .enabled(if: NetworkNamespaces.available, "skipped: needs root, iproute2 and network namespaces (ip netns add failed)"))
    func clientCutOff() async throws {
        let hosts = try TwoHosts.make()
        defer { hosts.remove() }
        let folder = try temporaryDirectory("cut-client")
        // A request may wait a minute for a place; a peer that acknowledges nothing is
        // dropped after two seconds (30 s by default).
        let config = folder.appendingPathComponent("kernel.yaml")
        try "kernel:\n  peer_timeout_ms: 2000\n  queue_timeout_ms: 60000\n".write(to: config, atomically: true, encoding: .utf8)
        let broker = hosts.broker
        let kernel = try hosts.startKernel(config: config)
        defer { kernel.stop() }
        // One place, on the kernel's host.
        let echo = try hosts.startEcho(in: hosts.kernelHost, config: config, ["--connections", "1", "--window", "1"])
        defer { echo.stop() }
        try await kernel.waitForOutput(containing: "worker registered", within: 30)
        // A reader on the other host whose stream sends a part every 5 s for five minutes.
        let far = try NetworkNamespaces.start(in: hosts.serviceHost, sbExecutable(), [
            "request", "echo", "numbers", #"{"n":60,"everyMs":5000}"#, "--stream", "--timeout", "700s", "--endpoint", broker,
        ])
        defer { far.stop() }
        // Quiet for over twice the peer timeout between its parts, and still there: its
        // machine acknowledges what the kernel sends it (the probes of its quiet stream).
        try await far.waitForOutput(containing: #"{"part":2}"#, within: 60)

        try hosts.setLink(up: false)
        let cutAt = ContinuousClock.now
        // The kernel drops the silent connection, its next probe of the stream fails, and the
        // worker is told to stop (echo's handler sees it at its next part, within 5 s): the
        // place serves a request from the kernel's host. Without the peer timeout the
        // connection stays until TCP's retransmissions give up (a quarter of an hour), and
        // the place with it.
        let next = try await NetworkNamespaces.run(in: hosts.kernelHost, sbExecutable(), [
            "request", "echo", "whoami", "--endpoint", broker, "--timeout", "60s",
        ], seconds: 90)
        #expect(next.status == 0, "the place stayed held by the cut-off reader: \(next)")
        print("a reader cut off: its worker's place served another \(ContinuousClock.now - cutAt) after the cut")
        try await kernel.waitForOutput(containing: "reason=clientGone", within: 5)
    }
}
