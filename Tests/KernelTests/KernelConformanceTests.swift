import BusProtocol
import Foundation
@testable import Kernel
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// A kernel on free loopback ports, for one test.
struct RunningKernel {
    let kernel: Kernel
    let endpoints: Kernel.Endpoints
    let context: ZMQContext

    static func start(_ configure: (inout KernelConfiguration) -> Void = { _ in }) async throws -> RunningKernel {
        var configuration = KernelConfiguration()
        configuration.brokerEndpoint = "tcp://127.0.0.1:*"
        configuration.snapshotEndpoint = "tcp://127.0.0.1:*"
        configuration.publisherEndpoint = "tcp://127.0.0.1:*"
        configuration.collectorEndpoint = "tcp://127.0.0.1:*"
        configure(&configuration)
        let context = try ZMQContext()
        let kernel = try Kernel(configuration: configuration, context: context)
        let endpoints = try await kernel.start()
        return RunningKernel(kernel: kernel, endpoints: endpoints, context: context)
    }

    /// A raw socket connected to one of the kernel's endpoints, with bounded waits.
    func socket(_ type: SocketType, _ endpoint: String, id: String? = nil) throws -> ZMQSocket {
        let socket = try ZMQSocket(context, type)
        try socket.set(.receiveTimeout, 5_000)
        try socket.set(.sendTimeout, 5_000)
        if let id { try socket.set(.routingID, Array(id.utf8)) }
        try socket.connect(endpoint)
        return socket
    }

    func stop() async { await kernel.stop() }
}

/// Receives without blocking the cooperative thread pool (a blocking zmq_msg_recv there
/// starves every other test): polls, yielding between tries, until `seconds` pass.
func receive(_ socket: ZMQSocket, within seconds: Double = 5) async throws -> Message {
    let deadline = Date().addingTimeInterval(seconds)
    while true {
        if let message = try socket.tryReceive() { return message }
        guard Date() < deadline else { throw ZMQError(call: "zmq_msg_recv(test, \(seconds) s)", code: EAGAIN) }
        try await Task.sleep(for: .milliseconds(2))
    }
}

/// Receives, skipping heartbeats, until a message that is not a HEARTBEAT arrives.
func receiveSkippingHeartbeats(_ socket: ZMQSocket, within seconds: Double = 5) async throws -> Message {
    while true {
        let message = try await receive(socket, within: seconds)
        if message.count == 3, message[2] == Frame([MDP.Command.heartbeat.rawValue]) { continue }
        return message
    }
}

/// The next REQUEST a raw worker gets (heartbeats skipped): the client frame and the body.
func receiveRequest(_ worker: ZMQSocket) async throws -> (client: Frame, body: [Frame]) {
    let command = try MDP.decodeAtWorker(try await receiveSkippingHeartbeats(worker))
    guard case .request(let client, let body) = command else { throw ProtocolError("MDP", "expected REQUEST, got \(command)") }
    return (client, body)
}

/// Asks `mmi.service` until the kernel reports `service` registered (READY has no answer,
/// and travels on another connection than the client's question).
func waitForService(_ client: ZMQSocket, _ service: String) async throws {
    for _ in 0..<250 {
        try client.send(MDP.request(service: "mmi.service", body: [Frame(service)]))
        if try await receive(client).last == "200" { return }
        try await Task.sleep(for: .milliseconds(20))
    }
    throw ZMQError(call: "waitForService(\(service))", code: 110)
}

func kernelRequest(_ method: String, _ params: JSONValue? = nil, id: Int64 = 1) -> Message {
    MDP.request(service: "kernel", body: [Frame(JSONRPCRequest(id: .number(id), method: method, params: params).jsonBytes)])
}

func result(_ reply: Message) throws -> JSONValue {
    let decoded = try MDP.decodeAtClient(reply)
    let responses = try JSONRPC.parseResponses(decoded.body[0].bytes)
    return try responses[0].outcome.get()
}

@Suite("Kernel conformance: raw frames against a live kernel")
struct KernelConformanceTests {
    @Test("lifecycle: start binds once (a second start answers the same endpoints); a stopped kernel does not start again")
    func lifecycle() async throws {
        let running = try await RunningKernel.start()
        #expect(try await running.kernel.start() == running.endpoints)
        await running.stop()
        await #expect(throws: KernelRefusal.self) { try await running.kernel.start() }
    }

    @Test("MDP: a raw worker and a raw client exchange a request through the kernel")
    func requestReply() async throws {
        let running = try await RunningKernel.start()
        let worker = try running.socket(.dealer, running.endpoints.broker, id: "W1")
        try worker.send(MDP.encode(.ready(service: "echo")))
        let client = try running.socket(.dealer, running.endpoints.broker, id: "C1")
        try client.send(MDP.request(service: "echo", body: ["hello", Frame()]))
        let request = try MDP.decodeAtWorker(try await receiveSkippingHeartbeats(worker))
        guard case .request(let clientAddress, let body) = request else { Issue.record("expected REQUEST"); return }
        #expect(clientAddress == "C1")
        #expect(body == ["hello", Frame()])
        try worker.send(MDP.encode(.reply(client: clientAddress, body: ["world"])))
        let reply = try await receive(client)
        #expect(reply == ["", "MDPC01", "echo", "world"])
        await running.stop()
    }

    @Test("MMI: mmi.service answers 200 and 404, other mmi.* names 501")
    func mmi() async throws {
        let running = try await RunningKernel.start()
        let worker = try running.socket(.dealer, running.endpoints.broker)
        try worker.send(MDP.encode(.ready(service: "echo")))
        let client = try running.socket(.dealer, running.endpoints.broker)
        try await waitForService(client, "echo")
        try client.send(MDP.request(service: "mmi.service", body: ["echo"]))
        #expect(try await receive(client) == ["", "MDPC01", "mmi.service", "200"])
        try client.send(MDP.request(service: "mmi.service", body: ["nobody"]))
        #expect(try await receive(client) == ["", "MDPC01", "mmi.service", "404"])
        try client.send(MDP.request(service: "mmi.echo", body: ["x"]))
        #expect(try await receive(client) == ["", "MDPC01", "mmi.echo", "501"])
        await running.stop()
    }

    @Test("a worker claiming mmi.* or kernel, or sending a second READY, is disconnected", arguments: ["mmi.x", "kernel"])
    func reservedNames(name: String) async throws {
        let running = try await RunningKernel.start()
        let worker = try running.socket(.dealer, running.endpoints.broker)
        try worker.send(MDP.encode(.ready(service: name)))
        #expect(try MDP.decodeAtWorker(try await receiveSkippingHeartbeats(worker)) == .disconnect)
        let twice = try running.socket(.dealer, running.endpoints.broker)
        try twice.send(MDP.encode(.ready(service: "echo")))
        try twice.send(MDP.encode(.ready(service: "echo")))
        #expect(try MDP.decodeAtWorker(try await receiveSkippingHeartbeats(twice)) == .disconnect)
        await running.stop()
    }

    @Test("bad frames are dropped or answered with DISCONNECT, and the kernel keeps serving")
    func badFrames() async throws {
        let running = try await RunningKernel.start { $0.maxMessageSize = 64 * 1024 }
        let hostile = try running.socket(.dealer, running.endpoints.broker)
        let garbage: [Message] = [
            ["x"], ["", "MDPX01", "echo", "body"], ["", "MDPC01"], ["", "MDPC01", "", "body"],
            [Frame([0xFF, 0x00, 0x13]), Frame([UInt8](repeating: 7, count: 300))],
            ["", "MDPW01", Frame([0x09])],
        ]
        for message in garbage { try hostile.send(message) }
        // A request with an empty service name is answered, not left waiting.
        let unnamed = try MDP.decodeAtClient(try await receiveSkippingHeartbeats(hostile))
        #expect(unnamed.service == "" && String(decoding: unnamed.body[0].bytes, as: UTF8.self).contains("service name"), "\(unnamed)")
        // A worker-protocol violation is answered with DISCONNECT.
        #expect(try MDP.decodeAtWorker(try await receiveSkippingHeartbeats(hostile)) == .disconnect)
        // HEARTBEAT and REPLY from a stranger: DISCONNECT.
        let stranger = try running.socket(.dealer, running.endpoints.broker)
        try stranger.send(MDP.encode(.heartbeat()))
        #expect(try MDP.decodeAtWorker(try await receiveSkippingHeartbeats(stranger)) == .disconnect)
        try stranger.send(MDP.encode(.reply(client: "nobody", body: ["x"])))
        #expect(try MDP.decodeAtWorker(try await receiveSkippingHeartbeats(stranger)) == .disconnect)
        // An oversized message gets its sender disconnected at the socket level.
        let big = try running.socket(.dealer, running.endpoints.broker)
        try big.send(MDP.request(service: "kernel", body: [Frame([UInt8](repeating: 1, count: 128 * 1024))]))
        // The kernel still serves a well-behaved client.
        let client = try running.socket(.dealer, running.endpoints.broker)
        try client.send(kernelRequest("ping"))
        #expect(try result(try await receive(client))["pong"] == true)
        try client.send(kernelRequest("stats"))
        let stats = try result(try await receive(client))
        // Each of the six bad messages once; the stranger's commands are not errors (it is
        // told to register), and the oversized one never reaches the broker.
        #expect(stats["protocolErrors"]?.intValue == 6, "\(stats)")
        await running.stop()
    }

    @Test("a request with an unusable service name (empty, too long, not printable) is answered -32600 with its id at once")
    func unusableServiceName() async throws {
        let running = try await RunningKernel.start()
        let client = try running.socket(.dealer, running.endpoints.broker)
        for name in [Frame(), Frame(String(repeating: "s", count: 256)), Frame("two words")] {
            let body = Frame(JSONRPCRequest(id: .number(7), method: "echo", params: ["a": 1]).jsonBytes)
            try client.send([Frame(), Frame(MDP.clientHeader), name, body])
            let reply = try MDP.decodeAtClient(try await receive(client, within: 2))
            let response = try #require(try JSONRPC.parseResponses(reply.body[0].bytes).first)
            #expect(response.id == .number(7))
            guard case .failure(let error) = response.outcome else { Issue.record("expected an error"); continue }
            #expect(error.code == JSONRPCError.invalidRequestCode && error.message.contains("service name"), "\(error)")
        }
        try client.send(kernelRequest("stats"))
        #expect((try result(try await receive(client))["protocolErrors"]?.intValue ?? 0) == 3)
        await running.stop()
    }

    @Test("a request for a service with no worker gets -32001 with its id after the queue timeout")
    func noWorker() async throws {
        let running = try await RunningKernel.start { $0.queueTimeout = .milliseconds(300) }
        let client = try running.socket(.dealer, running.endpoints.broker)
        let started = Date()
        try client.send(MDP.request(service: "nobody", body: [Frame(JSONRPCRequest(id: .string("r-1"), method: "x").jsonBytes)]))
        let reply = try MDP.decodeAtClient(try await receive(client))
        let elapsed = Date().timeIntervalSince(started)
        #expect(reply.service == "nobody")
        let response = try JSONRPC.parseResponses(reply.body[0].bytes)[0]
        #expect(response.id == .string("r-1"))
        guard case .failure(let error) = response.outcome else { Issue.record("expected an error"); return }
        #expect(error.code == -32001)
        #expect(error.message.contains("no worker for 'nobody'"))
        #expect(elapsed >= 0.25)
        // An opaque body still gets an answer, with a null id.
        try client.send(MDP.request(service: "nobody", body: ["not json"]))
        let opaque = try JSONRPC.parseResponses(try MDP.decodeAtClient(try await receive(client)).body[0].bytes)[0]
        #expect(opaque.id == .null)
        await running.stop()
    }

    @Test("the kernel service: ping, services.list, state.set/get, errors")
    func builtIns() async throws {
        let running = try await RunningKernel.start()
        let worker = try running.socket(.dealer, running.endpoints.broker)
        try worker.send(MDP.encode(.ready(service: "echo")))
        let client = try running.socket(.dealer, running.endpoints.broker)
        try await waitForService(client, "echo")
        try client.send(kernelRequest("services.list"))
        let services = try result(try await receive(client))["services"]?.arrayValue ?? []
        #expect(services.contains { $0["name"] == "echo" && $0["workers"] == 1 && $0["idle"] == 1 })
        try client.send(kernelRequest("state.get", ["prefix": "/kernel/services/"]))
        let registered = try result(try await receive(client))["entries"]?.arrayValue ?? []
        #expect(registered.count == 1)
        #expect(registered.first?["key"] == "/kernel/services/echo")
        #expect(registered.first?["value"] == ["name": "echo", "workers": 1])
        try client.send(kernelRequest("state.set", ["key": "/test/a", "value": ["n": 1]]))
        let sequence = try result(try await receive(client))["sequence"]?.intValue ?? 0
        #expect(sequence > 0)
        try client.send(kernelRequest("state.get", ["prefix": "/test/"]))
        let got = try result(try await receive(client))
        #expect(got["entries"] == [["key": "/test/a", "sequence": .int(sequence), "value": ["n": 1]]])
        try client.send(kernelRequest("state.set", ["key": "/kernel/x", "value": 1]))
        let forbidden = try await receive(client)
        #expect(throws: JSONRPCError.self) { try result(forbidden) }
        try client.send(kernelRequest("state.set", ["value": 1]))
        do { _ = try result(try await receive(client)) } catch let error as JSONRPCError {
            #expect(error.code == -32602)
            #expect(error.data?["field"] == "key")
        }
        try client.send(kernelRequest("no.such"))
        do { _ = try result(try await receive(client)) } catch let error as JSONRPCError { #expect(error.code == -32601) }
        try client.send(MDP.request(service: "kernel", body: ["{bad json"]))
        let parseError = try JSONRPC.parseResponses(try MDP.decodeAtClient(try await receive(client)).body[0].bytes)[0]
        #expect(parseError.outcome.failureCode == -32700)
        await running.stop()
    }

    @Test("CHP HUGZ counts: the greeting carries every topic, a HUGZ after writes only the topics that changed; long topics are not counted")
    func hugzCounts() async throws {
        let running = try await RunningKernel.start { $0.hugzInterval = .seconds(30) }
        let client = try running.socket(.dealer, running.endpoints.broker)
        let subscriber = try running.socket(.sub, running.endpoints.publisher)
        let long = "/client/" + String(repeating: "x", count: 300)
        // HUGZ first, so every greeting reaches this subscriber.
        for topic in ["HUGZ", "/catalog/", "/client/", long] { try subscriber.subscribe(topic) }
        func nextHugz() async throws -> [String: UInt64] {
            while true {
                if case .hugz(let counts) = try CHP.decodeUpdate(try await receive(subscriber)) { return counts }
            }
        }
        // A greeting per subscription message (four); the last knows every counted topic.
        var greeting: [String: UInt64] = [:]
        for _ in 1...4 { greeting = try await nextHugz() }
        #expect(greeting == ["/catalog/": 0, "/client/": 0], "every counted topic, from zero; not the 300-byte one")

        for n in 1...3 {
            try client.send(kernelRequest("state.set", ["key": "/catalog/n", "value": .int(Int64(n))]))
            _ = try await receive(client)
        }
        // The HUGZ after the writes (a tick may fall between two of them): the topic that
        // changed, with its count, alone.
        var counts = try await nextHugz()
        while counts["/catalog/"] != 3 {
            #expect(counts.keys.allSatisfy { $0 == "/catalog/" }, "only the topic that changed: \(counts)")
            counts = try await nextHugz()
        }
        #expect(counts == ["/catalog/": 3])
        await running.stop()
    }

    @Test("CHP: snapshot, then live KVPUB, HUGZ, collector writes within /client/ only, TTL expiry")
    func chp() async throws {
        let running = try await RunningKernel.start { $0.hugzInterval = .milliseconds(200) }
        let subscriber = try running.socket(.sub, running.endpoints.publisher)
        try subscriber.subscribe("/catalog/")
        try subscriber.subscribe("/client/")
        try subscriber.subscribe("HUGZ")
        // The kernel greets a new subscription with a HUGZ: after it, nothing can be missed.
        guard case .hugz(let counts) = try CHP.decodeUpdate(try await receive(subscriber)) else {
            Issue.record("expected HUGZ"); return
        }
        #expect(counts["/catalog/"] == 0, "the greeting counts the new topic from zero")

        // A write, then the snapshot that holds it; its KVPUB reaches the subscriber too, and a
        // subscriber skips what the snapshot holds (the updates up to its sequence).
        let client = try running.socket(.dealer, running.endpoints.broker)
        try client.send(kernelRequest("state.set", ["key": "/catalog/countries", "value": ["count": 249]]))
        let first = try result(try await receive(client))["sequence"]?.intValue ?? 0

        let snapshot = try running.socket(.dealer, running.endpoints.snapshot)
        try snapshot.send(CHP.icanhaz(subtree: "/catalog/"))
        #expect(try CHP.decodeSnapshotReply(try await receive(snapshot)) == .entry(KVEntry(key: "/catalog/countries", sequence: UInt64(first), value: Frame((["count": 249] as JSONValue).jsonBytes))))
        guard case .done(let snapshotSequence, "/catalog/", nil) = try CHP.decodeSnapshotReply(try await receive(snapshot)) else {
            Issue.record("expected KTHXBAI"); return
        }
        #expect(snapshotSequence >= UInt64(first))

        try client.send(kernelRequest("state.set", ["key": "/catalog/items", "value": 1]))
        _ = try await receive(client)
        func nextEntry() async throws -> KVEntry {
            while true {
                if case .entry(let entry) = try CHP.decodeUpdate(try await receive(subscriber)), entry.sequence > snapshotSequence { return entry }
            }
        }
        let update = try await nextEntry()
        #expect(update.key == "/catalog/items")
        #expect(update.sequence == snapshotSequence + 1)

        let collector = try running.socket(.pub, running.endpoints.collector)
        // Writes outside /client/ are refused; inside they are published, TTL honoured.
        for _ in 0..<50 {
            try collector.send(CHP.kv(KVEntry(key: "/catalog/evil", value: "x")))
            try collector.send(CHP.kv(KVEntry(key: "/client/note", properties: [("ttl", "0.3")], value: "hi")))
            if let message = try subscriber.tryReceive(), case .entry(let entry) = try CHP.decodeUpdate(message) {
                #expect(entry.key == "/client/note")
                #expect(entry.ttl == 0.3)
                break
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        // The entry expires: a delete is published.
        var deleted = false
        for _ in 0..<200 {
            let entry = try await nextEntry()
            #expect(entry.key != "/catalog/evil")
            if entry.key == "/client/note" && entry.isDelete { deleted = true; break }
        }
        #expect(deleted)
        await running.stop()
    }

    @Test("a request whose worker goes silent is re-sent to another worker, answered once")
    func workerDeath() async throws {
        let running = try await RunningKernel.start {
            $0.heartbeatInterval = .milliseconds(100)
            $0.heartbeatLiveness = 10
        }
        let client = try running.socket(.dealer, running.endpoints.broker)
        let doomed = try running.socket(.dealer, running.endpoints.broker, id: "doomed")
        try doomed.send(MDP.encode(.ready(service: "svc")))
        try await waitForService(client, "svc")
        try client.send(MDP.request(service: "svc", body: [Frame(JSONRPCRequest(id: .number(5), method: "m").jsonBytes)]))
        // The doomed worker heartbeats until it holds the request, then goes silent for good.
        #expect(try await serve(doomed, until: Date().addingTimeInterval(5)) { _ in nil })
        // A healthy worker joins, heartbeating on schedule, and answers what it is given.
        let healthy = try running.socket(.dealer, running.endpoints.broker, id: "healthy")
        try healthy.send(MDP.encode(.ready(service: "svc")))
        #expect(try await serve(healthy, until: Date().addingTimeInterval(10)) { $0 })
        let reply = try MDP.decodeAtClient(try await receive(client))
        #expect(reply.body == [Frame(JSONRPCRequest(id: .number(5), method: "m").jsonBytes)])
        // The late reply of the doomed worker is refused (DISCONNECT), never a second answer.
        try doomed.send(MDP.encode(.reply(client: Frame(try client.get(.routingID)), body: ["late"])))
        await #expect(throws: ZMQError.self) { _ = try await receive(client, within: 0.3) }
        await running.stop()
    }

    @Test("a non-retriable service's request whose worker dies gets -32006, not a second try")
    func outcomeUnknown() async throws {
        let running = try await RunningKernel.start {
            $0.heartbeatInterval = .milliseconds(100)
            $0.heartbeatLiveness = 10
            $0.nonRetriableServices = ["pay"]
        }
        let client = try running.socket(.dealer, running.endpoints.broker)
        let doomed = try running.socket(.dealer, running.endpoints.broker)
        try doomed.send(MDP.encode(.ready(service: "pay")))
        try await waitForService(client, "pay")
        try client.send(MDP.request(service: "pay", body: [Frame(JSONRPCRequest(id: .number(77), method: "charge").jsonBytes)]))
        #expect(try await serve(doomed, service: "pay", until: Date().addingTimeInterval(5)) { _ in nil })
        // A second worker is there, but the request must not be run twice.
        let other = try running.socket(.dealer, running.endpoints.broker)
        try other.send(MDP.encode(.ready(service: "pay")))
        let response = try JSONRPC.parseResponses(try MDP.decodeAtClient(try await receive(client)).body[0].bytes)[0]
        #expect(response.id == .number(77))
        #expect(response.outcome.failureCode == -32006)
        #expect(try other.tryReceive().map { try MDP.decodeAtWorker($0) } != .request(client: Frame(try client.get(.routingID)), body: []))
        await running.stop()
    }

    @Test("the window extension: a worker offering 3 gets 3 requests at once and answers them in any order")
    func windowWorker() async throws {
        // One client may take every place here (by default 90 %; see clientShare).
        let running = try await RunningKernel.start { $0.clientSharePercent = 100 }
        let worker = try running.socket(.dealer, running.endpoints.broker, id: "W")
        try worker.send(MDP.encode(.ready(service: "svc", window: 3)))
        let client = try running.socket(.dealer, running.endpoints.broker, id: "C")
        try await waitForService(client, "svc")
        for index in 0..<5 { try client.send(MDP.request(service: "svc", body: [Frame("r\(index)")])) }
        var held: [(Frame, [Frame])] = []
        for _ in 0..<3 {
            let (address, body) = try await receiveRequest(worker)
            // The client's routing id, then the broker's 4-byte tag.
            #expect(address.count == 5 && address.bytes.prefix(1) == [UInt8(ascii: "C")])
            held.append((address, body))
        }
        #expect(held.map(\.1) == [["r0"], ["r1"], ["r2"]])
        // A fourth waits until a place is free.
        await #expect(throws: ZMQError.self) { _ = try await receiveSkippingHeartbeats(worker, within: 0.2) }
        for (address, body) in held.reversed() { try worker.send(MDP.encode(.reply(client: address, body: body[...]))) }
        for expected in ["r2", "r1", "r0"] { #expect(try await receive(client).last == Frame(expected)) }
        for expected in ["r3", "r4"] {
            let (address, body) = try await receiveRequest(worker)
            #expect(body == [Frame(expected)])
            try worker.send(MDP.encode(.reply(client: address, body: body[...])))
            #expect(try await receive(client).last == Frame(expected))
        }
        // A tag it never got is refused like any reply with nothing in flight.
        try worker.send(MDP.encode(.reply(client: Frame("Cxxxx"), body: ["forged"])))
        #expect(try MDP.decodeAtWorker(try await receiveSkippingHeartbeats(worker)) == .disconnect)
        await running.stop()
    }

    @Test("one client holds at most its share of a service's places; another client's request is served meanwhile")
    func clientShare() async throws {
        let running = try await RunningKernel.start { $0.clientSharePercent = 50 }
        let worker = try running.socket(.dealer, running.endpoints.broker, id: "W")
        try worker.send(MDP.encode(.ready(service: "svc", window: 4)))
        let greedy = try running.socket(.dealer, running.endpoints.broker, id: "G")
        let other = try running.socket(.dealer, running.endpoints.broker, id: "O")
        try await waitForService(greedy, "svc")
        // Ten slow requests from one client: two of the four places go to it, the rest wait.
        for index in 0..<10 { try greedy.send(MDP.request(service: "svc", body: [Frame("g\(index)")])) }
        var held: [(Frame, [Frame])] = []
        for _ in 0..<2 { held.append(try await receiveRequest(worker)) }
        #expect(held.map(\.1) == [["g0"], ["g1"]])
        await #expect(throws: ZMQError.self) { _ = try await receiveSkippingHeartbeats(worker, within: 0.2) }
        // Another client is served at once, beside them.
        try other.send(MDP.request(service: "svc", body: [Frame("o0")]))
        let (address, body) = try await receiveRequest(worker)
        #expect(body == [Frame("o0")] && address.bytes.first == UInt8(ascii: "O"))
        try worker.send(MDP.encode(.reply(client: address, body: body[...])))
        #expect(try await receive(other).last == Frame("o0"))
        // As the greedy client's requests are answered, its next ones go out, in order.
        for expected in 2..<10 {
            let (address, body) = held.removeFirst()
            try worker.send(MDP.encode(.reply(client: address, body: body[...])))
            held.append(try await receiveRequest(worker))
            #expect(held.last?.1 == [Frame("g\(expected)")])
        }
        await running.stop()
    }

    @Test("a peer sending while the kernel's loop is busy is held back by its own socket, not read into the kernel without bound; once the loop is back, everything it sent is answered")
    func peerInputBounded() async throws {
        let running = try await RunningKernel.start()
        let peer = try running.socket(.dealer, running.endpoints.broker)
        try peer.send(kernelRequest("ping"))
        _ = try result(try await receive(peer))
        // Requests of 4 kB, so TCP's buffers hold a few thousand at most: what the peer can
        // still hand over past them, with the loop held, is what the kernel reads ahead.
        let padding: JSONValue = .object(["padding": .string(String(repeating: "x", count: 4_000))])
        let requests = (0..<40_000).lazy.map { kernelRequest("ping", padding, id: Int64($0)) }
        let (held, holds) = AsyncStream<Void>.makeStream()
        let release = DispatchSemaphore(value: 0)
        let sent = try await withThrowingTaskGroup(of: Void.self) { group in
            let kernel = running.kernel
            group.addTask { await kernel.holdLoop(saying: holds, until: release) }
            defer { release.signal() }
            try await within(10, "the kernel's loop held") { for await _ in held { break } }
            return try await sendUntilHeldBack(peer, requests)
        }
        #expect(sent != nil, "the kernel read all 40,000 requests of 4 kB while its loop was held")
        #expect((sent ?? 0) < 20_000)
        // Held back, not dropped: each is answered.
        var answered: Set<Int64> = []
        while answered.count < sent ?? 0 {
            let reply = try MDP.decodeAtClient(try await receive(peer, within: 30))
            let responses = try JSONRPC.parseResponses(reply.body[0].bytes)
            if case .number(let id) = responses[0].id { answered.insert(id) }
        }
        #expect(answered == Set(0..<Int64(sent ?? 0)))
        await running.stop()
    }

    @Test("a window worker that dies gives every request it held to another worker, each answered once")
    func windowWorkerDeath() async throws {
        let running = try await RunningKernel.start { $0.clientSharePercent = 100 }
        let client = try running.socket(.dealer, running.endpoints.broker)
        let doomed = try running.socket(.dealer, running.endpoints.broker)
        try doomed.send(MDP.encode(.ready(service: "svc", window: 4)))
        try await waitForService(client, "svc")
        for index in 0..<3 { try client.send(MDP.request(service: "svc", body: [Frame("r\(index)")])) }
        for _ in 0..<3 { _ = try await receiveSkippingHeartbeats(doomed) }
        try doomed.send(MDP.encode(.disconnect))
        let healthy = try running.socket(.dealer, running.endpoints.broker)
        try healthy.send(MDP.encode(.ready(service: "svc")))
        var answered: [Frame] = []
        for _ in 0..<3 {
            let (address, body) = try await receiveRequest(healthy)
            try healthy.send(MDP.encode(.reply(client: address, body: body[...])))
            answered.append(try await receive(client).last!)
        }
        #expect(answered == ["r0", "r1", "r2"])
        await #expect(throws: ZMQError.self) { _ = try await receive(client, within: 0.2) }
        await running.stop()
    }

    @Test("error counts come from the workers' heartbeats; the kernel reads no reply body")
    func errorsFromHeartbeats() async throws {
        let running = try await RunningKernel.start()
        let client = try running.socket(.dealer, running.endpoints.broker)
        let worker = try running.socket(.dealer, running.endpoints.broker)
        try worker.send(MDP.encode(.ready(service: "svc")))
        try await waitForService(client, "svc")
        func errors() async throws -> JSONValue? {
            try client.send(kernelRequest("stats"))
            return try result(try await receive(client))["services"]?["svc"]?["errors"]
        }
        // The heartbeat travels on the worker's connection, the question on the client's.
        func errorsReach(_ count: JSONValue) async throws -> Bool {
            for _ in 0..<250 {
                if try await errors() == count { return true }
                try await Task.sleep(for: .milliseconds(20))
            }
            return false
        }
        // An error reply relayed is not counted by the kernel itself…
        try client.send(MDP.request(service: "svc", body: [Frame(JSONRPCRequest(id: .number(1), method: "m").jsonBytes)]))
        let (address, _) = try await receiveRequest(worker)
        try worker.send(MDP.encode(.reply(client: address, body: [Frame(JSONRPCResponse(id: .number(1), error: .methodNotFound("m")).jsonBytes)])))
        _ = try await receive(client)
        #expect(try await errors() == 0)
        // …but as the worker reports it: a running total per connection.
        try worker.send(MDP.encode(.heartbeat(errors: 2)))
        #expect(try await errorsReach(2))
        try worker.send(MDP.encode(.heartbeat(errors: 5)))
        try worker.send(MDP.encode(.heartbeat()))
        #expect(try await errorsReach(5))
        #expect(try await errors() == 5)
        await running.stop()
    }

    /// Plays a worker: heartbeats every 50 ms until a REQUEST arrives, then answers it with
    /// `answer(body)` (no answer for nil). Returns whether a request arrived in time.
    func serve(_ worker: ZMQSocket, service: String = "svc", until deadline: Date, answer: ([Frame]) -> [Frame]?) async throws -> Bool {
        var lastBeat = Date.distantPast
        while Date() < deadline {
            if Date().timeIntervalSince(lastBeat) >= 0.05 {
                try worker.send(MDP.encode(.heartbeat()))
                lastBeat = Date()
            }
            guard let message = try worker.tryReceive() else {
                try await Task.sleep(for: .milliseconds(10))
                continue
            }
            switch try MDP.decodeAtWorker(message) {
            case .request(let address, let body):
                if let reply = answer(body) { try worker.send(MDP.encode(.reply(client: address, body: reply[...]))) }
                return true
            case .disconnect:
                // As a real worker would: the kernel forgot us (we were too slow), register again.
                try worker.send(MDP.encode(.ready(service: service)))
            case .heartbeat, .drain, .stop:
                break
            }
        }
        return false
    }
}

extension Result where Success == JSONValue, Failure == JSONRPCError {
    var failureCode: Int? { if case .failure(let error) = self { error.code } else { nil } }
}

@Suite("Latency buckets")
struct ReplyCountingTests {
    @Test("latency quantiles are bucket bounds")
    func histogram() {
        var histogram = LatencyHistogram()
        #expect(histogram.quantileMicroseconds(0.5) == nil)
        for _ in 0..<98 { histogram.record(nanoseconds: 80_000) }  // 80 µs: the 100 µs bucket
        histogram.record(nanoseconds: 3_000_000)  // 3 ms: the 5 ms bucket
        histogram.record(nanoseconds: 60_000_000_000)  // a minute: beyond the last bound
        #expect(histogram.quantileMicroseconds(0.5) == 100)
        #expect(histogram.quantileMicroseconds(0.99) == 5_000)
        #expect(histogram.quantileMicroseconds(1) == nil)
        #expect(histogram.count == 100)
    }
}

extension Kernel {
    /// Holds the kernel's loop thread (its actor's executor) until `release` is signalled,
    /// saying `held` once it does: the loop reads nothing meanwhile.
    func holdLoop(saying held: AsyncStream<Void>.Continuation, until release: DispatchSemaphore) {
        held.yield()
        release.wait()
    }
}

/// Sends `messages` in turn without waiting, until the socket has had no room for two
/// seconds: how many it sent by then, or nil when it sent them all. (No room for a moment is
/// a reader slower than this loop; no room for seconds, a reader that stopped.)
private func sendUntilHeldBack(_ socket: ZMQSocket, _ messages: some Collection<Message>) async throws -> Int? {
    var sent = 0
    for message in messages {
        var waited = 0
        while !(try socket.trySend(message)) {
            if waited == 200 { return sent }
            waited += 1
            try await Task.sleep(for: .milliseconds(10))
        }
        sent += 1
    }
    return nil
}
