import BusKit
import BusProtocol
import Contracts
import Etcd
import Foundation
import SwitchboardTestSupport
import Testing

/// A `switchboard kernel` process with its state in `cluster` (no configuration file, CURVE
/// off), on ports of its own: the process and its broker endpoint.
/// `environment` adds settings (`SWITCHBOARD_TELEMETRY_ENDPOINT`) or variables of its own.
func kernelOnEtcd(_ cluster: TestEtcd, leaseSeconds: Int = 10, environment: [String: String] = [:]) throws -> (process: ChildProcess, broker: String) {
    let kernel = try kernelOnEtcd(cluster, leaseSeconds: leaseSeconds, endpoints: (0..<4).map { _ in "tcp://127.0.0.1:\(freePort())" }, environment: environment)
    return (kernel.process, kernel.endpoints[0])
}

/// The same on the endpoints given: broker, snapshot, publisher, collector.
func kernelOnEtcd(_ cluster: TestEtcd, leaseSeconds: Int = 10, endpoints ports: [String],
                  environment: [String: String] = [:]) throws -> (process: ChildProcess, endpoints: [String]) {
    let folder = try temporaryDirectory("kernel-etcd")
    let config = folder.appendingPathComponent("empty.yaml")
    try "".write(to: config, atomically: true, encoding: .utf8)
    let process = try ChildProcess(switchboardExecutable(), [
        "kernel", "--config", config.path, "--broker", ports[0], "--snapshot", ports[1], "--publisher", ports[2], "--collector", ports[3],
    ], environment: [
        "SWITCHBOARD_KERNEL_STATE_BACKEND": "etcd",
        "SWITCHBOARD_KERNEL_STATE_ETCD_ENDPOINTS": "[\(cluster.clientURLs.joined(separator: ","))]",
        "SWITCHBOARD_KERNEL_STATE_ETCD_LEASE_SECONDS": "\(leaseSeconds)",
    ].merging(environment) { _, given in given })
    return (process, ports)
}

@Suite("switchboard up with the state on etcd", .serialized, .enabled(if: TestEtcd.available, "needs etcd-server (Scripts/bootstrap --tests installs it)"))
struct StateOnEtcdTests {
    @Test("kernel.state.backend: etcd from the environment: acknowledged state outlives kill -9 of the kernel, with its sequence numbers; sb stats names the etcd")
    func stateOutlivesTheKernel() async throws {
        let cluster = try await TestEtcd.start()
        defer { cluster.stop() }
        let folder = try temporaryDirectory("up-etcd")
        let (config, broker) = try writeDeploymentConfig(in: folder, services: echoOnly)
        let up = try ChildProcess(switchboardExecutable(), ["up", "--config", config.path], environment: [
            "SWITCHBOARD_KERNEL_STATE_BACKEND": "etcd",
            "SWITCHBOARD_KERNEL_STATE_ETCD_ENDPOINTS": "[\(cluster.clientURLs.joined(separator: ","))]",
            // The killed kernel's election goes with its lease: the new one stands after it.
            "SWITCHBOARD_KERNEL_STATE_ETCD_LEASE_SECONDS": "2",
        ])
        defer { up.stop(grace: 15) }
        try await up.waitForOutput(containing: "Stop with Ctrl-C", within: 120)
        let kernelPid = try #require(bannerPids(up.outputSoFar)["kernel"])

        let keys = busKeyFolder(in: folder)
        let bus = try await BusClient(brokers: [broker], timeout: .seconds(10), curve: try keys.clientKeys())
        let written = try await bus.publish(key: "/client/note", value: "kept in etcd")
        let stats = try await runCommand(sbExecutable(), ["stats", "--endpoint", broker, "--key-dir", keys.path])
        #expect(stats.status == 0 && stats.stdout.contains("state on etcd \(cluster.clientURLs[0]) under /switchboard/state"), "\(stats)")

        // The kernel killed: the supervisor starts a new one, which reads the state from etcd.
        kill(kernelPid, SIGKILL)
        try await up.waitForOutput(containing: "kernel (pid \(kernelPid)) was killed by signal 9 (SIGKILL); restarting")
        let entries = try await within(60, "the new kernel answered") {
            while true {
                if let page = try? await bus.call(KernelAPI.stateGet, .init(prefix: "/client/"), timeout: .seconds(1)) { return page.entries }
            }
        }
        #expect(entries.map(\.key) == ["/client/note"])
        #expect(entries.first?.sequence == written)
        #expect(entries.first?.value == "kept in etcd")
        await bus.close()
        up.signal(SIGTERM)
        #expect(await up.exit(within: 60))
    }

    @Test("a second kernel on the same etcd waits, asking the active one at its broker; kill -9 of the active: the second takes its election once it stops answering, long before its lease runs out, and serves what was written")
    func standbyTakesOver() async throws {
        let cluster = try await TestEtcd.start()
        defer { cluster.stop() }
        // A lease far longer than the waits below: a takeover within them is the standby's doing.
        func startKernel() throws -> (process: ChildProcess, broker: String) { try kernelOnEtcd(cluster, leaseSeconds: 120) }
        let active = try startKernel()
        defer { active.process.stop() }
        let bus = try await BusClient(brokers: [active.broker], timeout: .seconds(20))
        let written = try await bus.publish(key: "/client/note", value: "before")
        let standby = try startKernel()
        defer { standby.process.stop() }
        try await standby.process.waitForOutput(containing: "the kernel holding the election answers at its broker", within: 30)

        active.process.signal(SIGKILL)
        try await standby.process.waitForOutput(containing: "taking its election rather than wait for its lease", within: 30)
        let moved = try await BusClient(brokers: [active.broker, standby.broker], timeout: .seconds(30))
        let entries = try await moved.call(KernelAPI.stateGet, .init(prefix: "/client/")).entries
        #expect(entries.map(\.key) == ["/client/note"] && entries.first?.sequence == written)
        #expect(try await moved.publish(key: "/client/note", value: "after", revision: written) > written)
        await moved.close()
        await bus.close()
    }

    @Test("switchboard up beside another bus on the same etcd: its kernel stands by, up starts its services at once and runs; the other bus stopped, this one's kernel takes over and its echo worker answers")
    func upStandsBy() async throws {
        let cluster = try await TestEtcd.start()
        defer { cluster.stop() }
        let folder = try temporaryDirectory("up-standby")
        let environment = ["SWITCHBOARD_KERNEL_STATE_BACKEND": "etcd", "SWITCHBOARD_KERNEL_STATE_ETCD_ENDPOINTS": "[\(cluster.clientURLs.joined(separator: ","))]"]
        let (activeConfig, activeBroker) = try writeDeploymentConfig(in: folder, services: echoOnly)
        let active = try ChildProcess(switchboardExecutable(), ["up", "--config", activeConfig.path], environment: environment)
        defer { active.stop(grace: 15) }
        try await active.waitForOutput(containing: "Stop with Ctrl-C", within: 120)
        // The same folder, keys and database; ports of its own.
        let (standbyConfig, standbyPorts) = try writeBusConfiguration(in: folder, services: echoOnly, supervisor: "restart_backoff_ms: 100", fileName: "standby.yaml")
        let standby = try ChildProcess(switchboardExecutable(), ["up", "--config", standbyConfig.path], environment: environment)
        defer { standby.stop(grace: 15) }
        try await standby.waitForOutput(containing: "the kernel stands by", within: 60)
        try await standby.waitForOutput(containing: "Stop with Ctrl-C", within: 60)

        let bus = try await BusClient(brokers: [activeBroker, "tcp://127.0.0.1:\(standbyPorts[0])"], timeout: .seconds(30),
                                      curve: try busKeyFolder(in: folder).clientKeys())
        _ = try await bus.call(EchoAPI.echo, ["before": "stop"])
        active.signal(SIGTERM)
        #expect(await active.exit(within: 30))
        let answer = try await bus.call(EchoAPI.echo, ["after": "stop"])
        #expect(answer == ["after": "stop"])
        let pong = try await BusClient(brokers: ["tcp://127.0.0.1:\(standbyPorts[0])"], timeout: .seconds(10), curve: try busKeyFolder(in: folder).clientKeys())
        #expect(try await pong.call(KernelAPI.ping).pong)
        await pong.close()
        await bus.close()
    }

    @Test("a subscriber following both kernels on one etcd sees every acknowledged write once, in order, across kill -9 of the active one")
    func subscriberAcrossFailover() async throws {
        let cluster = try await TestEtcd.start()
        defer { cluster.stop() }
        let ports = (0..<2).map { _ in (0..<4).map { _ in "tcp://127.0.0.1:\(freePort())" } }
        let active = try kernelOnEtcd(cluster, endpoints: ports[0])
        defer { active.process.stop() }
        try await active.process.waitForOutput(containing: "kernel started", within: 30)
        let standby = try kernelOnEtcd(cluster, endpoints: ports[1])
        defer { standby.process.stop() }
        try await standby.process.waitForOutput(containing: "the kernel holding the election answers at its broker", within: 30)

        let subscription = try await Subscription.open(kernels: ports.map { ($0[1], $0[2]) }, prefixes: ["/client/tick/"], silenceTimeout: .seconds(3))
        // Writers at once, so the new kernel publishes as soon as it serves.
        let brokers = [ports[0][0], ports[1][0]]
        let acknowledged = try await withThrowingTaskGroup(of: [UInt64].self) { group in
            for writer in 0..<4 {
                group.addTask {
                    let bus = try await BusClient(brokers: brokers, timeout: .seconds(30))
                    var made: [UInt64] = []
                    for n in 0..<40 {
                        if writer == 0 && n == 15 { active.process.signal(SIGKILL) }
                        made.append(try await bus.publish(key: "/client/tick/\(writer)", value: .int(Int64(n))))
                    }
                    await bus.close()
                    return made
                }
            }
            return try await group.reduce(into: []) { $0 += $1 }
        }
        let expected = Set(acknowledged)
        let (seen, events) = try await within(30, "every acknowledged write delivered") {
            var seen: [UInt64] = [], events: [String] = []
            for try await event in subscription {
                events.append("\(event)")
                guard case .update(let update) = event else { continue }
                seen.append(update.sequence)
                if expected.isSubset(of: Set(seen)) { break }
            }
            return (seen, events)
        }
        #expect(Set(acknowledged).isSubset(of: Set(seen)), "missing: \(Set(acknowledged).subtracting(seen).sorted()); events: \(events.suffix(60))")
        #expect(seen == seen.sorted() && Set(seen).count == seen.count, "\(seen)")
        await subscription.cancel()
    }

    @Test("a kernel waiting for the election ends at SIGTERM, with status 0")
    func waitingKernelStops() async throws {
        let cluster = try await TestEtcd.start()
        defer { cluster.stop() }
        let (active, broker) = try kernelOnEtcd(cluster)
        defer { active.stop() }
        let bus = try await BusClient(brokers: [broker], timeout: .seconds(20))
        _ = try await bus.publish(key: "/client/note", value: 1)
        await bus.close()
        let (waiting, _) = try kernelOnEtcd(cluster)
        defer { waiting.stop() }
        try await waiting.waitForOutput(containing: "another kernel writes this state: waiting for it to go", within: 30)
        waiting.signal(SIGTERM)
        #expect(await waiting.exit(within: 30), "\(waiting.outputSoFar)")
        #expect(waiting.terminationStatus == 0, "\(waiting.outputSoFar)")
    }

    @Test("a kernel process whose election another kernel took sees it at once, without a write, and ends with an error saying so (its supervisor starts it again, to stand again)")
    func lostElectionEnds() async throws {
        let cluster = try await TestEtcd.start()
        defer { cluster.stop() }
        let (kernel, broker) = try kernelOnEtcd(cluster)
        defer { kernel.stop() }
        let bus = try await BusClient(brokers: [broker], timeout: .seconds(20))
        _ = try await bus.publish(key: "/client/before", value: 1)

        // Another kernel takes the election (as one waiting would once this one's lease ran
        // out while it was cut off): the key made again, under its own lease.
        let etcd = try EtcdClient(endpoints: cluster.clientURLs)
        let election = Array("/switchboard/state.active".utf8)
        let intruder = try await etcd.grantLease(ttl: 30)
        _ = try await etcd.delete(election)
        _ = try await etcd.put(election, Array("another kernel".utf8), lease: intruder.id)
        await etcd.close()

        // It watches its election key: no write is needed for it to know (the fenced test
        // shows the -32008 a write gets meanwhile).
        try await kernel.waitForOutput(containing: "this kernel no longer writes the state: ", within: 30)
        try await kernel.waitForOutput(containing: "lost the election of its state in etcd", within: 30)
        #expect(await kernel.exit(within: 30))
        #expect(kernel.terminationStatus != 0, "\(kernel.outputSoFar)")
        await bus.close()
    }
}
