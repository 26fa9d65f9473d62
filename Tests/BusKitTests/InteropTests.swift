import BusKit
import BusProtocol
import Contracts
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
        #expect(client.terminationStatus == 0, "\(output)")
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

    @Test("18/MDP peers written from RFC 18: parts in order to a 0.2 client, gathered for a 7/MDP client, a 0.2 client served by a 7/MDP service, a worker killed mid-stream")
    func mdp02() async throws {
        let kernel = try await TestKernel.start { fastHeartbeats(&$0) }
        let streaming = try ChildProcess(python, [peersScript.path, "worker02", kernel.endpoints.broker, "pystream", "3"])
        defer { streaming.stop() }
        let dying = try ChildProcess(python, [peersScript.path, "worker02", kernel.endpoints.broker, "pydying", "2", "die"])
        defer { dying.stop() }
        let host = try await hostEcho(kernel)
        try await kernel.workers("pystream")
        try await kernel.workers("pydying")
        try await kernel.workers("echo")
        let request = #"{"jsonrpc":"2.0","id":7,"method":"m"}"#
        func run(_ mode: String, _ service: String, _ body: String) async throws -> [String] {
            let peer = try ChildProcess(python, [peersScript.path, mode, kernel.endpoints.broker, service, body])
            #expect(await peer.exit(within: 15))
            let output = peer.readOutput()
            #expect(peer.terminationStatus == 0, "\(output)")
            return output.split(separator: "\n").map(String.init)
        }
        func part(_ final: Bool, _ body: [String]) -> JSONValue { ["final": .bool(final), "body": .array(body.map { .string($0) })] }

        // 0.2 worker → 0.2 client: each PARTIAL in order, then the FINAL.
        let parts = try await run("client02", "pystream", request).map { try JSONValue(parsing: Array($0.utf8)) }
        #expect(parts == [part(false, ["part-1"]), part(false, ["part-2"]), part(false, ["part-3"]), part(true, [request])])
        // 0.2 worker → 7/MDP client (zguide's REQ): one REPLY with every part's frames, then the FINAL's.
        #expect(try await run("client", "pystream", request) == ["part-1", "part-2", "part-3", request])
        // 0.2 client → a Swift 7/MDP service: its REPLY arrives as the FINAL.
        let echoed = try await run("client02", "echo", #"{"jsonrpc":"2.0","id":9,"method":"echo","params":{"from":"python"}}"#)
        #expect(echoed.count == 1)
        let final = try JSONValue(parsing: Array(echoed[0].utf8))
        #expect(final["final"] == true)
        let response = try JSONRPC.parseResponses(Array((final["body"]?.arrayValue?.first?.stringValue ?? "").utf8))
        #expect(response == [JSONRPCResponse(id: .number(9), result: ["from": "python"])])
        // A worker that dies after two parts: the client gets both, then a FINAL saying so.
        let cut = try await run("client02", "pydying", request).map { try JSONValue(parsing: Array($0.utf8)) }
        #expect(cut.prefix(2) == [part(false, ["part-1"]), part(false, ["part-2"])], "the dying worker said: \(dying.outputSoFar)")
        #expect(cut.count == 3 && cut.last?["final"] == true)
        let error = try JSONValue(parsing: Array((cut.last?["body"]?.arrayValue?.first?.stringValue ?? "").utf8))["error"]
        #expect(error?["code"]?.intValue == Int64(JSONRPCError.streamEndedCode))
        #expect(error?["data"]?["parts"]?.intValue == 2)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        let stats = try await bus.call(KernelAPI.stats)
        #expect(stats.brokenStreams == 1 && stats.gatheredBytes == 0, "kernel stats count the stream that broke")
        #expect(stats.streamsInProgress == 0 && stats.gathersInProgress == 0, "and no longer count it in progress")
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
        #expect(subscriber.terminationStatus == 0)
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
