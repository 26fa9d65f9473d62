import BusProtocol
import Contracts
import Foundation
@testable import Kernel
import Logging
import Synchronization
import Testing
import ZeroMQ

private let quiet = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

/// A worker's and a client's frames as the broker's ROUTER receives them.
private func fromWorker(_ id: String, _ command: WorkerToBroker) -> Message { Message([Frame(id)] + MDP.encode(command).frames) }
private func fromClient(_ id: String, _ service: String, _ body: String) -> Message {
    Message([Frame(id)] + MDP.request(service: service, body: [Frame(body)]).frames)
}

/// A message from the kernel's pair peer as its pair ROUTER receives it: the peer's routing
/// id, the link's header, then `frames`.
private func fromPeer(_ frames: [Frame]) -> Message { Message([Frame("peer"), PairWire.header] + frames) }

/// Makes a change to `state`: whether it was published at once (nothing waits for the peer).
private func changePublishedAtOnce(_ state: inout StateServer, now: UInt64) -> Bool {
    _ = state.set("/client/k", value: Frame("\(state.sequence)"), now: now)
    return !state.publisher.take().isEmpty
}

/// What the broker sent to each peer, decoded: a worker's commands and a client's replies.
private struct Sent {
    var toWorkers: [(worker: String, command: BrokerToWorker)] = []
    var toClients: [(client: String, body: String)] = []
    init(_ messages: [Message]) {
        for message in messages {
            let peer = message[0].string ?? ""
            let rest = Message(Array(message.frames.dropFirst()))
            if let command = try? MDP.decodeAtWorker(rest) {
                toWorkers.append((peer, command))
            } else if let reply = try? MDP.decodeAtClient(rest) {
                toClients.append((peer, reply.body.first?.string ?? ""))
            }
        }
    }
    var requests: [(worker: String, body: String)] {
        toWorkers.compactMap { if case .request(_, let body) = $0.command { ($0.worker, body.first?.string ?? "") } else { nil } }
    }
}

@Suite("Kernel timing rules, driven by a clock the test moves (no sockets, no sleeping)")
struct KernelTimingTests {
    var configuration: KernelConfiguration {
        var configuration = KernelConfiguration()
        configuration.heartbeatInterval = .milliseconds(500)  // worker_expiry: 3 heartbeats
        configuration.heartbeatLiveness = 3
        configuration.queueTimeout = .seconds(2)
        configuration.hugzInterval = .seconds(1)
        return configuration
    }

    @Test("a worker silent for worker_expiry is removed at the next tick, and its request goes to another worker")
    func workerExpiry() {
        let clock = ManualClock()
        var broker = Broker(configuration: configuration, logger: quiet)
        broker.handle(fromWorker("A", .ready(service: "svc", window: 1)), now: clock.now)
        broker.handle(fromClient("C", "svc", #"{"jsonrpc":"2.0","id":1,"method":"m"}"#), now: clock.now)
        #expect(Sent(broker.outbox.take()).requests.map(\.worker) == ["A"])
        broker.handle(fromWorker("B", .ready(service: "svc", window: 1)), now: clock.now)

        // B heartbeats, A does not: one millisecond before its expiry A is still there...
        clock.advance(.milliseconds(1499))
        broker.handle(fromWorker("B", .heartbeat(errors: nil)), now: clock.now)
        broker.tick(now: clock.now)
        #expect(broker.workers.count == 2)
        #expect(Sent(broker.outbox.take()).requests.isEmpty)
        // ...and at it, A is gone and B has the request.
        clock.advance(.milliseconds(1))
        broker.tick(now: clock.now)
        #expect(broker.workers.count == 1)
        #expect(Sent(broker.outbox.take()).requests.map(\.worker) == ["B"])
        #expect(broker.services["svc"]?.stats.redispatched == 1)
        #expect(broker.takeEvents().contains { if case .workersChanged("svc", 1) = $0 { true } else { false } })
        // A was slow, not gone: its next HEARTBEAT (or DRAIN) is answered DISCONNECT, 7/MDP's
        // way back to registering, and is no protocol error (nor is one after a restart).
        for command in [WorkerToBroker.heartbeat(errors: nil), .drain] {
            broker.handle(fromWorker("A", command), now: clock.now)
            let answer = Sent(broker.outbox.take()).toWorkers
            #expect(answer.count == 1 && answer.first?.worker == "A" && answer.first?.command == .disconnect, "\(answer)")
        }
        #expect(broker.protocolErrors == 0)
        broker.handle(fromWorker("A", .ready(service: "svc", window: 1)), now: clock.now)
        #expect(broker.workers.count == 2 && broker.protocolErrors == 0)
    }

    @Test("a worker removed for silence that then answers: kept while its request still waits (the client gets it once, no other worker is sent it), dropped once another worker has it",
          arguments: [1, 4])
    func lateReply(window: Int) throws {
        let clock = ManualClock()
        var broker = Broker(configuration: configuration, logger: quiet)
        broker.handle(fromWorker("A", .ready(service: "svc", window: window)), now: clock.now)
        broker.handle(fromClient("C", "svc", #"{"jsonrpc":"2.0","id":1,"method":"m"}"#), now: clock.now)
        broker.handle(fromClient("D", "svc", #"{"jsonrpc":"2.0","id":2,"method":"m"}"#), now: clock.now)
        let sent = Sent(broker.outbox.take()).toWorkers.compactMap { if case .request(let client, _) = $0.command { client } else { nil } }
        #expect(sent.count == min(window, 2))
        clock.advance(.milliseconds(1500))
        broker.tick(now: clock.now)
        #expect(broker.workers.isEmpty && broker.services["svc"]?.requests.count == 2)
        _ = broker.outbox.take()
        // A was late, not dead: its answer reaches C, and C's request leaves the queue.
        broker.handle(fromWorker("A", .reply(client: sent[0], body: ["late answer"])), now: clock.now)
        let afterLate = Sent(broker.outbox.take())
        #expect(afterLate.toClients.map(\.client) == ["C"] && afterLate.toClients.first?.body == "late answer")
        #expect(afterLate.toWorkers.contains { $0.worker == "A" && $0.command == .disconnect }, "A registers again")
        #expect(broker.protocolErrors == 0, "a slow worker's late answer is no protocol error")
        #expect(broker.services["svc"]?.requests.count == 1)
        // The same answer again is no second reply.
        broker.handle(fromWorker("A", .reply(client: sent[0], body: ["late answer"])), now: clock.now)
        #expect(Sent(broker.outbox.take()).toClients.isEmpty)
        // B takes what waits (D's): an answer from A for it now is dropped, and B's is the one D gets.
        broker.handle(fromWorker("B", .ready(service: "svc", window: 1)), now: clock.now)
        let toB = Sent(broker.outbox.take()).toWorkers.compactMap { if case .request(let client, _) = $0.command { client } else { nil } }
        #expect(toB == [Frame("D")])
        if sent.count > 1 {
            broker.handle(fromWorker("A", .reply(client: sent[1], body: ["too late"])), now: clock.now)
            #expect(Sent(broker.outbox.take()).toClients.isEmpty)
        }
        broker.handle(fromWorker("B", .reply(client: Frame("D"), body: ["from B"])), now: clock.now)
        #expect(Sent(broker.outbox.take()).toClients.map(\.body) == ["from B"])
    }

    @Test("a worker removed for silence that goes on with a reply in parts: its parts are dropped, so its FINAL is dropped too, and the request waits for another worker")
    func lateStream() throws {
        let clock = ManualClock()
        var broker = Broker(configuration: configuration, logger: quiet)
        broker.handle(Message([Frame("A")] + MDP.encode(.ready(service: "svc", window: 4), version: .v02).frames), now: clock.now)
        broker.handle(Message([Frame("C")] + MDP.request(service: "svc", body: [#"{"jsonrpc":"2.0","id":1,"method":"m","stream":true}"#], version: .v02).frames),
                      now: clock.now)
        let sent = Sent(broker.outbox.take()).toWorkers.compactMap { if case .request(let client, _) = $0.command { client } else { nil } }
        clock.advance(.milliseconds(1500))
        broker.tick(now: clock.now)
        _ = broker.outbox.take()
        for command in [WorkerToBroker.partial(client: sent[0], body: ["1"]), .reply(client: sent[0], body: ["the end"])] {
            broker.handle(Message([Frame("A")] + MDP.encode(command, version: .v02).frames), now: clock.now)
        }
        #expect(Sent(broker.outbox.take()).toClients.isEmpty, "no end without its parts")
        #expect(broker.services["svc"]?.requests.count == 1)
    }

    @Test("a request nobody takes is answered -32001 once queue_timeout has passed, not a millisecond before")
    func queueTimeout() throws {
        let clock = ManualClock()
        var broker = Broker(configuration: configuration, logger: quiet)
        broker.handle(fromClient("C", "nobody", #"{"jsonrpc":"2.0","id":7,"method":"m"}"#), now: clock.now)
        clock.advance(.milliseconds(1999))
        broker.expireQueued(now: clock.now)
        #expect(broker.outbox.take().isEmpty)
        clock.advance(.milliseconds(1))
        broker.expireQueued(now: clock.now)
        let replies = Sent(broker.outbox.take()).toClients
        #expect(replies.count == 1)
        let reply = try JSONValue(parsing: Array(replies[0].body.utf8))
        #expect(reply["id"]?.intValue == 7)
        #expect(reply["error"]?["code"]?.intValue == Int64(JSONRPCError.serviceUnavailableCode))
    }

    @Test("a worker that dies holding a request hands it on once, then the client hears -32012 (max_deliveries 2)")
    func redeliveryLimit() throws {
        let clock = ManualClock()
        var broker = Broker(configuration: configuration, logger: quiet)
        broker.handle(fromClient("C", "svc", #"{"jsonrpc":"2.0","id":3,"method":"crash"}"#), now: clock.now)
        for worker in ["A", "B"] {
            broker.handle(fromWorker(worker, .ready(service: "svc", window: 1)), now: clock.now)
            #expect(Sent(broker.outbox.take()).requests.map(\.worker) == [worker])
            broker.peerGone(Frame(worker), now: clock.now)
        }
        let replies = Sent(broker.outbox.take()).toClients
        #expect(replies.count == 1)
        #expect(try JSONValue(parsing: Array(replies[0].body.utf8))["error"]?["code"]?.intValue == Int64(JSONRPCError.handlerDiedCode))
    }

    @Test("the connections of one process dying together count as one death: the client hears -32012 only after a second process died with its request")
    func oneProcessOneDeath() throws {
        let clock = ManualClock()
        var broker = Broker(configuration: configuration, logger: quiet)
        broker.handle(fromClient("C", "svc", #"{"jsonrpc":"2.0","id":4,"method":"m"}"#), now: clock.now)
        for connection in ["P1/0/1", "P1/1/1"] { broker.handle(fromWorker(connection, .ready(service: "svc", window: 1)), now: clock.now) }
        // Process P1 is killed: both its connections go, one after the other.
        for connection in ["P1/0/1", "P1/1/1"] {
            #expect(Sent(broker.outbox.take()).requests.map(\.worker) == [connection])
            broker.peerGone(Frame(connection), now: clock.now)
        }
        #expect(Sent(broker.outbox.take()).toClients.isEmpty, "one process died: the request waits for another")
        broker.handle(fromWorker("P2/0/1", .ready(service: "svc", window: 1)), now: clock.now)
        #expect(Sent(broker.outbox.take()).requests.map(\.worker) == ["P2/0/1"])
        broker.peerGone(Frame("P2/0/1"), now: clock.now)
        let replies = Sent(broker.outbox.take()).toClients
        #expect(replies.count == 1)
        let error = try JSONValue(parsing: Array(replies[0].body.utf8))["error"]
        #expect(error?["code"]?.intValue == Int64(JSONRPCError.handlerDiedCode))
        #expect(error?["data"]?["times"]?.intValue == 2)
    }

    @Test("a key with a ttl is deleted (and the deletion published) at its expiry; HUGZ go out every hugz_interval")
    func ttlAndHugz() throws {
        let clock = ManualClock()
        var state = StateServer(configuration: configuration, logger: quiet)
        state.set("/client/x", value: Frame("1"), ttl: TimeToLive(seconds: 2), now: clock.now)
        _ = state.publisher.take()
        clock.advance(.milliseconds(1999))
        state.tick(now: clock.now)
        #expect(state.entries[Frame("/client/x")] != nil)
        clock.advance(.milliseconds(1))
        state.tick(now: clock.now)
        #expect(state.entries[Frame("/client/x")] == nil)
        let published = try state.publisher.take().map { try CHP.decodeUpdate($0) }
        let deletions = published.compactMap { if case .entry(let entry) = $0, entry.key == "/client/x" { entry } else { nil } }
        #expect(deletions.count == 1 && deletions[0].value.isEmpty)

        // Nothing published since: the next HUGZ waits the whole interval.
        clock.advance(.milliseconds(999))
        state.tick(now: clock.now)
        #expect(state.publisher.take().isEmpty)
        clock.advance(.milliseconds(1))
        state.tick(now: clock.now)
        let hugz = try state.publisher.take().map { try CHP.decodeUpdate($0) }
        #expect(hugz.count == 1)
        if case .hugz = hugz.first {} else { Issue.record("expected a HUGZ, got \(hugz)") }
    }

    /// A state server with a pair link in `role` (heartbeats every 200 ms), on `clock`.
    func pairedState(_ role: PairConfiguration.Role, clock: ManualClock, peerBroker: String? = nil) -> StateServer {
        var configuration = configuration
        configuration.pair = PairConfiguration(role: role, listen: "inproc://unused-listen", peer: "inproc://unused-peer",
                                               heartbeatInterval: .milliseconds(200), peerBroker: peerBroker)
        return StateServer(configuration: configuration, logger: quiet,
                           pair: PairLink(configuration: configuration.pair!, instance: role.rawValue, clock: clock, logger: quiet))
    }

    /// Whether a kernel of a pair holding `state` serves a client's request for `service` now.
    func serves(_ state: inout StateServer, _ service: String, body: ArraySlice<Frame> = [], now: UInt64) -> Bool {
        Admission(isPaired: true).verdict(service: service, body: body, peer: nil, security: nil, now: now) { state.pairRefusal(now: $0) } == .admitted
    }

    @Test("of a pair: the backup copies the active peer's state, refuses clients while the peer is heard, and takes over when a client comes after two silent heartbeats")
    func failover() throws {
        let clock = ManualClock()
        var state = pairedState(.backup, clock: clock)
        func heartbeat(_ peerState: PairState, sequence: UInt64) -> Message {
            let body: JSONValue = ["state": .string(peerState.rawValue), "role": "primary", "instance": "primary",
                                   "sequence": .int(Int64(sequence)), "synced": true]
            return Message([Frame("peer"), PairWire.header, PairWire.state, Frame(body.jsonBytes)])
        }
        // The primary is active: the backup becomes passive and asks for the state.
        state.pairReceived(heartbeat(.active, sequence: state.sequence), now: clock.now)
        #expect(state.pair!.state == .passive)
        #expect(state.pair!.outbox.take().contains { $0.count >= 2 && $0[1] == PairWire.snapshotRequest })
        state.pairReceived(Message([Frame("peer"), PairWire.header, PairWire.snapshotDone, CHP.sequenceFrame(state.sequence), CHP.sequenceFrame(0)]),
                           now: clock.now)
        #expect(state.pair!.holdsState)
        #expect(serves(&state, "svc", now: clock.now) == false)
        // Questions about the kernel itself are answered by either.
        #expect(serves(&state, KernelAPI.service, body: [Frame(#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)], now: clock.now))

        // 399 ms of silence: still the peer's.
        clock.advance(.milliseconds(399))
        #expect(serves(&state, "svc", now: clock.now) == false)
        #expect(state.pair!.state == .passive)
        // 400 ms (two heartbeats): the next client makes it take over.
        clock.advance(.milliseconds(1))
        #expect(serves(&state, "svc", now: clock.now))
        #expect(state.pair!.state == .active)
        #expect(state.pair!.takeEvents().contains { if case .becameActive = $0 { true } else { false } })
    }

    @Test("of a pair: a passive whose silent peer's broker is connected but answers no question takes over once the oldest question has waited two heartbeats; one whose peer's broker answers does not",
          arguments: [false, true])
    func peerBrokerThatDoesNotAnswer(answers: Bool) throws {
        let clock = ManualClock()
        var state = pairedState(.backup, clock: clock, peerBroker: "inproc://unused-broker")
        let body: JSONValue = ["state": "active", "role": "primary", "instance": "primary", "sequence": .int(Int64(state.sequence)), "synced": true]
        state.pairReceived(Message([Frame("peer"), PairWire.header, PairWire.state, Frame(body.jsonBytes)]), now: clock.now)
        state.pairReceived(Message([Frame("peer"), PairWire.header, PairWire.snapshotDone, CHP.sequenceFrame(state.sequence), CHP.sequenceFrame(0)]),
                           now: clock.now)
        #expect(state.pair!.state == .passive && state.pair!.holdsState)
        state.pair!.peerBrokerConnected = true
        // The link falls silent; each heartbeat the kernel asks the peer's broker again, and a
        // client comes.
        clock.advance(.milliseconds(400))
        let silentAt = clock.now
        var tookOverAfter: Duration?
        for _ in 0..<10 where tookOverAfter == nil {
            state.pairTick(now: clock.now)
            if answers { state.pair!.probeAnswered(now: clock.now) }
            if serves(&state, "svc", now: clock.now) { tookOverAfter = .nanoseconds(Int64(clock.now - silentAt)) }
            clock.advance(.milliseconds(200))
        }
        if answers {
            #expect(tookOverAfter == nil, "took over from a peer whose broker answers")
            #expect(state.pair!.state == .passive)
        } else {
            #expect(tookOverAfter == .milliseconds(400), "\(String(describing: tookOverAfter))")
            #expect(state.pair!.state == .active)
        }
    }

    @Test("of a pair: of two actives the one active for less time gives way, the primary too (a restarted primary that served alone before it heard its peer); too close to tell, the backup does")
    func twoActives() throws {
        func heartbeat(from role: PairConfiguration.Role, activeFor: Duration?) -> Message {
            var body: [String: JSONValue] = ["state": "active", "role": .string(role.rawValue), "instance": .string("peer-\(role)"),
                                             "sequence": 0, "synced": true]
            if let activeFor { body["activeForMs"] = .int(Int64(activeFor.nanoseconds / 1_000_000)) }
            return Message([Frame("peer"), PairWire.header, PairWire.state, Frame(JSONValue.object(body).jsonBytes)])
        }
        /// A primary that heard nobody and served alone once a client came, then was active for `served`.
        func primaryServingAlone(for served: Duration, clock: ManualClock) -> StateServer {
            var state = pairedState(.primary, clock: clock)
            clock.advance(.seconds(1))
            #expect(serves(&state, "svc", now: clock.now))
            #expect(state.pair!.state == .active)
            clock.advance(served)
            return state
        }
        // A primary restarted a moment ago against a backup active for 5 s: the primary gives way.
        do {
            let clock = ManualClock()
            var state = primaryServingAlone(for: .milliseconds(100), clock: clock)
            state.pairReceived(heartbeat(from: .backup, activeFor: .seconds(5)), now: clock.now)
            #expect(state.pair!.state == .passive)
        }
        // A primary active for a minute against a backup that took over 2 s ago: it stays.
        do {
            let clock = ManualClock()
            var state = primaryServingAlone(for: .seconds(60), clock: clock)
            state.pairReceived(heartbeat(from: .backup, activeFor: .seconds(2)), now: clock.now)
            #expect(state.pair!.state == .active)
        }
        // Within two heartbeats of each other, or a peer that does not say: the primary stays.
        do {
            let clock = ManualClock()
            var state = primaryServingAlone(for: .seconds(5), clock: clock)
            state.pairReceived(heartbeat(from: .backup, activeFor: .milliseconds(5_300)), now: clock.now)
            #expect(state.pair!.state == .active)
            state.pairReceived(heartbeat(from: .backup, activeFor: nil), now: clock.now)
            #expect(state.pair!.state == .active)
        }
        // ...and the backup gives way.
        do {
            let clock = ManualClock()
            var state = pairedState(.backup, clock: clock)
            // Paired as passive (its copy complete), then the primary goes silent and a client comes.
            state.pairReceived(heartbeat(from: .primary, activeFor: .zero), now: clock.now)
            state.pairReceived(Message([Frame("peer"), PairWire.header, PairWire.snapshotDone, CHP.sequenceFrame(0), CHP.sequenceFrame(0)]), now: clock.now)
            clock.advance(.seconds(1))
            #expect(serves(&state, "svc", now: clock.now))
            clock.advance(.seconds(5))
            state.pairReceived(heartbeat(from: .primary, activeFor: nil), now: clock.now)
            #expect(state.pair!.state == .passive)
        }
    }

    @Test("of a pair: a restarted passive from before TOLD whose request for the state came before its first heartbeat is waited for once it acknowledges the state, and changes wait for it from the moment the state is sent")
    func activeWaitsForRestartedPassive() throws {
        let clock = ManualClock()
        var state = pairedState(.primary, clock: clock)
        func heartbeat(_ peerState: PairState, instance: String) -> Message {
            let body: JSONValue = ["state": .string(peerState.rawValue), "role": "backup", "instance": .string(instance),
                                   "sequence": 0, "synced": false]
            return fromPeer([PairWire.state, Frame(body.jsonBytes)])
        }
        func released() -> Int { state.pair!.takeEvents().filter { if case .released = $0 { true } else { false } }.count }
        let publish = PairLink.Held.publish(Message([Frame("/k")]), key: Frame("/k"))
        // Paired with a backup: active.
        state.pairReceived(heartbeat(.backup, instance: "backup-1"), now: clock.now)
        #expect(state.pair!.state == .active)
        // The backup restarts; the new one's first word is its request for the state, its
        // heartbeat (a new instance) comes after it.
        state.pairReceived(fromPeer([PairWire.snapshotRequest, Frame("backup-2")]), now: clock.now)
        let sent = state.sequence
        #expect(state.pair!.outbox.take().contains { $0.count >= 2 && $0[1] == PairWire.snapshotDone })
        state.pairReceived(heartbeat(.passive, instance: "backup-2"), now: clock.now)
        // Sent the state, not yet acknowledged: a change waits for the peer.
        let heldForTheSnapshot = state.pair!.hold(publish, until: sent + 1)
        #expect(heldForTheSnapshot)
        state.pairReceived(fromPeer([PairWire.ack, CHP.sequenceFrame(sent)]), now: clock.now)
        #expect(state.pair!.peerInSync)
        #expect(released() == 0)
        state.pairReceived(fromPeer([PairWire.ack, CHP.sequenceFrame(sent + 1)]), now: clock.now)
        #expect(released() == 1)
        let heldForTheAck = state.pair!.hold(publish, until: sent + 2)
        #expect(heldForTheAck)
        // The passive falls silent: what waited for it goes out, and nothing waits any more.
        clock.advance(.milliseconds(401))
        state.pairTick(now: clock.now)
        #expect(released() == 1)
        let heldWithNoPeer = state.pair!.hold(publish, until: sent + 3)
        #expect(!heldWithNoPeer)
    }

    @Test("of a pair: an active that served alone through its passive's silence waits for it again once it is heard and missed no change; one that missed a change is waited for again once it copied the state")
    func activeWaitsAgainForPassiveBack() throws {
        let clock = ManualClock()
        var state = pairedState(.primary, clock: clock)
        func heartbeat(_ peerState: PairState, synced: Bool, sequence: UInt64) -> Message {
            let body: JSONValue = ["state": .string(peerState.rawValue), "role": "backup", "instance": "backup-1",
                                   "sequence": .int(Int64(sequence)), "synced": .bool(synced)]
            return fromPeer([PairWire.state, Frame(body.jsonBytes)])
        }
        func acknowledge() { state.pairReceived(fromPeer([PairWire.ack, CHP.sequenceFrame(state.sequence)]), now: clock.now) }
        func silence() {
            clock.advance(.milliseconds(401))
            state.pairTick(now: clock.now)
            _ = state.publisher.take()
        }
        // Paired; the passive copied the state: a change waits for its acknowledgement.
        state.pairReceived(heartbeat(.backup, synced: false, sequence: 0), now: clock.now)
        state.pairReceived(fromPeer([PairWire.snapshotRequest, Frame("backup-1")]), now: clock.now)
        acknowledge()
        state.pairReceived(heartbeat(.passive, synced: true, sequence: state.sequence), now: clock.now)
        #expect(!changePublishedAtOnce(&state, now: clock.now))
        acknowledge()

        // Silent for two heartbeats: the active serves alone. Heard again, holding every
        // change (none was made meanwhile): changes wait for it again.
        silence()
        state.pairReceived(heartbeat(.passive, synced: true, sequence: state.sequence), now: clock.now)
        #expect(!changePublishedAtOnce(&state, now: clock.now), "the active never waits again for a passive that was silent for a moment")
        acknowledge()

        // Silent, and a change made meanwhile never reached it: heard again, it is not waited
        // for (it asks for the state when the active's heartbeat shows it what it missed).
        silence()
        #expect(changePublishedAtOnce(&state, now: clock.now))
        state.pairReceived(heartbeat(.passive, synced: true, sequence: state.sequence - 1), now: clock.now)
        #expect(changePublishedAtOnce(&state, now: clock.now))
        state.pairReceived(fromPeer([PairWire.snapshotRequest, Frame("backup-1")]), now: clock.now)
        acknowledge()
        #expect(!changePublishedAtOnce(&state, now: clock.now))
    }

    @Test("of a pair: while a passive that waits to be told copies the state, changes do not wait for it; once it acknowledges the copy they do, and a heartbeat tells it so at once")
    func activeDoesNotHoldChangesWhileTheStateIsCopied() throws {
        let clock = ManualClock()
        var state = pairedState(.primary, clock: clock)
        let heartbeat: JSONValue = ["state": "backup", "role": "backup", "instance": "backup-1", "sequence": 0, "synced": false]
        /// What the active kernel's last heartbeat to its peer said of waiting for it.
        func toldWaits() -> Bool? {
            let beats = state.pair!.outbox.take().filter { $0.count == 3 && $0[1] == PairWire.state }
            return beats.last.flatMap { try? JSONValue(parsing: $0[2].bytes) }?["waitsForPeer"]?.boolValue
        }
        state.pairReceived(fromPeer([PairWire.state, Frame(heartbeat.jsonBytes)]), now: clock.now)
        #expect(state.pair!.state == .active)
        state.pairReceived(fromPeer([PairWire.snapshotRequest, Frame("backup-1"), PairWire.told]), now: clock.now)
        let sent = state.sequence
        // The state is on its way: a change goes out at once, and to the peer after the state.
        #expect(changePublishedAtOnce(&state, now: clock.now))
        let toPeer = state.pair!.outbox.take()
        let snapshotAt = toPeer.firstIndex { $0.count >= 2 && $0[1] == PairWire.snapshotDone }
        let updateAt = toPeer.firstIndex { $0.count >= 2 && $0[1] == PairWire.update }
        #expect(snapshotAt != nil && updateAt != nil && snapshotAt! < updateAt!)
        clock.advance(.milliseconds(200))
        state.pairTick(now: clock.now)
        #expect(toldWaits() == false)
        // The copy acknowledged: changes wait for the peer, and it is told at once.
        state.pairReceived(fromPeer([PairWire.ack, CHP.sequenceFrame(sent)]), now: clock.now)
        #expect(toldWaits() == true)
        #expect(!changePublishedAtOnce(&state, now: clock.now))
        state.pairReceived(fromPeer([PairWire.ack, CHP.sequenceFrame(state.sequence)]), now: clock.now)
        #expect(state.pair!.takeEvents().contains { if case .released = $0 { true } else { false } })
    }

    @Test("of a pair: a change made while the state travels goes to the peer after it even while the peer's heartbeats are late (held behind the copy), so the copy is whole once in and the peer is waited for")
    func changesFollowTheCopyWhileHeartbeatsAreLate() throws {
        let clock = ManualClock()
        var state = pairedState(.primary, clock: clock)
        func heartbeat(_ peerState: PairState, synced: Bool) -> Message {
            let body: JSONValue = ["state": .string(peerState.rawValue), "role": "backup", "instance": "backup-1", "sequence": 0, "synced": .bool(synced)]
            return fromPeer([PairWire.state, Frame(body.jsonBytes)])
        }
        state.pairReceived(heartbeat(.backup, synced: false), now: clock.now)
        state.pairReceived(fromPeer([PairWire.snapshotRequest, Frame("backup-1"), PairWire.told]), now: clock.now)
        let sent = state.sequence
        _ = state.pair!.outbox.take()
        // No heartbeat from the peer for two intervals while the state crosses the link.
        clock.advance(.milliseconds(401))
        state.pairTick(now: clock.now)
        _ = state.pair!.outbox.take()
        #expect(changePublishedAtOnce(&state, now: clock.now))
        #expect(state.pair!.outbox.take().contains { $0.count >= 2 && $0[1] == PairWire.update }, "the change did not follow the state")
        // The copy in and acknowledged, the peer heard again: it holds every change, and is waited for.
        state.pairReceived(fromPeer([PairWire.ack, CHP.sequenceFrame(sent)]), now: clock.now)
        state.pairReceived(heartbeat(.passive, synced: true), now: clock.now)
        #expect(!changePublishedAtOnce(&state, now: clock.now))
    }

    @Test("of a pair: a passive asks for the state saying it waits to be told, and may take over only while the active one's heartbeat says it waits for it; from an active one that does not say, as soon as its copy is in",
          arguments: [true, false])
    func passiveTakesOverOnlyWhenWaitedFor(activeTells: Bool) throws {
        let clock = ManualClock()
        var state = pairedState(.backup, clock: clock)
        func heartbeat(waits: Bool?) -> Message {
            var body: [String: JSONValue] = ["state": "active", "role": "primary", "instance": "primary", "sequence": .int(Int64(state.sequence)), "synced": true]
            if activeTells { body["waitsForPeer"] = .bool(waits ?? false) }
            return Message([Frame("peer"), PairWire.header, PairWire.state, Frame(JSONValue.object(body).jsonBytes)])
        }
        state.pairReceived(heartbeat(waits: false), now: clock.now)
        #expect(state.pair!.state == .passive)
        #expect(state.pair!.outbox.take().contains { $0.count == 4 && $0[1] == PairWire.snapshotRequest && $0[3] == PairWire.told })
        state.pairReceived(Message([Frame("peer"), PairWire.header, PairWire.snapshotDone, CHP.sequenceFrame(state.sequence), CHP.sequenceFrame(0)]),
                           now: clock.now)
        #expect(state.pair!.holdsState)
        if activeTells {
            // Complete, but the active one has not said it waits for this copy: a change it
            // published may still be on its way. Silent now, with a client: no taking over.
            #expect(!state.pair!.status.synced)
            clock.advance(.milliseconds(400))
            #expect(!serves(&state, "svc", now: clock.now))
            #expect(state.pair!.state == .passive)
            state.pairReceived(heartbeat(waits: true), now: clock.now)
            #expect(state.pair!.status.synced)
            // The active one served alone for a while (this kernel was silent to it): not whole
            // until it waits again.
            state.pairReceived(heartbeat(waits: false), now: clock.now)
            #expect(!state.pair!.status.synced)
            state.pairReceived(heartbeat(waits: true), now: clock.now)
        }
        #expect(state.pair!.status.synced)
        clock.advance(.milliseconds(400))
        #expect(serves(&state, "svc", now: clock.now))
        #expect(state.pair!.state == .active)
    }

    @Test("of a pair: a passive applies the active's next change, publishes it and acknowledges it; a change that does not follow changes nothing and makes it ask for the whole state again")
    func passiveAppliesChanges() throws {
        let clock = ManualClock()
        var state = pairedState(.backup, clock: clock)
        func fromPeer(_ frames: [Frame]) -> Message { Message([Frame("peer")] + frames) }
        let heartbeat: JSONValue = ["state": "active", "role": "primary", "instance": "primary", "sequence": 0, "synced": true]
        state.pairReceived(fromPeer([PairWire.header, PairWire.state, Frame(heartbeat.jsonBytes)]), now: clock.now)
        state.pairReceived(fromPeer([PairWire.header, PairWire.snapshotDone, CHP.sequenceFrame(0), CHP.sequenceFrame(0)]), now: clock.now)
        #expect(state.pair!.holdsState)
        _ = state.pair!.outbox.take()
        var change = ReplicatedEntry(key: Frame("/k"), sequence: 1, uuid: Frame(), properties: Frame(), value: Frame("1"), quotaOwner: nil, expiresIn: nil)
        state.pairReceived(fromPeer(change.frames(PairWire.update).frames), now: clock.now)
        #expect(state.sequence == 1)
        #expect(state.pair!.outbox.take() == [[PairWire.header, PairWire.ack, CHP.sequenceFrame(1)]])
        let published = try state.publisher.take().map { try CHP.decodeUpdate($0) }
        guard case .entry(let entry) = published.first, published.count == 1 else { Issue.record("expected one update, got \(published)"); return }
        #expect(entry.key == "/k" && entry.sequence == 1 && entry.value == Frame("1"))
        // Change 3 after change 1: one was lost on the way.
        change.sequence = 3
        state.pairReceived(fromPeer(change.frames(PairWire.update).frames), now: clock.now)
        #expect(state.sequence == 1)
        #expect(!state.pair!.holdsState)
        #expect(state.pair!.outbox.take().contains { $0.count >= 2 && $0[1] == PairWire.snapshotRequest })
        #expect(state.publisher.take().isEmpty)
    }

    @Test("a kernel request taken up after the kernel stopped is answered -32008 by every method, not run against parts that are gone (with the state on etcd each request is a task, which can wait for its turn while the kernel stops)")
    func answeredAfterStop() async throws {
        let context = try ZMQContext()
        var configuration = KernelConfiguration()
        configuration.brokerEndpoint = "inproc://after-stop-broker"
        configuration.snapshotEndpoint = "inproc://after-stop-snapshot"
        configuration.publisherEndpoint = "inproc://after-stop-publisher"
        configuration.collectorEndpoint = "inproc://after-stop-collector"
        let kernel = try Kernel(configuration: configuration, context: context, logger: quiet)
        try await kernel.start()
        let table = try #require(await kernel.methodTable)
        await kernel.stop()
        let calls: [(method: String, params: String)] = [
            ("ping", "{}"), ("services.list", "{}"), ("stats", "{}"), ("metrics", "{}"), ("workers.list", "{}"),
            ("workers.drain", #"{"service":"echo"}"#), ("state.get", "{}"), ("state.history", #"{"key":"/client/k"}"#),
            ("state.set", #"{"key":"/client/k","value":1}"#), ("state.publish", #"{"key":"/client/k","value":1}"#),
        ]
        for call in calls {
            let body = #"{"jsonrpc":"2.0","id":1,"method":"\#(call.method)","params":\#(call.params)}"#
            let reply = await table.answer(body: Array(body.utf8), on: kernel).reply
            let error = try JSONValue(parsing: reply)["error"]
            #expect(error?["code"]?.intValue == Int64(JSONRPCError.notActiveCode), "\(call.method): \(String(decoding: reply, as: UTF8.self))")
        }
    }

    @Test("a stopped kernel is freed, with its parts (the broker, and the state server with the pair link)")
    func stoppedKernelIsFreed() async throws {
        weak var weakKernel: Kernel?
        let parts = WeakParts()
        let context = try ZMQContext()
        do {
            var configuration = KernelConfiguration()
            configuration.brokerEndpoint = "inproc://freed-broker"
            configuration.snapshotEndpoint = "inproc://freed-snapshot"
            configuration.publisherEndpoint = "inproc://freed-publisher"
            configuration.collectorEndpoint = "inproc://freed-collector"
            configuration.pair = PairConfiguration(role: .primary, listen: "inproc://freed-pair", peer: "inproc://freed-peer")
            let kernel = try Kernel(configuration: configuration, context: context, logger: quiet)
            try await kernel.start()
            await kernel.note(parts)
            weakKernel = kernel
            await kernel.stop()
        }
        #expect(parts.noted)
        #expect(weakKernel == nil)
        #expect(parts.parts == nil)
    }
}

/// Weak references to a kernel's parts, taken on its loop.
final class WeakParts: @unchecked Sendable {
    weak var parts: KernelParts?
    var noted = false
}

extension Kernel {
    func note(_ weak: WeakParts) {
        weak.parts = parts
        weak.noted = parts?.state.pair != nil
    }
}

@Suite("Draining workers: no new requests, those in flight answered, nothing re-sent")
struct DrainTests {
    private func broker() -> Broker {
        var configuration = KernelConfiguration()
        configuration.clientSharePercent = 100
        return Broker(configuration: configuration, logger: quiet)
    }
    private func request(_ id: Int) -> String { #"{"jsonrpc":"2.0","id":\#(id),"method":"m"}"# }

    @Test("a worker that asks to drain is told no more come, gets none, answers what it holds and leaves without a re-send")
    func workerAsks() {
        let clock = ManualClock()
        var broker = broker()
        broker.handle(fromWorker("A", .ready(service: "svc", window: 2)), now: clock.now)
        broker.handle(fromClient("C", "svc", request(1)), now: clock.now)
        let held = Sent(broker.outbox.take()).toWorkers.compactMap { if case .request(let client, _) = $0.command { client } else { nil } }
        #expect(held.count == 1)
        broker.handle(fromWorker("B", .ready(service: "svc", window: 1)), now: clock.now)
        broker.handle(fromWorker("A", .drain), now: clock.now)
        #expect(Sent(broker.outbox.take()).toWorkers.map(\.command) == [.drain])
        #expect(broker.services["svc"]?.workers == 1)
        // A has a free place, but new requests go to B (from another client: C's share of
        // the places left, B's one, is taken by what A still holds for it).
        broker.handle(fromClient("D", "svc", request(2)), now: clock.now)
        #expect(Sent(broker.outbox.take()).requests.map(\.worker) == ["B"])
        broker.handle(fromWorker("A", .reply(client: held[0], body: ["one"])), now: clock.now)
        #expect(Sent(broker.outbox.take()).toClients.map(\.body) == ["one"])
        broker.handle(fromClient("D", "svc", request(3)), now: clock.now)
        #expect(Sent(broker.outbox.take()).requests.isEmpty)  // B is busy; A takes nothing
        broker.handle(fromWorker("A", .disconnect), now: clock.now)
        #expect(broker.workers.count == 1)
        #expect(broker.services["svc"]?.stats.redispatched == 0)
        #expect(broker.services["svc"]?.requests.count == 1)
    }

    @Test("the kernel drains a service: a window worker is told, a plain 7/MDP worker gets DISCONNECT once it holds nothing")
    func kernelDrains() {
        let clock = ManualClock()
        var broker = broker()
        broker.handle(fromWorker("plain", .ready(service: "svc")), now: clock.now)
        broker.handle(fromWorker("P1/0/1", .ready(service: "svc", window: 4)), now: clock.now)
        broker.handle(fromClient("C", "svc", request(1)), now: clock.now)
        broker.handle(fromClient("C", "svc", request(2)), now: clock.now)
        let sent = Sent(broker.outbox.take())
        #expect(Set(sent.requests.map(\.worker)) == ["P1/0/1", "plain"])
        let drained = broker.drain(service: "svc", worker: nil, now: clock.now)
        #expect(drained.count == 2)
        #expect(Sent(broker.outbox.take()).toWorkers.map(\.worker) == ["P1/0/1"])  // plain still holds one
        #expect(broker.services["svc"]?.workers == 0)
        let plainClient = sent.toWorkers.compactMap { if $0.worker == "plain", case .request(let client, _) = $0.command { client } else { nil } }[0]
        broker.handle(fromWorker("plain", .reply(client: plainClient, body: ["done"])), now: clock.now)
        let after = Sent(broker.outbox.take())
        #expect(after.toClients.map(\.body) == ["done"])
        #expect(after.toWorkers.map(\.worker) == ["plain"] && after.toWorkers.map(\.command) == [.disconnect])
        #expect(broker.workers.count == 1 && broker.services["svc"]?.stats.redispatched == 0)
    }

    @Test("a drain by id takes the connection or every connection of that process, and nothing else")
    func byProcess() {
        let clock = ManualClock()
        var broker = broker()
        for id in ["h:1:a/0/1", "h:1:a/1/1", "h:2:b/0/1"] { broker.handle(fromWorker(id, .ready(service: "svc", window: 2)), now: clock.now) }
        #expect(broker.drain(service: "svc", worker: "h:1:a", now: clock.now).map { $0.identity.string } == ["h:1:a/0/1", "h:1:a/1/1"])
        #expect(broker.drain(service: "svc", worker: "h:2:b/0/1", now: clock.now).count == 1)
        #expect(broker.drain(service: "other", worker: nil, now: clock.now).isEmpty)
    }
}

@Suite("What only operators may ask: refused from any other key before it reaches a worker")
struct OperatorsOnlyTests {
    /// A broker with CURVE on whose allow-lists hold one key of each kind.
    private func broker() -> Broker {
        var configuration = KernelConfiguration()
        configuration.security = KernelSecurity(secretKey: "unused", clientKeys: ["C"], serviceKeys: ["S": SupervisorAPI.service],
                                                operatorKeys: ["O"])
        return Broker(configuration: configuration, logger: quiet)
    }
    private func request(from user: String, _ service: String, _ method: String) -> Message {
        var message = fromClient("peer-\(user)", service, #"{"jsonrpc":"2.0","id":1,"method":"\#(method)"}"#)
        message.peerUserID = "client:" + user
        return message
    }

    @Test("the supervisor's methods and kernel workers.drain: -32011 to a client key, passed on for an operator's key; the rest open to clients")
    func refusedToClients() throws {
        let clock = ManualClock()
        var broker = broker()
        var ready = fromWorker("sup", .ready(service: SupervisorAPI.service, window: 4))
        ready.peerUserID = "worker:S"
        broker.handle(ready, now: clock.now)
        _ = broker.outbox.take()
        _ = broker.takeEvents()

        broker.handle(request(from: "C", SupervisorAPI.service, SupervisorAPI.restart.name), now: clock.now)
        let refused = Sent(broker.outbox.take())
        #expect(refused.requests.isEmpty)
        let error = try JSONValue(parsing: Array(refused.toClients[0].body.utf8))["error"]
        #expect(error?["code"]?.intValue == Int64(JSONRPCError.forbiddenCode))
        #expect(error?["message"]?.stringValue?.contains("operator.key") == true)
        broker.handle(request(from: "C", KernelAPI.service, KernelAPI.workersDrain.name), now: clock.now)
        #expect(Sent(broker.outbox.take()).toClients.count == 1)
        #expect(broker.takeEvents().isEmpty)  // never reached the kernel's methods
        #expect(broker.refusedForKey == 2)

        broker.handle(request(from: "O", SupervisorAPI.service, SupervisorAPI.restart.name), now: clock.now)
        #expect(Sent(broker.outbox.take()).requests.map(\.worker) == ["sup"])
        broker.handle(request(from: "O", KernelAPI.service, KernelAPI.workersDrain.name), now: clock.now)
        broker.handle(request(from: "C", KernelAPI.service, KernelAPI.workersList.name), now: clock.now)
        #expect(broker.takeEvents().count == 2)
        #expect(broker.refusedForKey == 2)
    }
}

@Suite("Fair queue: clients served in turn, none past its share, none remembered once done")
struct FairQueueTests {
    private func broker() -> Broker {
        var configuration = KernelConfiguration()
        configuration.queueTimeout = .seconds(2)
        return Broker(configuration: configuration, logger: quiet)
    }
    private func request(_ name: String) -> String { #"{"jsonrpc":"2.0","id":"\#(name)","method":"m"}"# }
    /// The requests sent to workers, in order: the client frame to answer with, and the id.
    private func dispatched(_ broker: inout Broker) -> [(client: Frame, id: String)] {
        broker.outbox.take().compactMap { message in
            guard case .request(let client, let body)? = try? MDP.decodeAtWorker(Message(Array(message.frames.dropFirst()))),
                  let text = body.first?.string else { return nil }
            return (client, String(text.split(separator: "\"")[7]))
        }
    }

    /// Longer than a client's turn may last.
    private let afterTurn = Duration.nanoseconds(Int64(FairQueue.runNanoseconds) + 1)

    @Test("one client's flood waits behind its own requests: another client's comes next, and a request back from a dead worker keeps its place")
    func inTurn() {
        // Slow requests: each answer comes after a turn's time, so a turn is one request.
        let clock = ManualClock()
        var broker = broker()
        broker.handle(fromWorker("W", .ready(service: "svc")), now: clock.now)
        for name in ["a1", "a2", "a3", "a4"] { broker.handle(fromClient("A", "svc", request(name)), now: clock.now) }
        broker.handle(fromClient("B", "svc", request("b1")), now: clock.now)
        #expect(dispatched(&broker).map(\.id) == ["a1"])
        var order: [String] = []
        for _ in 0..<2 {
            clock.advance(afterTurn)
            broker.handle(fromWorker("W", .reply(client: Frame("A"), body: ["done"])), now: clock.now)
            order += dispatched(&broker).map(\.id)
        }
        #expect(order == ["a2", "b1"])
        // W dies holding b1: b1 goes first again, before A's a3 and a4.
        broker.handle(fromWorker("W", .disconnect), now: clock.now)
        broker.handle(fromWorker("V", .ready(service: "svc")), now: clock.now)
        #expect(dispatched(&broker).map(\.id) == ["b1"])
        for (client, next) in [("B", ["a3"]), ("A", ["a4"]), ("A", [])] {
            clock.advance(afterTurn)
            broker.handle(fromWorker("V", .reply(client: Frame(client), body: ["done"])), now: clock.now)
            #expect(dispatched(&broker).map(\.id) == next)
        }
        let queue = broker.services["svc"]!.requests
        #expect(queue.isEmpty && queue.bytes == 0 && queue.clientCount == 0)
        #expect(broker.queuedBytes == 0)
    }

    @Test("places that free up quickly go to one client's requests in a row, at most a turn's worth; then the next client's turn")
    func turnsOfSeveral() {
        let clock = ManualClock()
        var broker = broker()
        broker.handle(fromWorker("W", .ready(service: "svc")), now: clock.now)
        let flood = FairQueue.maxRun + 8
        for index in 1...flood { broker.handle(fromClient("A", "svc", request("a\(index)")), now: clock.now) }
        broker.handle(fromClient("B", "svc", request("b1")), now: clock.now)
        var order = dispatched(&broker).map(\.id)
        #expect(order == ["a1"])
        // Each answer at once: A's turn goes on for maxRun requests, then B's comes.
        func answer(_ client: String) {
            broker.handle(fromWorker("W", .reply(client: Frame(client), body: ["done"])), now: clock.now)
            order += dispatched(&broker).map(\.id)
        }
        for _ in 0..<FairQueue.maxRun { answer("A") }
        #expect(order.prefix(3) == ["a1", "a2", "a3"], "turns of one request each")
        #expect(Array(order.dropFirst()) == (2...(FairQueue.maxRun + 1)).map { "a\($0)" })
        answer("A")
        #expect(order.last == "b1")
        // B has nothing more: A's next turn, which ends by time as much as by count.
        answer("B")
        #expect(order.last == "a\(FairQueue.maxRun + 2)")
        broker.handle(fromClient("B", "svc", request("b2")), now: clock.now)
        clock.advance(afterTurn)
        answer("A")
        #expect(order.last == "b2")
    }

    @Test("a worker's places are reused, but a late reply for an earlier use of a place answers nothing: the worker is disconnected")
    func staleTag() {
        let clock = ManualClock()
        var broker = broker()
        broker.handle(fromWorker("W", .ready(service: "svc", window: 2)), now: clock.now)
        broker.handle(fromClient("A", "svc", request("a1")), now: clock.now)
        let first = dispatched(&broker)
        broker.handle(fromWorker("W", .reply(client: first[0].client, body: ["one"])), now: clock.now)
        #expect(Sent(broker.outbox.take()).toClients.map(\.body) == ["one"])
        broker.handle(fromClient("A", "svc", request("a2")), now: clock.now)
        let second = dispatched(&broker)
        // The same place, another tag.
        #expect(second.map(\.id) == ["a2"] && second[0].client != first[0].client)
        broker.handle(fromWorker("W", .reply(client: first[0].client, body: ["late"])), now: clock.now)
        let sent = Sent(broker.outbox.take())
        #expect(sent.toClients.isEmpty)
        #expect(sent.toWorkers.map(\.command) == [.disconnect])
        #expect(broker.workers.isEmpty && broker.services["svc"]!.requests.count == 1)
    }

    @Test("a client holds at most its share of the places; what waits past the queue timeout is answered -32001; nobody is remembered once answered")
    func shareAndExpiry() {
        let clock = ManualClock()
        var broker = broker()
        // Four places, 90% share: one client holds at most three.
        broker.handle(fromWorker("W", .ready(service: "svc", window: 4)), now: clock.now)
        for index in 1...5 { broker.handle(fromClient("A", "svc", request("a\(index)")), now: clock.now) }
        var held = dispatched(&broker)
        #expect(held.map(\.id) == ["a1", "a2", "a3"])
        #expect(broker.services["svc"]!.requests.held(by: Frame("A")) == 3)
        broker.handle(fromClient("B", "svc", request("b1")), now: clock.now)
        held += dispatched(&broker)
        #expect(held.map(\.id) == ["a1", "a2", "a3", "b1"])
        #expect(broker.services["svc"]!.requests.count == 2)
        clock.advance(.milliseconds(2001))
        broker.expireQueued(now: clock.now)
        let answered = Sent(broker.outbox.take()).toClients
        #expect(answered.map(\.client) == ["A", "A"])
        #expect(answered.allSatisfy { $0.body.contains("-32001") })
        #expect(broker.services["svc"]!.requests.isEmpty && broker.services["svc"]!.requests.bytes == 0 && broker.queuedBytes == 0)
        // Both still hold their places until answered; then neither is remembered.
        #expect(broker.services["svc"]!.requests.clientCount == 2)
        for request in held { broker.handle(fromWorker("W", .reply(client: request.client, body: ["done"])), now: clock.now) }
        #expect(Sent(broker.outbox.take()).toClients.count == 4)
        #expect(broker.services["svc"]!.requests.clientCount == 0)
    }
}
