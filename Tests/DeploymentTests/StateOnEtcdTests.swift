import BusKit
import BusProtocol
import Contracts
import Foundation
import SwitchboardTestSupport
import Testing

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
}
