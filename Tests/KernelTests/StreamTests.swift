import BusProtocol
import Contracts
@testable import Kernel
import Logging
import Testing
import ZeroMQ

private let quiet = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

/// Frames as the broker's ROUTER receives them, from a peer speaking `version`.
private func fromWorker(_ id: String, _ command: WorkerToBroker, _ version: MDP.Version = .v02) -> Message {
    Message([Frame(id)] + MDP.encode(command, version: version).frames)
}
private func fromClient(_ id: String, _ service: String, _ body: String, _ version: MDP.Version = .v02) -> Message {
    Message([Frame(id)] + MDP.request(service: service, body: [Frame(body)], version: version).frames)
}
private func request(_ id: Int) -> String { #"{"jsonrpc":"2.0","id":\#(id),"method":"m"}"# }

/// One message the broker sent to a client, decoded.
private struct ToClient: Equatable {
    var client: String
    var version: MDP.Version
    var isFinal: Bool
    var body: [String]
}

/// What the broker sent: requests to workers (with the client frame to echo) and replies.
private struct Sent {
    var requests: [(worker: String, client: Frame)] = []
    var disconnects: [(worker: String, version: MDP.Version)] = []
    var stops: [(worker: String, client: Frame)] = []
    var heartbeats: [String] = []
    var toClients: [ToClient] = []
    init(_ messages: [Message]) {
        for message in messages {
            let peer = message[0].string ?? ""
            let rest = Message(Array(message.frames.dropFirst()))
            let version: MDP.Version = rest[0].isEmpty ? .v01 : .v02
            if let command = try? MDP.decodeAtWorker(rest) {
                if case .request(let client, _) = command { requests.append((peer, client)) }
                if case .disconnect = command { disconnects.append((peer, version)) }
                if case .stop(let client) = command { stops.append((peer, client)) }
                if case .heartbeat = command { heartbeats.append(peer) }
            } else if let reply = try? MDP.decodeAtClient(rest) {
                toClients.append(ToClient(client: peer, version: version, isFinal: reply.isFinal, body: reply.body.map { $0.string ?? "" }))
            }
        }
    }
}

@Suite("Replies in parts (18/MDP beside 7/MDP): each version mix, and every early end of a stream")
struct StreamTests {
    private func broker(_ configure: (inout KernelConfiguration) -> Void = { _ in }) -> Broker {
        var configuration = KernelConfiguration()
        configure(&configuration)
        return Broker(configuration: configuration, logger: quiet)
    }

    /// A request from `client` handed to the one worker `worker` (which registered in
    /// `workerVersion`); the client frame that worker echoes.
    private func dispatched(_ broker: inout Broker, client: String, clientVersion: MDP.Version, worker: String = "W",
                            workerVersion: MDP.Version = .v02, window: Int? = nil) -> Frame {
        if broker.workers[Frame(worker)] == nil {
            broker.handle(fromWorker(worker, .ready(service: "svc", window: window), workerVersion), now: 0)
        }
        broker.handle(fromClient(client, "svc", request(1), clientVersion), now: 0)
        let sent = Sent(broker.outbox.take())
        #expect(sent.requests.count == 1)
        return sent.requests[0].client
    }

    @Test("an 18/MDP client gets each PARTIAL as it comes, in order, then the FINAL; the worker is free only after the FINAL")
    func partsInOrder() {
        var broker = broker()
        let client = dispatched(&broker, client: "C", clientVersion: .v02)
        for part in ["one", "two", "three"] {
            broker.handle(fromWorker("W", .partial(client: client, body: [Frame(part)])), now: 0)
            #expect(Sent(broker.outbox.take()).toClients == [ToClient(client: "C", version: .v02, isFinal: false, body: [part])])
        }
        #expect(broker.workers[Frame("W")]?.inFlight.count == 1)
        #expect(broker.streamsInProgress == 1)
        broker.handle(fromWorker("W", .reply(client: client, body: ["end", "frames"])), now: 0)
        #expect(Sent(broker.outbox.take()).toClients == [ToClient(client: "C", version: .v02, isFinal: true, body: ["end", "frames"])])
        #expect(broker.workers[Frame("W")]?.inFlight.count == 0)
        #expect(broker.brokenStreams == 0 && broker.streamsInProgress == 0)
    }

    /// The CANCEL `client` sends for its request `id` to `svc`.
    private func cancel(_ client: String, _ id: Int = 1) -> Message {
        Message([Frame(client)] + MDP.cancel(of: MDP.request(service: "svc", body: [Frame(request(id))], version: .v02))!.frames)
    }

    @Test("a CANCEL of a reply in parts under way: the worker is told stop and nothing more of the answer reaches the client; another client's CANCEL of the same body finds nothing")
    func cancel() {
        var broker = broker()
        let client = dispatched(&broker, client: "C", clientVersion: .v02, window: 4)
        broker.handle(fromWorker("W", .partial(client: client, body: ["one"])), now: 0)
        #expect(Sent(broker.outbox.take()).toClients.count == 1)
        // Another client's CANCEL of the same body names nothing of its own.
        broker.handle(cancel("D"), now: 0)
        #expect(broker.outbox.take().isEmpty && broker.cancelledRequests == 0)
        broker.handle(cancel("C"), now: 0)
        let stops = Sent(broker.outbox.take()).stops
        #expect(stops.count == 1 && stops.first?.worker == "W" && stops.first?.client == client, "\(stops)")
        #expect(broker.cancelledRequests == 1)
        // Sent again: already cancelled, nothing more.
        broker.handle(cancel("C"), now: 0)
        #expect(broker.outbox.take().isEmpty && broker.cancelledRequests == 1)
        broker.handle(fromWorker("W", .partial(client: client, body: ["two"])), now: 0)
        broker.handle(fromWorker("W", .reply(client: client, body: ["end"])), now: 0)
        #expect(Sent(broker.outbox.take()).toClients.isEmpty)
        #expect(broker.workers[Frame("W")]?.inFlight.count == 0 && broker.streamsInProgress == 0)
    }

    @Test("a CANCEL of a request a worker holds with no part yet: an extension worker is told stop, a plain one is not, and neither's answer reaches the client")
    func cancelBeforeAPart() {
        for window in [4, nil] {
            var broker = broker()
            let client = dispatched(&broker, client: "C", clientVersion: .v02, window: window)
            broker.handle(cancel("D"), now: 0)
            broker.handle(cancel("C", 2), now: 0)
            #expect(broker.outbox.take().isEmpty && broker.cancelledRequests == 0, "only C's request 1 is named by C's CANCEL of it")
            broker.handle(cancel("C"), now: 0)
            let stops = Sent(broker.outbox.take()).stops
            #expect(broker.cancelledRequests == 1)
            if window == nil {
                #expect(stops.isEmpty, "a plain worker knows no stop")
            } else {
                #expect(stops.count == 1 && stops.first?.worker == "W" && stops.first?.client == client, "\(stops)")
            }
            broker.handle(fromWorker("W", .reply(client: client, body: ["end"])), now: 0)
            #expect(Sent(broker.outbox.take()).toClients.isEmpty)
            #expect(broker.workers[Frame("W")]?.inFlight.count == 0)
            // Its place is free: the next request goes to the worker.
            broker.handle(fromClient("C", "svc", request(3)), now: 0)
            #expect(Sent(broker.outbox.take()).requests.count == 1)
        }
    }

    @Test("a cancelled request whose worker dies before it answers is not handed to another worker")
    func cancelledThenWorkerDies() {
        var broker = broker()
        _ = dispatched(&broker, client: "C", clientVersion: .v02, window: 4)
        broker.handle(cancel("C"), now: 0)
        _ = broker.outbox.take()
        broker.handle(fromWorker("W", .disconnect), now: 0)
        broker.handle(fromWorker("W2", .ready(service: "svc", window: 4)), now: 0)
        let sent = Sent(broker.outbox.take())
        #expect(sent.requests.isEmpty && sent.toClients.isEmpty)
        #expect(broker.services["svc"]?.requests.count == 0)
    }

    @Test("a CANCEL of a request still queued takes it out of the queue: it never reaches a worker, and its bytes are no longer counted")
    func cancelQueued() {
        var broker = broker()
        // The worker's one place is taken by C's first request; the second waits.
        _ = dispatched(&broker, client: "C", clientVersion: .v02)
        broker.handle(fromClient("C", "svc", request(2)), now: 0)
        #expect(broker.services["svc"]?.requests.count == 1 && broker.queuedBytes > 0)
        broker.handle(cancel("C", 2), now: 0)
        #expect(broker.outbox.take().isEmpty && broker.cancelledRequests == 1)
        #expect(broker.services["svc"]?.requests.count == 0 && broker.queuedBytes == 0)
    }

    @Test("a 7/MDP worker's REPLY reaches an 18/MDP client as its FINAL; an 18/MDP worker's FINAL reaches a 7/MDP client as its REPLY")
    func versionMix() {
        var broker = broker()
        var client = dispatched(&broker, client: "C2", clientVersion: .v02, worker: "plain", workerVersion: .v01)
        broker.handle(fromWorker("plain", .reply(client: client, body: ["hi"]), .v01), now: 0)
        #expect(Sent(broker.outbox.take()).toClients == [ToClient(client: "C2", version: .v02, isFinal: true, body: ["hi"])])

        var other = self.broker()
        client = dispatched(&other, client: "C1", clientVersion: .v01)
        other.handle(fromWorker("W", .reply(client: client, body: ["hi"])), now: 0)
        #expect(Sent(other.outbox.take()).toClients == [ToClient(client: "C1", version: .v01, isFinal: true, body: ["hi"])])
    }

    @Test("a 7/MDP client asking a streaming worker gets one REPLY: every part's frames, then the FINAL's, in order")
    func gatheredForPlainClient() {
        var broker = broker()
        let client = dispatched(&broker, client: "C", clientVersion: .v01)
        broker.handle(fromWorker("W", .partial(client: client, body: ["a", "b"])), now: 0)
        broker.handle(fromWorker("W", .partial(client: client, body: ["c"])), now: 0)
        #expect(Sent(broker.outbox.take()).toClients.isEmpty)
        #expect(broker.gatheredBytes == 3)
        broker.handle(fromWorker("W", .reply(client: client, body: ["end"])), now: 0)
        #expect(Sent(broker.outbox.take()).toClients == [ToClient(client: "C", version: .v01, isFinal: true, body: ["a", "b", "c", "end"])])
        #expect(broker.gatheredBytes == 0)
    }

    @Test("parts too large to gather for a 7/MDP client: dropped at once, and the REPLY is -32010 saying so and how to ask instead")
    func gatherBound() throws {
        var broker = broker { $0.maxMessageSize = 10 }
        let client = dispatched(&broker, client: "C", clientVersion: .v01)
        broker.handle(fromWorker("W", .partial(client: client, body: ["12345678"])), now: 0)
        broker.handle(fromWorker("W", .partial(client: client, body: ["12345678"])), now: 0)
        #expect(broker.gatheredBytes == 0)
        broker.handle(fromWorker("W", .reply(client: client, body: ["end"])), now: 0)
        let replies = Sent(broker.outbox.take()).toClients
        #expect(replies.count == 1)
        let error = try JSONValue(parsing: Array(replies[0].body[0].utf8))["error"]
        #expect(error?["code"]?.intValue == Int64(JSONRPCError.tooLargeCode))
        #expect(error?["data"]?["parts"]?.intValue == 2)
        #expect(error?["message"]?.stringValue?.contains("MDPC02") == true)
    }

    @Test("parts of more frames than a reader takes in one message: the 7/MDP client's REPLY is -32010 too, by parts or by the FINAL")
    func gatherFrameBound() throws {
        var broker = broker()
        let frames = Broker.maxGatheredFrames
        // By parts: one frame too many.
        let first = dispatched(&broker, client: "C", clientVersion: .v01)
        broker.handle(fromWorker("W", .partial(client: first, body: Array(repeating: Frame("p"), count: frames)[...])), now: 0)
        #expect(broker.gatheredBytes == frames)
        broker.handle(fromWorker("W", .partial(client: first, body: ["p"])), now: 0)
        #expect(broker.gatheredBytes == 0)
        broker.handle(fromWorker("W", .reply(client: first, body: ["end"])), now: 0)
        var replies = Sent(broker.outbox.take()).toClients
        // By the FINAL: the parts fit, the FINAL's frames do not.
        let second = dispatched(&broker, client: "D", clientVersion: .v01)
        broker.handle(fromWorker("W", .partial(client: second, body: Array(repeating: Frame("p"), count: frames - 1)[...])), now: 0)
        broker.handle(fromWorker("W", .reply(client: second, body: ["end", "more"])), now: 0)
        replies += Sent(broker.outbox.take()).toClients
        #expect(replies.map(\.client) == ["C", "D"] && replies.allSatisfy { $0.body.count == 1 })
        for reply in replies {
            #expect(try JSONValue(parsing: Array(reply.body[0].utf8))["error"]?["code"]?.intValue == Int64(JSONRPCError.tooLargeCode))
        }
        #expect(broker.gatheredBytes == 0)
    }

    @Test("a worker that dies mid-stream: the client's FINAL is -32014 with the parts it got, and the request goes to no other worker")
    func workerDiesMidStream() throws {
        var broker = broker()
        let client = dispatched(&broker, client: "C", clientVersion: .v02)
        broker.handle(fromWorker("spare", .ready(service: "svc")), now: 0)
        broker.handle(fromWorker("W", .partial(client: client, body: ["one"])), now: 0)
        broker.handle(fromWorker("W", .partial(client: client, body: ["two"])), now: 0)
        _ = broker.outbox.take()
        broker.peerGone(Frame("W"), now: 0)
        let sent = Sent(broker.outbox.take())
        #expect(sent.requests.isEmpty, "a second worker would send the parts again")
        #expect(sent.toClients.count == 1 && sent.toClients[0].isFinal)
        let error = try JSONValue(parsing: Array(sent.toClients[0].body[0].utf8))["error"]
        #expect(error?["code"]?.intValue == Int64(JSONRPCError.streamEndedCode))
        #expect(error?["data"]?["parts"]?.intValue == 2)
        #expect(error?["data"]?["reason"]?.stringValue == "worker_died")
        #expect(try JSONValue(parsing: Array(sent.toClients[0].body[0].utf8))["id"]?.intValue == 1, "answered under the request's id")
    }

    @Test("a worker that dies before its first part: the request goes to another worker, as a 7/MDP request would")
    func workerDiesBeforeAnyPart() {
        var broker = broker()
        _ = dispatched(&broker, client: "C", clientVersion: .v02)
        broker.handle(fromWorker("spare", .ready(service: "svc")), now: 0)
        broker.peerGone(Frame("W"), now: 0)
        #expect(Sent(broker.outbox.take()).requests.map(\.worker) == ["spare"])
    }

    @Test("a client that does not read: its stream ends, later parts are not sent, and the FINAL is -32014 overrun with the parts sent")
    func overrun() throws {
        var broker = broker()
        let client = dispatched(&broker, client: "C", clientVersion: .v02)
        broker.handle(fromWorker("W", .partial(client: client, body: ["one"])), now: 0)
        _ = broker.outbox.take()
        broker.peerFull(Frame("C"), now: 0)  // the ROUTER could not take a part for C
        broker.handle(fromWorker("W", .partial(client: client, body: ["two"])), now: 0)
        #expect(Sent(broker.outbox.take()).toClients.isEmpty)
        broker.handle(fromWorker("W", .reply(client: client, body: ["end"])), now: 0)
        let final = Sent(broker.outbox.take()).toClients
        #expect(final.count == 1 && final[0].isFinal)
        let error = try JSONValue(parsing: Array(final[0].body[0].utf8))["error"]
        #expect(error?["data"]?["reason"]?.stringValue == "overrun")
        #expect(error?["data"]?["parts"]?.intValue == 2)
        #expect(broker.brokenStreams == 1)
    }

    @Test("a client that is gone: nothing more is sent to it, and the worker is free at its FINAL")
    func clientGone() {
        var broker = broker()
        let client = dispatched(&broker, client: "C", clientVersion: .v02)
        broker.handle(fromWorker("W", .partial(client: client, body: ["one"])), now: 0)
        _ = broker.outbox.take()
        broker.peerGone(Frame("C"), now: 0)
        broker.handle(fromWorker("W", .partial(client: client, body: ["two"])), now: 0)
        broker.handle(fromWorker("W", .reply(client: client, body: ["end"])), now: 0)
        #expect(Sent(broker.outbox.take()).toClients.isEmpty)
        #expect(broker.workers[Frame("W")]?.inFlight.count == 0)
    }

    @Test("a stream that breaks (client gone, overrun, too large to gather) tells its extension worker to stop it, naming its client frame, once; a plain 18/MDP worker is not told",
          arguments: ["gone", "overrun", "tooLarge"])
    func stopsItsWorker(breaking: String) throws {
        for window in [4, nil] as [Int?] {
            var broker = broker { $0.maxMessageSize = 1_000 }
            let client = dispatched(&broker, client: "C", clientVersion: breaking == "tooLarge" ? .v01 : .v02, window: window)
            broker.handle(fromWorker("W", .partial(client: client, body: ["one"])), now: 0)
            _ = broker.outbox.take()
            switch breaking {
            case "gone": broker.peerGone(Frame("C"), now: 0)
            case "overrun": broker.peerFull(Frame("C"), now: 0)
            default: broker.handle(fromWorker("W", .partial(client: client, body: [Frame(String(repeating: "x", count: 2_000))])), now: 0)
            }
            broker.handle(fromWorker("W", .partial(client: client, body: ["two"])), now: 0)
            let sent = Sent(broker.outbox.take())
            if window == nil {
                #expect(sent.stops.isEmpty, "a plain worker cannot be told")
            } else {
                #expect(sent.stops.count == 1 && sent.stops.first?.worker == "W" && sent.stops.first?.client == client, "\(breaking)")
            }
            // Its FINAL frees the place, and the client hears why (or nothing, when gone).
            broker.handle(fromWorker("W", .reply(client: client, body: ["stopped"])), now: 0)
            #expect(broker.workers[Frame("W")]?.inFlight.count == 0)
            #expect(Sent(broker.outbox.take()).toClients.count == (breaking == "gone" ? 0 : 1))
        }
    }

    @Test("two streams to one client through a window worker stay apart, each in order")
    func twoStreams() throws {
        var broker = broker { $0.clientSharePercent = 100 }
        broker.handle(fromWorker("W", .ready(service: "svc", window: 2)), now: 0)
        broker.handle(fromClient("C", "svc", request(1)), now: 0)
        broker.handle(fromClient("C", "svc", request(2)), now: 0)
        let clients = Sent(broker.outbox.take()).requests.map(\.client)
        try #require(clients.count == 2)
        #expect(clients[0] != clients[1])
        broker.handle(fromWorker("W", .partial(client: clients[1], body: ["2a"])), now: 0)
        broker.handle(fromWorker("W", .partial(client: clients[0], body: ["1a"])), now: 0)
        broker.handle(fromWorker("W", .reply(client: clients[0], body: ["1z"])), now: 0)
        broker.handle(fromWorker("W", .reply(client: clients[1], body: ["2z"])), now: 0)
        #expect(Sent(broker.outbox.take()).toClients.map(\.body) == [["2a"], ["1a"], ["1z"], ["2z"]])
    }

    @Test("a PARTIAL with nothing in flight, or a worker changing version, is a protocol error: DISCONNECT in its own version")
    func protocolErrors() {
        var broker = broker()
        broker.handle(fromWorker("W", .ready(service: "svc")), now: 0)
        broker.handle(fromWorker("W", .partial(client: "nobody", body: ["x"])), now: 0)
        var sent = Sent(broker.outbox.take())
        #expect(sent.disconnects.map(\.worker) == ["W"] && sent.disconnects.map(\.version) == [.v02])
        #expect(broker.workers.isEmpty)
        broker.handle(fromWorker("V", .ready(service: "svc"), .v01), now: 0)
        broker.handle(fromWorker("V", .heartbeat(), .v02), now: 0)
        sent = Sent(broker.outbox.take())
        #expect(sent.disconnects.map(\.worker) == ["V"])
        #expect(broker.workers.isEmpty)
        #expect(broker.protocolErrors == 2)
    }

    @Test("the kernel's own answers speak the client's version: 8/MMI, errors, a bad service name")
    func kernelAnswersInVersion() {
        var broker = broker()
        broker.handle(fromWorker("W", .ready(service: "svc")), now: 0)
        broker.handle(Message([Frame("C")] + MDP.request(service: MMI.serviceQuery, body: ["svc"], version: .v02).frames), now: 0)
        #expect(Sent(broker.outbox.take()).toClients == [ToClient(client: "C", version: .v02, isFinal: true, body: ["200"])])
        broker.handle(fromClient("C", "bad name", request(1)), now: 0)
        let refused = Sent(broker.outbox.take()).toClients
        #expect(refused.count == 1 && refused[0].version == .v02 && refused[0].isFinal && refused[0].body[0].contains("-32600"))
        // A 0.2 client's message that is no REQUEST is dropped, not answered as a bad name.
        broker.handle(Message([Frame("C"), "MDPC02", Frame([0x02]), "svc", "body"]), now: 0)
        #expect(broker.outbox.take().isEmpty)
        broker.handle(fromClient("C", KernelAPI.service, request(2)), now: 0)
        let events = broker.takeEvents()
        #expect(events.contains { if case .kernelRequest(let caller, _, _) = $0 { caller.version == .v02 } else { false } })
    }
}

@Suite("A request to every worker of a service (all:SERVICE): a copy each, answers tagged, an explicit end")
struct GatherTests {
    private func broker() -> Broker {
        var configuration = KernelConfiguration()
        configuration.queueTimeout = .seconds(1)
        return Broker(configuration: configuration, logger: quiet)
    }

    /// The body of a part the kernel writes for request 7.
    private func kernelPart(_ part: String) -> String { #"{"id":7,"jsonrpc":"2.0","part":\#(part)}"# }

    @Test("one copy to each worker registered (a busy plain worker gets its copy once free), first who was asked, each answer tagged with its worker, a death reported, then the FINAL with the counts")
    func everyWorker() {
        var broker = broker()
        broker.handle(fromWorker("A", .ready(service: "svc"), .v01), now: 0)
        // A holds another client's request: its one place is taken.
        broker.handle(fromClient("X", "svc", request(1), .v01), now: 0)
        let busy = Sent(broker.outbox.take()).requests[0].client
        broker.handle(fromWorker("B", .ready(service: "svc", window: 4)), now: 0)
        broker.handle(fromWorker("C", .ready(service: "svc")), now: 0)
        _ = broker.outbox.take()

        broker.handle(fromClient("G", "all:svc", request(7)), now: 0)
        var sent = Sent(broker.outbox.take())
        #expect(sent.toClients == [ToClient(client: "G", version: .v02, isFinal: false, body: [kernelPart(#"{"expected":3,"workers":["A","B","C"]}"#)])])
        #expect(sent.requests.map(\.worker) == ["B", "C"])
        #expect(broker.gathers.count == 1 && broker.streamsInProgress == 1)
        let copyB = sent.requests[0].client

        broker.handle(fromWorker("B", .reply(client: copyB, body: ["from B"])), now: 0)
        #expect(Sent(broker.outbox.take()).toClients == [ToClient(client: "G", version: .v02, isFinal: false, body: [#"{"worker":"B"}"#, "from B"])])
        // A answers the other client; its place goes to the copy that waited for it.
        broker.handle(fromWorker("A", .reply(client: busy, body: ["for X"]), .v01), now: 0)
        sent = Sent(broker.outbox.take())
        #expect(sent.toClients == [ToClient(client: "X", version: .v01, isFinal: true, body: ["for X"])])
        #expect(sent.requests.map(\.worker) == ["A"])
        let copyA = sent.requests[0].client
        // C dies with its copy: reported, not sent to another worker.
        broker.peerGone(Frame("C"), now: 0)
        #expect(Sent(broker.outbox.take()).requests.isEmpty)
        broker.handle(fromWorker("A", .reply(client: copyA, body: ["from A"]), .v01), now: 0)
        #expect(Sent(broker.outbox.take()).toClients == [
            ToClient(client: "G", version: .v02, isFinal: false, body: [#"{"worker":"A"}"#, "from A"]),
            ToClient(client: "G", version: .v02, isFinal: true,
                     body: [#"{"id":7,"jsonrpc":"2.0","result":{"answered":2,"expected":3,"missing":[{"reason":"died","worker":"C"}]}}"#]),
        ])
        #expect(broker.gathers.isEmpty && broker.streamsInProgress == 0 && broker.workers[Frame("A")]?.inFlight.count == 0)
        #expect(broker.queuedBytes == 0)
    }

    @Test("at the deadline the workers not heard from are timed_out; a late answer is dropped and frees its worker's place")
    func deadline() {
        var broker = broker()
        broker.handle(fromWorker("A", .ready(service: "svc")), now: 0)
        broker.handle(fromWorker("B", .ready(service: "svc")), now: 0)
        broker.handle(fromClient("G", "all:svc", request(7)), now: 0)
        let copies = Sent(broker.outbox.take()).requests
        broker.handle(fromWorker("A", .reply(client: copies[0].client, body: ["from A"])), now: 500_000_000)
        _ = broker.outbox.take()
        broker.expireQueued(now: 999_999_999)
        #expect(Sent(broker.outbox.take()).toClients.isEmpty)
        broker.expireQueued(now: 1_000_000_000)
        #expect(Sent(broker.outbox.take()).toClients == [ToClient(client: "G", version: .v02, isFinal: true,
            body: [#"{"id":7,"jsonrpc":"2.0","result":{"answered":1,"expected":2,"missing":[{"reason":"timed_out","worker":"B"}]}}"#])])
        broker.handle(fromWorker("B", .reply(client: copies[1].client, body: ["late"])), now: 2_000_000_000)
        #expect(Sent(broker.outbox.take()).toClients.isEmpty)
        #expect(broker.workers[Frame("B")]?.hasRoom == true)
    }

    @Test("bounded: one client's requests to every worker in progress hold at most its share of a worker's places, and the bodies held count in the queued bytes")
    func bounded() {
        var configuration = KernelConfiguration()
        configuration.maxQueuedBytes = 200
        var broker = Broker(configuration: configuration, logger: quiet)
        broker.handle(fromWorker("A", .ready(service: "svc")), now: 0)
        broker.handle(fromClient("G", "all:svc", request(7)), now: 0)
        let first = Sent(broker.outbox.take()).requests[0].client
        #expect(broker.queuedBytes == request(7).utf8.count)
        // A plain worker: one place, so one in progress for G; another client may still ask.
        broker.handle(fromClient("G", "all:svc", request(8)), now: 0)
        let refused = Sent(broker.outbox.take()).toClients
        #expect(refused.count == 1 && refused[0].isFinal && refused[0].body[0].contains("-32001"), "\(refused)")
        broker.handle(fromClient("H", "all:svc", request(9)), now: 0)
        #expect(Sent(broker.outbox.take()).toClients.map(\.isFinal) == [false])
        // H's copy waits for A's place: its body counts twice (held, and waiting).
        #expect(broker.queuedBytes == request(7).utf8.count + 2 * request(9).utf8.count)
        // Over the bytes: refused at once.
        broker.handle(fromClient("K", "all:svc", String(repeating: "x", count: 150)), now: 0)
        #expect(Sent(broker.outbox.take()).toClients.first?.body.first?.contains("-32001") == true)
        broker.handle(fromWorker("A", .reply(client: first, body: ["from A"])), now: 0)
        let next = Sent(broker.outbox.take()).requests
        broker.handle(fromWorker("A", .reply(client: next[0].client, body: ["from A"])), now: 0)
        #expect(broker.gathers.isEmpty && broker.queuedBytes == 0)
    }

    @Test("a worker that begins to drain before its copy reached it is reported drained, and gets no copy")
    func drained() {
        var broker = broker()
        broker.handle(fromWorker("B", .ready(service: "svc")), now: 0)
        // B's one place is taken by another client's request.
        broker.handle(fromClient("X", "svc", request(1), .v01), now: 0)
        broker.handle(fromWorker("A", .ready(service: "svc", window: 2)), now: 0)
        _ = broker.outbox.take()
        broker.handle(fromClient("G", "all:svc", request(7)), now: 0)
        let copies = Sent(broker.outbox.take()).requests
        #expect(copies.map(\.worker) == ["A"])
        _ = broker.drain(service: "svc", worker: "B", now: 0)
        broker.handle(fromWorker("A", .reply(client: copies[0].client, body: ["from A"])), now: 0)
        let sent = Sent(broker.outbox.take())
        #expect(sent.requests.isEmpty)
        #expect(sent.toClients.last == ToClient(client: "G", version: .v02, isFinal: true,
            body: [#"{"id":7,"jsonrpc":"2.0","result":{"answered":1,"expected":2,"missing":[{"reason":"drained","worker":"B"}]}}"#]))
        #expect(broker.queuedBytes == 0)
    }

    @Test("a 7/MDP client gets every answer in one REPLY; a service nobody serves is -32001; no worker may register under all:")
    func plainClientsAndRefusals() {
        var broker = broker()
        broker.handle(fromWorker("A", .ready(service: "svc")), now: 0)
        broker.handle(fromClient("G", "all:svc", request(7), .v01), now: 0)
        let copy = Sent(broker.outbox.take()).requests[0].client
        broker.handle(fromWorker("A", .reply(client: copy, body: ["from A"])), now: 0)
        #expect(Sent(broker.outbox.take()).toClients == [ToClient(client: "G", version: .v01, isFinal: true, body: [
            kernelPart(#"{"expected":1,"workers":["A"]}"#), #"{"worker":"A"}"#, "from A",
            #"{"id":7,"jsonrpc":"2.0","result":{"answered":1,"expected":1,"missing":[]}}"#])])

        for name in ["all:nobody", "all:kernel", "all:mmi.service"] {
            broker.handle(fromClient("G", name, request(8)), now: 0)
            let answer = Sent(broker.outbox.take()).toClients
            #expect(answer.count == 1 && answer[0].isFinal && answer[0].body[0].contains("-32001"), "\(name): \(answer)")
        }
        broker.handle(fromWorker("Z", .ready(service: "all:svc")), now: 0)
        #expect(Sent(broker.outbox.take()).disconnects.map(\.worker) == ["Z"])
    }
}

@Suite("Requests across cells at the broker: another cell's kernel is asked only when no worker here offers the service, and a request another cell sent never crosses again")
struct CellRoutingTests {
    private func broker() -> Broker { Broker(configuration: KernelConfiguration(), logger: quiet) }

    @Test("with no worker here a request goes to the cell that offers the service; once one registers here, here it goes")
    func localFirst() throws {
        var broker = broker()
        broker.handle(fromWorker("cell-b/svc/1", .ready(service: "svc", window: 64, callers: true, cell: "b")), now: 0)
        let service = try #require(broker.services["svc"])
        #expect(service.workers == 0 && service.offers.count == 1)
        // A client's share is of the places it is asked through: the offer's while it alone serves.
        #expect(broker.clientShare(of: service) == 57)
        let events = broker.takeEvents()
        #expect(events.count == 1 && events.allSatisfy { if case .offersChanged("svc") = $0 { true } else { false } },
                "another cell's offer is not a worker of this cell: \(events)")
        #expect(service.cells == ["b"])
        broker.handle(fromClient("C", "svc", request(1)), now: 0)
        #expect(Sent(broker.outbox.take()).requests.map(\.worker) == ["cell-b/svc/1"])
        broker.handle(fromWorker("W", .ready(service: "svc", window: 4)), now: 0)
        _ = broker.outbox.take()
        #expect(broker.clientShare(of: service) == 3)
        for id in 2...4 { broker.handle(fromClient("D", "svc", request(id)), now: 0) }
        #expect(Sent(broker.outbox.take()).requests.map(\.worker) == ["W", "W", "W"])
        // Busy here: they wait for this cell's worker rather than cross.
        for id in 5...6 { broker.handle(fromClient("E", "svc", request(id)), now: 0) }
        #expect(Sent(broker.outbox.take()).requests.map(\.worker) == ["W"])
        // A request to every worker goes to this cell's workers (W, once it has a free
        // place) and to the other cell, whose workers it names later.
        broker.handle(fromClient("G", "all:svc", request(7)), now: 0)
        let scattered = Sent(broker.outbox.take())
        #expect(scattered.toClients.first?.body.first?.contains(#""workers":["W"]"#) == true)
        #expect(scattered.toClients.first?.body.first?.contains(#""cells":["b"]"#) == true)
        #expect(scattered.requests.map(\.worker) == ["cell-b/svc/1"])
    }

    @Test("among other cells, each request goes to the one that would hold the fewest for each worker its directory record counts; the one asked longest ago among equals")
    func spreadByWorkers() throws {
        var broker = broker()
        broker.handle(fromWorker("cell-b/svc/1", .ready(service: "svc", window: 64, callers: true, cell: "b")), now: 0)
        broker.handle(fromWorker("cell-c/svc/1", .ready(service: "svc", window: 64, callers: true, cell: "c")), now: 0)
        broker.cellWorkers = ["b": ["svc": 1], "c": ["svc": 3]]
        for id in 1...8 { broker.handle(fromClient("C\(id)", "svc", request(id)), now: 0) }
        // In flight plus one, over the workers: c 1/3 < b 1/1, c 2/3 < 1, equal (b, asked
        // longest ago), c 3/3 < b 2/1, c 4/3 < 2, c 5/3 < 2, equal (b), c 7/3 < b 3: six to
        // c for two to b, as their workers.
        #expect(Sent(broker.outbox.take()).requests.map(\.worker) == ["cell-c/svc/1", "cell-c/svc/1", "cell-b/svc/1", "cell-c/svc/1", "cell-c/svc/1",
                                                                    "cell-c/svc/1", "cell-b/svc/1", "cell-c/svc/1"])
        // Without a count in the directory, a cell counts as one worker: alike, in turn.
        var fresh = self.broker()
        fresh.handle(fromWorker("cell-b/svc/1", .ready(service: "svc", window: 64, callers: true, cell: "b")), now: 0)
        fresh.handle(fromWorker("cell-c/svc/1", .ready(service: "svc", window: 64, callers: true, cell: "c")), now: 0)
        for id in 1...4 { fresh.handle(fromClient("C\(id)", "svc", request(id)), now: 0) }
        #expect(Sent(fresh.outbox.take()).requests.map(\.worker) == ["cell-b/svc/1", "cell-c/svc/1", "cell-b/svc/1", "cell-c/svc/1"])
        // A record in etcd that says any number: weighed as a great many, never overflowing.
        var told = self.broker()
        told.handle(fromWorker("cell-b/svc/1", .ready(service: "svc", window: 64, callers: true, cell: "b")), now: 0)
        told.handle(fromWorker("cell-c/svc/1", .ready(service: "svc", window: 64, callers: true, cell: "c")), now: 0)
        told.cellWorkers = ["b": ["svc": Int.max], "c": ["svc": Int.max]]
        for id in 1...4 { told.handle(fromClient("C\(id)", "svc", request(id)), now: 0) }
        #expect(Sent(told.outbox.take()).requests.map(\.worker) == ["cell-b/svc/1", "cell-c/svc/1", "cell-b/svc/1", "cell-c/svc/1"])
    }

    @Test("another cell's offer is heard at the links' quicker interval: silent for the cells' expiry it is dropped, while a worker of this cell as silent stays")
    func silentCellDroppedSooner() throws {
        var broker = broker()
        let configuration = KernelConfiguration()
        let cellExpiry = UInt64(configuration.cellExpiry.nanoseconds), workerExpiry = UInt64(configuration.workerExpiry.nanoseconds)
        #expect(cellExpiry < workerExpiry && cellExpiry < UInt64(configuration.queueTimeout.nanoseconds))
        broker.handle(fromWorker("cell-b/svc/1", .ready(service: "svc", window: 64, callers: true, cell: "b")), now: 0)
        broker.handle(fromWorker("W", .ready(service: "other", window: 1)), now: 0)
        _ = broker.outbox.take()
        // Each tick heartbeats its own: the workers' tick leaves the offer alone.
        broker.tick(now: 1)
        #expect(Sent(broker.outbox.take()).heartbeats == ["W"])
        broker.cellTick(now: 1)
        #expect(Sent(broker.outbox.take()).heartbeats == ["cell-b/svc/1"])
        broker.cellTick(now: cellExpiry + 1)
        #expect(broker.services["svc"]?.offers.isEmpty == true)
        broker.tick(now: cellExpiry + 1)
        #expect(broker.services["other"]?.workers == 1)
    }

    @Test("a request a silent cell held waits for another worker only for what is left of its queue timeout; one a silent worker of this cell held, a whole one again")
    func silentCellKeepsDeadline() throws {
        var broker = broker()
        let configuration = KernelConfiguration()
        let cellExpiry = UInt64(configuration.cellExpiry.nanoseconds), queue = UInt64(configuration.queueTimeout.nanoseconds)
        broker.handle(fromWorker("cell-b/svc/1", .ready(service: "svc", window: 64, callers: true, cell: "b")), now: 0)
        broker.handle(fromClient("C", "svc", request(1)), now: 0)
        #expect(Sent(broker.outbox.take()).requests.map(\.worker) == ["cell-b/svc/1"])
        broker.cellTick(now: cellExpiry + 1)
        _ = broker.outbox.take()
        broker.expireQueued(now: queue - 1)
        #expect(Sent(broker.outbox.take()).toClients.isEmpty, "it waits out the rest of its timeout")
        broker.expireQueued(now: queue)
        let told = Sent(broker.outbox.take()).toClients
        #expect(told.count == 1 && told[0].body.first?.contains("-32001") == true, "\(told)")

        // The same by a worker of this cell: a whole queue timeout from when it was found silent.
        var local = self.broker()
        let workerExpiry = UInt64(configuration.workerExpiry.nanoseconds)
        local.handle(fromWorker("W", .ready(service: "svc", window: 1)), now: 0)
        local.handle(fromClient("C", "svc", request(1)), now: 0)
        _ = local.outbox.take()
        local.tick(now: workerExpiry + 1)
        _ = local.outbox.take()
        local.expireQueued(now: workerExpiry + queue)
        #expect(Sent(local.outbox.take()).toClients.isEmpty)
        local.expireQueued(now: workerExpiry + 1 + queue)
        #expect(Sent(local.outbox.take()).toClients.count == 1)
    }

    @Test("a request another cell sent is served by this cell's workers, and answered -32001 at once where only a cell offers it")
    func oneCrossingAtMost() throws {
        var broker = broker()
        broker.handle(fromWorker("cell-c/svc/1", .ready(service: "svc", window: 4, callers: true, cell: "c")), now: 0)
        broker.handleForwarded(Broker.Caller(client: Frame("from-a"), version: .v02), service: "svc", body: [Frame(request(1))], peer: nil, now: 0)
        let refused = Sent(broker.outbox.take())
        #expect(refused.requests.isEmpty)
        #expect(refused.toClients.first?.body.first?.contains("-32001") == true)
        broker.handle(fromWorker("W", .ready(service: "svc", window: 1)), now: 0)
        broker.handleForwarded(Broker.Caller(client: Frame("from-a"), version: .v02), service: "svc", body: [Frame(request(2))], peer: nil, now: 0)
        #expect(Sent(broker.outbox.take()).requests.map(\.worker) == ["W"])
        // Its worker gone while it waits: not handed to the other cell either.
        broker.handleForwarded(Broker.Caller(client: Frame("from-a"), version: .v02), service: "svc", body: [Frame(request(3))], peer: nil, now: 0)
        broker.handle(fromWorker("W", .disconnect), now: 0)
        let after = Sent(broker.outbox.take())
        #expect(after.requests.isEmpty)
        #expect(after.toClients.count == 2 && after.toClients.allSatisfy { $0.body.first?.contains("-32001") == true })
    }

    @Test("another cell's kernel says nobody reads a request it sent: held with no part yet, its worker is told stop and its answer dropped; still queued, it leaves the queue")
    func linkedClientGone() {
        var broker = broker()
        broker.handle(fromWorker("W", .ready(service: "svc", window: 1)), now: 0)
        for id in 1...2 {
            broker.handleForwarded(Broker.Caller(client: Frame("from-a-\(id)"), version: .v02), service: "svc", body: [Frame(request(id))], peer: nil, now: 0)
        }
        let held = Sent(broker.outbox.take()).requests
        #expect(held.map(\.worker) == ["W"] && broker.services["svc"]?.requests.count == 1)
        broker.linkedClientGone(Frame("from-a-1"), service: "svc")
        let stops = Sent(broker.outbox.take()).stops
        #expect(stops.count == 1 && stops.first?.client == held.first?.client, "\(stops)")
        broker.linkedClientGone(Frame("from-a-2"), service: "svc")
        #expect(broker.services["svc"]?.requests.count == 0)
        broker.handle(fromWorker("W", .reply(client: held[0].client, body: ["end"])), now: 0)
        let after = Sent(broker.outbox.take())
        #expect(after.toClients.isEmpty && after.requests.isEmpty, "neither reaches anyone")
    }

    @Test("the directory: a key under the prefix is a cell's only with a cell's name; a kernel follows at most mostCells cells, the first by name")
    func directoryBounds() {
        let prefix = Array("/switchboard/cells/".utf8)
        #expect(CellDirectory.cell(at: Array("/switchboard/cells/b-1".utf8), under: prefix) == "b-1")
        for key in ["/switchboard/cells/b/x", "/switchboard/cells/", "/switchboard/cells/a b", "/switchboard/other/b"] {
            #expect(CellDirectory.cell(at: Array(key.utf8), under: prefix) == nil, "\(key)")
        }
        let few = Dictionary(uniqueKeysWithValues: (0..<3).map { ("c\($0)", $0) })
        #expect(CellDirectory.followed(few).records == few && CellDirectory.followed(few).leftOut == 0)
        let many = Dictionary(uniqueKeysWithValues: (0..<(CellDirectory.mostCells + 2)).map { (String(format: "c%04d", $0), $0) })
        let (followed, leftOut) = CellDirectory.followed(many)
        #expect(followed.count == CellDirectory.mostCells && leftOut == 2)
        #expect(followed.keys.sorted() == many.keys.sorted().prefix(CellDirectory.mostCells).map { $0 })
    }

    @Test("READY's cell=NAME: encoded after callers=1, read back, and refused when malformed")
    func readyWithCell() throws {
        let ready = MDP.encode(.ready(service: "svc", window: 8, callers: true, cell: "b-1"), version: .v02)
        #expect(ready.frames.suffix(2).map { $0.string } == ["callers=1", "cell=b-1"])
        let decoded = try MDP.decodeAtBroker(Message([Frame("id")] + ready.frames))
        #expect(decoded == .worker(Frame("id"), .ready(service: "svc", window: 8, callers: true, cell: "b-1"), version: .v02))
        for extras in [["cell=b", "callers=1"], ["cell=", "x"], ["cell=a b"], ["cell=a", "cell=b"]] {
            let frames = [Frame("id"), Frame("MDPW02"), Frame([0x01]), Frame("svc"), Frame("window=2")] + extras.map { Frame($0) }
            #expect(throws: ProtocolError.self, "\(extras)") { try MDP.decodeAtBroker(Message(frames)) }
        }
    }
}
