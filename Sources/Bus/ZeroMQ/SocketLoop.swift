internal import CZeroMQ
import DequeModule
import Dispatch
import Synchronization
#if canImport(Glibc)
internal import Glibc
#endif

/// A thread that owns ZeroMQ sockets and serves them to Swift concurrency.
///
/// # Why
/// libzmq sockets are not thread-safe, while tasks and actors hop between the threads of
/// the cooperative pool. A `SocketLoop` keeps a set of sockets on one dedicated thread for
/// their whole life, and everything else reaches them through that thread:
///
/// - **Sends** from any thread are queued to the loop (a lock and an `eventfd` that wakes
///   it only when it sleeps) and written by the loop; a message libzmq cannot take yet
///   (`EAGAIN`) waits in a per-socket backlog until the socket is writable.
/// - **Receives**: the loop waits in `poll` on its sockets' `ZMQ_FD`s and the wake-up
///   descriptor, drains readable sockets and hands each message to the socket's handler.
///   A handler that cannot keep up pauses its socket's reading: libzmq's high-water mark
///   then pushes back on the peer, so nothing is dropped and memory stays bounded.
/// - **Actors**: the loop is also a `SerialExecutor`. An actor whose `unownedExecutor` is
///   the loop's runs *on* the loop thread, so it may own sockets outright and use them
///   synchronously, with no hop per message. This is the one way a component owns state
///   beside its sockets (the kernel, `ServiceHost`'s connections, `BusClient`, `Subscription`;
///   docs/BRIDGE.md).
/// - **Tasks**: ``taskExecutor`` is the same thread as a `TaskExecutor`. A task that prefers
///   it runs its own code and the default actors it calls here, and is resumed here when
///   answered, with no thread woken per request (the service host's handlers,
///   `BusClient.executor`).
/// - **Timers** (heartbeats, expiry) run on the loop too, so they need no locking.
///
/// One loop can serve many sockets; a process uses one loop per busy component.
/// Call ``shutdown()`` when done: it closes the loop's sockets and ends the thread.
public final class SocketLoop: SerialExecutor, @unchecked Sendable {
    // `@unchecked`: cross-thread state is behind `shared` (a Mutex) or atomic; the rest
    // (`registrations`, `timers`, poll arrays) is touched only on the loop thread.

    public let context: ZMQContext
    public let name: String
    /// The loop as a task executor, for tasks that prefer its thread.
    public let taskExecutor = LoopTaskExecutor()

    enum Work {
        /// A job enqueued on the loop as an actor's serial executor.
        case actorJob(UnownedJob)
        /// A job of a task that prefers ``taskExecutor``, running nonisolated code.
        case taskJob(UnownedJob)
        case call(@Sendable () -> Void)
        case stop(UnsafeContinuation<Void, Never>?)
    }

    enum RunState { case running, stopped }

    struct Shared: ~Copyable {
        var work: Deque<Work> = []
        var sleeping = false
        var state: RunState = .running
    }

    private let shared = Mutex(Shared())
    private let wakeFD: Int32
    private let threadID = Atomic<UInt>(0)
    private let afterStop = DispatchQueue(label: "SocketLoop.afterStop")

    // Loop-thread state.
    private var registrations: [SocketRegistration] = []
    /// The registrations whose sockets may be used between turns (sent on, or read outside
    /// their handler): their events are looked at after every turn.
    private var usedBetweenTurns: [SocketRegistration] = []
    private var pollSetChanged = true
    /// The wake-up descriptor, then each polled registration's `ZMQ_FD`.
    private var pollDescriptors: [pollfd] = []
    private var pollOwners: [SocketRegistration] = []
    private var timers: [LoopTimer] = []
    private var nextTimerID: UInt64 = 0
    private var stopWaiters: [UnsafeContinuation<Void, Never>] = []
    private var finishing = false
    /// Executor jobs run (actors' and tasks'), for tests that count hops. Loop thread only.
    package private(set) var jobsRun = 0

    /// Starts a loop thread.
    /// - Parameters:
    ///   - context: the context the loop's sockets are opened in.
    ///   - name: the thread's name, shown by debuggers and `top -H` (15 characters used).
    public init(context: ZMQContext, name: String = "zmq-loop") throws(ZMQError) {
        self.context = context
        self.name = name
        let fd = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
        guard fd >= 0 else { throw ZMQError(call: "eventfd", code: errno) }
        wakeFD = fd
        var thread = pthread_t()
        let retained = Unmanaged.passRetained(self).toOpaque()
        let rc = pthread_create(&thread, nil, { argument in
            // The thread holds the loop until it ends, so the loop outlives its thread.
            let loop = Unmanaged<SocketLoop>.fromOpaque(argument!).takeRetainedValue()
            loop.runLoop()
            return nil
        }, retained)
        guard rc == 0 else {
            Unmanaged<SocketLoop>.fromOpaque(retained).release()
            close(fd)
            throw ZMQError(call: "pthread_create", code: rc)
        }
        pthread_detach(thread)
        taskExecutor.loop = self
    }

    deinit { close(wakeFD) }

    // MARK: Threads and the executor

    /// Whether the caller runs on this loop's thread.
    public var isLoopThread: Bool {
        threadID.load(ordering: .acquiring) == currentThreadID()
    }

    /// Stops with a message when called off the loop thread; for loop-only APIs.
    @inline(__always)
    public func preconditionLoopThread(_ function: StaticString = #function) {
        precondition(isLoopThread, "SocketLoop '\(name)': \(function) must run on the loop thread")
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        submit(.actorJob(UnownedJob(job)))
    }

    public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        UnownedSerialExecutor(ordinary: self)
    }

    public func checkIsolated() {
        // Asked for each request a hosted service answers and a client sends (`assumeIsolated`
        // from a task running on the loop as its task executor): the thread first, without
        // the lock. After the thread ended, late jobs run one by one on `afterStop` instead.
        if isLoopThread || shared.withLock({ $0.state == .stopped }) { return }
        preconditionLoopThread()
    }

    /// Runs a job as what it was enqueued to: a task's as its nonisolated code on the task
    /// executor; an actor's isolated to the actor, on the task executor too, since the tasks
    /// that call the actors pinned here prefer it (else each hop back to the same actor would
    /// count as a change of task executor, and be a job of its own). Run as isolated to the
    /// loop, a task's nonisolated code hopped to the generic executor through a job of its
    /// own at each async function it entered, many per request in a service host.
    private func run(_ work: Work) {
        switch work {
        case .actorJob(let job):
            jobsRun += 1
            job.runSynchronously(isolatedTo: asUnownedSerialExecutor(), taskExecutor: taskExecutor.asUnownedTaskExecutor())
        case .taskJob(let job):
            jobsRun += 1
            job.runSynchronously(on: taskExecutor.asUnownedTaskExecutor())
        case .call(let body): body()
        case .stop: break
        }
    }

    /// Runs `body` on the loop thread soon; safe to call from any thread.
    public func execute(_ body: @escaping @Sendable () -> Void) {
        submit(.call(body))
    }

    /// Runs `body` on the loop thread and returns its result. Sockets may be used inside.
    /// Throws ``SocketLoopStopped`` once the loop has shut down.
    public func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        if isLoopThread { return try body() }
        return try await withUnsafeThrowingContinuation { continuation in
            let accepted = submit(.call {
                do { continuation.resume(returning: try body()) } catch { continuation.resume(throwing: error) }
            })
            if !accepted { continuation.resume(throwing: SocketLoopStopped(loop: name)) }
        }
    }

    /// Closes every socket of the loop and ends its thread, after the work queued before
    /// this call. Messages still in send backlogs are dropped. Calling it again is harmless.
    public func shutdown() async {
        if isLoopThread {
            submit(.stop(nil))
            return
        }
        // A loop that already stopped resumes the continuation in `runAfterStop`.
        await withUnsafeContinuation { continuation in submit(.stop(continuation)) }
    }

    /// Starts shutting down without waiting: for `deinit`s of owners that were not stopped.
    public func beginShutdown() {
        submit(.stop(nil))
    }

    /// Queues work and wakes the loop if it sleeps. Returns false once the loop stopped.
    @discardableResult
    func submit(_ work: consuming Work) -> Bool {
        let (accepted, wake) = shared.withLock { shared -> (Bool, Bool) in
            guard shared.state != .stopped else { return (false, false) }
            shared.work.append(work)
            let wake = shared.sleeping
            shared.sleeping = false
            return (true, wake)
        }
        if wake {
            var one: UInt64 = 1
            _ = Glibc.write(wakeFD, &one, 8)
        }
        if !accepted { runAfterStop(work) }
        return accepted
    }

    /// Work that arrives after the thread ended. Executor jobs still have to run (an actor
    /// pinned here may be called late), one at a time and never inside the caller's task,
    /// so on a serial queue; socket work has nothing left to act on.
    private func runAfterStop(_ work: Work) {
        switch work {
        case .actorJob(let job):
            let executor = asUnownedSerialExecutor()
            afterStop.async { job.runSynchronously(on: executor) }
        case .taskJob(let job):
            let executor = taskExecutor.asUnownedTaskExecutor()
            afterStop.async { job.runSynchronously(on: executor) }
        case .call: break
        case .stop(let continuation): continuation?.resume()
        }
    }

    // MARK: Sockets (loop thread only)

    /// Registers `socket` with the loop; `onMessage` is called on the loop thread for each
    /// message received on it. Loop thread only (inside ``run(_:)`` or a pinned actor).
    public func register(_ socket: ZMQSocket, onMessage: @escaping (Message) -> Void) -> SocketRegistration {
        preconditionLoopThread()
        return add(SocketRegistration(loop: self, socket: socket, handler: .message(onMessage)))
    }

    /// Registers `socket` with a handler given each message's parts where libzmq holds them,
    /// valid during the call: for a hot path that makes frames only of the parts it keeps.
    public func register(readingParts socket: ZMQSocket, onParts: @escaping (ReceivedParts) -> Void) -> SocketRegistration {
        preconditionLoopThread()
        return add(SocketRegistration(loop: self, socket: socket, handler: .parts(onParts)))
    }

    /// Registers a socket that nothing but `onMessage` uses, and only to receive: another
    /// socket's events (``socketEvents(of:in:_:)``). It costs the loop nothing until its
    /// descriptor signals; a socket that is also sent on must be looked at after every turn.
    public func register(receivingOnly socket: ZMQSocket, onMessage: @escaping (Message) -> Void) -> SocketRegistration {
        preconditionLoopThread()
        let registration = add(SocketRegistration(loop: self, socket: socket, handler: .message(onMessage), onlyReceives: true))
        // What waited before the loop polled it may never signal its descriptor: read once now.
        schedule(after: .zero) { [weak registration] in
            guard let registration, !registration.isClosed else { return }
            registration.serveAllEvents()
        }
        return registration
    }

    private func add(_ registration: SocketRegistration) -> SocketRegistration {
        registrations.append(registration)
        if !registration.onlyReceives { usedBetweenTurns.append(registration) }
        pollSetChanged = true
        if finishing { registration.close(reason: stoppedError) }
        return registration
    }

    func unregister(_ registration: SocketRegistration) {
        registrations.removeAll { $0 === registration }
        usedBetweenTurns.removeAll { $0 === registration }
        pollSetChanged = true
    }

    // MARK: Timers (loop thread only)

    /// Calls `body` on the loop thread after `delay`, once. Loop thread only.
    @discardableResult
    public func schedule(after delay: Duration, _ body: @escaping () -> Void) -> LoopTimer {
        preconditionLoopThread()
        nextTimerID += 1
        let timer = LoopTimer(id: nextTimerID, deadline: monotonicNanoseconds() + delay.nanoseconds, body: body)
        let index = timers.firstIndex { $0.deadline > timer.deadline } ?? timers.endIndex
        timers.insert(timer, at: index)
        return timer
    }

    /// Calls `body` on the loop thread every `interval` until the returned timer is cancelled.
    @discardableResult
    public func scheduleRepeating(every interval: Duration, _ body: @escaping () -> Void) -> LoopTimer {
        preconditionLoopThread()
        let handle = LoopTimer(id: 0, deadline: 0, body: {})
        func arm() {
            let next = schedule(after: interval) {
                guard !handle.isCancelled else { return }
                body()
                arm()
            }
            handle.current = next
        }
        arm()
        return handle
    }

    // MARK: The loop

    // A turn of the loop walks its arrays by index, not with `for`-`in`, `enumerated()` or
    // `first(where:)`: in a debug build those go through the generic iterator, which
    // allocates a coroutine frame for each element it reads, so what a message costs would
    // grow with how many turns it took (the test command counts allocations per message on
    // a debug build).

    /// How many times the loop takes newly queued work before it polls its sockets again.
    static let workRoundsPerPoll = 8

    private func runLoop() {
        threadID.store(currentThreadID(), ordering: .releasing)
        czmq_name_current_thread(String(name.prefix(15)))
        var batch: Deque<Work> = []
        while true {
            // 1. Take everything queued and run it; what that work queued (a task resumed on
            //    the loop, a hop to an actor pinned here) runs too, a few rounds before the
            //    sockets are polled again: a poll per hop costs a system call each.
            var stopRequested = false
            for _ in 0..<Self.workRoundsPerPoll {
                shared.withLock { swap(&batch, &$0.work) }
                if batch.isEmpty { break }
                while let work = batch.popFirst() {
                    switch work {
                    case .actorJob, .taskJob, .call: run(work)
                    case .stop(let continuation):
                        if let continuation { stopWaiters.append(continuation) }
                        stopRequested = true
                    }
                }
                if stopRequested { break }
            }
            if stopRequested { break }
            // 2. Serve the sockets used since their events were read: libzmq may have taken in
            //    their descriptor's signal meanwhile (a send, a receive, an option).
            let served = serveSocketsUsedSinceRead()
            // 3. Sleep until a socket's descriptor, the wake-up descriptor or the next timer
            //    (including timers the work just scheduled), unless more work came in.
            let timeout = served ? 0 : nextPollTimeout()
            let sleep = shared.withLock { shared -> Bool in
                shared.sleeping = shared.work.isEmpty && timeout != 0
                return shared.sleeping
            }
            poll(timeoutMilliseconds: sleep ? timeout : 0)
            runDueTimers()
        }
        finish()
    }

    private func finish() {
        finishing = true
        // Close sockets and wake their consumers before anyone waiting on shutdown resumes.
        for registration in registrations { registration.close(reason: stoppedError) }
        registrations.removeAll()
        // The poll set holds the registrations too (and through their handlers, often the
        // loop's owners, which hold the loop): a stopped loop must let go of them.
        pollOwners.removeAll()
        pollDescriptors.removeAll()
        timers.removeAll()
        // From here on `submit` refuses work; what was queued before still runs here, on the
        // loop thread, so no `run` continuation is left hanging. Sockets it opens are closed
        // at once (see `register`).
        let late = shared.withLock { shared -> Deque<Work> in
            shared.state = .stopped
            defer { shared.work.removeAll() }
            return shared.work
        }
        for work in late {
            switch work {
            case .actorJob, .taskJob, .call: run(work)
            case .stop(let continuation): continuation?.resume()
            }
        }
        for waiter in stopWaiters { waiter.resume() }
        stopWaiters.removeAll()
    }

    private var stoppedError: ZMQError { ZMQError(call: "SocketLoop(\(name)) shut down", code: czmq_ETERM) }

    /// Why not `zmq_poll`: it reads every socket's events before and after it sleeps, and for
    /// a socket with nothing new that is a system call (libzmq polls the socket's mailbox), so
    /// the kernel's five sockets cost some fifteen system calls per wake-up. Here a socket's
    /// events are read only when its descriptor signalled or the socket was used since.
    private func poll(timeoutMilliseconds: Int) {
        if pollSetChanged {
            pollOwners = registrations
            pollDescriptors = [pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0)]
            for registration in pollOwners {
                pollDescriptors.append(pollfd(fd: registration.descriptor, events: Int16(POLLIN), revents: 0))
            }
            pollSetChanged = false
        }
        let count = nfds_t(pollDescriptors.count)
        let ready = pollDescriptors.withUnsafeMutableBufferPointer { Glibc.poll($0.baseAddress, count, Int32(timeoutMilliseconds)) }
        shared.withLock { $0.sleeping = false }
        guard ready > 0 else { return }
        if pollDescriptors[0].revents != 0 {
            var value: UInt64 = 0
            _ = Glibc.read(wakeFD, &value, 8)
        }
        // Handlers may register or close sockets; serve the set polled, skipping closed ones.
        // (Read from locals: a property read per socket is a check per socket per turn.)
        let owners = pollOwners, descriptors = pollDescriptors
        var index = 0
        while index < owners.count {
            if descriptors[index + 1].revents != 0 {
                let owner = owners[index]
                if owner.onlyReceives { owner.serveAllEvents() } else { owner.serveEvents() }
            }
            index += 1
        }
    }

    /// Reads and serves the events of every socket used since they were last read; whether
    /// any read or sent (then the loop polls without sleeping: there may be more waiting,
    /// read on the next turn, when the socket counts as used again).
    private func serveSocketsUsedSinceRead() -> Bool {
        // The set as it was: a handler may register or close sockets.
        let current = usedBetweenTurns
        var served = false
        var index = 0
        while index < current.count {
            let registration = current[index]
            if !registration.isClosed && registration.needsEventsRead && registration.serveEvents() { served = true }
            index += 1
        }
        return served
    }

    private func nextPollTimeout() -> Int {
        let pending = timers
        var index = 0
        while index < pending.count && pending[index].isCancelled { index += 1 }
        guard index < pending.count else { return -1 }
        let deadline = pending[index].deadline
        let now = monotonicNanoseconds()
        if deadline <= now { return 0 }
        // Round up so a timer never fires early.
        return Int((deadline - now + 999_999) / 1_000_000)
    }

    private func runDueTimers() {
        guard !timers.isEmpty else { return }
        let now = monotonicNanoseconds()
        while !timers.isEmpty {
            let first = timers[0]
            guard first.deadline <= now || first.isCancelled else { return }
            timers.removeFirst()
            if !first.isCancelled { first.body() }
        }
    }
}

/// A ``SocketLoop``'s thread as a `TaskExecutor`: a task that prefers it
/// (`group.addTask(executorPreference: loop.taskExecutor)`) runs its nonisolated code there.
/// Apart from the loop (which is a `SerialExecutor`) because an executor is told only the job,
/// not which of the two it was enqueued to, and each must run as what it is.
public final class LoopTaskExecutor: TaskExecutor, @unchecked Sendable {
    // `@unchecked`: `loop` is set once, before the executor is handed out.
    /// Weak: the loop holds its task executor, and a task may hold the executor after the loop
    /// is gone; its jobs then run one by one on a queue of their own.
    fileprivate weak var loop: SocketLoop?
    private let orphaned = DispatchQueue(label: "LoopTaskExecutor.orphaned")

    fileprivate init() {}

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        if let loop {
            loop.submit(.taskJob(job))
        } else {
            let executor = asUnownedTaskExecutor()
            orphaned.async { job.runSynchronously(on: executor) }
        }
    }

    public func asUnownedTaskExecutor() -> UnownedTaskExecutor {
        UnownedTaskExecutor(ordinary: self)
    }
}

/// The error for work handed to a ``SocketLoop`` after it shut down.
public struct SocketLoopStopped: Error, Sendable, CustomStringConvertible {
    public let loop: String
    public var description: String { "SocketLoop '\(loop)' has shut down" }
}

/// A timer scheduled on a ``SocketLoop``; cancel it on the loop thread.
public final class LoopTimer {
    let id: UInt64
    let deadline: UInt64
    let body: () -> Void
    fileprivate(set) var isCancelled = false
    /// For a repeating timer: the one-shot timer currently armed. Weak: the loop holds it,
    /// and it holds this handle (to re-arm), so a strong reference back would be a cycle
    /// that outlives the loop and keeps whatever the body captured.
    fileprivate weak var current: LoopTimer?

    init(id: UInt64, deadline: UInt64, body: @escaping () -> Void) {
        self.id = id
        self.deadline = deadline
        self.body = body
    }

    /// Stops the timer; it will not fire again.
    public func cancel() {
        isCancelled = true
        current?.cancel()
    }
}

/// A number for the calling thread (never 0, which marks "not started").
@inline(__always)
func currentThreadID() -> UInt {
    UInt(pthread_self())
}
