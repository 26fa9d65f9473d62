@testable import BusKit
import BusProtocol
import Contracts
import Foundation
import Kernel
import Synchronization
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// A service with one method that answers in parts: the numbers 1...n, one a part.
private enum NumbersAPI {
    static let service = "numbers"
    struct Count: Codable, Sendable {
        var n: Int
        /// Throws -32042 after this many parts.
        var failAfter: Int?
        /// Waits (until cancelled) after this many parts.
        var holdAfter: Int?
        /// Characters of padding in each part.
        var padding: Int?
        /// Milliseconds it waits before the first part.
        var startAfterMs: Int?
        /// Before the first part, waits as long as its reader reads (looking every 10 ms), as
        /// a push stream waits for its next message.
        var waitWhileRead: Bool?
    }
    struct Tally: Codable, Sendable {
        var total: Int
        var numbers: [Int]
    }
    struct Number: Codable, Sendable {
        var n: Int
        var pad: String?
    }
    static let countMethod = Method<Count, Tally>(service, "count", "The numbers 1 to n.")
    static let count = StreamMethod(countMethod, part: Number.self) { end, parts in
        var whole = end
        whole.numbers = parts.map(\.n)
        return whole
    }
}

private actor Numbers: BusService {
    static let name = NumbersAPI.service
    /// Parts its handlers have handed over, and handlers running now (a test awaits their
    /// end), over all its instances.
    static let partsSent = Atomic<Int>(0)
    static let running = Observed(0)

    nonisolated func methods(_ table: inout MethodTable<Numbers>) {
        table.onStream(NumbersAPI.count) { _, params, parts in
            Self.running.update { $0 += 1 }
            defer { Self.running.update { $0 -= 1 } }
            if let wait = params.startAfterMs { try await Task.sleep(for: .milliseconds(wait)) }
            if params.waitWhileRead == true { try await parts.pause(for: .seconds(600)) }
            for number in 0..<max(0, params.n) {
                if number == params.failAfter { throw JSONRPCError(code: -32042, message: "stopped after \(number)") }
                try await parts.send(.init(n: number + 1, pad: params.padding.map { String(repeating: "p", count: $0) }))
                Self.partsSent.add(1, ordering: .relaxed)
                if number + 1 == params.holdAfter { try await Task.sleep(for: .seconds(600)) }
            }
            return NumbersAPI.Tally(total: params.n, numbers: [])
        }
    }
}

@Suite("BusKit: replies in parts, from a hosted service's handler to a client's AsyncSequence")
struct PartStreamTests {
    private func hostNumbers(_ kernel: TestKernel, window: Int = 16) async throws -> ServiceHost<Numbers> {
        let options = ServiceHost<Numbers>.Options(brokers: [kernel.endpoints.broker], connections: 1, window: window,
                                                   heartbeatInterval: kernel.configuration.heartbeatInterval,
                                                   heartbeatLiveness: kernel.configuration.heartbeatLiveness, drainTimeout: .milliseconds(100),
                                                   maxMessageSize: kernel.configuration.maxMessageSize)
        let host = try ServiceHost(service: Numbers(), options: options)
        try await host.start()
        try await kernel.workers(NumbersAPI.service)
        return host
    }

    @Test("the parts come in order as the contract's type, then the result less the parts; asked in one reply, the parts are gathered into it; rpc.discover states the part")
    func partsInOrder() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let host = try await hostNumbers(kernel)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        let stream = bus.stream(NumbersAPI.count, .init(n: 25))
        var numbers: [Int] = []
        for try await part in stream { numbers.append(part.n) }
        #expect(numbers == Array(1...25))
        let end = try await stream.end()
        #expect(end.total == 25 && end.numbers.isEmpty)
        // The same method in one reply (7/MDP): the same answer, whole.
        #expect(try await bus.call(NumbersAPI.countMethod, .init(n: 5)).numbers == [1, 2, 3, 4, 5])
        let contract = try await bus.call(Method.discover(NumbersAPI.service))
        #expect(contract.methods.first { $0.name == "count" }?.part?.schema["properties"]?["n"] != nil)
        let document = try await bus.request(service: NumbersAPI.service, method: "rpc.discover")
        #expect(document["methods"]?.arrayValue?.first { $0["name"] == "count" }?["x-part"] != nil)
        await bus.close()
        await host.stop()
        await kernel.stop()
    }

    @Test("a service's error after some parts ends the iteration with that error; a 7/MDP worker asked for parts answers its whole result as the end")
    func errorsAndOneReplyWorkers() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let counter = try await hostNumbers(kernel)
        let echo = try await hostEcho(kernel)
        try await kernel.workers("echo")
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        let failing = bus.stream(NumbersAPI.count, .init(n: 10, failAfter: 3))
        var numbers: [Int] = []
        await #expect(throws: BusError.remote(service: NumbersAPI.service, JSONRPCError(code: -32042, message: "stopped after 3"))) {
            for try await part in failing { numbers.append(part.n) }
        }
        #expect(numbers == [1, 2, 3])
        let echoed = bus.stream(service: "echo", method: "echo", paramsText: Array(#"{"a":1}"#.utf8))
        var parts = 0
        for try await _ in echoed { parts += 1 }
        #expect(parts == 0)
        #expect(try await echoed.end() == ["a": 1])
        // Params that do not fit: the error, and no part.
        await #expect(throws: BusError.self) { _ = try await bus.stream(service: NumbersAPI.service, method: "count", paramsText: Array(#"{"n":"x"}"#.utf8)).end() }
        await bus.close()
        await echo.stop()
        await counter.stop()
        await kernel.stop()
    }

    @Test("a part over the kernel's message limit the host was given ends the stream with -32010, and the worker stays registered")
    func partOverTheLimit() async throws {
        let kernel = try await TestKernel.start {
            fastHeartbeats(&$0)
            $0.maxMessageSize = 4_096
        }
        let host = try await hostNumbers(kernel)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        var numbers: [Int] = []
        do {
            for try await part in bus.stream(NumbersAPI.count, .init(n: 3, padding: 5_000)) { numbers.append(part.n) }
            Issue.record("expected -32010")
        } catch let error as BusError {
            #expect(error.code == JSONRPCError.tooLargeCode, "\(error)")
        }
        #expect(numbers.isEmpty)
        #expect(try await bus.call(NumbersAPI.countMethod, .init(n: 2)).numbers == [1, 2])
        await bus.close()
        await host.stop()
        await kernel.stop()
    }

    @Test("a reader that falls behind its buffer, in parts or in bytes, is told: the parts it has, then -32014 reader_behind; the client goes on serving",
          arguments: [(bufferSize: 4, bufferBytes: 64 << 20, padding: 0), (bufferSize: 1_000, bufferBytes: 4_600, padding: 1_000)])
    func readerBehind(bound: (bufferSize: Int, bufferBytes: Int, padding: Int)) async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let host = try await hostNumbers(kernel)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        // Four parts fit either bound (a padded part is about 1,045 bytes), the fifth does not.
        let stream = bus.stream(NumbersAPI.count, .init(n: 50, padding: bound.padding), bufferSize: bound.bufferSize, bufferBytes: bound.bufferBytes)
        try await eventually(10, "the stream ended unread") { stream.state.ending.withLock { $0 != nil } }
        var numbers: [Int] = []
        do {
            for try await part in stream { numbers.append(part.n) }
            Issue.record("expected -32014")
        } catch let error as BusError {
            guard case .remote(_, let rpc) = error else { Issue.record("expected a remote error, got \(error)"); return }
            #expect(rpc.code == JSONRPCError.streamEndedCode)
            #expect(rpc.data?["reason"] == "reader_behind")
            #expect(rpc.data?["parts"] == 4)
        }
        #expect(numbers == [1, 2, 3, 4])
        #expect(await bus.waitingCount() == 0)
        #expect(try await bus.call(NumbersAPI.countMethod, .init(n: 2)).numbers == [1, 2])
        await bus.close()
        await host.stop()
        await kernel.stop()
    }

    @Test("leaving the loop early ends the request on the client's side: nothing waits, later parts are dropped, the client goes on serving")
    func leavingEarly() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let host = try await hostNumbers(kernel)
        // A timeout far past the wait below: only the cancel can end the request in time.
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(60))
        do {
            // The service holds after 5 parts: only the client can end this request.
            for try await part in bus.stream(NumbersAPI.count, .init(n: 10, holdAfter: 5)) where part.n == 3 { break }
        }
        try await eventually(10, "the request ended on the client's side") { await bus.waitingCount() == 0 }
        #expect(try await bus.call(NumbersAPI.countMethod, .init(n: 3)).numbers == [1, 2, 3])
        await bus.close()
        await host.stop()
        await kernel.stop()
    }

    /// How a reader leaves a long stream.
    enum Leaving: CaseIterable {
        /// Its client closed, the stream still open: nothing is said; the kernel's next part
        /// to the reader finds it gone.
        case hangsUp
        /// Its loop left after some parts: its client sends a CANCEL.
        case leavesLoop
        /// Dropped before the first part: its client's CANCEL finds the request its worker holds.
        case leavesBeforeAPart
    }

    @Test("a reader that leaves a long stream, hanging up, leaving its loop or leaving before the first part (its client cancels the request): the kernel tells the worker, whose handler ends at its next part and frees its place",
          arguments: Leaving.allCases)
    func leavingStopsTheWorker(leaving: Leaving) async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        // One place: the request after the stream is served only once the stream's is free.
        let host = try await hostNumbers(kernel, window: 1)
        let before = Numbers.partsSent.load(ordering: .relaxed)
        let reader = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(60))
        do {
            let waits = leaving == .leavesBeforeAPart ? 200 : nil
            var parts = reader.stream(NumbersAPI.count, .init(n: 1_000_000, startAfterMs: waits)).makeAsyncIterator()
            if leaving != .leavesBeforeAPart { for _ in 1...5 { _ = try await parts.next() } }
            if leaving == .hangsUp { await reader.close() }
        }  // The stream dropped unfinished: unless closed already, its client sends a CANCEL.
        // (Left before a part, the request may not have reached the handler yet.)
        if leaving == .leavesBeforeAPart { try await Numbers.running.wait(within: 30, "the handler started") { $0 == 1 } }
        try await Numbers.running.wait(within: 30, "the handler ended") { $0 == 0 }
        let made = Numbers.partsSent.load(ordering: .relaxed) - before
        #expect(made < 500_000, "the handler made \(made) parts of 1,000,000 for a reader gone")
        let bus = leaving == .hangsUp ? try await BusClient(brokers: [kernel.endpoints.broker]) : reader
        #expect(try await bus.call(KernelAPI.stats).cancelledRequests == (leaving == .hangsUp ? 0 : 1))
        #expect(try await bus.call(NumbersAPI.countMethod, .init(n: 3)).numbers == [1, 2, 3])
        await bus.close()
        await host.stop()
        await kernel.stop()
    }

    @Test("echo's numbers, a part every 10 s: a reader that leaves after the first frees the worker's place at once, not at the next part")
    func pauseEndsWhenTheReaderLeaves() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        // One place: the call after the stream is served only once the stream's is free.
        let host = try await hostEcho(kernel, connections: 1, window: 1)
        try await kernel.workers(EchoAPI.service)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(60))
        do {
            for try await number in bus.stream(EchoAPI.numbers, .init(n: 3, everyMs: 10_000)) where number == 1 { break }
        }  // Left: its client sends a CANCEL, and the kernel tells the worker.
        // Answered once the stream's place is free; the kernel holds it for a place only
        // seconds (then -32001), fewer than the handler would wait for its next part.
        #expect(try await bus.call(EchoAPI.echo, ["after": "leaving"]) == ["after": "leaving"])
        await bus.close()
        await host.stop()
        await kernel.stop()
    }

    @Test("a reader that vanishes without a word while its stream sends nothing (its process killed: no CANCEL, no part to fail): the kernel's probe, a PARTIAL of one empty frame once the stream was quiet for a worker's expiry, finds it gone, and the worker's handler is told to stop")
    func vanishedReaderIsFound() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        // One place: the request after the stream is served only once the stream's is free.
        let host = try await hostNumbers(kernel, window: 1)
        // An 18/MDP client on a socket of its own, closed with nothing more said.
        let context = try ZMQContext()
        let reader = try ZMQSocket(context, .dealer)
        try reader.set(.linger, 0)
        try reader.set(.receiveTimeout, 30_000)
        try reader.connect(kernel.endpoints.broker)
        let body = JSONRPCRequest(id: .number(1), method: NumbersAPI.countMethod.name, params: ["n": 1, "waitWhileRead": true], stream: true)
        try reader.send(MDP.request(service: NumbersAPI.service, body: [Frame(body.jsonBytes)], version: .v02))
        try await Numbers.running.wait(within: 30, "the handler started") { $0 == 1 }
        let probe = try await reader.receiveOffPool()
        #expect(probe.frames == ["MDPC02", Frame([0x02]), Frame(NumbersAPI.service), Frame()])
        reader.close()
        try await Numbers.running.wait(within: 30, "the handler ended") { $0 == 0 }
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(30))
        #expect(try await bus.call(KernelAPI.stats).cancelledRequests == 0)
        // A reader that stays drops the probes of its quiet stream, which then ends as any does.
        let quiet = bus.stream(NumbersAPI.count, .init(n: 3, startAfterMs: 2_500))
        var numbers: [Int] = []
        for try await part in quiet { numbers.append(part.n) }
        #expect(numbers == [1, 2, 3])
        #expect(try await bus.call(NumbersAPI.countMethod, .init(n: 3)).numbers == [1, 2, 3])
        await bus.close()
        await host.stop()
        await kernel.stop()
    }

    @Test("a kernel that reads nothing: the handler is held after a bounded number of parts (the socket's high-water mark, then the part outbox), not all it was asked for")
    func partsAreBoundedByWhatTheKernelReads() async throws {
        let context = try ZMQContext()
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        let router = try await kernelStandIn(at: endpoint, in: context)
        defer { withExtendedLifetime(context) { router.close() } }
        // Slow heartbeats: the worker must not give up on this silent stand-in while the test runs.
        let options = ServiceHost<Numbers>.Options(brokers: [endpoint], connections: 1, heartbeatInterval: .seconds(20),
                                                   heartbeatLiveness: 3, drainTimeout: .milliseconds(100))
        let host = try ServiceHost(service: Numbers(), options: options)
        try await host.start()
        var worker = Frame()
        repeat {
            guard case .worker(let identity, let command, _) = try MDP.decodeAtBroker(try await router.receiveOffPool()) else { continue }
            worker = identity
            if case .ready = command { break }
        } while true
        let before = Numbers.partsSent.load(ordering: .relaxed)
        let asked = 100_000
        let body = JSONRPCRequest(id: .number(1), method: NumbersAPI.countMethod.name, params: ["n": .int(Int64(asked)), "padding": 1_000], stream: true)
        try router.send(MDP.encode(.request(client: Frame("c"), body: [Frame(body.jsonBytes)]), to: worker, version: .v02))
        // The stand-in reads nothing more: the handler makes parts until it is held, then waits.
        // Held: no part made for half a second (a plateau has no event to await).
        var made = 0
        let deadline = ContinuousClock.now + .seconds(30)
        while true {
            try await Task.sleep(for: .milliseconds(500))
            let now = Numbers.partsSent.load(ordering: .relaxed) - before
            if now > 0, now == made { break }
            made = now
            guard ContinuousClock.now < deadline else { throw TimedOut(what: "the handler is held (\(made) parts made)") }
        }
        #expect(made < asked / 2, "\(made) parts of \(asked) made for a kernel that reads none")
        await host.stop()
    }

    @Test("a worker that dies mid-stream: the reader gets the parts that came, then -32014 worker_died with their count")
    func workerDiesMidStream() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let context = try ZMQContext()
        let worker = try ZMQSocket(context, .dealer)
        try worker.set(.receiveTimeout, Int32(5_000))
        try worker.connect(kernel.endpoints.broker)
        try worker.send(MDP.encode(.ready(service: "dying"), version: .v02))
        try await kernel.workers("dying")
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        let stream = bus.stream(service: "dying", method: "m", paramsText: nil)
        // The kernel's heartbeat may come first (a loaded machine).
        var command = try MDP.decodeAtWorker(try await worker.receiveOffPool())
        while case .heartbeat = command { command = try MDP.decodeAtWorker(try await worker.receiveOffPool()) }
        guard case .request(let client, let body) = command,
              case .single(.request(let request)) = JSONRPC.parseRequests(body[0].bytes), let id = request.id else {
            Issue.record("expected a JSON-RPC request")
            return
        }
        #expect(request.stream)
        for n in 1...2 {
            try worker.send(MDP.encode(.partial(client: client, body: [Frame(JSONRPC.partReply(id: id, partText: Array("\(n)".utf8)))][...]), version: .v02))
        }
        try worker.set(.linger, 0)
        worker.close()
        var parts: [JSONValue] = []
        do {
            for try await part in stream { parts.append(part) }
            Issue.record("expected -32014")
        } catch let error as BusError {
            guard case .remote(_, let rpc) = error else { Issue.record("expected a remote error, got \(error)"); return }
            #expect(rpc.code == JSONRPCError.streamEndedCode)
            #expect(rpc.data?["reason"] == "worker_died")
            #expect(rpc.data?["parts"] == 2)
        }
        #expect(parts == [1, 2])
        await bus.close()
        await kernel.stop()
    }

    @Test("a request to every worker: each echo worker's own answer, tagged with its worker, then the count; a stopped worker is not waited for")
    func everyWorker() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let one = try await hostEcho(kernel, instance: "one", connections: 1)
        let two = try await hostEcho(kernel, instance: "two", connections: 1)
        try await kernel.workers("echo", atLeast: 2)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        let gather = bus.gather(EchoAPI.whoami)
        var asked: [String] = [], answers: [String: String] = [:]
        for try await event in gather {
            switch event {
            case .asked(let workers): asked = workers
            case .answer(let worker, let outcome): answers[worker] = try outcome.get()
            }
        }
        let end = try await gather.end()
        #expect(asked.count == 2 && Set(answers.keys) == Set(asked))
        #expect(Set(answers.values) == ["one", "two"])
        #expect(end == GatherSummary(expected: 2, answered: 2, missing: []))
        // Errors come back per worker.
        var codes: [Int] = []
        for try await event in bus.gather(EchoAPI.fail, .init(code: -32042)) {
            if case .answer(_, .failure(let error)) = event { codes.append(error.code) }
        }
        #expect(codes == [-32042, -32042])
        await two.stop()
        try await kernel.workers("echo", "one echo worker left") { $0 == 1 }
        #expect(try await bus.gather(EchoAPI.whoami).end() == GatherSummary(expected: 1, answered: 1, missing: []))
        await bus.close()
        await one.stop()
        await kernel.stop()
    }
}
