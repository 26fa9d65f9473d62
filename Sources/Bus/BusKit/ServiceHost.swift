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
    /// How many worker connections to each kernel, each served on a loop thread of its own
    /// (its handlers run on the cooperative pool).
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
    /// A loop thread per worker connection: it serves the connection's socket and its
    /// heartbeats and nothing else, so no handler can keep it from them.
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
            // Each connection's requests are taken on its loop and answered on the pool.
            for worker in workers { group.addTask { await worker.answerRequests() } }
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
            // Every connection stops taking requests before any waits, and before the service
            // ends its waits: a client that asks again then is sent to another worker.
            for worker in workers { await worker.beginDrain() }
            await service.draining()
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
        // A graceful shutdown while the service cannot serve yet (its database away) ends
        // the wait: the host stops without having registered.
        let ready = ready
        await cancelWhenGracefulShutdown { await ready() }
        guard !Task.isCancelled, !Task.isShuttingDownGracefully else { return await shutdownLoops() }
        try await serve { try? await gracefulShutdown() }
    }

    /// Requests being handled right now, over all connections.
    public func inFlight() async -> Int {
        var total = 0
        for worker in workers { total += await worker.busy }
        return total
    }
}

/// One MDP worker connection, running on its loop thread; its requests' handlers run on the
/// cooperative pool.
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
    let answer: @Sendable (_ body: Frame, _ parts: (any PartOut)?) async -> (reply: [UInt8], errors: Int)
    let options: ServiceHostOptions
    let logger: Logger
    let onReregistered: @Sendable () async -> Void
    let onDrainRequested: @Sendable () -> Void
    /// 18/MDP when a method answers in parts (PARTIAL is 0.2's), else 7/MDP.
    let version: MDP.Version
    /// Whether each request is to say who sent it (``CallerIdentity``): on CURVE only, where
    /// the kernel can tell callers apart.
    var asksCallers: Bool { options.curve != nil }

    private var state = State.idle
    private var registration: SocketRegistration?
    /// Connection events of the current socket: a new kernel on the same endpoint is met
    /// with READY at once rather than after heartbeat x liveness.
    private var monitor: SocketRegistration?
    private var lostConnection = false
    /// Whether the current socket got through a handshake with a kernel (its monitor said so,
    /// or a message came), and whether it has tried to connect and failed.
    private var handshaken = false
    private var connectFailed = false
    /// Handshakes the kernel refused since one last succeeded (CURVE on one side only, a key
    /// the kernel does not allow), and when the log last said so.
    private var refusedHandshakes = 0
    private var refusalLogged: ContinuousClock.Instant?
    /// Connections the endpoint took and ended before any handshake since one last
    /// succeeded: what listens there is no broker (another program, a kernel's state
    /// endpoint), or a kernel that refuses this service and whose reason did not arrive (it
    /// often does not: CURVE on one side only, a server key not the kernel's). Said once a few
    /// have ended so with no refusal said, and never as a kernel come back.
    private var endedBeforeHandshake = 0
    private var unsaidEndsLogged: ContinuousClock.Instant?
    private static let endedBeforeHandshakeSaid = 3
    /// No kernel is there for this socket, as far as the socket has seen: it has not got
    /// through a handshake, and its attempts failed (nothing listens at the endpoint, the
    /// kernel refuses this service, or another program listens there). No request can have
    /// come then, and no kernel will acknowledge a drain: stopping does not wait for one. Only
    /// such evidence counts, as the monitor's events may come after the first messages do.
    private var kernelUnreachable: Bool { !handshaken && (connectFailed || refusedHandshakes > 0 || endedBeforeHandshake > 0) }
    /// The TCP connection to the kernel while there is one: bytes arriving on it say the
    /// kernel is there while its heartbeats wait behind a large request still on its way.
    private var kernelConnection: TCPConnection?
    private var heartbeat: LoopTimer?
    private var liveness: Int
    /// Messages libzmq queues for the kernel; past them, replies and parts wait on this side.
    static let sendHighWaterMark: Int32 = 1_000
    /// Bumped on every new socket, so a reply computed for an old socket is not sent.
    private var generation = 0
    private(set) var busy = 0
    /// Replies on the current socket that were JSON-RPC errors, reported in heartbeats.
    private var errors = 0
    private var errorReport: LoopTimer?
    private var drained: [CheckedContinuation<Void, Never>] = []
    /// Parts and replies handed over by handlers (off the loop), sent by the loop in batches.
    nonisolated let outbox = AnswerOutbox()
    /// Requests in flight by the client frame the kernel sent them with (on a connection
    /// that can answer in parts, the only kind told `stop`), and those of them whose parts
    /// nobody reads any more (the kernel said `stop`): their next part ends them.
    private var running: [Frame: Int] = [:]
    nonisolated let stopped = Mutex<Set<Frame>>([])
    /// ``generation`` as handlers off the loop see it (-1 once stopped): a part for an earlier
    /// connection tells its handler the stream is over.
    nonisolated let currentGeneration = Atomic<Int>(0)
    /// The kernel answered the drain (`drain=1`): nothing more comes on this connection.
    private var drainAcknowledged = false

    /// Requests taken from the kernel, which the answerers take in turn from their own
    /// tasks, with no hop to the loop; finished once no more come. Not bounded here: the
    /// kernel sends a connection no more than its window at once.
    nonisolated let requests = BoundedBuffer<Request>(capacity: .max, whenFull: .refuse)
    /// One element each time the service's `onReregistered` is to run (the kernel forgot the
    /// service), which ``answerRequests()`` runs in a child task; finished once no more work
    /// comes (the connection stopped).
    private let (reregistrations, reregistered) = AsyncStream.makeStream(of: Void.self)

    /// A request to answer.
    struct Request: Sendable {
        let client: Frame
        let body: Frame?
        /// Who sent it, as the kernel says (on a CURVE connection, which asks).
        let caller: CallerIdentity?
        let generation: Int
    }

    /// No more work comes: ``answerRequests()`` ends once what runs is done.
    private func endWork() {
        requests.finish()
        reregistered.finish()
    }

    init(loop: SocketLoop, process: String, index: Int, broker: String, serviceName: String, streams: Bool,
         answer: @escaping @Sendable (Frame, (any PartOut)?) async -> (reply: [UInt8], errors: Int),
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
        (handshaken, connectFailed) = (false, false)
        kernelConnection = nil
        errors = 0
        errorReport?.cancel()
        errorReport = nil
        let socket = try ZMQSocket(loop.context, .dealer)
        try socket.set(.routingID, Array("\(process)/\(index)/\(generation)".utf8))
        try socket.secure(options.curve)
        try socket.set(.receiveHighWaterMark, 0)
        // Bounded, so that parts a handler makes faster than the kernel reads wait in the part
        // outbox, where they hold the handler back, and not in libzmq's queue, which would grow.
        try socket.set(.sendHighWaterMark, Self.sendHighWaterMark)
        let pair = try connectionEvents(of: socket, in: loop.context, also: [.handshakeRefused, .handshakeSucceeded, .connectRetried])
        try socket.connect(broker)
        let current = generation
        registration = loop.register(socket) { [weak self] message in
            self?.assumeIsolated { $0.received(message, generation: current) }
        }
        registration?.onBacklogSent = { [weak self] in
            self?.assumeIsolated { connection in
                connection.flushOutbox()
                connection.releaseIfDrained()
            }
        }
        monitor = loop.register(receivingOnly: pair) { [weak self] message in
            self?.assumeIsolated { $0.connectionEvent(message, generation: current) }
        }
        // The window frame even for 1: it says this worker understands `drain=1`. Callers
        // asked for only where the kernel can tell them apart (CURVE).
        registration?.send(MDP.encode(.ready(service: serviceName, window: options.window, callers: asksCallers), version: version))
        liveness = options.heartbeatLiveness
        state = .registered
        // Parts and replies still waiting for the old socket are dropped, and their handlers go on.
        flushOutbox()
        if heartbeat == nil {
            heartbeat = loop.scheduleRepeating(every: options.heartbeatInterval) { [weak self] in
                self?.assumeIsolated { $0.beat() }
            }
        }
    }

    private func received(_ message: Message, generation: Int) {
        guard generation == self.generation, state == .registered || state == .draining else { return }
        liveness = options.heartbeatLiveness
        handshaken = true
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
            // replies would be refused (so none waits to be sent).
            drainAcknowledged = true
            lostConnection = true
            releaseIfDrained()
        case .disconnect:
            logger.info("the kernel asked to re-register", metadata: ["connection": "\(index)"])
            reregister()
        case .stop(let client):
            // Only a request still running: the client frame may come again in a later one.
            if running[client] != nil { _ = stopped.withLock { $0.insert(client) } }
        case .request(let client, var body):
            var caller: CallerIdentity?
            // Our kernel puts the caller before every body; a broker that does not know the
            // extension sends a service's one-frame body alone, and names nobody.
            if asksCallers, body.count > 1 {
                caller = body[MDP.callerPart].string.flatMap(CallerIdentity.init)
                body.remove(at: MDP.callerPart)
            }
            busy += 1
            if version == .v02 { running[client, default: 0] += 1 }
            requests.push(Request(client: client, body: body.count == 1 ? body[0] : nil, caller: caller, generation: generation))
        }
    }

    /// Answers the connection's requests until it stops, in a child task per window slot (as
    /// hummingbird serves each connection in a task of its own): the kernel sends no more than
    /// the window at once, so a request never waits for an answerer, and none is made per
    /// request. An answerer takes its requests from ``requests`` and hands its replies to
    /// ``outbox`` without a hop to the loop: the loop sends what gathered in one turn. The
    /// answerers run on the cooperative pool, never on the connection's loop
    /// thread: the loop only moves messages and keeps the heartbeats, so a handler that
    /// computes for seconds (a multi-megabyte body parsed or encoded, a blocking database
    /// call) cannot silence the connection and make the kernel drop it with the reply still
    /// to come. The service's `onReregistered` runs in a child task of its own. What still
    /// runs after ``stop(drain:)`` waited for it is cancelled.
    func answerRequests() async {
        let hook = onReregistered
        await withDiscardingTaskGroup { group in
            for _ in 0..<options.window {
                group.addTask { await self.answerInTurn() }
            }
            for await _ in reregistrations { group.addTask { await hook() } }
            group.cancelAll()
        }
    }

    /// One answerer: the oldest request no other answerer has taken, in turn, until no more
    /// come (or the answerers are cancelled).
    nonisolated private func answerInTurn() async {
        while let request = try? await requests.next() { await answer(request) }
    }

    /// Runs the service's method table on one request, off the loop, and hands the reply to
    /// the loop to send (after the request's parts: the reply ends its stream).
    nonisolated private func answer(_ request: Request) async {
        let client = request.client, generation = request.generation
        let parts = version == .v02 ? RequestPartOut(connection: self, client: client, generation: generation) : nil
        let outcome: (reply: [UInt8], errors: Int)
        if let body = request.body, let caller = request.caller {
            outcome = await CallerIdentity.$current.withValue(caller) { await answer(body, parts) }
        } else if let body = request.body {
            // The table keeps the reply within the kernel's message limit.
            outcome = await answer(body, parts)
        } else {
            outcome = (JSONRPCResponse(id: .null, error: .invalidRequest("the body must be one frame")).jsonBytes, 1)
        }
        let reply = MDP.encode(.reply(client: client, body: [Frame(outcome.reply)]), version: version)
        handOver(reply, bytes: 0, generation: generation, ends: (client, outcome.errors))
    }

    /// Queues `message` in the outbox, and has the loop flush it when it is the first since
    /// the last flush (the rest ride along). `ends`: the request it answers, and how many of
    /// its replies were errors; nil for a part.
    nonisolated private func handOver(_ message: Message, bytes: Int, generation: Int, ends: AnswerOutbox.Ends?) {
        if outbox.add(message, bytes: bytes, generation: generation, ends: ends) {
            loop.execute { [weak self] in _ = self?.assumeIsolated { $0.flushOutbox() } }
        }
    }

    /// A request's reply has left the outbox (sent, or dropped with the connection it came
    /// on): it no longer holds the connection.
    private func ended(_ request: AnswerOutbox.Ends, sent: Bool) {
        busy -= 1
        if version == .v02, let count = running[request.client] {
            running[request.client] = count > 1 ? count - 1 : nil
            if count == 1 { _ = stopped.withLock { $0.remove(request.client) } }
        }
        if sent, request.errors > 0 { countErrors(request.errors) }
    }

    /// Whether the parts of the request `client` sent on connection `generation` are still
    /// read: not once the kernel said nobody reads them (`stop`), nor once that connection
    /// was replaced.
    nonisolated fileprivate func partsAreRead(client: Frame, generation: Int) -> Bool {
        currentGeneration.load(ordering: .relaxed) == generation && !stopped.withLock { $0.contains(client) }
    }

    /// Hands one part of a reply in parts to the loop, which sends what has gathered in one
    /// turn (a hop to the loop thread per part would wake it, and libzmq's I/O thread, once a
    /// part). Waits while the outbox is full (``AnswerOutbox``), so a handler is held to the pace
    /// at which the kernel reads; throws once the kernel said nobody reads this request's
    /// parts, which ends the handler.
    nonisolated fileprivate func sendPart(_ body: [UInt8], client: Frame, generation: Int) async throws {
        guard currentGeneration.load(ordering: .relaxed) == generation else {
            throw JSONRPCError.streamEnded("the connection to the kernel", parts: 0, reason: "connection_lost", service: serviceName)
        }
        if stopped.withLock({ $0.contains(client) }) {
            throw JSONRPCError.streamEnded("its client", parts: 0, reason: "stopped", service: serviceName)
        }
        let message = MDP.encode(.partial(client: client, body: [Frame(body)][...]), version: version)
        handOver(message, bytes: body.count, generation: generation, ends: nil)
        await outbox.waitForRoom()
    }

    /// Sends the parts and replies that gathered, in the order they were handed over, as fast
    /// as libzmq takes them: past the socket's high-water mark they stay in the outbox (whose
    /// handlers wait for room) until the socket has room again
    /// (``SocketRegistration/onBacklogSent``). Those of an earlier connection are dropped (the
    /// kernel ended their streams, and sends their requests again, when it went).
    private func flushOutbox() {
        let usable = state == .registered || state == .draining
        var anyEnded = false
        defer { if anyEnded { releaseIfDrained() } }
        while !(usable && (registration?.backlogCount ?? 0) > 0) {
            let batch = outbox.take(upTo: 64)
            if batch.isEmpty { return }
            for entry in batch {
                let current = usable && entry.generation == generation
                if current { registration?.send(entry.message) }
                if let request = entry.ends {
                    ended(request, sent: current)
                    anyEnded = true
                }
            }
        }
    }

    /// Whether replies or parts still wait to be sent (the socket was full) to a kernel that
    /// is there: a drain waits for them, or closing the socket would throw them away.
    private var unsent: Bool { !lostConnection && (!outbox.isEmpty || (registration?.backlogCount ?? 0) > 0) }

    /// Ends a drain's wait once nothing is held or waits to be sent, and the kernel said
    /// nothing more comes.
    private func releaseIfDrained() {
        guard busy == 0, state != .draining || (drainAcknowledged && !unsent) else { return }
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
        if !event.event.isDisjoint(with: .handshakeRefused) { handshakeRefused(event.handshakeProblem) }
        if event.event.contains(.handshakeSucceeded) { (handshaken, refusedHandshakes, endedBeforeHandshake) = (true, 0, 0) }
        if event.event.contains(.connectRetried) { connectFailed = true }
        if event.event.contains(.disconnected) {
            kernelConnection = nil
            if !handshaken { endedBeforeHandshake += 1 }
        }
        if let connection = TCPConnection(event) { kernelConnection = connection }
        // Draining, the kernel gone or found not there: no word will come.
        if state == .draining, event.event.contains(.disconnected) || kernelUnreachable {
            drainAcknowledged = true
            lostConnection = true
            releaseIfDrained()
        }
        guard state == .registered else { return }
        if event.event.contains(.disconnected) {
            lostConnection = true
        } else if event.event.contains(.connected), lostConnection {
            reregister(saying: "reconnected to the kernel; registering again")
        }
    }

    /// The kernel refused this connection's handshake; libzmq tries again. Said at the first
    /// refusal and then once a minute while they go on, with what to look at, as far as the
    /// event tells: a service without keys meeting a kernel with CURVE on, or the other way
    /// round, or a key the kernel does not allow, would otherwise look like a kernel that is
    /// not there.
    private func handshakeRefused(_ problem: HandshakeProblem?) {
        refusedHandshakes += 1
        guard LogCadence.dueAgain(&refusalLogged) else { return }
        let why = switch (problem, options.curve == nil) {
        case (.keyRefused, _):
            "the kernel does not allow this service's key: add its public key to the kernel's security.worker_keys or key folder"
        case (_, true):
            "this service has CURVE off, and a kernel with CURVE on answers only workers with keys it allows (security.curve: true, or SWITCHBOARD_SECURITY_CURVE=true, with the kernel's key folder as security.keys_dir)"
        case (_, false):
            "this service speaks CURVE: the kernel must have CURVE on and allow this service's key (its security.worker_keys or key folder), and security.server_key here must be the kernel's"
        }
        logger.warning("the kernel refused this service's handshake; trying again", metadata: [
            "connection": "\(index)", "broker": "\(broker)", "refused": "\(refusedHandshakes)", "why": "\(why)",
        ])
    }

    /// What listens at the broker endpoint ends each connection before a handshake, unsaid.
    /// Said then and once a minute, apart from refusals: one that says why is logged too.
    private func endedUnsaid() {
        guard LogCadence.dueAgain(&unsaidEndsLogged) else { return }
        let why = options.curve == nil
            ? "a kernel with CURVE on ends a plain-text service's handshake so (security.curve: true, with the kernel's key folder as security.keys_dir); anything else there is not a kernel's broker endpoint: another program, or a kernel's state endpoint (kernel.broker names the broker)"
            : "a kernel with CURVE off, or one whose key is not security.server_key, ends a CURVE handshake so; anything else there is not a kernel's broker endpoint: another program, or a kernel's state endpoint (kernel.broker names the broker)"
        logger.warning("the broker endpoint ends each connection before a ZeroMQ handshake, unsaid; trying again", metadata: [
            "connection": "\(index)", "broker": "\(broker)", "ended": "\(endedBeforeHandshake)", "why": "\(why)",
        ])
    }

    private func beat() {
        guard state == .registered || state == .draining else { return }
        liveness -= 1
        // Silent is what sends nothing: over a slow link a large request takes longer to
        // arrive than heartbeat x liveness, and the kernel's heartbeats wait behind it.
        // Leaving then would throw it away and have it sent again, without end.
        if liveness <= 0, let quiet = kernelConnection?.sinceDataReceived, quiet < options.heartbeatInterval * options.heartbeatLiveness {
            liveness = 1
        }
        if liveness <= 0, state == .draining {
            // The kernel fell silent while this connection drained: nothing more comes, and
            // nothing more can be sent.
            drainAcknowledged = true
            lostConnection = true
            releaseIfDrained()
            return
        }
        if liveness <= 0 {
            reregister(saying: "the kernel is silent; registering again")
            return
        }
        registration?.send(MDP.encode(.heartbeat(errors: errors > 0 ? errors : nil), version: version))
    }

    /// Registers again on a new socket, the log saying why (`lost`: the kernel was lost).
    /// While the kernel refuses the handshake, or what listens at the endpoint ends each
    /// connection before one, every try registers again: that is what the log says instead,
    /// once a minute.
    private func reregister(saying lost: Logger.Message) {
        if refusedHandshakes == 0, endedBeforeHandshake >= Self.endedBeforeHandshakeSaid {
            endedUnsaid()
        } else if refusedHandshakes == 0, endedBeforeHandshake == 0 {
            logger.info(lost, metadata: ["connection": "\(index)", "broker": "\(broker)"])
        }
        reregister()
    }

    private func reregister() {
        do {
            try connect()
        } catch {
            logger.error("could not reconnect", metadata: ["error": "\(error)"])
            return
        }
        if index == 0 { reregistered.yield() }
    }

    /// Tells the kernel to send nothing more (drain=1), the first step of ``stop(drain:)``.
    func beginDrain() {
        guard state == .registered || state == .idle else { return }
        let wasRegistered = state == .registered
        state = .draining
        // No word can come over a connection that is down (the kernel stopped first), nor
        // from a kernel that is not there.
        drainAcknowledged = !wasRegistered || lostConnection || kernelUnreachable
        if wasRegistered { registration?.send(MDP.encode(.drain, version: version)) }
    }

    /// Drains: tells the kernel to send nothing more, answers what it holds (and what the
    /// kernel sent before it heard), then unregisters; after `timeout` it unregisters
    /// anyway and what still runs is cancelled (the kernel re-sends those requests).
    func stop(drain timeout: Duration) async {
        // However it ends, no more work comes: answerRequests() ends once what runs is done.
        defer { endWork() }
        beginDrain()
        guard state == .draining else { return }
        if busy > 0 || !drainAcknowledged || unsent {
            let loop = self.loop
            await withCheckedContinuation { continuation in
                // Asked again here: the actor may run other work between the check above and
                // this body, and what released the waiters then would not release them again.
                guard busy > 0 || !drainAcknowledged || unsent else {
                    continuation.resume()
                    return
                }
                drained.append(continuation)
                loop.schedule(after: timeout) { [weak self] in
                    self?.assumeIsolated { connection in
                        if connection.busy > 0 || connection.unsent {
                            connection.logger.warning("drain timed out; unregistering with requests still in flight (the kernel sends them to another worker)",
                                                      metadata: ["connection": "\(connection.index)", "inFlight": "\(connection.busy)"])
                        } else if !connection.drainAcknowledged {
                            connection.logger.warning("drain timed out: the kernel did not acknowledge it (nothing was in flight); unregistering",
                                                      metadata: ["connection": "\(connection.index)"])
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
        // What libzmq still holds for the kernel (up to its high-water mark of parts and
        // replies, then the DISCONNECT) leaves after the socket is closed: it lingers until all
        // of it has, for at most the drain's timeout (a kernel that is there reads it at once;
        // a loaded one may take seconds), and not at all once the kernel is gone or was never
        // there.
        try? registration?.socket.set(.linger, lostConnection || kernelUnreachable ? 0 : Int32(clamping: timeout.nanoseconds / 1_000_000))
        registration?.close()
        registration = nil
        monitor?.close()
        monitor = nil
        state = .stopped
        currentGeneration.store(-1, ordering: .relaxed)
        flushOutbox()
    }
}

/// Where the parts of one request on a connection that answers in parts go.
private final class RequestPartOut: PartOut {
    weak let connection: WorkerConnection?
    let client: Frame
    let generation: Int

    init(connection: WorkerConnection, client: Frame, generation: Int) {
        (self.connection, self.client, self.generation) = (connection, client, generation)
    }

    func send(_ part: [UInt8]) async throws {
        guard let connection else { throw CancellationError() }
        try await connection.sendPart(part, client: client, generation: generation)
    }

    var isRead: Bool { connection?.partsAreRead(client: client, generation: generation) ?? false }
}

/// What handlers hand to a worker connection from their own tasks, waiting for its loop to
/// send it: the parts of replies in parts, and the replies that end requests, in the order
/// handed over (a reply never passes its own parts). The first of a batch schedules one
/// flush, the rest ride along. Bounded in entries and in bytes of parts: a handler sending a
/// part that finds either bound reached waits until the loop has sent some, so a stream nobody
/// reads fast enough costs its worker at most this much. A reply never waits: the window
/// bounds them.
final class AnswerOutbox: Sendable {
    /// Entries, and bytes of their parts' bodies, that may wait at once (one part always may).
    static let limit = 1_024
    static let byteLimit = 4 << 20
    /// The request a reply ends, and how many of its replies were JSON-RPC errors.
    typealias Ends = (client: Frame, errors: Int)
    typealias Entry = (message: Message, generation: Int, ends: Ends?)
    private struct State {
        var entries: Deque<(entry: Entry, bytes: Int)> = []
        var bytes = 0
        var waiters: [UnsafeContinuation<Void, Never>] = []
        var isFull: Bool { entries.count >= AnswerOutbox.limit || bytes >= AnswerOutbox.byteLimit }
    }
    private let state = Mutex(State())

    /// Queues a message (a part of `bytes`, or a reply that `ends` a request); true when it
    /// is the first since the last flush (schedule one).
    func add(_ message: Message, bytes: Int, generation: Int, ends: Ends?) -> Bool {
        state.withLock { state in
            state.entries.append(((message, generation, ends), bytes))
            state.bytes += bytes
            return state.entries.count == 1
        }
    }

    /// Returns once the outbox is below its bounds.
    func waitForRoom() async {
        guard state.withLock({ $0.isFull }) else { return }
        await withUnsafeContinuation { continuation in
            let full = state.withLock { state in
                guard state.isFull else { return false }
                state.waiters.append(continuation)
                return true
            }
            if !full { continuation.resume() }
        }
    }

    var isEmpty: Bool { state.withLock { $0.entries.isEmpty } }

    /// Up to `count` of the oldest entries, for the loop to send; the waiting handlers go on
    /// once there is room.
    func take(upTo count: Int) -> [Entry] {
        let (taken, waiters) = state.withLock { state -> ([Entry], [UnsafeContinuation<Void, Never>]) in
            // Nothing waits (every flush that finds the socket free asks): nothing to copy or free.
            guard !state.entries.isEmpty else { return ([], []) }
            var taken: [Entry] = []
            taken.reserveCapacity(min(count, state.entries.count))
            while taken.count < count, let next = state.entries.popFirst() {
                taken.append(next.entry)
                state.bytes -= next.bytes
            }
            var waiters: [UnsafeContinuation<Void, Never>] = []
            if !state.isFull { swap(&waiters, &state.waiters) }
            return (taken, waiters)
        }
        for waiter in waiters { waiter.resume() }
        return taken
    }
}
