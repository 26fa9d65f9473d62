@testable import BusKit
import BusProtocol
import Kernel
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// Opaque requests (`BusClient.call(service:body:)`) carry no id: their replies are matched
/// in order, and a late or lost reply must not become another request's answer.
@Suite("BusKit: opaque requests, matched without an id")
struct OpaqueCallTests {
    /// A worker the test drives by hand, offering `service` with room for two requests at once.
    static func handDrivenWorker(_ service: String, _ kernel: TestKernel, on loop: SocketLoop) async throws -> LoopSocket {
        let worker = try await LoopSocket.open(.dealer, on: loop) { [broker = kernel.endpoints.broker] socket in
            try socket.set(.linger, 0)
            try socket.connect(broker)
        }
        try worker.send(MDP.encode(.ready(service: service, window: 2)))
        try await kernel.workers(service)
        return worker
    }

    /// The test's worker sends no heartbeats, and the test's one client may hold both its places.
    static func handDriven(_ configuration: inout KernelConfiguration) {
        configuration.heartbeatLiveness = 1_000
        configuration.clientSharePercent = 100
    }

    /// The next request the kernel hands `worker`.
    static func nextRequest(_ worker: LoopSocket, _ what: String) async throws -> (client: Frame, body: [Frame]) {
        try await within(10, "\(what) at the worker") {
            var command: BrokerToWorker
            repeat { command = try MDP.decodeAtWorker(try await worker.receive()) } while command == .heartbeat
            guard case .request(let client, let body) = command else { throw TimedOut(what: "a REQUEST (got \(command))") }
            return (client, body)
        }
    }

    /// Runs `body` with a kernel, a worker on it the test drives by hand (offering "opaque")
    /// and the client `makeClient` opens on the kernel, each stopped however `body` ends (the
    /// client first, the kernel last).
    static func withOpaqueWorker(client makeClient: (TestKernel) async throws -> BusClient,
                                 _ body: (TestKernel, LoopSocket, BusClient) async throws -> Void) async throws {
        let kernel = try await TestKernel.start(handDriven)
        try await stopping(kernel, with: { await $0.stop() }) { kernel in
            let loop = try SocketLoop(context: ZMQContext())
            try await stopping(loop, with: { await $0.shutdown() }) { loop in
                let worker = try await handDrivenWorker("opaque", kernel, on: loop)
                try await stopping(worker, with: { await $0.close() }) { worker in
                    try await stopping(try await makeClient(kernel), with: { await $0.close() }) { try await body(kernel, worker, $0) }
                }
            }
        }
    }

    @Test("the late reply of an opaque request that timed out is dropped, not taken for the next one's; a reply that never comes gives up its place once as long again as the timeout passed")
    func lateReplyDropped() async throws {
        // The client's timeouts pass when the test moves its clock.
        let clock = ManualClock()
        try await Self.withOpaqueWorker(client: { try await BusClient(brokers: [$0.endpoints.broker], clock: clock) }) { _, worker, client in
            func timedOutCall(_ body: Frame) async throws -> (client: Frame, body: [Frame]) {
                let call = Task { () -> BusError? in
                    do throws(BusError) { _ = try await client.call(service: "opaque", body: [body], timeout: .seconds(1)) } catch { return error }
                    return nil
                }
                let asked = try await Self.nextRequest(worker, "\(body)")
                clock.advance(.milliseconds(1_100))
                #expect(try await within(10, "the timeout") { await call.value } == .timedOut(service: "opaque", method: "(opaque)", after: .seconds(1)))
                return asked
            }

            // The first request's reply comes after the second was sent: the second gets its own.
            let first = try await timedOutCall("first")
            #expect(first.body == ["first"])
            let second = Task { try await client.call(service: "opaque", body: ["second"], timeout: .seconds(30)) }
            let secondAsked = try await Self.nextRequest(worker, "the second request")
            try worker.send(MDP.encode(.reply(client: first.client, body: ["first"])))
            try worker.send(MDP.encode(.reply(client: secondAsked.client, body: ["second"])))
            #expect(try await within(10, "the second reply") { try await second.value } == ["second"])
            #expect(await client.counters().lateReplies == 1)

            // A request the worker never answers: once its timeout has passed again, the next
            // request's reply is that request's.
            _ = try await timedOutCall("lost")
            clock.advance(.seconds(1))
            let fresh = Task { try await client.call(service: "opaque", body: ["fresh"], timeout: .seconds(30)) }
            let freshAsked = try await Self.nextRequest(worker, "the fresh request")
            try worker.send(MDP.encode(.reply(client: freshAsked.client, body: ["fresh"])))
            #expect(try await within(10, "the fresh reply") { try await fresh.value } == ["fresh"])
        }
    }

    @Test("an opaque request may carry JSON-RPC with ids of its own: its reply is its own, and the client's request in flight gets its own; the client's ids are never the small ones people write")
    func jsonInsideOpaque() async throws {
        try await Self.withOpaqueWorker(client: { try await BusClient(brokers: [$0.endpoints.broker], timeout: .seconds(30)) }) { _, worker, client in
            let request = Task { try await client.request(service: "opaque", method: "own") }
            let asked = try await Self.nextRequest(worker, "the client's request")
            let body = try #require(asked.body.first)
            let id = try #require(try JSONValue(parsing: body.bytes)["id"]?.intValue)
            #expect(id > 1 << 40 && id < 1 << 53, "the client's id \(id)")
            let opaque = Task { try await client.call(service: "opaque", body: [#"{"jsonrpc":"2.0","id":1,"method":"theirs"}"#]) }
            let opaqueAsked = try await Self.nextRequest(worker, "the opaque request")
            let theirs = Frame(#"{"jsonrpc":"2.0","id":1,"result":"theirs"}"#)
            try worker.send(MDP.encode(.reply(client: opaqueAsked.client, body: [theirs])))
            #expect(try await within(10, "the opaque reply") { try await opaque.value } == [theirs])
            try worker.send(MDP.encode(.reply(client: asked.client, body: [Frame(#"{"jsonrpc":"2.0","id":\#(id),"result":"own"}"#)])))
            #expect(try await within(10, "the client's reply") { try await request.value } == "own")
        }
    }

    @Test("the ids a process hands out: each one once, each known as its own, none before its start")
    func idCounter() {
        let counter = IDCounter(start: 100)
        #expect(!counter.handedOut(101))
        #expect(counter.next() == 101 && counter.next() == 102)
        #expect(counter.handedOut(101) && counter.handedOut(102))
        #expect(!counter.handedOut(100) && !counter.handedOut(103) && !counter.handedOut(1))
    }

    @Test("an opaque request in flight when the connection to the kernel drops fails at once with -32006; it is not sent again")
    func inFlightWhenConnectionDrops() async throws {
        try await Self.withOpaqueWorker(client: { try await BusClient(brokers: [$0.endpoints.broker], timeout: .seconds(120)) }) { kernel, worker, client async throws in
            let call = Task { () -> BusError? in
                do throws(BusError) { _ = try await client.call(service: "opaque", body: ["x"]) } catch { return error }
                return nil
            }
            #expect(try await Self.nextRequest(worker, "the request").body == ["x"])
            await kernel.stop()
            #expect(try await within(30, "the failure") { await call.value } == .remote(service: "opaque", .outcomeUnknown("opaque", JSONRPCError.connectionDropped)))
        }
    }
}
