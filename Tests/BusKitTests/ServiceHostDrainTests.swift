@testable import BusKit
import BusProtocol
import Contracts
import Foundation
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// A service whose `hold` answers only once the test opens its gate.
private actor Held: BusService {
    static let name = "held"
    static let hold = Method<NoParams, Int>(name, "hold", "Answers once the gate opens.")
    private var open = false
    private var waiting: [CheckedContinuation<Void, Never>] = []
    private(set) var started = 0

    nonisolated func methods(_ table: inout MethodTable<Held>) {
        table.on(Self.hold) { held, _ in await held.pass() }
    }

    private func pass() async -> Int {
        countStarted()
        if !open { await withCheckedContinuation { waiting.append($0) } }
        return started
    }

    private var counting: [(count: Int, continuation: CheckedContinuation<Void, Never>)] = []

    /// Returns once `count` handlers have started.
    func started(atLeast count: Int) async {
        if started >= count { return }
        await withCheckedContinuation { counting.append((count, $0)) }
    }

    private func countStarted() {
        started += 1
        for waiter in counting where waiter.count <= started { waiter.continuation.resume() }
        counting.removeAll { $0.count <= started }
    }

    func release() {
        open = true
        for waiter in waiting { waiter.resume() }
        waiting.removeAll()
    }
}

/// A service whose `chunks` answers in many parts of 4 KiB: more than libzmq's queue, the
/// connection and the host's part outbox hold at once, when the kernel reads slowly.
private actor Chunks: BusService {
    static let name = "chunks"
    static let chunksMethod = Method<NoParams, Int>(name, "chunks", "Parts of 4 KiB, then their count.")
    static let chunks = StreamMethod(chunksMethod, part: String.self) { end, _ in end }
    static let count = 10_000
    static let chunk = String(repeating: "c", count: 4_096)
    private(set) var sent = 0
    private var counting: [(count: Int, continuation: CheckedContinuation<Void, Never>)] = []

    nonisolated func methods(_ table: inout MethodTable<Chunks>) {
        table.onStream(Self.chunks) { chunks, _, parts in
            for _ in 0..<Self.count {
                try await parts.send(Self.chunk)
                await chunks.countSent()
            }
            return Self.count
        }
    }

    private func countSent() {
        sent += 1
        for waiter in counting where waiter.count <= sent { waiter.continuation.resume() }
        counting.removeAll { $0.count <= sent }
    }

    /// Returns once `count` parts were handed to the host.
    func sent(atLeast count: Int) async {
        if sent >= count { return }
        await withCheckedContinuation { counting.append((count, $0)) }
    }
}

/// The worker's side of a drain (``ServiceHost`` stopping), seen from a ROUTER standing in
/// for the kernel: it says `drain=1` before anything else, answers every request it holds or
/// gets before the kernel's answer, and sends DISCONNECT only when both are done. (The
/// kernel's side is `DrainTests`, with a clock the test moves.)
@Suite("ServiceHost drains: drain=1 first, every request answered, DISCONNECT only after the kernel's word and the last reply")
struct ServiceHostDrainTests {
    /// What the stand-in kernel reads: the worker's commands, its heartbeats counted apart.
    private struct StandIn {
        let router: ZMQSocket
        var worker = Frame()
        var heartbeats = 0

        /// The next command that is not a plain heartbeat (those are counted).
        mutating func next() async throws -> WorkerToBroker {
            while true {
                let message = try await router.receiveOffPool()
                guard case .worker(let identity, let command, _) = try MDP.decodeAtBroker(message) else { continue }
                worker = identity
                if case .heartbeat = command {
                    heartbeats += 1
                    // Answered, so the worker keeps hearing its kernel while it waits.
                    try router.send(MDP.encode(.heartbeat, to: worker))
                    continue
                }
                return command
            }
        }

        /// Reads until `count` more heartbeats came: the worker is still there, waiting.
        mutating func heartbeats(_ count: Int) async throws -> [WorkerToBroker] {
            let target = heartbeats + count
            var others: [WorkerToBroker] = []
            while heartbeats < target {
                let message = try await router.receiveOffPool()
                guard case .worker(_, let command, _) = try MDP.decodeAtBroker(message) else { continue }
                if case .heartbeat = command {
                    heartbeats += 1
                    try router.send(MDP.encode(.heartbeat, to: worker))
                } else {
                    others.append(command)
                }
            }
            return others
        }

        func request(_ id: Int, client: String) throws {
            let body = Frame(JSONRPCRequest(id: .number(Int64(id)), method: Held.hold.name, paramsText: nil).jsonBytes)
            try router.send(MDP.encode(.request(client: Frame(client), body: [body]), to: worker))
        }
    }

    private func host(at endpoint: String) throws -> (ServiceHost<Held>, Held) {
        let held = Held()
        // Heartbeats every 50 ms; a drain that waited for nothing would be over at once, and
        // one that waited out its timeout would take 30 s.
        let options = ServiceHost<Held>.Options(brokers: [endpoint], connections: 1, window: 4, heartbeatInterval: .milliseconds(50),
                                                heartbeatLiveness: 20, drainTimeout: .seconds(30))
        return (try ServiceHost(service: held, options: options), held)
    }

    /// A host of `Held` with window 4, registered with a stand-in kernel on an endpoint of its own.
    private func registeredHost() async throws -> (kernel: StandIn, host: ServiceHost<Held>, held: Held, context: ZMQContext) {
        let context = try ZMQContext()
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        var kernel = StandIn(router: try await kernelStandIn(at: endpoint, in: context))
        do {
            let (host, held) = try host(at: endpoint)
            try await host.start()
            #expect(try await kernel.next() == .ready(service: Held.name, window: 4))
            return (kernel, host, held, context)
        } catch {
            kernel.router.close()
            throw error
        }
    }

    @Test("with requests in flight: drain=1, a request sent before the kernel heard is answered too, no DISCONNECT until both replies are out")
    func busy() async throws {
        let (standIn, host, held, context) = try await registeredHost()
        var kernel = standIn
        defer { withExtendedLifetime(context) { kernel.router.close() } }
        try kernel.request(1, client: "c1")

        let stopping = Task { await host.stop() }
        #expect(try await kernel.next() == .drain, "drain=1 is the first thing a stopping worker says")
        try kernel.request(2, client: "c2")  // sent before the kernel heard
        try kernel.router.send(MDP.encode(.drain, to: kernel.worker))
        #expect(try await kernel.heartbeats(3).isEmpty, "nothing is answered and nothing said while both requests are held")

        await held.release()
        var replies: [String] = []
        var after: WorkerToBroker
        repeat {
            after = try await kernel.next()
            if case .reply(let client, _) = after { replies.append(client.string ?? "") }
        } while replies.count < 2 && after != .disconnect
        #expect(replies.sorted() == ["c1", "c2"])
        #expect(try await kernel.next() == .disconnect)
        await stopping.value
        #expect(await held.started == 2)
    }

    @Test("a connection answers as many requests at once as its window holds: 4 held at once, then 40 more")
    func answersAWindowAtOnce() async throws {
        let (standIn, host, held, context) = try await registeredHost()
        var kernel = standIn
        defer { withExtendedLifetime(context) { kernel.router.close() } }
        for id in 1...4 { try kernel.request(id, client: "c\(id)") }
        // All four run at once: none answers before the gate opens, and it opens only now.
        await held.started(atLeast: 4)
        await held.release()
        var replies = 0
        func readReplies(_ count: Int) async throws {
            let target = replies + count
            while replies < target {
                if case .reply = try await kernel.next() { replies += 1 }
            }
        }
        try await readReplies(4)
        for round in 0..<10 {
            for id in 1...4 { try kernel.request(100 + round * 4 + id, client: "d\(id)") }
            try await readReplies(4)
        }
        #expect(await held.started == 44)

        let stopping = Task { await host.stop() }
        #expect(try await kernel.next() == .drain)
        try kernel.router.send(MDP.encode(.drain, to: kernel.worker))
        #expect(try await kernel.next() == .disconnect)
        await stopping.value
    }

    @Test("parts and a reply still waiting for a full socket are sent before DISCONNECT: none is lost when the drain ends")
    func sendsWhatWaits() async throws {
        let context = try ZMQContext()
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        var kernel = StandIn(router: try await kernelStandIn(at: endpoint, in: context, receiveHighWaterMark: 1))
        defer { withExtendedLifetime(context) { kernel.router.close() } }
        let chunks = Chunks()
        // The stand-in reads nothing for a while: the worker must not take it for dead.
        let options = ServiceHost<Chunks>.Options(brokers: [endpoint], connections: 1, heartbeatInterval: .milliseconds(100),
                                                  heartbeatLiveness: 300, drainTimeout: .seconds(60))
        let host = try ServiceHost(service: chunks, options: options)
        try await host.start()
        guard case .ready(Chunks.name, _, _, _) = try await kernel.next() else { Issue.record("expected READY"); return }
        let body = Frame(JSONRPCRequest(id: .number(1), method: Chunks.chunksMethod.name, paramsText: nil, stream: true).jsonBytes)
        try kernel.router.send(MDP.encode(.request(client: Frame("c1"), body: [body]), to: kernel.worker, version: .v02))
        // More than libzmq's queue (1,000) and the part outbox (1,024) hold: the handler now
        // waits for room, and parts wait on the host's side.
        await chunks.sent(atLeast: 2_100)

        let stopping = Task { await host.stop() }
        var parts = 0
        var final = false
        var drained = false
        // Read as fast as possible; heartbeats answered only until the drain is: a reply the
        // worker never reads before it closes would make its end of the connection reset it,
        // and what was in flight would be lost on the way, whoever sent it.
        while true {
            let message = try await kernel.router.receiveOffPool()
            guard case .worker(_, let command, _) = try MDP.decodeAtBroker(message) else { continue }
            switch command {
            case .partial: parts += 1
            case .reply: final = true
            case .heartbeat where !drained: try kernel.router.send(MDP.encode(.heartbeat, to: kernel.worker, version: .v02))
            case .drain:
                drained = true
                try kernel.router.send(MDP.encode(.drain, to: kernel.worker, version: .v02))
            default: break
            }
            if command == .disconnect { break }
        }
        #expect(parts == Chunks.count, "every part before DISCONNECT")
        #expect(final, "the FINAL before DISCONNECT")
        await stopping.value
    }

    @Test("idle: drain=1, then no DISCONNECT until the kernel answers drain=1")
    func waitsForTheKernel() async throws {
        let (standIn, host, _, context) = try await registeredHost()
        var kernel = standIn
        defer { withExtendedLifetime(context) { kernel.router.close() } }

        let stopping = Task { await host.stop() }
        #expect(try await kernel.next() == .drain)
        #expect(try await kernel.heartbeats(3).isEmpty, "it waits for the kernel's word: a request may still be on its way")
        try kernel.router.send(MDP.encode(.drain, to: kernel.worker))
        #expect(try await kernel.next() == .disconnect)
        await stopping.value
    }
}
