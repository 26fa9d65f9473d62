import BusKit
import BusProtocol
import Foundation
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// A stand-in for the kernel that shows each `state.set` it gets and answers when the test says.
private final class StateKernelStandIn {
    struct Write {
        var client: Frame
        var service: Frame
        var id: JSONValue
        var key: String
        var value: JSONValue
    }

    let context: ZMQContext
    let router: ZMQSocket
    let endpoint: String

    init() async throws {
        endpoint = "tcp://127.0.0.1:\(freePort())"
        context = try ZMQContext()
        router = try await kernelStandIn(at: endpoint, in: context)
    }

    func close() { withExtendedLifetime(context) { router.close() } }

    /// Runs `body` with a stand-in and a publisher whose client reaches it (no resend within
    /// a test: a minute's timeout), and closes both however `body` ends.
    static func with(_ body: (StateKernelStandIn, StatePublisher) async throws -> Void) async throws {
        let kernel = try await StateKernelStandIn()
        defer { kernel.close() }
        try await stopping(try await BusClient(brokers: [kernel.endpoint], timeout: .seconds(60)), with: { await $0.close() }) { client in
            try await body(kernel, StatePublisher(client: client))
        }
    }

    func nextWrite() async throws -> Write {
        guard case .request(let client, let service, let body, _) = try MDP.decodeAtBroker(try await router.receiveOffPool()) else {
            throw BusError.protocolViolation("the stand-in got something other than a client's request")
        }
        let request = try JSONValue(parsing: try #require(body.last).bytes)
        #expect(request["method"] == "state.set")
        return Write(client: client, service: Frame(service), id: try #require(request["id"]),
                     key: try #require(request["params"]?["key"]?.stringValue), value: try #require(request["params"]?["value"]))
    }

    func acknowledge(_ write: Write, sequence: Int64) throws {
        try answer(write, ["jsonrpc": "2.0", "id": write.id, "result": ["sequence": .int(sequence)]])
    }

    func refuse(_ write: Write) throws {
        try answer(write, ["jsonrpc": "2.0", "id": write.id, "error": ["code": -32602, "message": "refused by the stand-in"]])
    }

    private func answer(_ write: Write, _ reply: JSONValue) throws {
        try router.send(MDP.reply(to: write.client, serviceFrame: write.service, body: [Frame(reply.jsonBytes)]))
    }
}

@Suite("StatePublisher: a service's own keys, in order, and restored after a kernel restart")
struct StatePublisherTests {
    @Test("writes of one key reach the kernel one at a time, in the order asked; another key's do not wait for them")
    func eachKeysWritesInOrder() async throws {
        try await StateKernelStandIn.with { kernel, publisher in
            let first = Task { try await publisher.set("/svc/route", ["price": 1]) }
            let held = try await kernel.nextWrite()
            #expect(held.key == "/svc/route" && held.value == ["price": 1])
            let second = Task { try await publisher.set("/svc/route", ["price": 2]) }
            // Another key's writes go while the first of /svc/route is unacknowledged; by the end of
            // two of their round trips, a second write of /svc/route sent at once would be here.
            let other = Task { try await publisher.set("/svc/deal", ["day": 1]) }
            let otherWrite = try await kernel.nextWrite()
            #expect(otherWrite.key == "/svc/deal", "the second write of /svc/route went out before the first was acknowledged")
            try kernel.acknowledge(otherWrite, sequence: 1)
            #expect(try await other.value == 1)
            let later = Task { try await publisher.set("/svc/deal", ["day": 2]) }
            let laterWrite = try await kernel.nextWrite()
            #expect(laterWrite.key == "/svc/deal" && laterWrite.value == ["day": 2],
                    "the second write of /svc/route went out before the first was acknowledged")
            try kernel.acknowledge(laterWrite, sequence: 2)
            #expect(try await later.value == 2)

            try kernel.acknowledge(held, sequence: 3)
            #expect(try await first.value == 3)
            let secondWrite = try await kernel.nextWrite()
            #expect(secondWrite.key == "/svc/route" && secondWrite.value == ["price": 2])
            try kernel.acknowledge(secondWrite, sequence: 4)
            #expect(try await second.value == 4)
        }
    }

    @Test("a value that changed while its write was on the way is written again once that write is acknowledged, until the latest is the one written")
    func toLatest() async throws {
        actor Latest {
            var value: JSONValue = ["price": 1]
            func change(to value: JSONValue) { self.value = value }
        }
        try await StateKernelStandIn.with { kernel, publisher in
            let latest = Latest()
            let written = Task { try await publisher.set("/svc/route", toLatest: { await latest.value }) }
            let first = try await kernel.nextWrite()
            #expect(first.value == ["price": 1])
            await latest.change(to: ["price": 2])
            try kernel.acknowledge(first, sequence: 1)
            let second = try await kernel.nextWrite()
            #expect(second.key == "/svc/route" && second.value == ["price": 2], "the older value was the last written")
            try kernel.acknowledge(second, sequence: 2)
            #expect(try await written.value == 2)
        }
    }

    @Test("republish sends each key as last asked: a write the kernel refused goes again, an acknowledged deletion does not")
    func republishSendsWhatWasAsked() async throws {
        try await StateKernelStandIn.with { kernel, publisher in
            func set(_ key: String, _ value: JSONValue?, answer: (StateKernelStandIn.Write) throws -> Void) async throws -> Result<UInt64, BusError> {
                let write = Task { () async -> Result<UInt64, BusError> in
                    do throws(BusError) { return .success(try await publisher.set(key, value)) } catch { return .failure(error) }
                }
                try answer(try await kernel.nextWrite())
                return await write.value
            }

            _ = try await set("/svc/route", ["price": 1]) { try kernel.acknowledge($0, sequence: 1) }
            _ = try await set("/svc/deal", ["day": 1]) { try kernel.acknowledge($0, sequence: 2) }
            _ = try await set("/svc/gone", ["soon": true]) { try kernel.acknowledge($0, sequence: 3) }
            _ = try await set("/svc/gone", nil) { try kernel.acknowledge($0, sequence: 4) }
            // The kernel goes away before it takes the new price: the service still wants it.
            let refused = try await set("/svc/route", ["price": 2]) { try kernel.refuse($0) }
            guard case .failure(.remote) = refused else { Issue.record("the refusal was not reported: \(refused)"); return }
            #expect(await publisher.keys == ["/svc/deal", "/svc/route"])

            let republished = Task { await publisher.republish() }
            let deal = try await kernel.nextWrite()
            #expect(deal.key == "/svc/deal" && deal.value == ["day": 1])
            try kernel.acknowledge(deal, sequence: 5)
            let route = try await kernel.nextWrite()
            #expect(route.key == "/svc/route" && route.value == ["price": 2], "republished what the kernel last acknowledged, not what was asked")
            try kernel.acknowledge(route, sequence: 6)
            #expect(await republished.value == 2)
        }
    }
}
