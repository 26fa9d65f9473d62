import Testing
import ZeroMQ
@testable import BusProtocol

@Suite("7/MDP and 8/MMI codecs")
struct MDPTests {
    let client = Frame("client-1")
    let worker = Frame([0x00, 0x6B, 0x8B, 0x45, 0x67])

    @Test("a client REQUEST is encoded as the RFC says and decoded at the broker")
    func clientRequest() throws {
        let message = MDP.request(service: "echo", body: ["hello", "world"])
        #expect(message == ["", "MDPC01", "echo", "hello", "world"])
        let routed = Message([client] + message.frames)
        #expect(try MDP.decodeAtBroker(routed) == .request(client: client, service: "echo", body: ["hello", "world"]))
        #expect(try MDP.decodeAtBroker(PartsReader().read(routed)) == .request(client: client, service: "echo", body: ["hello", "world"]))
    }

    @Test("a client CANCEL (the client extension): the REQUEST's frames with command 0x04, decoded at the broker; a 7/MDP REQUEST has none; one with no body is malformed")
    func clientCancel() throws {
        let request = MDP.request(service: "echo", body: ["hello"], version: .v02)
        let cancel = try #require(MDP.cancel(of: request))
        #expect(cancel == ["MDPC02", Frame([0x04]), "echo", "hello"])
        #expect(try MDP.decodeAtBroker(Message([client] + cancel.frames)) == .cancel(client: client, service: "echo", body: ["hello"]))
        #expect(MDP.cancel(of: MDP.request(service: "echo", body: ["hello"])) == nil)
        #expect(throws: ProtocolError.self) { try MDP.decodeAtBroker([client, "MDPC02", Frame([0x04]), "echo"]) }
        #expect(throws: ProtocolError.self) { try MDP.decodeAtBroker([client, "MDPC02", Frame([0x05]), "echo", "x"]) }
    }

    @Test("a REPLY reaches the client with its service and body")
    func clientReply() throws {
        let message = MDP.reply(to: client, service: "echo", body: ["{}"])
        #expect(message == [client, "", "MDPC01", "echo", "{}"])
        #expect(try MDP.decodeAtClient(Message(Array(message.frames.dropFirst()))) == ClientReply(service: "echo", body: ["{}"]))
    }

    @Test("worker commands round trip", arguments: [
        WorkerToBroker.ready(service: "search"),
        .ready(service: "search", window: 64),
        .ready(service: "search", window: 1),
        .ready(service: "search", window: 16, callers: true),
        .reply(client: Frame("c"), body: ["a", Frame()]),
        .heartbeat(),
        .heartbeat(errors: 0),
        .heartbeat(errors: 12),
        .drain,
        .disconnect,
    ])
    func workerCommands(command: WorkerToBroker) throws {
        let encoded = MDP.encode(command)
        #expect(encoded[0].isEmpty && encoded[1] == "MDPW01")
        #expect(try MDP.decodeAtBroker(Message([worker] + encoded.frames)) == .worker(worker, command))
        #expect(try MDP.decodeAtBroker(PartsReader().read(Message([worker] + encoded.frames))) == .worker(worker, command))
    }

    @Test("broker commands round trip", arguments: [
        BrokerToWorker.request(client: Frame("c"), body: ["{\"id\":1}"]),
        .heartbeat,
        .drain,
        .stop(client: Frame([0x00, 0x6B, 0x8B, 0x45, 0x67, 0x01, 0x00, 0x00, 0x00])),
        .disconnect,
    ])
    func brokerCommands(command: BrokerToWorker) throws {
        let encoded = MDP.encode(command, to: worker)
        #expect(encoded[0] == worker)
        #expect(try MDP.decodeAtWorker(Message(Array(encoded.frames.dropFirst()))) == command)
    }

    @Test("the exact bytes of READY and HEARTBEAT")
    func exactBytes() {
        let ready = MDP.encode(.ready(service: "echo"))
        #expect(ready.frames.map(\.bytes) == [[], Array("MDPW01".utf8), [0x01], Array("echo".utf8)])
        #expect(MDP.encode(.heartbeat()).frames.map(\.bytes) == [[], Array("MDPW01".utf8), [0x04]])
        // The Switchboard extension adds one text frame; its defaults are plain 7/MDP.
        #expect(MDP.encode(.ready(service: "echo", window: 1)).frames.last == "window=1")
        #expect(MDP.encode(.ready(service: "echo", window: 8)).frames.last == "window=8")
        #expect(MDP.encode(.ready(service: "echo", window: 8, callers: true)).frames.suffix(2) == ["window=8", "callers=1"])
        #expect(MDP.encode(.ready(service: "echo", callers: true)).frames.last == "echo", "callers only beside a window")
        #expect(MDP.encode(.heartbeat(errors: 3)).frames.map(\.bytes) == [[], Array("MDPW01".utf8), [0x04], Array("errors=3".utf8)])
        #expect(MDP.encode(.drain).frames.map(\.bytes) == [[], Array("MDPW01".utf8), [0x04], Array("drain=1".utf8)])
        #expect(MDP.encode(.drain, to: Frame("w")).frames.map(\.bytes) == [Array("w".utf8), [], Array("MDPW01".utf8), [0x04], Array("drain=1".utf8)])
        #expect(MDP.encode(.stop(client: "c"), to: Frame("w")).frames.map(\.bytes) == [Array("w".utf8), [], Array("MDPW01".utf8), [0x04], Array("stop=1".utf8), [0x63]])
    }

    @Test("malformed messages give typed errors, never a crash", arguments: [
        (["id"] as Message, "at least 3"),
        (["id", "x", "MDPC01", "echo", "body"], "frame 1 must be empty"),
        (["id", "", "MDPX01", "echo", "body"], "unknown protocol header"),
        (["id", "", "MDPC01", "echo"], "client REQUEST has 3 frames"),
        (["id", "", "MDPC01", "", "body"], "service name"),
        (["id", "", "MDPW01"], "no command frame"),
        (["id", "", "MDPW01", Frame([0x09])], "unknown worker command"),
        (["id", "", "MDPW01", Frame([0x01, 0x01]), "echo"], "unknown worker command"),
        (["id", "", "MDPW01", Frame([0x01])], "READY has 3 frames"),
        (["id", "", "MDPW01", Frame([0x01]), "a", "b"], "expected window=N"),
        (["id", "", "MDPW01", Frame([0x01]), "a", "window=0"], "expected window=N"),
        (["id", "", "MDPW01", Frame([0x01]), "a", "window=99999"], "expected window=N"),
        (["id", "", "MDPW01", Frame([0x01]), "a", "window=2", "c"], "frames after the window must be callers=1, then cell=NAME"),
        (["id", "", "MDPW01", Frame([0x01]), "a", "window=2", "callers=1", "c"], "then cell=NAME"),
        (["id", "", "MDPW01", Frame([0x01]), "a", "window=2", "callers=1", "cell=x", "c"], "READY has 8 frames"),
        (["id", "", "MDPW01", Frame([0x02]), "c", "", "x"], "may not send REQUEST"),
        (["id", "", "MDPW01", Frame([0x03]), "c", "x", "body"], "frame 4 must be empty"),
        (["id", "", "MDPW01", Frame([0x03]), "c", ""], "REPLY has 5 frames"),
        (["id", "", "MDPW01", Frame([0x04]), "extra"], "expected errors=N"),
        (["id", "", "MDPW01", Frame([0x04]), "errors=-1"], "expected errors=N"),
        (["id", "", "MDPW01", Frame([0x04]), "errors=1", "x"], "HEARTBEAT has 5 frames"),
    ] as [(Message, String)])
    func malformedAtBroker(message: Message, problem: String) throws {
        let error = #expect(throws: ProtocolError.self) { try MDP.decodeAtBroker(message) }
        #expect(error?.proto == "MDP")
        #expect(error?.problem.contains(problem) == true, "\(error?.problem ?? "-") should mention \(problem)")
        // Read where the socket received it, the same error.
        let parts = try PartsReader().read(message)
        let fromParts = #expect(throws: ProtocolError.self) { try MDP.decodeAtBroker(parts) }
        #expect(fromParts?.problem == error?.problem)
    }

    @Test("a worker rejects what a broker may not send")
    func malformedAtWorker() {
        #expect(throws: ProtocolError.self) { try MDP.decodeAtWorker(["", "MDPW01", Frame([0x01]), "echo"]) }
        #expect(throws: ProtocolError.self) { try MDP.decodeAtWorker(["", "MDPC01", Frame([0x04])]) }
        #expect(throws: ProtocolError.self) { try MDP.decodeAtWorker(["", "MDPW01", Frame([0x02]), "c", "x", "body"]) }
        #expect(throws: ProtocolError.self) { try MDP.decodeAtClient(["", "MDPW01", "echo", "x"]) }
    }

    @Test("service names are printable ASCII, 1 to 255 characters")
    func serviceNames() {
        #expect(MDP.isValidServiceName("search"))
        #expect(MDP.isValidServiceName("mmi.service"))
        #expect(!MDP.isValidServiceName(""))
        #expect(!MDP.isValidServiceName("has space"))
        #expect(!MDP.isValidServiceName("ünïcode"))
        #expect(!MDP.isValidServiceName(String(repeating: "a", count: 256)))
    }

    @Test("MMI answers 200, 404 and 501")
    func mmi() {
        let registered: (String) -> Bool = { $0 == "echo" }
        #expect(MMI.isManagement("mmi.service"))
        #expect(!MMI.isManagement("mmiservice"))
        #expect(MMI.answer(service: "mmi.service", body: ["echo"], isRegistered: registered) == "200")
        #expect(MMI.answer(service: "mmi.service", body: ["nope"], isRegistered: registered) == "404")
        #expect(MMI.answer(service: "mmi.service", body: [], isRegistered: registered) == "404")
        #expect(MMI.answer(service: "mmi.other", body: ["echo"], isRegistered: registered) == "501")
    }

    @Test("10,000 random messages decode to a value or an error, at the broker and the collector the same from parts as from frames")
    func randomInput() throws {
        let reader = try PartsReader()
        var generator = SystemRandomNumberGenerator()
        let pieces: [Frame] = ["", "MDPC01", "MDPW01", "MDPC02", "MDPW02", Frame([1]), Frame([2]), Frame([3]), Frame([4]), Frame([5]), Frame([6]),
                               "echo", "ICANHAZ?", "KTHXBAI", "HUGZ"]
        for _ in 0..<10_000 {
            let count = Int.random(in: 0...8, using: &generator)
            let frames = (0..<count).map { _ -> Frame in
                if Bool.random(using: &generator) { return pieces.randomElement(using: &generator)! }
                return Frame((0..<Int.random(in: 0...12, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) })
            }
            let message = Message(frames)
            let decoded = Result { () throws(ProtocolError) in try MDP.decodeAtBroker(message) }
            if !message.isEmpty {
                let parts = try reader.read(message)
                let fromParts = Result { () throws(ProtocolError) in try MDP.decodeAtBroker(parts) }
                #expect(fromParts == decoded, "\(message)")
                let checked = Result { () throws(ProtocolError) in try CHP.checkKVSet(message) }
                #expect(Result { () throws(ProtocolError) in try CHP.checkKVSet(parts) } == checked, "\(message)")
            }
            _ = try? MDP.decodeAtWorker(message)
            _ = try? MDP.decodeAtClient(message)
            _ = try? CHP.decodeUpdate(message)
            _ = try? CHP.decodeKVSet(message)
            _ = try? CHP.decodeSnapshotReply(message)
            _ = try? CHP.decodeSnapshotRequest(message)
        }
    }
}

/// Messages sent over a socket pair and read into parts, as the broker reads its ROUTER. A
/// part's bytes are valid until the next message is read.
final class PartsReader {
    let context: ZMQContext
    let sender: ZMQSocket, receiver: ZMQSocket
    let parts = ZMQReceivedParts()

    init() throws {
        context = try ZMQContext()
        (sender, receiver) = (try ZMQSocket(context, .pair), try ZMQSocket(context, .pair))
        try receiver.bind("inproc://mdp-parts")
        try sender.connect("inproc://mdp-parts")
    }

    func read(_ message: Message) throws -> ZMQReceivedParts {
        try sender.send(message)
        try #require(try receiver.tryReceive(into: parts))
        return parts
    }
}

@Suite("18/MDP (Majordomo 0.2) codecs: the exact frames of RFC 18, beside 7/MDP")
struct MDP02Tests {
    let client = Frame("client-1")
    let worker = Frame([0x00, 0x6B, 0x8B, 0x45, 0x67])

    @Test("a client REQUEST has no empty first frame and a command frame; the broker reads it as 0.2")
    func clientRequest() throws {
        let message = MDP.request(service: "echo", body: ["hello", "world"], version: .v02)
        #expect(message.frames.map(\.bytes) == [Array("MDPC02".utf8), [0x01], Array("echo".utf8), Array("hello".utf8), Array("world".utf8)])
        #expect(try MDP.decodeAtBroker(Message([client] + message.frames)) == .request(client: client, service: "echo", body: ["hello", "world"], version: .v02))
    }

    @Test("PARTIAL (0x02) and FINAL (0x03) reach the client with the service; 7/MDP's REPLY is final too")
    func clientReplies() throws {
        let partial = MDP.reply(to: client, serviceFrame: "echo", body: ["part"], version: .v02, final: false)
        #expect(partial.frames.map(\.bytes) == [Array("client-1".utf8), Array("MDPC02".utf8), [0x02], Array("echo".utf8), Array("part".utf8)])
        let final = MDP.reply(to: client, serviceFrame: "echo", body: ["end"], version: .v02)
        #expect(final[2] == Frame([0x03]))
        #expect(try MDP.decodeAtClient(Message(Array(partial.frames.dropFirst()))) == ClientReply(service: "echo", body: ["part"], isFinal: false))
        #expect(try MDP.decodeAtClient(Message(Array(final.frames.dropFirst()))) == ClientReply(service: "echo", body: ["end"], isFinal: true))
        let plain = MDP.reply(to: client, serviceFrame: "echo", body: ["end"], version: .v01)
        #expect(try MDP.decodeAtClient(Message(Array(plain.frames.dropFirst()))).isFinal)
    }

    @Test("worker commands round trip in 0.2", arguments: [
        WorkerToBroker.ready(service: "search"),
        .ready(service: "search", window: 64),
        .ready(service: "search", window: 64, callers: true),
        .partial(client: Frame("c"), body: ["a", Frame()]),
        .reply(client: Frame("c"), body: ["z"]),
        .heartbeat(),
        .heartbeat(errors: 3),
        .drain,
        .disconnect,
    ])
    func workerCommands(command: WorkerToBroker) throws {
        let encoded = MDP.encode(command, version: .v02)
        #expect(encoded[0] == "MDPW02")
        #expect(try MDP.decodeAtBroker(Message([worker] + encoded.frames)) == .worker(worker, command, version: .v02))
    }

    @Test("broker commands round trip in 0.2", arguments: [
        BrokerToWorker.request(client: Frame("c"), body: ["{\"id\":1}", "second"]),
        .heartbeat,
        .drain,
        .stop(client: Frame("c")),
        .disconnect,
    ])
    func brokerCommands(command: BrokerToWorker) throws {
        let encoded = MDP.encode(command, to: worker, version: .v02)
        #expect(encoded[0] == worker && encoded[1] == "MDPW02")
        #expect(try MDP.decodeAtWorker(Message(Array(encoded.frames.dropFirst()))) == command)
    }

    @Test("a worker command's code read back is that command, in either version; any other byte is none")
    func workerVerbCodes() {
        for version in [MDP.Version.v01, .v02] {
            var known = Set<UInt8>()
            for verb in MDP.WorkerVerb.allCases {
                guard let code = verb.code(in: version) else { continue }
                known.insert(code)
                #expect(MDP.WorkerVerb(code: code, in: version) == verb, "\(verb) in \(version)")
            }
            for code in UInt8.min...UInt8.max where !known.contains(code) {
                #expect(MDP.WorkerVerb(code: code, in: version) == nil, "\(code) in \(version)")
            }
        }
    }

    @Test("the exact bytes of the worker's commands: 0x01 READY, 0x02 REQUEST, 0x03 PARTIAL, 0x04 FINAL, 0x05 HEARTBEAT, 0x06 DISCONNECT")
    func exactBytes() {
        let header = Array("MDPW02".utf8)
        #expect(MDP.encode(.ready(service: "echo"), version: .v02).frames.map(\.bytes) == [header, [0x01], Array("echo".utf8)])
        #expect(MDP.encode(.partial(client: "c", body: ["b"]), version: .v02).frames.map(\.bytes) == [header, [0x03], [0x63], [], [0x62]])
        #expect(MDP.encode(.reply(client: "c", body: ["b"]), version: .v02).frames.map(\.bytes) == [header, [0x04], [0x63], [], [0x62]])
        #expect(MDP.encode(.heartbeat(), version: .v02).frames.map(\.bytes) == [header, [0x05]])
        #expect(MDP.encode(.disconnect, version: .v02).frames.map(\.bytes) == [header, [0x06]])
        #expect(MDP.request(to: "w", client: "c", body: ["b"], version: .v02).frames.map(\.bytes) == [[0x77], header, [0x02], [0x63], [], [0x62]])
        #expect(MDP.encode(.heartbeat, to: "w", version: .v02).frames.map(\.bytes) == [[0x77], header, [0x05]])
    }

    @Test("malformed 0.2 messages give typed errors, never a crash", arguments: [
        (["id", "MDPC02", Frame([0x02]), "echo", "body"], "may only send REQUEST"),
        (["id", "MDPC02", Frame([0x01]), "echo"], "client REQUEST has 3 frames"),
        (["id", "MDPC02", Frame([0x01]), "", "body"], "service name"),
        (["id", "MDPW02", Frame([0x07])], "unknown worker command"),
        (["id", "MDPW02", Frame([0x01])], "READY has 2 frames"),
        (["id", "MDPW02", Frame([0x01]), "a", "window=0"], "expected window=N"),
        (["id", "MDPW02", Frame([0x02]), "c", "", "x"], "may not send REQUEST"),
        (["id", "MDPW02", Frame([0x03]), "c", "x", "body"], "frame 3 must be empty"),
        (["id", "MDPW02", Frame([0x04]), "c", ""], "has 4 frames"),
        (["id", "MDPW02", Frame([0x05]), "errors=x"], "expected errors=N"),
        (["id", "MDPW02", Frame([0x06]), "x"], "DISCONNECT has 3 frames"),
        (["id", "MDPX02", Frame([0x01]), "echo", "body"], "MDPC02 or MDPW02"),
    ] as [(Message, String)])
    func malformedAtBroker(message: Message, problem: String) throws {
        let error = #expect(throws: ProtocolError.self) { try MDP.decodeAtBroker(message) }
        #expect(error?.problem.contains(problem) == true, "\(error?.problem ?? "-") should mention \(problem)")
        let parts = try PartsReader().read(message)
        #expect(throws: try #require(error)) { try MDP.decodeAtBroker(parts) }
    }

    @Test("a 0.2 worker and client reject what a broker may not send them")
    func malformedAtPeers() {
        #expect(throws: ProtocolError.self) { try MDP.decodeAtWorker(["MDPW02", Frame([0x03]), "c", "", "x"]) }
        #expect(throws: ProtocolError.self) { try MDP.decodeAtWorker(["MDPW02", Frame([0x02]), "c", "x", "body"]) }
        #expect(throws: ProtocolError.self) { try MDP.decodeAtWorker(["MDPW02", Frame([0x05]), "x"]) }
        #expect(throws: ProtocolError.self) { try MDP.decodeAtClient(["MDPC02", Frame([0x01]), "echo", "x"]) }
        #expect(throws: ProtocolError.self) { try MDP.decodeAtClient(["MDPC02", Frame([0x02]), "echo"]) }
    }

    @Test("a frame's text: ASCII and valid UTF-8 read as they are, invalid UTF-8 is nil")
    func frameText() {
        #expect(Frame("echo").string == "echo")
        #expect(Frame("Zürich ✈ 東京, and longer than a frame holds inline").string == "Zürich ✈ 東京, and longer than a frame holds inline")
        #expect(Frame([0x61, 0xC3, 0x28]).string == nil)
        #expect(Frame([0xFF]).string == nil && !Frame([0xFF]).isUTF8)
    }
}
