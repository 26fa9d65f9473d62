import BusKit
import BusProtocol
import EchoService
import Foundation
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// The Python peers in Tests/Interop, run with Debian's python3 and python3-zmq
/// (Scripts/bootstrap installs it).
let python = URL(fileURLWithPath: "/usr/bin/python3")
let peersScript = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .appendingPathComponent("Interop/zmq_peers.py")

@Suite("Language-neutral: pyzmq peers written from the RFCs work with the kernel")
struct InteropTests {
    @Test("a pyzmq MDP worker serves Swift clients; a pyzmq MDP client reaches a Swift service")
    func mdp() async throws {
        let kernel = try await TestKernel.start()
        let worker = try ChildProcess(python, [peersScript.path, "worker", kernel.endpoints.broker, "pyecho"])
        defer { worker.stop() }
        let host = try await hostEcho(kernel)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        try await kernel.workers("pyecho")
        // Swift client → Python worker: the echoed JSON-RPC request comes back whole.
        let reply = try await bus.call(service: "pyecho", body: ["opaque bytes", Frame()])
        #expect(reply == ["opaque bytes", Frame()])
        // Python client (REQ) → Swift service.
        let client = try ChildProcess(python, [peersScript.path, "client", kernel.endpoints.broker, "echo",
                                               #"{"jsonrpc":"2.0","id":9,"method":"echo","params":{"from":"python"}}"#])
        #expect(await client.exit(within: 15))
        let output = client.readOutput()
        #expect(client.process.terminationStatus == 0, "\(output)")
        let response = try JSONRPC.parseResponses(Array(output.trimmingCharacters(in: .whitespacesAndNewlines).utf8))
        #expect(response == [JSONRPCResponse(id: .number(9), result: ["from": "python"])])
        // Python MMI query.
        let mmi = try ChildProcess(python, [peersScript.path, "client", kernel.endpoints.broker, "mmi.service", "pyecho"])
        #expect(await mmi.exit(within: 15))
        #expect(mmi.readOutput().trimmingCharacters(in: .whitespacesAndNewlines) == "200")
        await bus.close()
        await host.stop()
        await kernel.stop()
    }

    @Test("a pyzmq CHP subscriber gets the snapshot and live updates")
    func chp() async throws {
        let kernel = try await TestKernel.start()
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        let publisher = StatePublisher(client: bus)
        try await publisher.set("/catalog/countries", ["count": 249])
        let subscriber = try ChildProcess(python, [peersScript.path, "subscribe", kernel.endpoints.snapshot,
                                                   kernel.endpoints.publisher, "/catalog/", "3"])
        defer { subscriber.stop() }
        // Publish until the subscriber has what it asked for (it may join late).
        var round = 0
        while subscriber.isRunning && round < 500 {
            round += 1
            try await publisher.set("/catalog/items", ["round": .int(Int64(round))])
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(await subscriber.exit(within: 15))
        let lines = subscriber.readOutput().split(separator: "\n").compactMap { try? JSONValue(parsing: Array($0.utf8)) }
        #expect(subscriber.process.terminationStatus == 0)
        let snapshot = lines.filter { $0["snapshot"] == true }
        #expect(snapshot.contains { $0["key"] == "/catalog/countries" && $0["value"] == #"{"count":249}"# })
        #expect(lines.prefix(snapshot.count).allSatisfy { $0["snapshot"] == true }, "the snapshot comes first")
        let live = lines.filter { $0["snapshot"] == false }
        #expect(live.count == 3)
        let sequences = live.compactMap { $0["sequence"]?.intValue }
        #expect(sequences == sequences.sorted() && Set(sequences).count == sequences.count)
        await bus.close()
        await kernel.stop()
    }
}
