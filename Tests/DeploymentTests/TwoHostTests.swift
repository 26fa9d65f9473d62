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
    let serviceLink: String

    static func make() throws -> TwoHosts {
        let tag = String(UInt32.random(in: 0..<UInt32.max), radix: 36)
        let subnet = "10.\(Int.random(in: 200...250)).\(Int.random(in: 1...250))"
        let hosts = TwoHosts(kernelHost: "sbk-\(tag)", serviceHost: "sbs-\(tag)", kernelAddress: "\(subnet).1", serviceLink: "vs-\(tag)")
        let kernelLink = "vk-\(tag)"
        do {
            try NetworkNamespaces.ip(["netns", "add", hosts.kernelHost])
            try NetworkNamespaces.ip(["netns", "add", hosts.serviceHost])
            try NetworkNamespaces.ip(["link", "add", kernelLink, "type", "veth", "peer", "name", hosts.serviceLink])
            try NetworkNamespaces.ip(["link", "set", kernelLink, "netns", hosts.kernelHost])
            try NetworkNamespaces.ip(["link", "set", hosts.serviceLink, "netns", hosts.serviceHost])
            for (host, link, address) in [(hosts.kernelHost, kernelLink, "\(subnet).1/24"), (hosts.serviceHost, hosts.serviceLink, "\(subnet).2/24")] {
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

    /// Cuts (or restores) the service host's side of the link.
    func setLink(up: Bool) throws {
        try NetworkNamespaces.ip(["-n", serviceHost, "link", "set", serviceLink, up ? "up" : "down"])
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
        let address = hosts.kernelAddress
        let broker = "tcp://\(address):5555"
        let kernel = try NetworkNamespaces.start(in: hosts.kernelHost, switchboardExecutable(), [
            "kernel", "--config", emptyConfig.path, "--broker", broker, "--snapshot", "tcp://\(address):5556",
            "--publisher", "tcp://\(address):5557", "--collector", "tcp://\(address):5558", "--heartbeat-ms", "200", "--liveness", "5",
        ])
        defer { kernel.stop() }
        let echo = try NetworkNamespaces.start(in: hosts.serviceHost, switchboardExecutable(), [
            "serve", "echo", "--config", emptyConfig.path, "--broker", broker, "--state", "tcp://\(address):5556",
            "--heartbeat-ms", "200", "--liveness", "5", "--instance", "far-away",
        ])
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
}
