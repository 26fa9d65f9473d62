import BusProtocol
import Contracts
import Logging
import ZeroMQ

/// Which client requests this kernel serves now: the one rule, asked by the broker before a
/// request goes anywhere. With CURVE on, what ``OperatorsOnly`` lists is served to operators'
/// keys only. Otherwise a kernel alone serves everything. Of a pair, any kernel answers
/// questions about itself (8/MMI, and the `kernel` service's methods other than the state's);
/// a request for a service, or for the state, only the active one, and asking is what makes
/// a passive kernel whose peer is gone take over (Binary Star).
struct Admission {
    /// Whether the kernel is one of a pair.
    let isPaired: Bool

    enum Verdict: Equatable {
        case admitted
        /// This kernel is not the active one of its pair (answered -32008), and why.
        case notActive(String)
        /// What only operators may ask, from another key (answered -32011).
        case notOperator
        /// From a connection whose key a reload took out (answered -32011).
        case keyRemoved
    }

    /// Of a pair: asked about a request only the active kernel serves, nil when this kernel
    /// serves it (possibly by taking over now), else why not (``StateServer/pairRefusal(now:)``).
    typealias PairRefusal = (_ now: UInt64) -> String?

    /// Whether the kernel serves a request for `service` from `peer` (its ZAP user id), given
    /// who may ask what (`security`, nil without CURVE).
    func verdict(service: String, body: ArraySlice<Frame>, peer: String?, security: KernelSecurity?, now: UInt64,
                 pairRefusal: PairRefusal) -> Verdict {
        // A body is read only when a rule needs its methods, and only for the kernel's own
        // service, whose requests are few.
        let isKernel = service == KernelAPI.service
        func calls(_ names: Set<String>) -> Bool {
            isKernel && body.count == 1 && JSONRPC.parseRequests(body.first!.bytes).requests.contains { names.contains($0.method) }
        }
        if let security, security.wasRemoved(peer) { return .keyRemoved }
        if let security, OperatorsOnly.services.contains(service) || calls(OperatorsOnly.kernelMethods),
           !Peer(userID: peer, security: security).isOperator {
            return .notOperator
        }
        guard isPaired, !MMI.isManagement(service) else { return .admitted }
        if isKernel, !calls(Self.stateMethods) { return .admitted }
        return pairRefusal(now).map { .notActive($0) } ?? .admitted
    }

    /// Why a request was refused.
    func refusal(_ verdict: Verdict, service: String) -> JSONRPCError {
        switch verdict {
        case .admitted: JSONRPCError(code: JSONRPCError.notActiveCode, message: "Not active")
        case .notActive(let why): JSONRPCError(code: JSONRPCError.notActiveCode, message: "Not active: \(why)")
        case .notOperator:
            .forbidden("\(service == KernelAPI.service ? "this kernel method" : "the '\(service)' service") is for operators' keys only: "
                + "sb sends it with KEYS/operator.key, which switchboard up makes; another machine's operator needs its public key in the kernel's KEYS/operators/ or security.operator_keys")
        case .keyRemoved:
            .forbidden("this connection's key is no longer among the kernel's allowed keys (a reload took it out): connect with a key the kernel allows")
        }
    }

    private static let stateMethods: Set<String> = [KernelAPI.stateSet.name, KernelAPI.statePublish.name, KernelAPI.stateGet.name, KernelAPI.stateHistory.name]
}

/// The kernel's parts on its loop thread, and the one place they meet: each socket's
/// messages go to its part, and after every call what the parts sent or told is carried
/// out (messages to their sockets, events to the part that acts on them). Built once the
/// sockets are bound; the sockets' handlers and timers hold it weakly (the broker socket's
/// and the collector's handlers strongly, until ``close()`` closes those sockets), so a
/// stopped kernel frees it with everything it holds.
final class KernelParts {
    /// The sockets, bound and configured by ``Kernel/start()``.
    struct Sockets {
        var zap: ZMQSocket?
        var router: ZMQSocket
        var snapshot: ZMQSocket
        var publisher: ZMQSocket
        var collector: ZMQSocket
        /// Of a pair: where the peer sends, where this kernel sends, and optionally a
        /// DEALER to the peer's broker (asked whether the peer still serves; not yet connected).
        var pair: (listener: ZMQSocket, sender: ZMQSocket, peerBroker: ZMQSocket?)?
    }

    var broker: Broker
    var state: StateServer
    /// ``StateServer/isPaired``, kept here too: ``flush()`` and the router's handler ask it
    /// at every turn.
    private let isPaired: Bool
    let zap: ZAPHandler?
    /// Where the state's changes are made when etcd keeps it.
    let etcd: EtcdStateLink?
    /// This cell's offers to the other cells (`kernel.cell`), once serving.
    private(set) var cells: CellLinks?
    /// The cells' directory in etcd, which says where the other cells are.
    var cellDirectory: CellDirectory?
    let clock: any NanosecondClock
    private let configuration: KernelConfiguration
    /// Answers the `kernel` service's requests (the kernel owns these parts).
    private weak let kernel: Kernel?
    private var registrations: Registrations?
    private var timers: [LoopTimer] = []

    private struct Registrations {
        var zap: SocketRegistration?
        var router: SocketRegistration
        var snapshot: SocketRegistration
        var publisher: SocketRegistration
        var collector: SocketRegistration
        var pairListener: SocketRegistration?
        var pairSender: SocketRegistration?
        var peerBroker: SocketRegistration?
        var peerBrokerMonitor: SocketRegistration?
        /// The connections each listening socket accepts (``connectionAccepted(_:)``).
        var accepted: [SocketRegistration] = []

        var all: [SocketRegistration] {
            [zap, router, snapshot, publisher, collector, pairListener, pairSender, peerBroker, peerBrokerMonitor].compactMap { $0 } + accepted
        }
    }

    init(kernel: Kernel, configuration: KernelConfiguration, instance: String, clock: any NanosecondClock, logger: Logger,
         etcd: EtcdStateLink? = nil) {
        self.kernel = kernel
        self.etcd = etcd
        self.configuration = configuration
        self.clock = clock
        state = StateServer(configuration: configuration, logger: logger,
                            pair: configuration.pair.map { PairLink(configuration: $0, instance: instance, clock: clock, logger: logger) })
        isPaired = configuration.pair != nil
        broker = Broker(configuration: configuration, logger: logger, admission: Admission(isPaired: isPaired))
        broker.recordsSpans = BusTracing.recordsSpans
        zap = configuration.security.map { ZAPHandler(security: $0, logger: logger) }
        etcd?.parts = self
    }

    /// Starts serving the sockets (on the loop thread).
    func serve(_ sockets: Sockets, on loop: SocketLoop) throws {
        // What a batch of messages produced is written out once, after the batch: one round
        // of sends (and of waking libzmq's I/O thread) per batch rather than per message.
        func register(_ socket: ZMQSocket, receivingOnly: Bool = false, _ handle: @escaping (KernelParts, Message) -> Void) -> SocketRegistration {
            let onMessage = { [weak self] (message: Message) in
                guard let self else { return }
                handle(self, message)
            }
            let registration = receivingOnly ? loop.register(receivingOnly: socket, onMessage: onMessage) : loop.register(socket, onMessage: onMessage)
            registration.afterReading = { [weak self] in self?.flush() }
            return registration
        }
        // The broker's socket, the busiest: its messages are read where libzmq holds them,
        // by a handler that holds these parts strongly, with no weak reference to load per
        // message. The registration lets go of its handler when its socket closes
        // (``close()``, or the loop's end), which ends the cycle.
        let router = loop.register(readingParts: sockets.router) { [self] parts in
            if isPaired {
                broker.handle(parts, now: clock.now) { state.pairRefusal(now: $0) }
            } else {
                broker.handle(parts, now: clock.now)
            }
        }
        router.afterReading = { [weak self] in self?.flush() }
        router.dropsWhenPeerFull = true
        router.onSendError = { [weak self] message, error in
            guard let self, let peer = message.first else { return }
            if error.isUnroutable {
                broker.peerGone(peer, undelivered: message, now: clock.now)
            } else if error.isWouldBlock {
                broker.peerFull(peer, undelivered: message, now: clock.now)
            }
        }
        // The collector's too, the next busiest: a KVSET's parts read where libzmq holds them,
        // by a handler holding these parts as the router's does.
        let collector = loop.register(readingParts: sockets.collector) { [self] in state.collect($0, now: clock.now) }
        collector.afterReading = { [weak self] in self?.flush() }
        var registrations = Registrations(
            zap: sockets.zap.map { register($0) { $0.zap?.handle($1) } },
            router: router,
            snapshot: register(sockets.snapshot) { $0.state.snapshot($1) },
            publisher: register(sockets.publisher) { $0.state.subscriptionChanged($1, now: $0.clock.now) },
            collector: collector)
        if let pair = configuration.pair, let pairSockets = sockets.pair {
            // Read as parts for the connection a message came on (a heartbeat names it).
            let listener = loop.register(readingParts: pairSockets.listener) { [weak self] parts in
                guard let self else { return }
                state.pairReceived(parts.message(), now: clock.now) { parts.sourceDescriptor.flatMap(TCPConnection.init(descriptor:)) }
            }
            listener.afterReading = { [weak self] in self?.flush() }
            registrations.pairListener = listener
            registrations.pairSender = register(pairSockets.sender) { _, _ in }
            registrations.pairSender?.dropsWhenPeerFull = true
            if let peerBroker = pairSockets.peerBroker {
                // Reachable once a ZMTP handshake succeeds, not when TCP connects: the machine of
                // a peer whose process is stopped still accepts connections, and only a process
                // that runs greets.
                let events = try connectionEvents(of: peerBroker, in: loop.context, also: .handshakeSucceeded)
                registrations.peerBrokerMonitor = register(events, receivingOnly: true) { parts, message in
                    guard let event = SocketEvent(message) else { return }
                    if event.event.contains(.handshakeSucceeded) { parts.state.pair?.peerBrokerConnected = true }
                    if event.event.contains(.disconnected) { parts.state.pair?.peerBrokerConnected = false }
                }
                registrations.peerBroker = register(peerBroker) { parts, _ in parts.state.pair?.probeAnswered(now: parts.clock.now) }
                registrations.peerBroker?.dropsWhenPeerFull = true
                // Connected only now: its first connection is an event the monitor sees.
                if let endpoint = pair.peerBroker { try peerBroker.connect(endpoint) }
            }
            repeatEvery(pair.heartbeatInterval, on: loop) { $0.state.pairTick(now: $0.clock.now) }
        }
        // Every connection accepted is looked at, to end it if the process cannot afford it.
        for listener in [sockets.router, sockets.snapshot, sockets.publisher, sockets.collector] + [sockets.pair?.listener].compactMap({ $0 }) {
            registrations.accepted.append(register(try socketEvents(of: listener, in: loop.context, .accepted), receivingOnly: true) { $0.connectionAccepted($1) })
        }
        self.registrations = registrations
        repeatEvery(configuration.heartbeatInterval, on: loop) { $0.broker.tick(now: $0.clock.now) }
        if let cell = configuration.cell {
            let cells = CellLinks(configuration: cell, kernel: configuration, loop: loop, logger: state.logger)
            cells.parts = self
            self.cells = cells
        }
        // Whether or not this kernel is of a cell: a peer that says it is one is heard at
        // this interval, and dropped when it falls silent.
        repeatEvery(configuration.cellHeartbeatInterval, on: loop) { parts in
            let now = parts.clock.now
            parts.broker.cellTick(now: now)
            parts.cells?.tick(now: now, services: parts.offeredToCells)
        }
        var heap = HeapTrim()
        // `kernel stats` as metrics, for a backend the process bootstrapped (telemetry on).
        let metrics = KernelMetrics.isExporting ? KernelMetrics() : nil
        repeatEvery(.seconds(1), on: loop) { parts in
            parts.broker.releaseIdleQueues()
            heap.releaseIfWorthIt()
            for log in [parts.broker.peerLog, parts.state.peerLog] + (parts.zap.map { [$0.peerLog] } ?? []) { log.flush() }
            if let change = parts.openFiles.check() { parts.say(change) }
            if let metrics, let stats = parts.kernel?.assumeIsolated({ try? $0.statistics() }) { metrics.record(stats) }
        }
        let sweep = max(min(configuration.queueTimeout / 10, .milliseconds(100)), .milliseconds(5))
        repeatEvery(sweep, on: loop) { parts in
            let now = parts.clock.now
            parts.broker.expireQueued(now: now)
            parts.state.tick(now: now)
        }
    }

    /// Connections ended as soon as accepted (``connectionAccepted(_:)``).
    private(set) var refusedForOpenFiles = 0
    /// Whether the process is near its limit on open files, said once each way.
    private var openFiles = OpenFiles.Watch()

    /// A listening socket accepted a connection: ended at once while the process holds files
    /// into its reserve (``OpenFiles/isInReserve``). At the limit libzmq's accept would fail
    /// and be tried again at once, forever, at a whole core, while the clients already
    /// connected waited their turn; ended, a connection costs an accept and a close, and the
    /// client tries again later as it would after any lost connection.
    private func connectionAccepted(_ message: Message) {
        guard let event = SocketEvent(message), OpenFiles.isInReserve, let connection = AcceptedConnection(event) else { return }
        connection.end()
        refusedForOpenFiles += 1
        if let change = openFiles.endedConnection() { say(change) }
    }

    private func say(_ change: OpenFiles.Watch.Change) {
        switch change {
        case .near(let open, let limit):
            state.logger.warning("this process holds \(open.map { "at least \($0)" } ?? "all") of the \(limit) files it may open: past \(limit - OpenFiles.reserve(of: limit)) the kernel ends each new connection as it comes (clients, workers, subscribers), until connections close; raise the hard limit (LimitNOFILE= in a systemd unit, ulimit -Hn), or see who holds the connections (ss -tnp)")
        case .room(let open, let limit):
            state.logger.notice("room for connections again: \(open) files open, of the \(limit) this process may open")
        }
    }

    private func repeatEvery(_ interval: Duration, on loop: SocketLoop, _ body: @escaping (KernelParts) -> Void) {
        timers.append(loop.scheduleRepeating(every: interval) { [weak self] in
            guard let self else { return }
            body(self)
            self.flush()
        })
    }

    /// Applies a reloaded configuration's live settings to every part.
    func reconfigure(_ new: KernelConfiguration) {
        broker.configuration.takeLiveSettings(from: new)
        state.configuration.takeLiveSettings(from: new)
        if let security = broker.configuration.security { zap?.security = security }
        cells?.security = broker.configuration.security
        broker.dropWorkersNoLongerAllowed(now: clock.now)
        flush()
    }

    /// Stops serving: the timers end and the sockets close (on the loop thread).
    func close() {
        cells?.close()
        cells = nil
        for timer in timers { timer.cancel() }
        timers.removeAll()
        for registration in registrations?.all ?? [] { registration.close() }
        registrations = nil
    }

    /// Carries out what the parts sent and told since the last call, until nothing is left
    /// (an event can make a part send, a failed send can make the broker re-dispatch).
    func flush() {
        guard let registrations else { return }
        if let etcd, !state.resumesFromEtcd.isEmpty {
            // Read from etcd a few at a time; the rest get what the copy holds.
            for (request, through) in state.resumesFromEtcd {
                if etcd.resumesReading < EtcdStateLink.maxResumesReading, etcd.closedWith == nil {
                    etcd.resumesReading += 1
                    etcd.requests.continuation.yield(.resume(request, through: through))
                } else {
                    state.answer(request)
                }
            }
            state.resumesFromEtcd.removeAll()
        }
        repeat {
            for event in broker.takeEvents() { handle(event) }
            if isPaired { for event in state.pair?.takeEvents() ?? [] { handle(event) } }
            // What a part writes while its batch is sent (a failed send makes the broker
            // re-dispatch) is the next batch.
            while let batch = broker.outbox.takeBatch() {
                if let cells {
                    // Answers to requests another cell sent go back on its link.
                    batch.forEach { CellLinks.isAnswer($0) ? cells.relay($0) : registrations.router.send(frames: $0) }
                } else {
                    send(batch, on: registrations.router)
                }
                broker.outbox.reuse(batch)
            }
            while let batch = state.snapshots.takeBatch() { send(batch, on: registrations.snapshot); state.snapshots.reuse(batch) }
            while let batch = state.publisher.takeBatch() { send(batch, on: registrations.publisher); state.publisher.reuse(batch) }
            if let zap {
                while let batch = zap.outbox.takeBatch() { send(batch, on: registrations.zap); zap.outbox.reuse(batch) }
            }
            if isPaired {
                while let batch = state.pair?.outbox.takeBatch() { send(batch, on: registrations.pairSender); state.pair?.outbox.reuse(batch) }
                while let batch = state.pair?.probes.takeBatch() { send(batch, on: registrations.peerBroker); state.pair?.probes.reuse(batch) }
            }
        } while !broker.events.isEmpty || isPaired && state.pair?.hasEvents == true || !broker.outbox.isEmpty
        if let etcd, !state.durableWrites.isEmpty {
            let dropped = etcd.droppedWrites
            for write in state.durableWrites where !etcd.enqueue(EtcdStateLink.Pending(write: write, done: nil)) { state.settled(write) }
            state.durableWrites.removeAll(keepingCapacity: true)
            if etcd.droppedWrites > dropped {
                state.peerLog.warning("collector writes dropped: too many wait for etcd", metadata: ["dropped": "\(etcd.droppedWrites)"])
            }
            kernel?.assumeIsolated { $0.startWritingState() }
        }
    }

    /// Sends a part's batch on `registration`, or drops it when there is none (a socket this
    /// kernel does not have).
    private func send(_ batch: Outbox.Batch, on registration: SocketRegistration?) {
        guard let registration else { return }
        batch.forEach { registration.send(frames: $0) }
    }

    private func handle(_ event: Broker.Event) {
        switch event {
        case .kernelRequest(let caller, let body, let peer):
            kernel?.assumeIsolated { $0.answer(caller, body: body, peer: peer) }
        case .workersChanged(let service, let count):
            setServiceKey(service, now: clock.now)
            if let cells, count <= 1 { cells.reconcile(services: offeredToCells, now: clock.now) }
            cellDirectory?.changed.yield()
        case .offersChanged(let service):
            setServiceKey(service, now: clock.now)
        case .answered(let service, let body, let received, let now):
            guard body.count == 1 else { return }
            BusTracing.recordDispatch(service: service, body: body[0], received: received, answered: now, now: clock.now)
        }
    }

    private func handle(_ event: PairLink.Event) {
        switch event {
        case .becameActive:
            // The kernel's own keys now say this kernel and the workers registered with it.
            writeOwnKeys(now: clock.now)
        case .released(.publish(let update, let key)):
            state.emit(update, key: key)
        case .released(.reply(let caller, let body)):
            broker.replyFromKernel(to: caller, body)
        }
    }

    /// The `kernel` service's reply to `caller`: of a pair, once the peer holds every change
    /// made so far (a write is acknowledged only then).
    func reply(to caller: Broker.Caller, _ body: [UInt8]) {
        if isPaired {
            let made = state.sequence
            if state.pair?.hold(.reply(caller, body: body), until: made) == true { return }
        }
        broker.replyFromKernel(to: caller, body)
    }

    /// The services this cell offers the other cells, with their workers here: those with a
    /// worker here (not those only other cells offer), but the ones bound to this cell
    /// (``cellBound``). What its record in the directory lists, and its links offer.
    var workersOfferedToCells: [(name: String, workers: Int)] {
        broker.workerCounts.filter { $0.workers > 0 && !Self.cellBound.contains($0.name) }
    }
    var offeredToCells: [String] { workersOfferedToCells.map(\.name) }

    /// Services never offered to other cells: the supervisor restarts the processes
    /// `switchboard up` runs on this cell's machines, so asked through another cell it would
    /// restart this cell's pieces, not the asker's.
    static let cellBound: Set<String> = [SupervisorAPI.service]

    /// Writes every one of the kernel's own keys: its instance, and each service's workers.
    func writeOwnKeys(now: UInt64) {
        setInstance(now: now)
        for (name, _) in broker.workerCounts { setServiceKey(name, now: now) }
    }

    func setInstance(now: UInt64) {
        guard let kernel else { return }
        state.set(KernelAPI.StateKeys.instance(cell: configuration.cell?.name), value: Frame(JSONValue.object(["instance": .string(kernel.instance)]).jsonBytes), now: now)
    }

    /// A service's key: its workers in this cell, and the other cells offering it (`cells`,
    /// left out when none), as `services.list` counts them.
    private func setServiceKey(_ name: String, now: UInt64) {
        let service = broker.services[name]
        var value: [String: JSONValue] = ["name": .string(name), "workers": .int(Int64(service?.workers ?? 0))]
        if let cells = service?.cells, !cells.isEmpty { value["cells"] = .array(cells.map(JSONValue.string)) }
        state.set(KernelAPI.StateKeys.service(name, cell: configuration.cell?.name), value: Frame(JSONValue.object(value).jsonBytes), now: now)
    }
}
