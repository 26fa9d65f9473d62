import BusKit
import BusProtocol
import Foundation
import Synchronization
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// Finding 2 of the hostile-client review: a request that kills what handles it was handed
/// out again and again (by the kernel to the next worker, by clients to each restarted
/// kernel) until everything was down. Now each is handed out twice at most.
@Suite("A request that kills what handles it is not handed out again and again", .serialized)
struct PoisonRequestTests {
    @Test("the kernel hands a request to a second worker when the first dies with it, and answers -32012 when that one dies too")
    func kernelStopsRedispatching() async throws {
        let kernel = try await KernelUnderAttack.start(["heartbeat_ms": "100", "liveness": "3"])
        // Three plain 7/MDP workers that die (close their socket) on the first request they get.
        var workers: [ZMQSocket?] = try (0..<3).map { _ in
            let worker = try kernel.socket(.dealer, kernel.broker)
            try worker.send(MDP.encode(.ready(service: "fragile")))
            return worker
        }
        try await kernel.workers("fragile", "the three workers registered") { $0 == 3 }
        let answered = Answered()
        let outcome = Task {
            let error = await rpcError { try await kernel.bystander.request(service: "fragile", method: "crash", timeout: .seconds(20)) }
            answered.flag.store(true, ordering: .releasing)
            return error
        }
        var deaths = 0
        let deadline = Date().addingTimeInterval(20)
        while deaths < 3, Date() < deadline, !answered.flag.load(ordering: .acquiring) {
            var poller = ZMQPoller()
            let live = workers.indices.filter { workers[$0] != nil }
            for index in live { _ = try poller.add(workers[index]!) }
            _ = try poller.poll(timeoutMilliseconds: 100)
            for (slot, index) in live.enumerated() {
                let worker = workers[index]!
                if poller.events(at: slot).contains(.readable) {
                    while let message = try worker.tryReceive() {
                        if case .request? = try? MDP.decodeAtWorker(message) {
                            worker.close()
                            workers[index] = nil
                            deaths += 1
                            break
                        }
                    }
                }
                if workers[index] != nil { try worker.send(MDP.encode(.heartbeat())) }
            }
        }
        let error = await outcome.value
        #expect(deaths == 2, "the request went to \(deaths) workers")
        #expect(error?.code == JSONRPCError.handlerDiedCode && error?.message.contains("died 2 times") == true, "\(String(describing: error))")
        let stats = try await kernel.stats()
        #expect(stats["services"]?["fragile"]?["handlerDied"] == 1 && stats["services"]?["fragile"]?["redispatched"] == 1, "\(stats)")
        // The third worker still serves.
        #expect(workers.compactMap { $0 }.count == 1)
        try await kernel.stillServes()
        for worker in workers { worker?.close() }
        await kernel.stop()
    }

    @Test("a client sends a request again after the kernel's connection dropped once; after a second drop it answers -32012, not a third send")
    func clientStopsResending() async throws {
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        let context = try ZMQContext()
        var standIn = try await kernelStandIn(at: endpoint, in: context)
        let client = try await BusClient(brokers: [endpoint], timeout: .seconds(30))
        let outcome = Task { await rpcError { try await client.request(service: "echo", method: "echo", params: ["n": 1]) } }
        // Each stand-in takes the request and goes away with it, as a kernel it killed would.
        var received: [[UInt8]] = []
        for round in 0..<2 {
            let request = try await standIn.receiveOffPool()
            received.append(request.frames.last!.bytes)
            standIn.close()
            if round == 0 { standIn = try await kernelStandIn(at: endpoint, in: context) }
        }
        let error = await outcome.value
        #expect(received.count == 2 && received[0] == received[1], "the same request, sent twice")
        #expect(error?.code == JSONRPCError.handlerDiedCode && error?.message.contains("the connection to the kernel died 2 times") == true,
                "\(String(describing: error))")
        #expect(await client.counters().resent == 1)
        await client.close()
    }
}

final class Answered: Sendable {
    let flag = Atomic<Bool>(false)
}
