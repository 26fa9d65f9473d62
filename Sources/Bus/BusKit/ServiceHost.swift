public import BusProtocol
public import Contracts
import DequeModule
import Foundation
import Synchronization
public import Logging
public import ServiceLifecycle
public import ZeroMQ

/// How a ``ServiceHost`` hosts its service. Not nested in the generic host, so the worker
/// connections that read it per request need no type looked up at run time.
public struct ServiceHostOptions: Sendable {
    /// The kernel to register with, or the two kernels of a pair: the service registers
    /// with both, so the passive one can dispatch to it the moment it takes over.
    public var brokers: [String]
    /// How many worker connections to each kernel, each served (and its handlers run)
    /// on a loop thread of its own.
    public var connections: Int
    /// Requests each connection holds at once (the window extension; 1: plain 7/MDP).
    public var window: Int
    public var heartbeatInterval: Duration
    /// Missed heartbeats after which the kernel is considered gone.
    public var heartbeatLiveness: Int
    /// How long a drain waits for requests in flight (and the kernel's word that no more come).
    public var drainTimeout: Duration
    /// Keys for a CURVE-secured kernel (a worker key; nil: plain text).
    public var curve: CurveClientKeys?
    /// The kernel's `max_message_size`: a bigger reply is answered -32010 instead (the
    /// kernel would drop the worker's connection, and the client would wait in vain).
    public var maxMessageSize: Int
    /// The kernel's `max_batch_items`: a bigger batch is refused (-32010) unanswered.
    public var maxBatchItems: Int

    public init(brokers: [String], connections: Int = 2, window: Int = 16, heartbeatInterval: Duration = .milliseconds(2_500),
                heartbeatLiveness: Int = 3, drainTimeout: Duration = .seconds(5), curve: CurveClientKeys? = nil,
                maxMessageSize: Int = MDP.defaultMaxMessageSize, maxBatchItems: Int = BodyLimits().maxBatchItems) {
        self.curve = curve
        self.maxMessageSize = maxMessageSize
        self.maxBatchItems = maxBatchItems
        self.brokers = brokers
        self.connections = connections
        self.window = window
        self.heartbeatInterval = heartbeatInterval
        self.heartbeatLiveness = heartbeatLiveness
        self.drainTimeout = drainTimeout
    }
}

/// Hosts a ``BusService`` on the bus: N Majordomo worker connections (7/MDP), each
/// registering the service, heartbeating, and answering up to `window` requests at a time
/// with the service's method table (the Switchboard window extension, docs/PROTOCOL.md;
/// a window of 1 is plain 7/MDP). Heartbeats report how many replies were errors.
/// Unknown methods get -32601, bad params -32602 naming the field, malformed JSON -32700.
///
/// After a DISCONNECT from the kernel, or when the kernel falls silent (a restart), each
/// connection registers again on a new socket; ``onReregistered`` then runs, which is
/// where a service republishes its state (see ``StatePublisher``).
///
/// A `ServiceHost` is a swift-service-lifecycle `Service`: `run()` serves until graceful
/// shutdown, then drains: each connection tells the kernel to send it nothing more
/// (`drain=1`), answers what it holds, and unregisters (DISCONNECT), so no request is
/// re-sent elsewhere. A kernel may also tell any connection to drain (`sb drain`): the
/// whole host then drains the same way and `run()` returns. Requests
/// are answered in task groups of ``serve(onRegistered:until:)``, which end with it.
public final class ServiceHost<Hosted: BusService>: Service {
    /// How the service is hosted (``ServiceHostOptions``).
    public typealias Options = ServiceHostOptions

    public let service: Hosted
    public let options: Options
    /// A loop thread per worker connection: it serves the connection's socket and runs the
    /// handlers of the requests that came on it (a hop to the cooperative pool and back
    /// would wake two threads per request), so a host answers on as many threads as it has
    /// connections.
    let loops: [SocketLoop]
    private let logger: Logger
    private let workers: [WorkerConnection]
    private let ready: @Sendable () async -> Void
    /// Told when a kernel asks a connection to drain: the whole host drains and leaves.
    private let (drainRequests, drainRequested) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))

    /// - Parameters:
    ///   - onReregistered: runs after the kernel forgot this service (it restarted) and the
    ///     service registered again.
    ///   - ready: ``run()`` registers once this returns: a service that cannot serve yet (its
    ///     database unreachable) is not offered to clients meanwhile.
    public init(service: Hosted, options: Options, context: ZMQContext? = nil, logger: Logger? = nil,
                onReregistered: @escaping @Sendable () async -> Void = {}, ready: @escaping @Sendable () async -> Void = {}) throws {
        precondition(!options.brokers.isEmpty && options.connections > 0, "ServiceHost needs a broker and a connection")
        precondition((1...MDP.maxWindow).contains(options.window), "ServiceHost's window must be 1...\(MDP.maxWindow)")
        self.service = service
        self.options = options
        let logger = logger ?? Logger(label: "switchboard.\(Hosted.name)")
        self.logger = logger
        self.ready = ready
        let context = try context ?? ZMQContext()
        let places = options.brokers.flatMap { broker in (0..<options.connections).map { _ in broker } }
        let loops = try places.indices.map { index in try SocketLoop(context: context, name: "\(Hosted.name.prefix(10))-\(index)") }
        self.loops = loops
        var table = MethodTable(of: service)
        table.logger = logger
        table.limits = BodyLimits(maxBatchItems: options.maxBatchItems, maxReplyBytes: options.maxMessageSize)
        let frozen = table
        // The connections' routing ids start with it: the kernel counts the death of this
        // process, with all its connections, as one (kernel.max_deliveries), and an operator
        // finds the process by it (`sb workers`, `sb drain --worker`).
        let process = Self.processID()
        let requests = drainRequested
        workers = places.enumerated().map { index, broker in
            WorkerConnection(loop: loops[index], process: process, index: index, broker: broker, serviceName: Hosted.name,
                             streams: frozen.streams, answer: { body, parts in await frozen.answer(body: body, on: service, parts: parts) },
                             options: options, logger: logger, onReregistered: onReregistered, onDrainRequested: { requests.yield() })
        }
    }

    /// `HOST:PID:RANDOM`: readable, and unique however many hosts share a machine or a pid.
    private static func processID() -> String {
        let host = ProcessInfo.processInfo.hostName.filter { $0 != "/" && $0 != ":" }.prefix(64)
        return "\(host):\(getpid()):\(UUID().uuidString.prefix(8).lowercased())"
    }

    /// Registers every worker connection with the kernel (`onRegistered` runs once the
    /// READYs are queued: 7/MDP has no answer to READY), answers requests until `until`
    /// returns, then unregisters: waits (up to the drain timeout) for requests in flight,
    /// sends DISCONNECT, closes every connection and ends the loop. Requests still running
    /// after the drain timeout are cancelled; nothing outlives this call.
    public func serve(onRegistered: () -> Void = {}, until: @escaping @Sendable () async -> Void) async throws {
        do {
            for worker in workers { try await worker.connect() }
        } catch {
            await shutdownLoops()
            throw error
        }
        logger.info("service hosted", metadata: ["service": "\(Hosted.name)", "connections": "\(workers.count)"])
        onRegistered()
        await withDiscardingTaskGroup { group in
            // On the connection's loop: the handlers too, with no hop to the pool and back.
            for worker in workers { group.addTask(executorPreference: worker.loop.taskExecutor) { await worker.answerRequests() } }
            // Until told to stop, or until a kernel asks for a drain.
            let requests = drainRequests
            let byKernel = await withTaskGroup(of: Bool.self) { race in
                race.addTask { await until(); return false }
                race.addTask {
                    for await _ in requests { return true }
                    return false
                }
                defer { race.cancelAll() }
                return await race.next() ?? false
            }
            if byKernel { logger.notice("a kernel asked this service to drain: answering what it holds, then leaving", metadata: ["service": "\(Hosted.name)"]) }
            // Every connection at once: each stops taking requests before any waits.
            let timeout = options.drainTimeout
            await withDiscardingTaskGroup { stopping in
                for worker in workers { stopping.addTask { await worker.stop(drain: timeout) } }
            }
        }
        await shutdownLoops()
    }

    private func shutdownLoops() async {
        for loop in loops { await loop.shutdown() }
    }

    deinit {
        // Released without stop(): close the connections and end the threads anyway.
        for loop in loops { loop.beginShutdown() }
    }

    public func run() async throws {
        await ready()
        guard !Task.isCancelled else { return await shutdownLoops() }
        try await serve { try? await gracefulShutdown() }
    }

    /// Answerers started over all connections (each answers request after request).
    func answerersStarted() async -> Int {
        var total = 0
        for worker in workers { total += await worker.answerersStarted }
        return total
    }

    /// Requests being handled right now, over all connections.
    public func inFlight() async -> Int {
        var total = 0
        for worker in workers { total += await worker.busy }
        return total
    }
}

/// One MDP worker connection, running on its loop thread, where its requests' handlers run too.
/// Not generic over the service (it answers through `answer`): the methods of a generic actor
/// in another module than the service look up their types at run time, several per request.
actor WorkerConnection {
    nonisolated let loop: SocketLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    /// `draining`: the kernel was told (`drain=1`); requests it sent before it heard are
    /// still answered, and the connection unregisters once it holds none and the kernel
    /// said no more come.
    enum State { case idle, registered, draining, stopped }

    /// The hosting process's id, the first part of the routing id `PROCESS/INDEX/GENERATION`.
    let process: String
    let index: Int
    let broker: String
    let serviceName: String
    /// The service's method table answering a request body (``MethodTable/answer(body:on:parts:)``).
    let answer: @Sendable (_ body: [UInt8], _ parts: PartOut?) async -> (reply: [UInt8], errors: Int)
    let options: ServiceHostOptions
    let logger: Logger
    let onReregistered: @Sendable () async -> Void
    let onDrainRequested: @Sendable () -> Void
    /// 18/MDP when a method answers in parts (PARTIAL is 0.2's), else 7/MDP.
    let version: MDP.Version

    private var state = State.idle
    private var registration: SocketRegistration?
    /// Connection events of the current socket: a new kernel on the same endpoint is met
    /// with READY at once rather than after heartbeat x liveness.
    private var monitor: SocketRegistration?
    private var lostConnection = false
    private var heartbeat: LoopTimer?
    private var liveness: Int
    /// Bumped on every new socket, so a reply computed for an old socket is not sent.
    private var generation = 0
    private(set) var busy = 0
    /// Replies on the current socket that were JSON-RPC errors, reported in heartbeats.
    private var errors = 0
    private var errorReport: LoopTimer?
    private var drained: [CheckedContinuation<Void, Never>] = []
    /// Parts handed over by handlers (off the loop), sent by the loop in batches.
    nonisolated let partOutbox = PartOutbox()
    /// ``generation`` as handlers off the loop see it (-1 once stopped): a part for an earlier
    /// connection tells its handler the stream is over.
    nonisolated let currentGeneration = Atomic<Int>(0)
    /// The kernel answered the drain (`drain=1`): nothing more comes on this connection.
    private var drainAcknowledged = false

    /// What ``answerRequests()`` starts, as each is needed: an answerer (a request waits and
    /// none is free), or the service's `onReregistered` after the kernel forgot it.
    enum Work: Sendable {
        case answerer
        case reregistered
    }
    /// Work asked for since ``answerRequests()`` last took it, taken all at once. The
    /// consumer waits in `waiting`.
    private var pending: [Work] = []
    private var waiting: CheckedContinuation<[Work], Never>?
    /// No more work comes (the connection stopped): ``answerRequests()`` ends, and so does
    /// each answerer once nothing is queued.
    private var noMoreWork = false

    /// A request to answer, taken by the first free answerer.
    struct Request: Sendable {
        let client: Frame
        let body: [UInt8]?
        let generation: Int
    }
    /// Requests no answerer has taken yet; answerers waiting for one; answerers asked for and
    /// not yet running. Answerers are long-lived child tasks of ``answerRequests()``, as many
    /// as requests ran at once: a child task per request cost its creation, its place in the
    /// group and a wake-up of ``answerRequests()`` before it ran.
    private var queued: Deque<Request> = []
    private var idle: [UnsafeContinuation<Request?, Never>] = []
    private var starting = 0
    /// Answerers started since the connection was made (tests: they are reused).
    private(set) var answerersStarted = 0

    private func enqueue(_ item: Work) {
        if let waiting {
            self.waiting = nil
            waiting.resume(returning: [item])
        } else {
            pending.append(item)
        }
    }

    /// Hands `request` to a free answerer, or queues it (asking for one more answerer when
    /// the ones on their way would not be enough).
    private func answer(_ request: Request) {
        if let answerer = idle.popLast() { return answerer.resume(returning: request) }
        queued.append(request)
        if starting < queued.count {
            starting += 1
            enqueue(.answerer)
        }
    }

    /// What an answerer finds when it looks for its next request.
    enum Next { case request(Request), wait, done }

    /// A queued request, if any; else whether to wait for one or stop (none come any more).
    private func next() -> Next {
        if let request = queued.popFirst() { return .request(request) }
        return noMoreWork ? .done : .wait
    }

    /// Waits `answerer` for the next request. The continuation's closure may run as a job of
    /// its own (swiftlang/swift#85668), after other work on the loop: what ``next()`` finds
    /// meanwhile (a request queued, or the end of work) is handed over by a job too, not by
    /// resuming the continuation inside its own closure (a first version did, and the host
    /// crashed running a job with nothing to run).
    private func park(_ answerer: UnsafeContinuation<Request?, Never>) {
        switch next() {
        case .request(let request): loop.execute { answerer.resume(returning: request) }
        case .done: loop.execute { answerer.resume(returning: nil) }
        case .wait: idle.append(answerer)
        }
    }

    private func endWork() {
        noMoreWork = true
        waiting?.resume(returning: [])
        waiting = nil
        for answerer in idle { answerer.resume(returning: nil) }
        idle.removeAll()
    }

    init(loop: SocketLoop, process: String, index: Int, broker: String, serviceName: String, streams: Bool,
         answer: @escaping @Sendable ([UInt8], PartOut?) async -> (reply: [UInt8], errors: Int),
         options: ServiceHostOptions, logger: Logger, onReregistered: @escaping @Sendable () async -> Void,
         onDrainRequested: @escaping @Sendable () -> Void) {
        self.loop = loop
        self.process = process
        self.index = index
        self.broker = broker
        self.serviceName = serviceName
        self.answer = answer
        self.options = options
        self.logger = logger
        self.onReregistered = onReregistered
        self.onDrainRequested = onDrainRequested
        self.liveness = options.heartbeatLiveness
        version = streams ? .v02 : .v01
    }

    func connect() throws {
        guard state == .idle || state == .registered else { return }
        registration?.close()
        monitor?.close()
        generation += 1
        currentGeneration.store(generation, ordering: .relaxed)
        lostConnection = false
        errors = 0
        errorReport?.cancel()
        errorReport = nil
        let socket = try ZMQSocket(loop.context, .dealer)
        try socket.set(.routingID, Array("\(process)/\(index)/\(generation)".utf8))
        try socket.secure(options.curve)
        try socket.set(.receiveHighWaterMark, 0)
        try socket.set(.sendHighWaterMark, 0)
        let pair = try connectionEvents(of: socket, in: loop.context)
        try socket.connect(broker)
        let current = generation
        registration = loop.register(socket) { [weak self] message in
            self?.assumeIsolated { $0.received(message, generation: current) }
        }
        monitor = loop.register(pair) { [weak self] message in
            self?.assumeIsolated { $0.connectionEvent(message, generation: current) }
        }
        // The window frame even for 1: it says this worker understands `drain=1`.
        registration?.send(MDP.encode(.ready(service: serviceName, window: options.window), version: version))
        liveness = options.heartbeatLiveness
        state = .registered
        if heartbeat == nil {
            heartbeat = loop.scheduleRepeating(every: options.heartbeatInterval) { [weak self] in
                self?.assumeIsolated { $0.beat() }
            }
        }
    }

    private func received(_ message: Message, generation: Int) {
        guard generation == self.generation, state == .registered || state == .draining else { return }
        liveness = options.heartbeatLiveness
        let command: BrokerToWorker
        do {
            command = try MDP.decodeAtWorker(message)
        } catch {
            logger.warning("malformed message from the kernel", metadata: ["problem": "\(error)"])
            return
        }
        switch command {
        case .heartbeat:
            break
        case .drain where state == .draining:
            drainAcknowledged = true
            releaseIfDrained()
        case .drain:
            onDrainRequested()
        case .disconnect where state == .draining:
            // The kernel forgot this connection (it restarted): nothing more comes, and
            // replies would be refused.
            drainAcknowledged = true
            releaseIfDrained()
        case .disconnect:
            logger.info("the kernel asked to re-register", metadata: ["connection": "\(index)"])
            reregister()
        case .request(let client, let body):
            busy += 1
            answer(Request(client: client, body: body.count == 1 ? body[0].bytes : nil, generation: generation))
        }
    }

    /// Starts answerers as requests need them, until the connection stops. It runs in a task
    /// that prefers the connection's loop (``ServiceHost/serve``), and so do its children: a
    /// handler that awaits lets the loop serve the socket meanwhile; one that computes holds
    /// it, as an event loop's handler would; what still runs after ``stop(drain:)`` waited
    /// for it is cancelled.
    func answerRequests() async {
        let hook = onReregistered
        await withDiscardingTaskGroup { group in
            while case let batch = await nextWork(), !batch.isEmpty {
                for item in batch {
                    switch item {
                    case .answerer: group.addTask { await self.answerQueued() }
                    case .reregistered: group.addTask { await hook() }
                    }
                }
            }
            group.cancelAll()
        }
    }

    /// One answerer: takes requests one after another until no more come. Off the actor, on
    /// the loop thread (its task prefers the loop): the connection's state is reached with
    /// `assumeIsolated`, never by a hop to the actor and back.
    nonisolated private func answerQueued() async {
        onLoop { connection in
            connection.starting -= 1
            connection.answerersStarted += 1
        }
        let answer = self.answer, streams = version == .v02
        while let request = await nextRequest() {
            let client = request.client, generation = request.generation
            var parts: PartOut?
            if streams {
                parts = { [weak self] part in
                    guard let self else { throw CancellationError() }
                    try await self.sendPart(part, client: client, generation: generation)
                }
            }
            var outcome: (reply: [UInt8], errors: Int)
            if let bytes = request.body {
                // The table keeps the reply within the kernel's message limit.
                outcome = await answer(bytes, parts)
            } else {
                outcome = (JSONRPCResponse(id: .null, error: .invalidRequest("the body must be one frame")).jsonBytes, 1)
            }
            deliver(client: client, reply: outcome.reply, errors: outcome.errors, generation: generation)
        }
    }

    /// The work asked for, waiting for some; empty once no more comes.
    private func nextWork() async -> [Work] {
        if !pending.isEmpty {
            defer { pending.removeAll(keepingCapacity: true) }
            return pending
        }
        if noMoreWork { return [] }
        return await withCheckedContinuation { waiting = $0 }
    }

    /// The next request for an answerer: a queued one at once, else the next to arrive
    /// (``answer(_:)`` hands it over); nil once no more come.
    nonisolated private func nextRequest() async -> Request? {
        switch onLoop({ $0.next() }) {
        case .request(let request): return request
        case .done: return nil
        case .wait: return await withUnsafeContinuation { answerer in onLoop { $0.park(answerer) } }
        }
    }

    /// Runs `body` on the connection's state from the loop thread, where an answerer runs.
    nonisolated private func onLoop<T: Sendable>(_ body: (isolated WorkerConnection) -> T) -> T {
        assumeIsolated(body)
    }

    /// Hands a reply to the connection. The handler's task prefers the loop, so it is usually
    /// on the loop thread already, where the connection's state lives: it goes on at once
    /// there, rather than as a job queued for the actor (a hop per request).
    nonisolated private func deliver(client: Frame, reply: [UInt8], errors: Int, generation: Int) {
        if loop.isLoopThread {
            assumeIsolated { $0.finished(client: client, reply: reply, errors: errors, generation: generation) }
        } else {
            loop.execute { [self] in assumeIsolated { $0.finished(client: client, reply: reply, errors: errors, generation: generation) } }
        }
    }

    private func finished(client: Frame, reply: [UInt8], errors: Int, generation: Int) {
        // The parts that wait go first: the FINAL ends the stream.
        flushParts()
        busy -= 1
        if generation == self.generation, state == .registered || state == .draining {
            registration?.send(MDP.encode(.reply(client: client, body: [Frame(reply)]), version: version))
            if errors > 0 { countErrors(errors) }
        }
        releaseIfDrained()
    }

    /// Hands one part of a reply in parts to the loop, which sends what has gathered in one
    /// turn (a hop to the loop thread per part would wake it, and libzmq's I/O thread, once a
    /// part). Waits while ``PartOutbox/limit`` parts wait, so a fast handler is held to the
    /// pace of the socket.
    nonisolated private func sendPart(_ body: [UInt8], client: Frame, generation: Int) async throws {
        guard currentGeneration.load(ordering: .relaxed) == generation else {
            throw JSONRPCError.streamEnded("the connection to the kernel", parts: 0, reason: "connection_lost", service: serviceName)
        }
        let message = MDP.encode(.partial(client: client, body: [Frame(body)][...]), version: version)
        if partOutbox.add(message, generation: generation) {
            loop.execute { [weak self] in self?.assumeIsolated { $0.flushParts() } }
        }
        await partOutbox.waitForRoom()
    }

    /// Sends the parts that gathered; those of an earlier connection are dropped (the kernel
    /// ended their streams when it went).
    private func flushParts() {
        let usable = state == .registered || state == .draining
        for (message, generation) in partOutbox.take() where usable && generation == self.generation {
            registration?.send(message)
        }
    }

    /// Ends a drain's wait once nothing is held and the kernel said nothing more comes.
    private func releaseIfDrained() {
        guard busy == 0, state != .draining || drainAcknowledged else { return }
        for waiter in drained { waiter.resume() }
        drained.removeAll()
    }

    /// Errors reach the kernel with the next heartbeat, or within 100 ms when that is later,
    /// so `sb stats` is current without a message per reply.
    private func countErrors(_ count: Int) {
        errors += count
        guard errorReport == nil else { return }
        errorReport = loop.schedule(after: min(options.heartbeatInterval, .milliseconds(100))) { [weak self] in
            self?.assumeIsolated { connection in
                connection.errorReport = nil
                guard connection.state == .registered || connection.state == .draining else { return }
                connection.registration?.send(MDP.encode(.heartbeat(errors: connection.errors), version: connection.version))
            }
        }
    }

    private func connectionEvent(_ message: Message, generation: Int) {
        guard generation == self.generation, let event = SocketEvent(message) else { return }
        if state == .draining, event.event.contains(.disconnected) {
            drainAcknowledged = true
            releaseIfDrained()
        }
        guard state == .registered else { return }
        if event.event.contains(.disconnected) {
            lostConnection = true
        } else if event.event.contains(.connected), lostConnection {
            logger.info("reconnected to the kernel; registering again", metadata: ["connection": "\(index)", "broker": "\(broker)"])
            reregister()
        }
    }

    private func beat() {
        guard state == .registered || state == .draining else { return }
        liveness -= 1
        if liveness <= 0, state == .draining {
            // The kernel fell silent while this connection drained: nothing more comes.
            drainAcknowledged = true
            releaseIfDrained()
            return
        }
        if liveness <= 0 {
            logger.info("the kernel is silent; registering again", metadata: ["connection": "\(index)", "broker": "\(broker)"])
            reregister()
            return
        }
        registration?.send(MDP.encode(.heartbeat(errors: errors > 0 ? errors : nil), version: version))
    }

    private func reregister() {
        do {
            try connect()
        } catch {
            logger.error("could not reconnect", metadata: ["error": "\(error)"])
            return
        }
        if index == 0 { enqueue(.reregistered) }
    }

    /// Drains: tells the kernel to send nothing more, answers what it holds (and what the
    /// kernel sent before it heard), then unregisters; after `timeout` it unregisters
    /// anyway and what still runs is cancelled (the kernel re-sends those requests).
    func stop(drain timeout: Duration) async {
        // However it ends, no more work comes: answerRequests() ends once what runs is done.
        defer { endWork() }
        guard state == .registered || state == .idle else { return }
        let wasRegistered = state == .registered
        state = .draining
        // No word can come over a connection that is down (the kernel stopped first).
        drainAcknowledged = !wasRegistered || lostConnection
        if wasRegistered { registration?.send(MDP.encode(.drain, version: version)) }
        if busy > 0 || !drainAcknowledged {
            let loop = self.loop
            await withCheckedContinuation { continuation in
                drained.append(continuation)
                loop.schedule(after: timeout) { [weak self] in
                    self?.assumeIsolated { connection in
                        if connection.busy > 0 || !connection.drainAcknowledged {
                            connection.logger.warning("drain timed out; unregistering with requests still in flight (the kernel sends them to another worker)",
                                                      metadata: ["connection": "\(connection.index)", "inFlight": "\(connection.busy)"])
                        }
                        for waiter in connection.drained { waiter.resume() }
                        connection.drained.removeAll()
                    }
                }
            }
            // The actor may have run other work while it waited: still the one stopping it?
            guard state == .draining else { return }
        }
        heartbeat?.cancel()
        heartbeat = nil
        if errorReport != nil { registration?.send(MDP.encode(.heartbeat(errors: errors), version: version)) }
        errorReport?.cancel()
        errorReport = nil
        registration?.send(MDP.encode(.disconnect, version: version))
        // Give the DISCONNECT a moment to leave before the socket closes.
        try? registration?.socket.set(.linger, 200)
        registration?.close()
        registration = nil
        monitor?.close()
        monitor = nil
        state = .stopped
        currentGeneration.store(-1, ordering: .relaxed)
    }
}

/// The parts handlers hand to a worker connection from their own tasks, waiting for its loop
/// to send them: the first part of a batch schedules one flush, the rest ride along.
final class PartOutbox: Sendable {
    /// Parts that may wait at once; a handler that finds this many waits for the flush.
    static let limit = 1_024
    private struct State {
        var parts: [(Message, generation: Int)] = []
        var waiters: [UnsafeContinuation<Void, Never>] = []
    }
    private let state = Mutex(State())

    /// Queues a part; true when it is the first since the last flush (schedule one).
    func add(_ message: Message, generation: Int) -> Bool {
        state.withLock { state in
            state.parts.append((message, generation))
            return state.parts.count == 1
        }
    }

    /// Returns once fewer than ``limit`` parts wait.
    func waitForRoom() async {
        guard state.withLock({ $0.parts.count >= Self.limit }) else { return }
        await withUnsafeContinuation { continuation in
            let full = state.withLock { state in
                guard state.parts.count >= Self.limit else { return false }
                state.waiters.append(continuation)
                return true
            }
            if !full { continuation.resume() }
        }
    }

    /// Everything that waits, for the loop to send; the waiting handlers go on.
    func take() -> [(Message, generation: Int)] {
        let (parts, waiters) = state.withLock { state in
            defer { state = State() }
            return (state.parts, state.waiters)
        }
        for waiter in waiters { waiter.resume() }
        return parts
    }
}
