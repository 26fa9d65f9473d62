import Foundation
import SwitchboardTestSupport
import Testing
@testable import ZeroMQ

/// `switchboard-bench socket-floor`, the kernel's socket layer alone, which `switchboard-bench
/// kernel` measures beside the kernel and C: it must forward what the kernel would, or its
/// rows mean nothing. Driven here with hand-made 7/MDP and CHP frames, not the codecs it uses.
@Suite("The socket layer's floor (switchboard-bench socket-floor)")
struct SocketFloorTests {
    @Test("it forwards 7/MDP requests within the worker's window and replies to their clients, and republishes KVSETs in order")
    func forwardsAndRepublishes() async throws {
        let folder = try temporaryDirectory("floor")
        defer { try? FileManager.default.removeItem(at: folder) }
        let endpoints = ["broker", "collector", "publisher"].map { "ipc://" + folder.appendingPathComponent($0).path }
        let (broker, collector, publisher) = (endpoints[0], endpoints[1], endpoints[2])
        let bench = switchboardExecutable().deletingLastPathComponent().appendingPathComponent("switchboard-bench")
        let floor = try ChildProcess(bench, ["socket-floor", "--broker", broker, "--collector", collector, "--publisher", publisher])
        defer { floor.stop() }

        let context = try ZMQContext()
        let worker = try bounded(ZMQSocket(context, .dealer))
        try worker.connect(broker)
        try worker.send(["", "MDPW01", Frame([0x01]), "echo", "window=2"])
        let client = try bounded(ZMQSocket(context, .dealer))
        try client.connect(broker)
        for index in 0..<3 { try client.send(["", "MDPC01", "echo", Frame("request \(index) " + String(repeating: "x", count: 40))]) }
        // Two at once (the window), the third once one is answered.
        func request() throws -> Message {
            let request = try worker.receive()
            #expect(request.count == 6 && request[0].isEmpty && request[1] == "MDPW01" && request[2] == Frame([0x02]) && request[4].isEmpty)
            return request
        }
        func answer(_ request: Message) throws {
            try worker.send(["", "MDPW01", Frame([0x03]), request[3], "", request[5]])
        }
        var requests = [try request(), try request()]
        try worker.set(.receiveTimeout, Int32(200))
        #expect(try worker.tryReceive() == nil && (try? worker.receive()) == nil, "a third request beyond the window of 2")
        try worker.set(.receiveTimeout, Int32(5_000))
        try answer(requests[0])
        requests.append(try request())
        try answer(requests[1])
        try answer(requests[2])
        #expect(requests.map { $0[5].string?.prefix(10) } == ["request 0 ", "request 1 ", "request 2 "])
        for request in requests {
            let reply = try client.receive()
            #expect(reply.count == 4 && reply[0].isEmpty && reply[1] == "MDPC01" && reply[2] == "echo" && reply[3] == request[5])
        }

        let subscriber = try bounded(ZMQSocket(context, .sub), milliseconds: 100)
        try subscriber.subscribe("")
        try subscriber.connect(publisher)
        let writer = try ZMQSocket(context, .pub)
        try writer.connect(collector)
        // PUB and SUB join in their own time: KVSETs until one comes back (bounded), then two more.
        let value = Frame(String(repeating: "v", count: 64))
        let kvset: Message = ["/floor/key", Frame([UInt8](repeating: 0, count: 8)), "", "", value]
        var first: Message?
        let deadline = Date().addingTimeInterval(10)
        while first == nil, Date() < deadline {
            try writer.send(kvset)
            first = try? subscriber.receive()
        }
        let published = try #require(first, "no KVPUB within 10 s")
        #expect(published.count == 5 && published[0] == "/floor/key" && published[4] == value)
        func sequence(_ message: Message) -> UInt64 { message[1].bytes.reduce(0) { $0 << 8 | UInt64($1) } }
        // What was sent while the two joined is still coming; then the next ones, numbered on.
        var last = sequence(published)
        while let next = try? subscriber.receive() {
            #expect(sequence(next) == last + 1)
            last = sequence(next)
        }
        try writer.send(kvset)
        let after = try #require(try? subscriber.receive())
        #expect(sequence(after) == last + 1 && after[4] == value)
    }
}
