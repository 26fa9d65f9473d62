import Foundation
import Synchronization
import Testing
@testable import ZeroMQ

@Suite("Sockets over real libzmq")
struct SocketTests {
    enum Transport: String, CaseIterable, Sendable { case inproc, ipc, tcp }

    /// Binds `server` on a unique endpoint of the transport and returns where to connect.
    func bindUnique(_ server: ZMQSocket, _ transport: Transport) throws -> String {
        switch transport {
        case .inproc: return try server.bind(inprocEndpoint())
        case .ipc: return try server.bind("ipc://" + (try temporaryDirectory().appendingPathComponent("s.ipc").path))
        case .tcp: return try server.bind("tcp://127.0.0.1:*")
        }
    }

    /// A PUSH connected to a PULL bound on a unique endpoint of `transport`, both bounded.
    func pushPull(_ context: ZMQContext, _ transport: Transport = .inproc) throws -> (sender: ZMQSocket, receiver: ZMQSocket) {
        let receiver = try bounded(ZMQSocket(context, .pull))
        let sender = try bounded(ZMQSocket(context, .push))
        try sender.connect(try bindUnique(receiver, transport))
        return (sender, receiver)
    }

    @Test("request and reply round trip", arguments: Transport.allCases)
    func roundTrip(transport: Transport) throws {
        let context = try ZMQContext()
        let server = try bounded(ZMQSocket(context, .rep))
        let client = try bounded(ZMQSocket(context, .req))
        let endpoint = try bindUnique(server, transport)
        if transport == .tcp { #expect(endpoint.hasPrefix("tcp://127.0.0.1:") && !endpoint.hasSuffix(":*")) }
        try client.connect(endpoint)
        for index in 0..<100 {
            try client.send(["hello \(index)"])
            let request = try server.receive()
            #expect(request == ["hello \(index)"])
            try server.send(["world \(index)"])
            #expect(try client.receive() == ["world \(index)"])
        }
    }

    @Test("multipart messages keep empty and 8 MiB frames intact", arguments: Transport.allCases)
    func multipartIntegrity(transport: Transport) throws {
        let context = try ZMQContext()
        let (sender, receiver) = try pushPull(context, transport)
        var big = [UInt8](repeating: 0, count: 8 * 1024 * 1024)
        for index in big.indices { big[index] = UInt8(truncatingIfNeeded: index &* 31 &+ index >> 13) }
        let message: Message = [Frame(), Frame(big), "tail", Frame()]
        try sender.send(message)
        try sender.send([Frame()])
        let received = try receiver.receive()
        #expect(received.count == 4)
        #expect(received[0].isEmpty && received[3].isEmpty)
        #expect(received[1].count == big.count)
        #expect(received[1].equals(big))
        #expect(received[2].string == "tail")
        #expect(try receiver.receive() == [Frame()])
    }

    @Test("frames of every size around the inline and in-message bounds arrive intact, message after message, read into the same parts")
    func framesAroundTheInlineBound() throws {
        // Sizes either side of a frame's inline bytes (32) and of what libzmq keeps inside a
        // message (33): small frames go out through zmq_send, and every message is received
        // into the same parts, one libzmq message each, their slots grown past the first 8
        // by a message of 24 parts (what was read before moves with them).
        let sizes = [0, 1, 31, 32, 33, 34, 64, 8_192]
        let context = try ZMQContext()
        let (sender, receiver) = try pushPull(context, .tcp)
        func frames(_ round: Int) -> [Frame] {
            let frames = (round == 7 ? sizes + sizes + sizes : sizes).enumerated().map { index, size in
                Frame((0..<size).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ round &+ size &+ index) })
            }
            return round % 2 == 0 ? frames : frames.reversed()
        }
        for round in 0..<20 { try sender.send(Message(frames(round))) }
        var poller = ZMQPoller()
        _ = try poller.add(receiver)
        let parts = ZMQReceivedParts()
        var kept: [[Frame]] = []
        for round in 0..<20 {
            // Waits for the message (bounded), then reads it into the same parts as the last.
            while try !receiver.tryReceive(into: parts) {
                try #require(try poller.poll(timeoutMilliseconds: 5_000) == 1, "message \(round) did not come")
            }
            let expected = frames(round)
            #expect(parts.count == expected.count)
            #expect((0..<parts.count).allSatisfy { expected[$0].equals(parts[$0]) })
            // A part made a frame twice: two frames of the same bytes.
            #expect(parts.message().frames == expected && parts.frames(from: 0) == expected[...])
            kept.append(parts.message().frames)
            if round % 5 == 4 { parts.release() }
        }
        // Frames made of parts outlive the parts they were read into.
        parts.release()
        #expect(kept == (0..<20).map(frames))
    }

    @Test("a message of many parts grows the parts' room while it is read; released, the room goes back")
    func manyPartsGiveTheirRoomBack() throws {
        let context = try ZMQContext()
        let (sender, receiver) = try pushPull(context)
        let many = Message((0..<1_000).map { Frame("part \($0)") })
        try sender.send(many)
        try sender.send(["after", "it"])
        var poller = ZMQPoller()
        _ = try poller.add(receiver)
        let parts = ZMQReceivedParts()
        while try !receiver.tryReceive(into: parts) {
            try #require(try poller.poll(timeoutMilliseconds: 5_000) == 1, "the message of 1,000 parts did not come")
        }
        #expect(parts.count == 1_000 && parts.slots >= 1_000 && parts.message() == many)
        parts.release()
        #expect(parts.slots == ReceivedParts.initialRoom)
        #expect(try receiver.tryReceive(into: parts) && parts.message() == ["after", "it"])
    }

    @Test("a message of more parts than the limit is read to its end and let go, counted; one of exactly the limit arrives whole")
    func partLimit() throws {
        let context = try ZMQContext()
        let (sender, receiver) = try pushPull(context)
        let atLimit = Message((0..<ZMQSocket.maxParts).map { Frame("part \($0)") })
        try sender.send(Message((0...ZMQSocket.maxParts).map { _ in Frame("") }))
        try sender.send(["between"])
        try sender.send(Message((0..<ZMQSocket.maxParts * 3).map { _ in Frame("x") }))
        try sender.send(atLimit)
        // Both ways of reading: into parts as the loop does, and the blocking receive.
        var poller = ZMQPoller()
        _ = try poller.add(receiver)
        let parts = ZMQReceivedParts()
        while try !receiver.tryReceive(into: parts) {
            try #require(try poller.poll(timeoutMilliseconds: 5_000) == 1, "nothing came")
        }
        #expect(parts.message() == ["between"] && receiver.messagesOverPartLimit == 1)
        parts.release()
        #expect(try receiver.receive() == atLimit)
        #expect(receiver.messagesOverPartLimit == 2)
    }

    @Test("a frame can be sent many times without its bytes changing")
    func frameReuse() throws {
        let context = try ZMQContext()
        let (sender, receiver) = try pushPull(context)
        let shared = Frame([UInt8](repeating: 7, count: 100_000))
        for _ in 0..<10 { try sender.send([shared]) }
        for _ in 0..<10 { #expect(try receiver.receive() == [shared]) }
        #expect(shared.equals([UInt8](repeating: 7, count: 100_000)))
    }

    @Test("a large frame made here is lent to libzmq, not copied: over inproc the peer reads its very bytes, and once every message is let go so is its buffer",
          arguments: Transport.allCases)
    func largeFrameLent(transport: Transport) throws {
        let context = try ZMQContext()
        let (sender, receiver) = try pushPull(context, transport)
        weak var lent: FrameBuffer?
        var small: Frame? = Frame([UInt8](repeating: 3, count: Frame.lentFromBytes - 1))
        do {
            let large = Frame([UInt8](repeating: 9, count: 1_000_000))
            lent = large.buffer
            try sender.send([large, small!])
            let received = try receiver.receive()
            #expect(received[0] == large && received[1] == small!)
            // A frame below the bound is copied whatever the transport; a lent one is read
            // where it lies only by a peer in the same process.
            #expect(received[1].buffer?.bytes.baseAddress != small!.buffer?.bytes.baseAddress)
            if transport == .inproc { #expect(received[0].buffer?.bytes.baseAddress == large.buffer?.bytes.baseAddress) }
        }
        small = nil
        // libzmq lets go of a message sent over TCP or IPC on its I/O thread, once written.
        let deadline = ContinuousClock.now + .seconds(10)
        while lent != nil, ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.001) }
        #expect(lent == nil, "the lent buffer is still held")
    }

    @Test("a received frame kept for long gets bytes of its own (not a share of libzmq's receive buffer); a big one stays as it came")
    func keepableFrames() throws {
        let context = try ZMQContext()
        let (sender, receiver) = try pushPull(context, .tcp)
        try sender.send([Frame([UInt8](repeating: 1, count: 100)), Frame([UInt8](repeating: 2, count: 100_000))])
        let message = try receiver.receive()
        let small = message[0], big = message[1]
        #expect(small.buffer is ZMQFrameBuffer && big.buffer is ZMQFrameBuffer)
        let kept = small.keepable()
        #expect(kept == small && !(kept.buffer is ZMQFrameBuffer))
        #expect(big.keepable().buffer === big.buffer)
    }

    @Test("a received frame is sent from several threads at once, every copy intact")
    func receivedFrameSentFromThreads() throws {
        let context = try ZMQContext()
        let (sender, receiver) = try pushPull(context, .tcp)
        let small = [UInt8](repeating: 3, count: 100), big = [UInt8](repeating: 4, count: 100_000)
        try sender.send([Frame(small), Frame(big)])
        // Frames that came over TCP: held in libzmq's messages, copied (not locked) to send.
        let received = try receiver.receive()
        #expect(received[0].buffer is ZMQFrameBuffer && received[1].buffer is ZMQFrameBuffer)
        let threads = 4, sends = 200
        let intact = Mutex(0)
        DispatchQueue.concurrentPerform(iterations: threads) { _ in
            do {
                let pull = try bounded(ZMQSocket(context, .pull)), push = try bounded(ZMQSocket(context, .push))
                try push.connect(try pull.bind(inprocEndpoint("copies")))
                for _ in 0..<sends {
                    try push.send(received)
                    let copy = try pull.receive()
                    if copy.count == 2, copy[0].equals(small), copy[1].equals(big) { intact.withLock { $0 += 1 } }
                }
            } catch {
                Issue.record(error)
            }
        }
        #expect(intact.withLock { $0 } == threads * sends)
        #expect(received[0].equals(small) && received[1].equals(big))
    }

    @Test("ROUTER routes by routing id, and router-mandatory refuses an unknown peer")
    func routerRouting() throws {
        let context = try ZMQContext()
        let router = try bounded(ZMQSocket(context, .router))
        try router.set(.routerMandatory, true)
        let endpoint = try router.bind("tcp://127.0.0.1:*")
        var dealers: [ZMQSocket] = []
        for name in ["alpha", "beta"] {
            let dealer = try bounded(ZMQSocket(context, .dealer))
            try dealer.set(.routingID, Array(name.utf8))
            try dealer.connect(endpoint)
            try dealer.send(["hi from \(name)"])
            dealers.append(dealer)
        }
        var seen: [String: String] = [:]
        for _ in 0..<2 {
            let message = try router.receive()
            seen[message[0].string!] = message[1].string!
        }
        #expect(seen == ["alpha": "hi from alpha", "beta": "hi from beta"])
        try router.send(["beta", "to beta"])
        try router.send(["alpha", "to alpha"])
        #expect(try dealers[0].receive() == ["to alpha"])
        #expect(try dealers[1].receive() == ["to beta"])

        #expect(throws: ZMQError.self) { try router.send(["nobody", "lost"]) }
        do {
            try router.send(["nobody", "lost"])
        } catch {
            #expect(error.isUnroutable)
            // The routing id is a small frame: sent by zmq_send, which the error names.
            #expect(error.description.contains("zmq_send(ROUTER)"))
            #expect(error.description.contains("Host unreachable") || error.description.contains("unreachable"))
        }
    }

    @Test("a non-blocking receive with nothing waiting says EAGAIN")
    func nonBlockingReceive() throws {
        let context = try ZMQContext()
        let socket = try ZMQSocket(context, .pull)
        try socket.bind(inprocEndpoint())
        #expect(try socket.tryReceive() == nil)
        let error = #expect(throws: ZMQError.self) { try socket.set(.receiveTimeout, 0); _ = try socket.receive() }
        #expect(error?.isAgain == true)
        #expect(error?.isTerminated == false)
        #expect(error?.call == "zmq_msg_recv(PULL)")
    }

    @Test("errors name the call and the reason")
    func errorText() throws {
        let context = try ZMQContext()
        let first = try ZMQSocket(context, .rep)
        let endpoint = try first.bind("tcp://127.0.0.1:*")
        let second = try ZMQSocket(context, .rep)
        let error = #expect(throws: ZMQError.self) { try second.bind(endpoint) }
        #expect(error?.description == "zmq_bind(\(endpoint)): Address already in use")
        let bad = #expect(throws: ZMQError.self) { try second.connect("nonsense://x") }
        #expect(bad?.description.hasPrefix("zmq_connect(nonsense://x): ") == true)
        second.close()
        let closed = #expect(throws: ZMQError.self) { try second.send(["x"]) }
        #expect(closed?.call == "zmq_msg_send")
    }

    @Test("closing a context with sockets still open neither hangs nor crashes")
    func closeWithOpenSockets() async throws {
        // Released while sockets are open: the sockets keep it alive; no hang.
        do {
            let context = try ZMQContext()
            let a = try ZMQSocket(context, .push)
            try a.connect("tcp://127.0.0.1:9") // nobody there: a message stays queued
            try a.send(["pending"], options: .dontWait)
            _ = a
        }
        // Shut down while another thread blocks in receive: it gets ETERM promptly.
        let context = try ZMQContext()
        let endpoint = inprocEndpoint()
        let result = try await within(5, "blocked receive to end with ETERM") {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<ZMQError?, any Error>) in
                let thread = Thread {
                    do {
                        let socket = try ZMQSocket(context, .pull)
                        try socket.bind(endpoint)
                        _ = try socket.receive()
                        continuation.resume(returning: nil)
                    } catch let error as ZMQError {
                        continuation.resume(returning: error)
                    } catch {
                        continuation.resume(throwing: error)
                    }
                }
                thread.start()
                // Give the thread a moment to block; shutdown works either way.
                usleep(50_000)
                context.shutdown()
            }
        }
        #expect(result?.isTerminated == true)
    }

    @Test("the poller watches several sockets at once")
    func poller() throws {
        let context = try ZMQContext()
        var pulls: [ZMQSocket] = []
        var pushes: [ZMQSocket] = []
        for _ in 0..<3 {
            let pull = try ZMQSocket(context, .pull)
            let push = try ZMQSocket(context, .push)
            try push.connect(try pull.bind(inprocEndpoint()))
            pulls.append(pull)
            pushes.append(push)
        }
        var poller = ZMQPoller()
        for pull in pulls { try poller.add(pull) }
        #expect(try poller.poll(timeoutMilliseconds: 0) == 0)
        try pushes[2].send(["two"])
        try pushes[0].send(["zero"])
        #expect(try poller.poll(timeoutMilliseconds: 2_000) == 2)
        #expect(poller.events(at: 0) == .readable)
        #expect(poller.events(at: 1) == [])
        #expect(poller.events(at: 2) == .readable)
        #expect(try pulls[0].receive() == ["zero"])
        #expect(try pulls[2].receive() == ["two"])
        #expect(try poller.poll(timeoutMilliseconds: 0) == 0)
        var pipeEnds: [Int32] = [0, 0]
        #expect(pipe(&pipeEnds) == 0)
        defer { close(pipeEnds[0]); close(pipeEnds[1]) }
        let index = poller.add(fileDescriptor: pipeEnds[0])
        var one: UInt8 = 1
        _ = write(pipeEnds[1], &one, 1)
        #expect(try poller.poll(timeoutMilliseconds: 2_000) == 1)
        #expect(poller.events(at: index) == .readable)
    }

    /// A ROUTER bound on loopback, and a DEALER whose connection `events` (and `also`) a
    /// monitor's reader receives, not yet connected.
    func monitoredClient(also: SocketEvents = []) throws -> (server: ZMQSocket, endpoint: String, client: ZMQSocket, events: ZMQSocket) {
        let context = try ZMQContext()
        let server = try bounded(ZMQSocket(context, .router))
        let client = try bounded(ZMQSocket(context, .dealer))
        return (server, try server.bind("tcp://127.0.0.1:*"), client, try bounded(connectionEvents(of: client, in: context, also: also)))
    }

    /// Connects `client` to `server` `rounds` times, a message each time, each an event or
    /// more of the monitored client: whether every message was delivered (within its bound).
    /// Messages go through the I/O thread that sends the events: were it waiting, none would.
    /// On a failure the client is kept (its context cannot end while that thread waits, nor
    /// its events stop), so that the test fails rather than hangs.
    func reconnects(_ client: ZMQSocket, to server: ZMQSocket, at endpoint: String, rounds: Int) -> Bool {
        do {
            for round in 0..<rounds {
                try client.connect(endpoint)
                try client.send(["round \(round)"])
                #expect(try server.receive().last?.string == "round \(round)")
                try client.disconnect(endpoint)
            }
            return true
        } catch {
            _ = Unmanaged.passRetained(client)
            Issue.record("a message was not delivered: \(error)")
            return false
        }
    }

    @Test("a monitored socket's events stop when their reader closes first, so libzmq's I/O thread, which sends them, goes on serving the context's connections")
    func monitorReaderClosedFirst() throws {
        let (server, endpoint, client, events) = try monitoredClient()
        try client.connect(endpoint)
        #expect(SocketEvent(try events.receive())?.event == .connected)
        try client.disconnect(endpoint)
        // The reader goes first, as a connection replaced after its kernel restarted may close
        // them: the events that follow would wait for ever for a reader that is no more.
        events.close()
        guard reconnects(client, to: server, at: endpoint, rounds: 5) else { return }
        client.close()
    }

    @Test("a monitored socket's events wait, however many, for a reader that is behind, so libzmq's I/O thread, which sends them, goes on serving the context's connections")
    func monitorReaderBehind() throws {
        // Every event libzmq has: several a connection, so the rounds pass the default bounds
        // of the monitor's pipe (1,000 messages each way) many times over.
        let (server, endpoint, client, events) = try monitoredClient(also: .all)
        guard reconnects(client, to: server, at: endpoint, rounds: 1_500) else { return _ = Unmanaged.passRetained(events) }
        var read = 0
        while try events.tryReceive() != nil { read += 1 }
        #expect(read > 2_000, "events waiting: \(read)")
        client.close()
    }

    enum Listener: String, CaseIterable, Sendable { case tcp, ipcPath, ipcAbstract }

    @Test("a connection a listener accepted is known by its listener's address (TCP port, IPC path, abstract IPC name) and ended by the process; another listener's does not claim it",
          arguments: Listener.allCases)
    func acceptedConnectionEnded(listener: Listener) throws {
        let context = try ZMQContext()
        func bind(_ server: ZMQSocket) throws -> String {
            switch listener {
            case .tcp: return try server.bind("tcp://127.0.0.1:*")
            case .ipcPath: return try server.bind("ipc://" + (try temporaryDirectory().appendingPathComponent("s.ipc").path))
            case .ipcAbstract: return try server.bind("ipc://@switchboard-test-\(UUID().uuidString)")
            }
        }
        let server = try bounded(ZMQSocket(context, .router))
        let endpoint = try bind(server)
        let other = try bounded(ZMQSocket(context, .router))
        let otherEndpoint = try bind(other)
        let accepted = try bounded(socketEvents(of: server, in: context, .accepted))
        let client = try bounded(ZMQSocket(context, .dealer))
        let clientEvents = try bounded(connectionEvents(of: client, in: context))
        try client.connect(endpoint)

        let message = try accepted.receive()
        let event = try #require(SocketEvent(message))
        #expect(event.endpoint == endpoint)
        // The same descriptor, said to be accepted on the other listener, is not this one's.
        let elsewhere = try #require(SocketEvent(Message([message[0], Frame(otherEndpoint)])))
        #expect(AcceptedConnection(elsewhere) == nil)
        let connection = try #require(AcceptedConnection(event))
        #expect(SocketEvent(try clientEvents.receive())?.event == .connected)
        connection.end()
        #expect(SocketEvent(try clientEvents.receive())?.event == .disconnected)
        client.close()
        other.close()
    }

    @Test("socket options read back what was set")
    func options() throws {
        let context = try ZMQContext()
        let socket = try ZMQSocket(context, .dealer)
        #expect(try socket.get(.linger) == 0)
        try socket.set(.sendHighWaterMark, 5_000)
        try socket.set(.receiveHighWaterMark, 6_000)
        try socket.set(.maxMessageSize, 1 << 20)
        try socket.set(.heartbeatInterval, 2_500)
        try socket.set(.heartbeatTimeout, 7_500)
        try socket.set(.heartbeatTTL, 10_000)
        try socket.set(.reconnectInterval, 100)
        try socket.set(.reconnectIntervalMax, 2_000)
        try socket.set(.immediate, true)
        try socket.set(.tcpKeepalive, 1)
        try socket.set(.routingID, [1, 2, 3])
        try socket.set(.zapDomain, "switchboard")
        #expect(try socket.get(.sendHighWaterMark) == 5_000)
        #expect(try socket.get(.receiveHighWaterMark) == 6_000)
        #expect(try socket.get(.maxMessageSize) == 1 << 20)
        #expect(try socket.get(.reconnectIntervalMax) == 2_000)
        #expect(try socket.get(.immediate) == true)
        #expect(try socket.get(.tcpKeepalive) == 1)
        #expect(try socket.get(.routingID) == [1, 2, 3])
        #expect(try socket.get(.zapDomain) == "switchboard")
        let sub = try ZMQSocket(context, .sub)
        try sub.subscribe("/catalog/")
        try sub.unsubscribe("/catalog/")
    }

    @Test("a message over the size limit is refused by the receiving side")
    func maxMessageSize() throws {
        let context = try ZMQContext()
        let receiver = try bounded(ZMQSocket(context, .pull), milliseconds: 300)
        try receiver.set(.maxMessageSize, 1_000)
        let sender = try bounded(ZMQSocket(context, .push))
        try sender.connect(try receiver.bind("tcp://127.0.0.1:*"))
        try sender.send([Frame([UInt8](repeating: 1, count: 2_000))])
        #expect(try receiver.tryReceive() == nil)
        #expect(throws: ZMQError.self) { _ = try receiver.receive() }
    }
}

@Suite("CURVE, Z85 and the library")
struct CurveTests {
    @Test("the library reports its version and capabilities")
    func library() {
        #expect(ZMQLibrary.version.major == 4)
        #expect(ZMQLibrary.versionString.split(separator: ".").count == 3)
        #expect(ZMQLibrary.has("ipc"))
        #expect(!ZMQLibrary.has("no-such-capability"))
    }

    @Test("Z85 round trips and rejects bad input")
    func z85() {
        // The test vector from RFC 32/Z85.
        let bytes: [UInt8] = [0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B]
        #expect(Z85.encode(bytes) == "HelloWorld")
        #expect(Z85.decode("HelloWorld") == bytes)
        #expect(Z85.encode([1, 2, 3]) == nil)
        #expect(Z85.decode("abcd") == nil)
        #expect(Z85.decode("abc\"d") == nil)
    }

    @Test("CURVE key pairs are generated, derived and secure a connection", .enabled(if: ZMQLibrary.has("curve")))
    func curve() throws {
        let server = try CurveKeyPair.generate()
        let client = try CurveKeyPair.generate()
        #expect(server.publicKey.count == 40 && server.secretKey.count == 40)
        #expect(try CurveKeyPair.publicKey(forSecretKey: server.secretKey) == server.publicKey)
        #expect(Z85.decode(server.publicKey)?.count == 32)

        let context = try ZMQContext()
        let rep = try bounded(ZMQSocket(context, .rep))
        try rep.set(.curveServer, true)
        try rep.set(.curveSecretKey, server.secretKey)
        let endpoint = try rep.bind("tcp://127.0.0.1:*")
        let req = try bounded(ZMQSocket(context, .req))
        try req.set(.curveServerKey, server.publicKey)
        try req.set(.curvePublicKey, client.publicKey)
        try req.set(.curveSecretKey, client.secretKey)
        try req.connect(endpoint)
        try req.send(["secret"])
        #expect(try rep.receive() == ["secret"])
        #expect(try rep.get(.mechanism) == 2)
        try rep.send(["ok"])
        #expect(try req.receive() == ["ok"])
    }
}
