import BusProtocol
public import Contracts
import DequeModule
import Foundation
public import Logging
public import ServiceLifecycle
public import ZeroMQ

/// The Switchboard kernel: a Majordomo broker and a Clustered-Hashmap state server on one
/// loop thread, plus the built-in `kernel` service.
///
/// The actor runs on its ``SocketLoop`` (its executor is the loop), so it owns its sockets
/// outright and handles every message without a thread hop.
public actor Kernel: BusService {
    /// The name of the built-in service, whose methods are ``KernelAPI``'s.
    public static let name = KernelAPI.service

    /// Where the kernel listens, with the ports chosen for `*` endpoints.
    public struct Endpoints: Sendable, Equatable {
        public var broker: String
        public var snapshot: String
        public var publisher: String
        public var collector: String
    }

    public nonisolated let loop: SocketLoop
    public nonisolated let configuration: KernelConfiguration
    public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    /// A new identity each start, so clients can tell a restarted kernel.
    public nonisolated let instance = UUID().uuidString
    /// Where the broker, the state server and the pair link read the time.
    public nonisolated let clock: any NanosecondClock
    let logger: Logger
    private var startedAt = Date()
    /// The `kernel` service's methods, answered on the loop as each request arrives.
    private var table: MethodTable<Kernel>?
    /// Bodies answered a turn of the loop at a time, between turns: after each poll of the
    /// sockets the first takes a turn, then goes to the back. One turn for all of them, so
    /// however many batches are under way the loop is held up by one turn's work.
    private var answersUnderWay: Deque<AnswerUnderWay> = []
    /// The CURVE key of the request being answered, for `state.set`'s rules.
    @TaskLocal static var requestPeer: String?

    /// Where the kernel is in its life: ``start()`` binds once, ``stop()`` is final.
    enum Phase {
        case idle
        /// Reading the state from etcd before binding.
        case starting
        case serving(Endpoints, KernelParts)
        case stopped
    }
    private var phase = Phase.idle
    /// The work with the cells' directory (``joinCells(_:)``), while serving.
    var cellWork: Task<Void, Never>?

    public init(configuration: KernelConfiguration, context: ZMQContext, clock: any NanosecondClock = SystemClock(),
                logger: Logger = Logger(label: "switchboard.kernel")) throws {
        self.configuration = try Self.trustingOwnKey(configuration)
        self.clock = clock
        self.logger = logger
        loop = try SocketLoop(context: context, name: "kernel")
    }

    /// A kernel of a cell takes the kernels with its own key for its cell's peers: the cells
    /// of a bus that share one key folder offer each other their services with it.
    static func trustingOwnKey(_ configuration: KernelConfiguration) throws -> KernelConfiguration {
        guard configuration.cell != nil, var security = configuration.security else { return configuration }
        security.workerKeys.insert(try CurveKeyPair.publicKey(forSecretKey: security.secretKey))
        var trusting = configuration
        trusting.security = security
        return trusting
    }

    /// The parts while serving (nil before ``start()`` and after ``stop()``).
    var parts: KernelParts? {
        guard case .serving(_, let parts) = phase else { return nil }
        return parts
    }

    /// The parts the `kernel` service's methods read. A request can be taken up after the
    /// kernel stopped (with the state on etcd each one is answered by a task of its own,
    /// which may wait for its turn on the kernel while it stops): it is answered -32008.
    private func serving() throws(JSONRPCError) -> KernelParts {
        guard let parts else { throw Self.stopping }
        return parts
    }

    /// Binds every endpoint and starts serving; with the state on etcd, reads it from there
    /// first. Throws (leaving nothing bound) when etcd cannot be read or an endpoint cannot be
    /// bound, naming it.
    @discardableResult
    public func start() async throws -> Endpoints {
        switch phase {
        case .serving(let endpoints, _): return endpoints
        case .stopped: throw KernelRefusal("a stopped kernel does not start again")
        case .starting: throw KernelRefusal("the kernel is already starting")
        case .idle: break
        }
        guard let settings = configuration.stateEtcd else {
            if let cell = configuration.cell { try await whileStarting { try await refuseSecondKernel(of: cell) } }
            return try bind(KernelParts(kernel: self, configuration: configuration, instance: instance, clock: clock, logger: logger))
        }
        guard configuration.pair == nil else {
            phase = .stopped
            throw KernelRefusal("a pair with kernel.state.backend: etcd is not supported: leave out the pair; a second kernel on the same etcd is the active kernel's standby through etcd's election")
        }
        let parts = try await whileStarting {
            let link = try await connectState(settings)
            do {
                let parts = KernelParts(kernel: self, configuration: configuration, instance: instance, clock: clock, logger: logger, etcd: link)
                try await readState(into: parts, from: link)
                try stillStarting()
                return parts
            } catch {
                await closeState(link)
                throw error
            }
        }
        return try bind(parts)
    }

    /// Runs `work`, what a start awaits before it binds, in the starting phase: a second
    /// start meanwhile is refused, and a stop meanwhile makes the start throw (`work` checks
    /// ``stillStarting()`` itself before it hands back anything it must close).
    private func whileStarting<Result>(_ work: () async throws -> Result) async throws -> Result {
        phase = .starting
        do {
            let result = try await work()
            try stillStarting()
            phase = .idle
            return result
        } catch {
            if case .starting = phase { phase = .idle }
            throw error
        }
    }

    /// Throws unless the kernel is still starting (a stop came while the start awaited).
    private func stillStarting() throws {
        guard case .starting = phase else { throw KernelRefusal("the kernel was stopped while it started") }
    }

    /// Binds every endpoint and serves them with `parts` (their state read from etcd, if it
    /// keeps it).
    private func bind(_ parts: KernelParts) throws -> Endpoints {
        let context = loop.context
        let security = configuration.security, inprocName = configuration.inprocName
        func open(_ type: SocketType, _ endpoint: String, _ role: String,
                  configure: (ZMQSocket) throws -> Void = { _ in }) throws -> (ZMQSocket, String) {
            let socket = try ZMQSocket(context, type)
            do {
                // Enforced by libzmq before a message is assembled: a bigger one drops the peer.
                try socket.set(.maxMessageSize, Int64(configuration.maxMessageSize))
                if let security {
                    try socket.set(.curveServer, true)
                    try socket.set(.curveSecretKey, security.secretKey)
                    try socket.set(.zapDomain, "switchboard")
                }
                try configure(socket)
                let bound = try socket.bind(endpoint)
                if let inprocName { _ = try socket.bind("inproc://\(inprocName)-\(role)") }
                return (socket, bound)
            } catch {
                socket.close()
                throw error
            }
        }
        var opened: [ZMQSocket] = []
        do {
            if security != nil {
                // Bound before any secured socket, so no connection is admitted unasked.
                let zap = try ZMQSocket(context, .router)
                opened.append(zap)
                _ = try zap.bind(ZAPHandler.endpoint)
            }
            let (router, brokerEndpoint) = try open(.router, configuration.brokerEndpoint, "broker") {
                $0.readsPeerUserID = security != nil
                // A send to a peer whose connection is gone fails at once (EHOSTUNREACH)
                // instead of vanishing: that is how a killed worker is noticed early.
                try $0.set(.routerMandatory, true)
                try $0.set(.sendHighWaterMark, Int32(clamping: configuration.peerBacklog))
                try $0.set(.receiveHighWaterMark, Self.peerInputBacklog)
                // A peer whose machine is gone or whose link is cut closes nothing: its
                // connection is dropped after peer_timeout, and with it what it held (a quiet
                // stream's probe then fails), not after TCP's retransmissions give up.
                try $0.dropSilentPeers(after: configuration.peerTimeout)
            }
            opened.append(router)
            let (snapshot, snapshotEndpoint) = try open(.router, configuration.snapshotEndpoint, "snapshot") {
                try $0.set(.sendHighWaterMark, 1_000_000)
            }
            opened.append(snapshot)
            let (publisher, publisherEndpoint) = try open(.xpub, configuration.publisherEndpoint, "publisher") {
                try $0.set(.xpubVerbose, true)
                try $0.set(.sendHighWaterMark, Int32(clamping: configuration.subscriberBacklog))
                // A subscriber that stops draining its connection answers no PING: dropped
                // after subscriber_timeout, with everything queued for it.
                let timeout = Int32(clamping: Int(configuration.subscriberTimeout.nanoseconds / 1_000_000))
                try $0.set(.heartbeatInterval, max(1, min(timeout / 3, Int32(clamping: Int(configuration.heartbeatInterval.nanoseconds / 1_000_000)))))
                try $0.set(.heartbeatTimeout, timeout)
            }
            opened.append(publisher)
            let (collector, collectorEndpoint) = try open(.sub, configuration.collectorEndpoint, "collector") {
                $0.readsPeerUserID = security != nil
                try $0.subscribe("")
            }
            opened.append(collector)
            var pairSockets: (listener: ZMQSocket, sender: ZMQSocket, peerBroker: ZMQSocket?)?
            if let pair = configuration.pair {
                // The peer kernel sends on a DEALER to this ROUTER; with CURVE the ZAP handler
                // admits only the kernel's own key here (both kernels hold the same pair).
                let (listener, _) = try open(.router, pair.listen, "pair") {
                    if security != nil { try $0.set(.zapDomain, ZAPHandler.pairDomain) }
                }
                opened.append(listener)
                pairSockets = try openPair(pair, listener: listener, opened: &opened)
            }
            try parts.serve(KernelParts.Sockets(zap: security == nil ? nil : opened[0], router: router, snapshot: snapshot,
                                                publisher: publisher, collector: collector, pair: pairSockets), on: loop)
            let endpoints = Endpoints(broker: brokerEndpoint, snapshot: snapshotEndpoint,
                                      publisher: publisherEndpoint, collector: collectorEndpoint)
            if let cell = configuration.cell {
                let curveKey = try security.map { try CurveKeyPair.publicKey(forSecretKey: $0.secretKey) }
                parts.cellDirectory = try CellDirectory(cell: cell, broker: try Self.advertised(cell, bound: brokerEndpoint), curveKey: curveKey, instance: instance)
            }
            phase = .serving(endpoints, parts)
            startedAt = Date()
            installMethods()
            if let link = parts.etcd { followState(link) }
            if let directory = parts.cellDirectory { joinCells(directory) }
            parts.setInstance(now: clock.now)
            parts.flush()
            var metadata: Logger.Metadata = ["broker": "\(brokerEndpoint)", "snapshot": "\(snapshotEndpoint)",
                                             "publisher": "\(publisherEndpoint)", "collector": "\(collectorEndpoint)", "version": "\(SwitchboardVersion.current)"]
            if let pair = configuration.pair {
                metadata["pair"] = "\(pair.role.rawValue), listening on \(pair.listen), peer \(pair.peer)"
            }
            if let settings = configuration.stateEtcd { metadata["state"] = "etcd \(settings.endpoints.joined(separator: ",")) \(settings.prefix)" }
            logger.info("kernel started", metadata: metadata)
            return endpoints
        } catch {
            for socket in opened { socket.close() }
            throw error
        }
    }

    /// The rest of the pair's sockets: the DEALER this kernel sends to its peer on, and (with
    /// `peerBroker`) a DEALER to the peer's broker, the clients' way to it, asked whether the
    /// peer still serves when the link is silent (ZMTP heartbeats notice a machine gone).
    private func openPair(_ configuration: PairConfiguration, listener: ZMQSocket,
                          opened: inout [ZMQSocket]) throws -> (listener: ZMQSocket, sender: ZMQSocket, peerBroker: ZMQSocket?) {
        let security = self.configuration.security, context = loop.context
        // Nothing waits for a peer that is not there: what is sent meanwhile is dropped, and
        // the peer copies the state when it is back. With CURVE, each kernel is a client of
        // the other with the key pair they share.
        let interval = Int32(clamping: Int(configuration.heartbeatInterval.nanoseconds / 1_000_000))
        func dealer() throws -> ZMQSocket {
            let socket = try ZMQSocket(context, .dealer)
            opened.append(socket)
            if let security {
                let publicKey = try CurveKeyPair.publicKey(forSecretKey: security.secretKey)
                try CurveClientKeys(serverKey: publicKey, secretKey: security.secretKey).apply(to: socket)
            }
            try socket.set(.immediate, true)
            try socket.set(.linger, 0)
            return socket
        }
        // The link carries the whole state when the peer copies it: a PING would wait behind
        // it, and on a slow link time out a connection that is busy, not silent. TCP hears
        // each acknowledgement: the connection goes once the peer acknowledges nothing for
        // peer_timeout (its machine gone, the link cut); the pair's own heartbeats, on the
        // link's other connection, say within two intervals that the peer is silent.
        let sender = try dealer()
        try sender.dropSilentPeers(after: self.configuration.peerTimeout)
        try sender.set(.sendHighWaterMark, 1_000_000)
        try sender.connect(configuration.peer)
        // Connected by the parts once its connection events are watched.
        // The peer's broker answers small questions only: ZMTP heartbeats notice at once that
        // its connection went silent.
        let peerBroker = try configuration.peerBroker.map { _ in
            let socket = try dealer()
            try socket.set(.heartbeatInterval, interval)
            try socket.set(.heartbeatTimeout, interval * 2)
            return socket
        }
        return (listener, sender, peerBroker)
    }

    private func installMethods() {
        var table = MethodTable(of: self)
        table.logger = logger
        table.limits = BodyLimits(maxBatchItems: configuration.maxBatchItems, maxReplyBytes: configuration.maxMessageSize)
        self.table = table
    }

    deinit {
        // Released without stop(): close the sockets and end the thread anyway.
        loop.beginShutdown()
    }

    /// Stops serving: closes every socket and ends the loop thread.
    public func stop() async {
        guard case .serving(_, let parts) = phase else {
            phase = .stopped
            return await loop.shutdown()
        }
        phase = .stopped
        table = nil
        answersUnderWay.removeAll()
        if let directory = parts.cellDirectory { await leaveCells(directory) }
        parts.close()
        if let link = parts.etcd { await closeState(link) }
        logger.info("kernel stopped")
        await loop.shutdown()
    }

    /// Applies what can change while serving (a reload: SIGHUP): the limits and the keys
    /// admitted (``KernelConfiguration/takeLiveSettings(from:)``); the rest needs a restart.
    public func reconfigure(_ new: KernelConfiguration) {
        guard let new = try? Self.trustingOwnKey(new) else { return logger.error("a reloaded secret key is not Z85: settings not reloaded") }
        parts?.reconfigure(new)
        logger.info("kernel settings reloaded")
    }

    // MARK: The built-in `kernel` service

    /// Answers a `kernel` request body here, as one through the broker is answered, all its
    /// turns at once (for the fuzz target, which drives the methods without sockets); empty
    /// before ``start()``.
    public func respond(to body: [UInt8], peer: String? = nil) -> [UInt8] {
        guard let table else { return [] }
        return Self.$requestPeer.withValue(peer) {
            switch table.answerNow(body: body, on: self, turnBytes: Self.turnBytes) {
            case .answered(let reply, _): return reply
            case .underWay(var rest):
                while true {
                    if let answered = table.goOn(&rest, on: self, turnBytes: Self.turnBytes) { return answered.reply }
                }
            }
        }
    }

    /// How much of a body's results the loop builds before it serves its sockets again: a
    /// batch of `state.get` pages can ask for as much as the message limit, and building it
    /// all in one go would hold every other client's requests behind it.
    static let turnBytes = 1 << 20

    /// Messages libzmq reads ahead from one peer of the broker before the loop takes them.
    /// Past it libzmq stops reading that connection, so a peer that sends faster than the
    /// loop reads is held back by TCP and its own socket: a worker pumping the parts of a
    /// stream its client does not read fills its own queues (where its handlers wait),
    /// not the kernel's memory, and what that worker sends next (another client's reply)
    /// waits behind this much of it and what TCP holds, not behind all it sent meanwhile.
    static let peerInputBacklog: Int32 = 1_000

    /// A request for the `kernel` service, admitted by the broker (``Admission``).
    func answer(_ caller: Broker.Caller, body: [Frame], peer: String?) {
        guard let parts, let table else { return }
        guard body.count == 1 else {
            parts.broker.replyFromKernel(to: caller, JSONRPCResponse(id: .null, error: .invalidRequest("the body must be one frame")).jsonBytes)
            return
        }
        guard let etcd = parts.etcd else {
            let answering = Self.$requestPeer.withValue(peer) { table.answerNow(body: body[0].bytes, on: self, turnBytes: Self.turnBytes) }
            return goOn(answering, to: caller, peer: peer)
        }
        // With the state on etcd a write is answered once etcd has it: the loop goes on meanwhile.
        etcd.requests.continuation.yield(.kernel(caller: caller, body: body[0].bytes, peer: peer))
    }

    /// Replies to `caller` once its body is answered; until then answers the next turn of it
    /// after the loop has served its sockets (a timer due at once runs after the poll).
    private func goOn(_ answering: BodyAnswering, to caller: Broker.Caller, peer: String?) {
        switch answering {
        case .answered(let reply, _): parts?.reply(to: caller, reply)
        case .underWay(let rest):
            answersUnderWay.append(AnswerUnderWay(body: rest, caller: caller, peer: peer))
            // A turn is due while any is under way: the first one under way asks for it.
            if answersUnderWay.count == 1 { scheduleTurn() }
        }
    }

    /// A body answered in turns, between two of them.
    private struct AnswerUnderWay {
        var body: BodyUnderWay
        let caller: Broker.Caller
        let peer: String?
    }

    private func scheduleTurn() {
        loop.schedule(after: .zero) { [weak self] in self?.assumeIsolated { $0.takeTurn() } }
    }

    /// Answers the next turn of the first body under way, and replies once it is all
    /// answered. The body is taken out for its turn and put back after it: held in one place
    /// only, its reply grows where it lies.
    private func takeTurn() {
        // Stopped meanwhile: there is no socket to answer on.
        guard var answer = answersUnderWay.popFirst(), let table, let parts else { return }
        if let answered = Self.$requestPeer.withValue(answer.peer, operation: { table.goOn(&answer.body, on: self, turnBytes: Self.turnBytes) }) {
            parts.reply(to: answer.caller, answered.reply)
            parts.flush()
        } else {
            answersUnderWay.append(answer)
        }
        if !answersUnderWay.isEmpty { scheduleTurn() }
    }

    /// The `kernel` service's methods while serving.
    var methodTable: MethodTable<Kernel>? { table }

    public nonisolated func methods(_ table: inout MethodTable<Kernel>) {
        table.onIsolated(KernelAPI.ping) { kernel, _ in try kernel.ping() }
        table.onIsolated(KernelAPI.servicesList) { kernel, _ in try kernel.servicesList() }
        table.onIsolated(KernelAPI.stats) { kernel, _ in try kernel.statistics() }
        table.onIsolated(KernelAPI.metrics) { kernel, _ in KernelAPI.Metrics(contentType: "text/plain; version=0.0.4", text: try kernel.prometheusText()) }
        if configuration.stateEtcd == nil {
            table.onIsolated(KernelAPI.stateSet) { kernel, params in try kernel.stateSet(params, peer: Self.requestPeer, asClient: false).made() }
            table.onIsolated(KernelAPI.statePublish) { kernel, params in try kernel.stateSet(params, peer: Self.requestPeer, asClient: true).made() }
        } else {
            table.on(KernelAPI.stateSet) { kernel, params in try await kernel.stateSetOnEtcd(params, asClient: false) }
            table.on(KernelAPI.statePublish) { kernel, params in try await kernel.stateSetOnEtcd(params, asClient: true) }
        }
        table.onIsolated(KernelAPI.stateGet, encoded: { kernel, params in kernel.stateGet(params, in: try kernel.servingState()) })
        table.onIsolated(KernelAPI.stateHistory) { kernel, params in kernel.stateHistory(params, in: try kernel.servingState()) }
        table.onIsolated(KernelAPI.workersList) { kernel, params in try kernel.workersList(params) }
        table.onIsolated(KernelAPI.workersDrain) { kernel, params in try kernel.drainWorkers(params) }
    }

    private func ping() throws(JSONRPCError) -> KernelAPI.Pong {
        let parts = try serving()
        return KernelAPI.Pong(pong: true, instance: instance, pid: Int(ProcessInfo.processInfo.processIdentifier),
                              uptimeSeconds: (Date().timeIntervalSince(startedAt) * 1000).rounded() / 1000, version: SwitchboardVersion.current,
                              pair: parts.state.pair?.status)
    }

    private func servicesList() throws(JSONRPCError) -> KernelAPI.ServiceList {
        let parts = try serving()
        return KernelAPI.ServiceList(services: parts.broker.services.values.sorted { $0.name < $1.name }.map { service in
            let workers = parts.broker.workers.values.filter { $0.service === service && $0.cell == nil }, cells = service.cells
            let draining = workers.filter(\.draining).count
            return KernelAPI.ServiceList.Entry(name: service.name, workers: service.workers, idle: workers.filter { $0.inFlight.isEmpty && !$0.draining }.count,
                                               queued: service.requests.count, inFlight: workers.reduce(0) { $0 + $1.inFlight.count },
                                               draining: draining > 0 ? draining : nil, cells: cells.isEmpty ? nil : cells)
        }, pair: parts.state.pair?.status)
    }

    private func workersList(_ params: KernelAPI.WorkersParams) throws(JSONRPCError) -> KernelAPI.Workers {
        let chosen = try serving().broker.workers.values.filter { worker in
            (params.service == nil || worker.service.name == params.service) && params.worker.map(worker.isNamed) != false
        }
        return Self.workers(chosen)
    }

    private func drainWorkers(_ params: KernelAPI.WorkersParams) throws(JSONRPCError) -> KernelAPI.Workers {
        guard let service = params.service, !service.isEmpty else { throw .invalidParams(field: "service", "is required: the service whose workers drain") }
        let drained = try serving().broker.drain(service: service, worker: params.worker, now: clock.now)
        guard !drained.isEmpty else {
            throw .invalidParams(field: params.worker == nil ? "service" : "worker",
                                 params.worker.map { "no worker of '\(service)' has the id or process '\($0)' (kernel workers.list shows them)" }
                                     ?? "no worker offers '\(service)' here")
        }
        logger.notice("draining workers on request", metadata: ["service": "\(service)", "workers": "\(drained.count)"])
        return Self.workers(drained)
    }

    private static func workers(_ workers: [Broker.Worker]) -> KernelAPI.Workers {
        func text(_ frame: Frame) -> String { frame.string ?? frame.description }
        return KernelAPI.Workers(workers: workers.map { worker in
            KernelAPI.Workers.Entry(service: worker.service.name, id: text(worker.identity), process: text(worker.process), window: worker.window,
                                    inFlight: worker.inFlight.count, draining: worker.draining)
        }.sorted { ($0.service, $0.id) < ($1.service, $1.id) })
    }

    /// `state.set` or `state.publish` with the state on etcd: admitted here, answered once
    /// etcd committed it and the copy holds it.
    private func stateSetOnEtcd(_ params: KernelAPI.StateSetParams, asClient: Bool) async throws -> KernelAPI.StateWritten {
        switch try stateSet(params, peer: Self.requestPeer, asClient: asClient) {
        case .made(let sequence): return KernelAPI.StateWritten(sequence: sequence)
        case .toCommit(let write): return KernelAPI.StateWritten(sequence: try await commitToEtcd(write))
        }
    }

    /// Refuses the state's methods (-32008) once this kernel lost the election of its state
    /// in etcd, or while its lease may have run out unrenewed: its copy may then miss what
    /// another kernel writes, so even a read from it could answer what is no longer so.
    private func servingState() throws(JSONRPCError) -> KernelParts {
        let parts = try serving()
        guard let link = parts.etcd else { return parts }
        if let closed = link.closedWith { throw closed }
        // The rule is the time itself; the flag is set by a watcher that may not have run
        // yet when a request comes (after the process was frozen, say).
        if link.leaseLapsed || ContinuousClock.now >= link.leaseHeldUntil {
            throw JSONRPCError(code: JSONRPCError.notActiveCode, message: "Not active: this kernel could not renew its lease in etcd for \(link.leaseSeconds) s "
                + "(no majority of etcd's members answered); it serves the state again once it does, or another kernel takes over")
        }
        return parts
    }

    /// What a request the kernel takes up after it stopped is answered (it may have waited
    /// for its turn while the kernel stopped).
    static let stopping = JSONRPCError(code: JSONRPCError.notActiveCode, message: "Not active: the kernel is stopping")

    /// `state.set`, or with `asClient` `state.publish` (the collector's rule for the key).
    private func stateSet(_ params: KernelAPI.StateSetParams, peer: String?, asClient: Bool) throws(JSONRPCError) -> StateServer.Written {
        let parts = try servingState()
        guard params.key.hasPrefix("/"), params.key.count > 1 else {
            throw .invalidParams(field: "key", "must be a path starting with '/'")
        }
        // The contract's range refuses any other ttl before this runs; checked again here
        // because this is where seconds become nanoseconds.
        let ttl = try params.ttl.map { seconds throws(JSONRPCError) in
            guard let ttl = TimeToLive(seconds: seconds) else { throw .invalidParams(field: "ttl", "must be \(TimeToLive.rangeDescription)") }
            return ttl
        }
        let value = params.value ?? .null
        let frame = value.isNull ? Frame() : Frame(value.jsonBytes)
        return try parts.state.write(params.key, value: frame, ttl: ttl, expected: params.revision, uuid: Self.digest(RequestKey.current),
                               by: Peer(userID: peer, security: configuration.security), asClient: asClient, now: clock.now).get()
    }

    /// The CHP UUID of a change a request made: 16 bytes from its client and id (two FNV-1a
    /// hashes), the same on both kernels of a pair, so a request sent again is known.
    static func digest(_ key: RequestKey?) -> Frame {
        guard let key else { return Frame() }
        var first: UInt64 = 0xcbf2_9ce4_8422_2325, second: UInt64 = 0x6c62_272e_07bb_0142
        for byte in key.description.utf8 {
            first = (first ^ UInt64(byte)) &* 0x0000_0100_0000_01b3
            second = (second ^ UInt64(byte)) &* 0x0000_0100_0000_01b3 &+ 0x9e37_79b9
        }
        var bytes = [UInt8]()
        withUnsafeBytes(of: first.bigEndian) { bytes += $0 }
        withUnsafeBytes(of: second.bigEndian) { bytes += $0 }
        return Frame(bytes)
    }

    private func stateHistory(_ params: KernelAPI.StateHistoryParams, in parts: KernelParts) -> KernelAPI.StateRevisions {
        let revisions = parts.state.revisions(of: Frame(params.key)).map { change in
            let value: JSONValue = change.value.isEmpty ? .null
                : (try? JSONValue(parsing: change.value.bytes)) ?? .string(String(decoding: change.value.bytes, as: UTF8.self))
            return KernelAPI.StateRevisions.Revision(sequence: change.sequence, value: value)
        }
        return KernelAPI.StateRevisions(key: params.key, revisions: revisions, sequence: parts.state.sequence, since: parts.state.history.start)
    }

    /// A page of ``KernelAPI/StateEntries`` as JSON text: each stored value spliced in as it
    /// is (a value that is not JSON, from a plain CHP client, as a string; checked when it
    /// was written), so a page costs a copy of its bytes, not a parse and an encoding of each.
    private func stateGet(_ params: KernelAPI.StateGetParams, in parts: KernelParts) -> [UInt8] {
        let page = parts.state.page(under: params.prefix ?? "", after: params.after, limit: params.limit ?? KernelAPI.stateGetDefaultLimit,
                              maxBytes: KernelAPI.stateGetPageBytes)
        func string(_ text: String) -> [UInt8] { JSONValue.string(text).jsonBytes }
        var text = Array(#"{"entries":["#.utf8)
        text.reserveCapacity(page.entries.reduce(64) { $0 + $1.entry.size + 64 })
        for (index, (key, entry)) in page.entries.enumerated() {
            if index > 0 { text.append(UInt8(ascii: ",")) }
            text += Array(#"{"key":"#.utf8) + string(key.string ?? "") + Array(#","sequence":\#(entry.sequence),"value":"#.utf8)
            entry.value.withUnsafeBytes { value in
                if entry.isJSON { text += value } else { text += string(String(decoding: value, as: UTF8.self)) }
            }
            text.append(UInt8(ascii: "}"))
        }
        text += Array("]".utf8)
        if page.more, let last = page.entries.last { text += Array(#","next":"#.utf8) + string(last.key.string ?? "") }
        text += Array(#","sequence":\#(parts.state.sequence)}"#.utf8)
        return text
    }
}

extension Kernel {
    /// `kernel` `stats`: totals, and per service its requests, replies, errors, queue
    /// depth, workers and latencies (p50/p99 are bucket bounds: upper estimates).
    func statistics() throws(JSONRPCError) -> KernelAPI.Stats {
        let parts = try serving()
        var services: [String: KernelAPI.Stats.Service] = [:]
        for service in parts.broker.services.values {
            let stats = service.stats
            services[service.name] = KernelAPI.Stats.Service(
                requests: stats.requests, replies: stats.replies, errors: stats.errors, unavailable: stats.unavailable,
                redispatched: stats.redispatched, outcomeUnknown: stats.outcomeUnknown, handlerDied: stats.handlerDied,
                queued: service.requests.count, workers: service.workers, meanLatencyMicroseconds: stats.latency.meanMicroseconds.rounded(),
                p50LatencyMicroseconds: stats.latency.quantileMicroseconds(0.5).map { Int($0) },
                p99LatencyMicroseconds: stats.latency.quantileMicroseconds(0.99).map { Int($0) })
        }
        var pairStatus = parts.state.pair?.status
        pairStatus?.refusedNotActive = parts.broker.refusedNotActive
        return KernelAPI.Stats(
            requests: parts.broker.totalRequests, protocolErrors: parts.broker.protocolErrors, droppedReplies: parts.broker.droppedReplies,
            brokenStreams: parts.broker.brokenStreams, cancelledRequests: parts.broker.cancelledRequests, gatheredBytes: parts.broker.gatheredBytes,
            streamsInProgress: parts.broker.streamsInProgress, gathersInProgress: parts.broker.gathers.count, queuedBytes: parts.broker.queuedBytes, uptimeSeconds: Date().timeIntervalSince(startedAt).rounded(),
            openFiles: OpenFiles.count, maxOpenFiles: OpenFiles.limit, refusedForOpenFiles: parts.refusedForOpenFiles, services: services,
            security: .init(curve: configuration.security != nil, refusedConnections: parts.zap?.refused ?? 0,
                            refusedRegistrations: parts.broker.refusedRegistrations, refusedRequests: parts.broker.refusedForKey),
            state: .init(keys: parts.state.entries.count, bytes: parts.state.totalBytes, sequence: parts.state.sequence, rejectedWrites: parts.state.rejectedWrites,
                         refusedForbidden: parts.state.refusedForbidden, refusedOverLimit: parts.state.refusedOverLimit, refusedConflict: parts.state.refusedConflict,
                         history: .init(changes: parts.state.history.changes.count, bytes: parts.state.history.bytes, keys: parts.state.history.keys,
                                        since: parts.state.history.start, maxChanges: parts.state.history.limits.changes,
                                        maxBytes: parts.state.history.limits.bytes, perKey: parts.state.history.limits.perKey,
                                        resumes: parts.state.resumes, resumesRefused: parts.state.resumesRefused),
                         etcd: parts.etcd.map { link in
                             .init(endpoints: link.client.settings.endpoints, prefix: String(decoding: link.prefix, as: UTF8.self), revision: link.lastRevision,
                                   lagRevisions: max(0, link.reportedRevision - link.lastRevision), lease: String(link.lease, radix: 16),
                                   transactions: link.transactions, failedWrites: link.failedWrites, droppedWrites: link.droppedWrites, queuedWrites: link.queue.count)
                         }),
            pair: pairStatus,
            cell: configuration.cell.map { cell in
                .init(name: cell.name, received: parts.broker.receivedFromCells, peers: parts.broker.cellStats.mapValues { stats in
                    .init(sent: stats.requests, answered: stats.replies, meanLatencyMicroseconds: stats.latency.meanMicroseconds.rounded(),
                          p50LatencyMicroseconds: stats.latency.quantileMicroseconds(0.5).map { Int($0) },
                          p99LatencyMicroseconds: stats.latency.quantileMicroseconds(0.99).map { Int($0) })
                })
            })
    }

    /// The same figures in the Prometheus text exposition format (version 0.0.4).
    func prometheusText() throws(JSONRPCError) -> String {
        let parts = try serving()
        var text = ""
        func family(_ name: String, _ type: String, _ help: String, _ samples: [(labels: String, value: String)]) {
            text += "# HELP switchboard_\(name) \(help)\n# TYPE switchboard_\(name) \(type)\n"
            for sample in samples { text += "switchboard_\(name)\(sample.labels) \(sample.value)\n" }
        }
        let services = parts.broker.services.values.sorted { $0.name < $1.name }
        func label(_ service: Broker.Service, _ extra: String = "") -> String {
            let escaped = service.name.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
            return "{service=\"\(escaped)\"\(extra)}"
        }
        func perService(_ name: String, _ type: String, _ help: String, _ value: (Broker.Service) -> Int) {
            family(name, type, help, services.map { (label($0), String(value($0))) })
        }
        perService("requests_total", "counter", "Requests received for the service.") { $0.stats.requests }
        perService("replies_total", "counter", "Replies relayed from the service's workers.") { $0.stats.replies }
        perService("errors_total", "counter", "Replies that were JSON-RPC errors, as the service's workers report them in heartbeats.") { $0.stats.errors }
        perService("unavailable_total", "counter", "Requests answered -32001: no worker in time or the queue full.") { $0.stats.unavailable }
        perService("redispatched_total", "counter", "Requests re-sent after their worker died.") { $0.stats.redispatched }
        perService("outcome_unknown_total", "counter", "Requests answered -32006 after their worker died.") { $0.stats.outcomeUnknown }
        perService("handler_died_total", "counter", "Requests answered -32012: each worker they were handed to died with them.") { $0.stats.handlerDied }
        perService("queue_depth", "gauge", "Requests waiting for a worker.") { $0.requests.count }
        perService("workers", "gauge", "Registered workers.") { $0.workers }
        text += "# HELP switchboard_request_duration_seconds Time from a request's arrival to its reply.\n"
        text += "# TYPE switchboard_request_duration_seconds histogram\n"
        for service in services {
            let latency = service.stats.latency
            var cumulative = 0
            for (index, count) in latency.counts.enumerated() {
                cumulative += count
                let bound = index < LatencyHistogram.bounds.count ? "\(Double(LatencyHistogram.bounds[index]) / 1_000_000)" : "+Inf"
                text += "switchboard_request_duration_seconds_bucket\(label(service, ",le=\"\(bound)\"")) \(cumulative)\n"
            }
            text += "switchboard_request_duration_seconds_sum\(label(service)) \(Double(latency.sumNanoseconds) / 1_000_000_000)\n"
            text += "switchboard_request_duration_seconds_count\(label(service)) \(latency.count)\n"
        }
        family("protocol_errors_total", "counter", "Malformed or unexpected messages from peers.", [("", String(parts.broker.protocolErrors))])
        family("broken_streams_total", "counter", "Replies in parts (18/MDP) that ended before their FINAL.", [("", String(parts.broker.brokenStreams))])
        family("cancelled_requests_total", "counter", "Requests their clients cancelled while the kernel held them.", [("", String(parts.broker.cancelledRequests))])
        family("gathered_bytes", "gauge", "Bytes of reply parts held for 7/MDP clients until their FINAL.", [("", String(parts.broker.gatheredBytes))])
        family("streams_in_progress", "gauge", "Replies in parts (18/MDP) under way: a part relayed, no FINAL yet.", [("", String(parts.broker.streamsInProgress))])
        family("gathers_in_progress", "gauge", "Requests to every worker of a service (all:SERVICE) still gathering answers.", [("", String(parts.broker.gathers.count))])
        family("refused_connections_total", "counter", "Connections refused by the ZAP handler.", [("", String(parts.zap?.refused ?? 0))])
        family("refused_registrations_total", "counter", "READY commands refused: a client key, or a service's key for another service.", [("", String(parts.broker.refusedRegistrations))])
        family("refused_requests_total", "counter", "Requests refused for their key: for operators only (workers.drain, the supervisor) from another key, or from a key a reload took out.", [("", String(parts.broker.refusedForKey))])
        family("state_keys", "gauge", "Keys in the CHP state.", [("", String(parts.state.entries.count))])
        family("state_bytes", "gauge", "Bytes of keys and values in the CHP state.", [("", String(parts.state.totalBytes))])
        family("state_refused_total", "counter", "State writes refused: forbidden for the writer's key, or over a key or byte limit.",
               [("{reason=\"forbidden\"}", String(parts.state.refusedForbidden)), ("{reason=\"limit\"}", String(parts.state.refusedOverLimit))])
        family("state_refused_conflict_total", "counter", "Compare-and-sets refused: the key was not at the revision given.", [("", String(parts.state.refusedConflict))])
        family("state_history_changes", "gauge", "Recent changes of the state kept for resumes and state.history.", [("", String(parts.state.history.changes.count))])
        family("state_history_bytes", "gauge", "Bytes the state's kept changes hold: keys, values and each change's record.", [("", String(parts.state.history.bytes))])
        family("state_resumes_total", "counter", "Subscribers resumed from a sequence: with the changes since, or with a whole snapshot (no longer held).",
               [("{outcome=\"exact\"}", String(parts.state.resumes)), ("{outcome=\"snapshot\"}", String(parts.state.resumesRefused))])
        family("state_sequence", "gauge", "The CHP sequence number: the position of the latest change, not a count of events.", [("", String(parts.state.sequence))])
        if let etcd = parts.etcd {
            family("state_etcd_revision", "gauge", "The etcd revision of the last change the kernel's copy of the state holds.", [("", String(etcd.lastRevision))])
            family("state_etcd_lag_revisions", "gauge", "Revisions etcd reported past the kernel's copy of the state.",
                   [("", String(max(0, etcd.reportedRevision - etcd.lastRevision)))])
            family("state_etcd_transactions_total", "counter", "Transactions the kernel sent etcd with state writes.", [("", String(etcd.transactions))])
            family("state_etcd_failed_writes_total", "counter", "State writes etcd did not take (answered with an error).", [("", String(etcd.failedWrites))])
            family("state_etcd_dropped_writes_total", "counter", "Collector writes dropped: too many waited for etcd.", [("", String(etcd.droppedWrites))])
            family("state_etcd_queued_writes", "gauge", "State writes waiting for etcd.", [("", String(etcd.queue.count))])
        }
        if configuration.cell != nil {
            let cells = parts.broker.cellStats.sorted { $0.key < $1.key }
            func cellLabel(_ name: String) -> String { "{cell=\"\(name)\"}" }
            family("cell_requests_total", "counter", "Requests handed to another cell of the bus.", cells.map { (cellLabel($0.key), String($0.value.requests)) })
            family("cell_replies_total", "counter", "Answers another cell of the bus sent back.", cells.map { (cellLabel($0.key), String($0.value.replies)) })
            family("cell_reply_seconds_sum", "counter", "Seconds from the arrival of each request answered by another cell to its answer, summed.",
                   cells.map { (cellLabel($0.key), String(Double($0.value.latency.sumNanoseconds) / 1_000_000_000)) })
            family("cell_received_total", "counter", "Requests other cells of the bus sent here.", [("", String(parts.broker.receivedFromCells))])
        }
        family("uptime_seconds", "gauge", "Seconds since the kernel started.", [("", String(Date().timeIntervalSince(startedAt).rounded()))])
        if let open = OpenFiles.count, let limit = OpenFiles.limit {
            family("open_files", "gauge", "Files (connections among them) the kernel's process holds open.", [("", String(open))])
            family("max_open_files", "gauge", "Files the kernel's process may hold open: near this limit it ends new connections.", [("", String(limit))])
        }
        family("refused_for_open_files_total", "counter", "Connections ended as soon as accepted: the kernel held files into the few it keeps for its own use.",
               [("", String(parts.refusedForOpenFiles))])
        return text
    }
}

extension Kernel: Service {
    /// How long a kernel that lost the election of its state in etcd answers -32008 before
    /// it ends.
    static let lostElectionGrace = Duration.seconds(1)

    /// Serves until graceful shutdown (SIGTERM/SIGINT through a `ServiceGroup`), then stops;
    /// a kernel keeping its state in etcd that loses the election ends with an error.
    public func run() async throws {
        do {
            // A kernel waiting for the election of its state in etcd waits until it is asked
            // to stop, no longer.
            _ = try await cancelWhenGracefulShutdown { try await self.start() }
        } catch where Task.isShuttingDownGracefully {
            // Cancelled by the shutdown (whatever the wait in progress made of that).
            await stop()
            return
        }
        // Until shutdown, or until a kernel that keeps its state in etcd loses the election
        // (another kernel writes the state now): then it ends with an error, so its supervisor
        // starts it again and it waits to stand again rather than serve without writing.
        let lost = parts?.etcd?.lost.stream
        let why = await withTaskGroup(of: String?.self) { group in
            group.addTask {
                try? await gracefulShutdown()
                return nil
            }
            if let lost {
                group.addTask {
                    for await why in lost { return why }
                    return nil
                }
            }
            defer { group.cancelAll() }
            return await group.next() ?? nil
        }
        if why != nil {
            // A moment answering -32008 before it goes: the requests under way get their
            // answer, and clients learn to ask the other kernel, rather than wait out a
            // timeout on a kernel that vanished.
            try? await Task.sleep(for: Self.lostElectionGrace)
        }
        await stop()
        if let why { throw KernelLostElection(why: why) }
    }
}

/// What the kernel itself refuses, where libzmq has no say: a start its configuration, its
/// cell's directory or its own state rules out, saying why and what to change.
public struct KernelRefusal: Error, Sendable, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// The kernel ended because it no longer holds the election of the state it keeps in etcd.
public struct KernelLostElection: Error, CustomStringConvertible {
    public let why: String
    public var description: String { "this kernel lost the election of its state in etcd (\(why)): it ends, to stand again when started" }
}
