import Foundation
import Synchronization
import SwitchboardTestSupport
import Testing
@testable import ZeroMQ

@Suite("SocketLoop: sockets on one thread, used from async code")
struct SocketLoopTests {
    @Test("8 concurrent tasks send 100,000 messages: each arrives exactly once, in order per task")
    func concurrentSenders() async throws {
        let context = try ZMQContext()
        let loop = try SocketLoop(context: context, name: "test-loop")
        let receiver = try await LoopSocket.open(.pull, on: loop) { try $0.bind("tcp://127.0.0.1:*") }
        let endpoint = try await receiver.withSocket { try $0.get(.lastEndpoint) }
        let sender = try await LoopSocket.open(.push, on: loop) { try $0.connect(endpoint) }
        let tasks = 8, perTask = 12_500

        let counts = try await within(60, "100,000 messages") {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for task in 0..<tasks {
                    group.addTask {
                        for sequence in 0..<perTask {
                            try sender.send(["\(task)", "\(sequence)"])
                        }
                    }
                }
                var next = [Int](repeating: 0, count: tasks)
                var received = 0
                for try await message in receiver.messages {
                    let task = Int(message[0].string!)!, sequence = Int(message[1].string!)!
                    #expect(sequence == next[task], "task \(task): expected \(next[task]), got \(sequence)")
                    next[task] = sequence + 1
                    received += 1
                    if received == tasks * perTask { break }
                }
                try await group.waitForAll()
                return next
            }
        }
        #expect(counts == [Int](repeating: perTask, count: tasks))
        #expect(receiver.tryReceive() == nil)
        await loop.shutdown()
    }

    @Test("a small buffer pushes back instead of dropping: 20,000 messages to a slow reader")
    func backpressure() async throws {
        let context = try ZMQContext()
        let loop = try SocketLoop(context: context)
        let endpoint = inprocEndpoint()
        let receiver = try await LoopSocket.open(.pull, on: loop, bufferSize: 8) {
            try $0.set(.receiveHighWaterMark, 10)
            try $0.bind(endpoint)
        }
        let sender = try await LoopSocket.open(.push, on: loop) {
            try $0.set(.sendHighWaterMark, 10)
            try $0.connect(endpoint)
        }
        let total = 20_000
        try await within(60, "slow reader") {
            async let sending: Void = {
                for index in 0..<total { try sender.send(["\(index)"]) }
            }()
            for index in 0..<total {
                if index % 1_000 == 0 { await Task.yield() }
                let message = try await receiver.receive()
                #expect(message[0].string == "\(index)")
            }
            try await sending
        }
        await loop.shutdown()
    }

    /// An actor pinned to the loop owns a socket outright and uses it synchronously.
    actor Echo {
        let loop: SocketLoop
        private var socket: ZMQSocket?
        private(set) var echoed = 0
        nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

        init(loop: SocketLoop) { self.loop = loop }

        func start(endpoint: String) throws {
            let socket = try ZMQSocket(loop.context, .router)
            try socket.bind(endpoint)
            self.socket = socket
            _ = loop.register(socket) { [weak self] message in
                // Handlers run on the loop thread, which is this actor's executor.
                self?.assumeIsolated { echo in echo.handle(message) }
            }
        }

        private func handle(_ message: Message) {
            echoed += 1
            try? socket?.send(message, options: .dontWait)
        }
    }

    @Test("an actor pinned to the loop serves a socket with no hop per message")
    func pinnedActor() async throws {
        let context = try ZMQContext()
        let loop = try SocketLoop(context: context)
        let echo = Echo(loop: loop)
        let endpoint = inprocEndpoint()
        try await echo.start(endpoint: endpoint)
        let client = try await LoopSocket.open(.dealer, on: loop) { try $0.connect(endpoint) }
        try await within(10, "echo") {
            for index in 0..<1_000 {
                try client.send(["ping \(index)"])
                #expect(try await client.receive() == ["ping \(index)"])
            }
        }
        #expect(await echo.echoed == 1_000)
        await loop.shutdown()
    }

    @Test("timers fire in order on the loop thread, and a cancelled timer does not")
    func timers() async throws {
        let context = try ZMQContext()
        let loop = try SocketLoop(context: context)
        let order = Mutex<[String]>([])
        try await within(5, "timers") {
            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                loop.execute {
                    var ticks = 0
                    loop.schedule(after: .milliseconds(30)) {
                        #expect(loop.isLoopThread)
                        order.withLock { $0.append("30ms") }
                    }
                    let cancelled = loop.schedule(after: .milliseconds(10)) { order.withLock { $0.append("cancelled") } }
                    cancelled.cancel()
                    loop.schedule(after: .milliseconds(5)) { order.withLock { $0.append("5ms") } }
                    var repeating: LoopTimer?
                    repeating = loop.scheduleRepeating(every: .milliseconds(15)) {
                        ticks += 1
                        order.withLock { $0.append("tick") }
                        if ticks == 3 {
                            repeating?.cancel()
                            loop.schedule(after: .milliseconds(40)) { done.resume() }
                        }
                    }
                }
            }
        }
        let seen = order.withLock { $0 }
        #expect(seen.first == "5ms")
        #expect(!seen.contains("cancelled"))
        #expect(seen.filter { $0 == "tick" }.count == 3)
        #expect(seen.contains("30ms"))
        await loop.shutdown()
    }

    @Test("a socket registered as receiving only (not looked at after every turn) gets what waited before it was registered, then every message, however they come")
    func receivingOnly() async throws {
        let context = try ZMQContext()
        let loop = try SocketLoop(context: context, name: "receiving-only")
        let endpoint = inprocEndpoint("receiving-only")
        let (received, arrived) = AsyncStream.makeStream(of: Int.self)
        try await loop.run {
            let receiver = try ZMQSocket(context, .pull)
            try receiver.bind(endpoint)
            // Waiting before the loop polls the socket. (Their sender is the loop's from here
            // on, kept open until it shuts down.)
            let first = try ZMQSocket(context, .push)
            try first.connect(endpoint)
            for n in 0..<5 { try first.send(["\(n)"]) }
            _ = loop.register(first) { _ in }
            _ = loop.register(receivingOnly: receiver) { message in arrived.yield(Int(message[0].string!)!) }
        }
        let sender = try await LoopSocket.open(.push, on: loop) { try $0.connect(endpoint) }
        let all = try await within(30, "20,005 messages") {
            var seen: [Int] = []
            var iterator = received.makeAsyncIterator()
            // What waited comes before anything else wakes the loop.
            while seen.count < 5, let n = await iterator.next() { seen.append(n) }
            // The rest one at a time (each wakes the loop) and in bursts (read in one go).
            for n in 5..<10 {
                try sender.send(["\(n)"])
                guard let next = await iterator.next() else { return seen }
                seen.append(next)
            }
            for n in 10..<20_005 { try sender.send(["\(n)"]) }
            while seen.count < 20_005, let n = await iterator.next() { seen.append(n) }
            return seen
        }
        #expect(all == Array(0..<20_005))
        await loop.shutdown()
    }

    @Test("a stopped loop is freed with its context and what its handlers and timers held")
    func stoppedLoopIsFreed() async throws {
        // What owns a loop is what its handlers and timers usually capture (a client, a
        // host): a reference kept after the loop stops keeps the owner, the loop, its
        // context and the context's threads and descriptors for good.
        final class Owner: @unchecked Sendable { var loop: SocketLoop? }
        weak var weakLoop: SocketLoop?
        weak var weakContext: ZMQContext?
        weak var weakOwner: Owner?
        do {
            let context = try ZMQContext()
            let loop = try SocketLoop(context: context)
            let owner = Owner()
            owner.loop = loop
            (weakLoop, weakContext, weakOwner) = (loop, context, owner)
            try await loop.run {
                let socket = try ZMQSocket(context, .pull)
                try socket.bind(inprocEndpoint("freed"))
                let registration = loop.register(socket) { _ in _ = owner }
                registration.onSendError = { _, _ in _ = owner }
                registration.afterReading = { _ = owner }
                // A repeating timer nobody cancels, and a one-shot one still pending.
                loop.scheduleRepeating(every: .milliseconds(1)) { _ = owner }
                loop.schedule(after: .seconds(60)) { _ = owner }
            }
            await loop.shutdown()
        }
        // The loop's thread lets go of the loop as it ends, just after `shutdown` returns.
        let deadline = ContinuousClock.now + .seconds(5)
        while weakLoop != nil, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(2)) }
        #expect(weakLoop == nil)
        #expect(weakOwner == nil)
        #expect(weakContext == nil)
    }

    @Test("a timer scheduled by queued work fires although nothing else wakes the loop")
    func timerFromQueuedWork() async throws {
        let context = try ZMQContext()
        let loop = try SocketLoop(context: context)
        // Let the loop fall asleep with no timers at all.
        _ = try await loop.run { 0 }
        try await within(5, "the timer to fire") {
            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                loop.execute {
                    loop.schedule(after: .milliseconds(20)) { done.resume() }
                }
            }
        }
        await loop.shutdown()
    }

    @Test("a cancelled receive ends with CancellationError and the socket stays usable")
    func cancelReceive() async throws {
        let context = try ZMQContext()
        let loop = try SocketLoop(context: context)
        let endpoint = inprocEndpoint()
        let receiver = try await LoopSocket.open(.pull, on: loop) { try $0.bind(endpoint) }
        let waiting = Task { try await receiver.receive() }
        waiting.cancel()
        await #expect(throws: CancellationError.self) { try await waiting.value }
        let sender = try await LoopSocket.open(.push, on: loop) { try $0.connect(endpoint) }
        try sender.send(["after"])
        #expect(try await within(5, "receive after cancel") { try await receiver.receive() } == ["after"])
        await loop.shutdown()
    }

    @Test("shutdown closes every socket: receivers end, later sends fail, nothing hangs")
    func shutdown() async throws {
        let context = try ZMQContext()
        let loop = try SocketLoop(context: context)
        let socket = try await LoopSocket.open(.pull, on: loop) { try $0.bind(inprocEndpoint()) }
        let iterating = Task { () -> Int in
            var count = 0
            for try await _ in socket.messages { count += 1 }
            return count
        }
        let receiving = Task { try await socket.receive() }
        try await within(5, "shutdown") { await loop.shutdown() }
        #expect(try await within(5, "iteration to end") { try await iterating.value } == 0)
        await #expect(throws: ZMQError.self) { try await receiving.value }
        #expect(throws: ZMQError.self) { try socket.send(["late"]) }
        await loop.shutdown()
        // Work sent to a stopped loop is refused, not lost in a queue nobody reads.
        await #expect(throws: (any Error).self) { _ = try await LoopSocket.open(.push, on: loop) }
    }

    @Test("sendAndConfirm reports an unroutable peer; plain sends count it")
    func confirmedSend() async throws {
        let context = try ZMQContext()
        let loop = try SocketLoop(context: context)
        let router = try await LoopSocket.open(.router, on: loop) {
            try $0.set(.routerMandatory, true)
            try $0.bind(inprocEndpoint())
        }
        let error = await #expect(throws: ZMQError.self) { try await router.sendAndConfirm(["nobody", "x"]) }
        #expect(error?.isUnroutable == true)
        await loop.shutdown()
    }

    @Test("a task that prefers the loop runs its nonisolated code there without a job per hop, and its actor's code as the actor's")
    func taskExecutor() async throws {
        let context = try ZMQContext()
        let loop = try SocketLoop(context: context)
        let pinned = PinnedCounter(loop: loop)
        let before = try await loop.run { loop.jobsRun }
        let (onLoop, depth) = await withTaskExecutorPreference(loop.taskExecutor) {
            (loop.isLoopThread, await nestedNonisolated(depth: 50))
        }
        let after = try await loop.run { loop.jobsRun }
        #expect(onLoop && depth == 50)
        // Run as isolated to the loop, each nonisolated function's hop to the generic executor
        // was a job of its own (50 and more here): a task's code runs as nonisolated code.
        #expect(after - before < 10, "\(after - before) jobs for one task's nonisolated calls")
        // An actor pinned to the loop is still served isolated, from a task that prefers it.
        let counted = await withTaskExecutorPreference(loop.taskExecutor) { await pinned.increment() }
        #expect(counted == 1)
        await loop.shutdown()
    }

    @Test("loop-only APIs know their thread")
    func loopThread() async throws {
        let context = try ZMQContext()
        let loop = try SocketLoop(context: context)
        #expect(!loop.isLoopThread)
        #expect(try await loop.run { loop.isLoopThread })
        await loop.shutdown()
    }
}

/// Calls itself `depth` times, each call a nonisolated async function.
private nonisolated func nestedNonisolated(depth: Int) async -> Int {
    guard depth > 0 else { return 0 }
    return await nestedNonisolated(depth: depth - 1) + 1
}

/// An actor on a loop, checked to run isolated there.
private actor PinnedCounter {
    nonisolated let loop: SocketLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    private var count = 0
    init(loop: SocketLoop) { self.loop = loop }
    func increment() -> Int {
        loop.preconditionLoopThread()
        count += 1
        return count
    }
}
