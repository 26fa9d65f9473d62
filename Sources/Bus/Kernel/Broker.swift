import BusProtocol
import Contracts
import DequeModule
import Logging
import ZeroMQ

/// The Majordomo broker (7/MDP and 18/MDP, with 8/MMI) on the kernel's ROUTER socket.
///
/// A value the kernel's parts own (``KernelParts/broker``), never copied (`~Copyable`), on
/// the kernel's loop thread: a message goes in, and what to send comes out in ``outbox``
/// and what to act on in ``takeEvents()``; it holds no callback and nothing reaches into
/// it while a method runs, so its own state needs neither locks nor run-time checks.
///
/// Idle workers are served least recently used first; each worker has at most one request
/// in flight (MDP); a request whose worker dies goes back to the front of its queue (or is
/// answered -32006 for a non-retriable service); replies from a worker the broker no longer
/// knows are dropped, so a client never gets two replies.
///
/// Each peer speaks the version its messages say. An 18/MDP worker may answer in parts
/// (PARTIAL, then FINAL): an 18/MDP client gets each part as it comes; a 7/MDP client gets
/// them all in one REPLY at the end (every part's frames, then the FINAL's). A stream that
/// cannot go on ends with a FINAL error saying how many parts came and why
/// (docs/PROTOCOL.md, "Replies in parts").
struct Broker: ~Copyable {
    /// A client to answer, and the Majordomo version it asked in.
    struct Caller: Equatable, Sendable {
        let client: Frame
        let version: MDP.Version
    }

    /// Why a reply in parts stopped reaching its client before its end.
    enum StreamBreak: Equatable {
        /// A part found the client's backlog full (it does not read fast enough).
        case overrun
        /// The client's connection is gone: nothing more is sent.
        case clientGone
        /// The parts gathered for a 7/MDP client passed the bound.
        case tooLarge
        /// The client cancelled the request (CANCEL): nothing more of its answer is sent.
        case cancelled
    }

    /// A class, not a struct: a request moves from its queue to a worker and back, and a
    /// reference moves without copying (and retaining) each of its frames.
    final class Request {
        let client: Frame
        /// The Majordomo the client asked in, which its replies are written in.
        let version: MDP.Version
        /// Whose share of the service's places it counts against (``FairQueue``): the
        /// sender's CURVE key, or without CURVE its connection.
        let owner: FairQueue.Client
        /// The sender's CURVE user id (nil without CURVE), for workers that ask who sent it.
        let peer: String?
        /// The frames after the service name. Most bodies are one frame, held alone: the
        /// message it arrived in is let go at once, and its socket reads the next message into
        /// the same array. Longer ones stay a slice of it.
        private let onlyFrame: Frame?
        private let frames: ArraySlice<Frame>
        var body: ArraySlice<Frame> { onlyFrame.map { [$0][...] } ?? frames }
        /// When it times out waiting for a worker (monotonic nanoseconds).
        var deadline: UInt64
        let received: UInt64
        /// Worker processes that died holding it (``Worker/process``), and the last of them:
        /// the connections of one process die one after another, which is one death.
        var deaths = 0
        var lastDeadProcess: Frame?
        /// Bytes of its body, counted against ``KernelConfiguration/maxQueuedBytes``.
        let size: Int
        /// PARTIAL replies its worker sent so far (18/MDP): once there is one, the request is
        /// never handed to another worker, which would repeat them.
        var parts = 0
        /// For a 7/MDP client: the parts' frames, sent with the FINAL's in one REPLY.
        var gathered: [Frame] = []
        var gatheredBytes = 0
        /// Set when the parts stopped reaching the client; the FINAL then says why.
        var broken: StreamBreak?
        /// The extension worker sending its parts and the client frame it echoes, from its
        /// first PARTIAL: told `stop` when the stream breaks, so it ends the request at once
        /// rather than computing parts nobody reads while it holds a place.
        weak var streamWorker: Worker?
        var streamClient: Frame?
        /// A copy of a request to every worker: the gather it answers, and the worker's name.
        var gather: (of: Gather, worker: String)?
        /// Sent here by another cell (``CellLinks``): served by this cell's own workers only,
        /// never forwarded again, so a request crosses one link at most.
        var forwarded = false
        /// In ``Broker/streams``: it had a part, or its client was asked whether it is there.
        var listed = false
        /// For ``Broker/probeQuietClients(now:)``: since when its client was sent nothing of
        /// it (as of the kernel's last look), and the parts it had then.
        var quietSince: UInt64
        var partsSeen = 0

        var caller: Caller { Caller(client: client, version: version) }

        init(client: Frame, version: MDP.Version = .v01, owner: FairQueue.Client, peer: String? = nil, body: ArraySlice<Frame>, deadline: UInt64,
             received: UInt64) {
            self.client = client
            self.version = version
            self.owner = owner
            self.peer = peer
            if body.count == 1 {
                (onlyFrame, frames) = (body.first, [])
            } else {
                (onlyFrame, frames) = (nil, body)
            }
            self.deadline = deadline
            self.received = received
            quietSince = received
            size = body.reduce(0) { $0 + $1.count }
        }

        /// Appends the body's frames to a message being written.
        func appendBody(into message: inout [Frame]) {
            if let onlyFrame { message.append(onlyFrame) } else { message.append(contentsOf: frames) }
        }
    }

    /// A request as it goes to a worker: 7/MDP's REQUEST head with the client's address as
    /// the worker will echo it, then the body from where the request keeps it.
    /// To a worker that asked for callers, who sent it first (``MDP/callerPart``).
    struct WorkerRequest: MessageEncoding {
        let worker: Frame
        let client: Frame
        let version: MDP.Version
        let caller: Frame?
        let request: Request

        func appendFrames(to frames: inout [Frame]) {
            MDP.appendRequestHead(to: worker, client: client, version: version, into: &frames)
            if let caller { frames.append(caller) }
            request.appendBody(into: &frames)
        }
    }

    final class Worker {
        let identity: Frame
        /// The process it belongs to: a routing id `PROCESS/…` (as `ServiceHost` sets it) is
        /// one of several connections of that process; any other is a process of its own.
        let process: Frame
        /// Held strongly (an unowned reference cost a check on every reply): a removed worker
        /// leaves its service's idle list, and the broker's `deinit` empties the rest.
        let service: Service
        /// Requests it may hold at once: 1 for a plain 7/MDP worker, more for one that
        /// offered a window (the Switchboard extension, docs/PROTOCOL.md).
        let window: Int
        /// Whether its READY carried a window: it understands `drain=1` from the kernel.
        let speaksExtension: Bool
        /// Whether its READY said `callers=1`: each request it gets says who sent it.
        let wantsCallers: Bool
        /// The cell whose kernel this is, offering that cell's workers of the service
        /// (READY `cell=NAME`): used only while the service has no worker here.
        let cell: String?
        /// The Majordomo its READY was in; every command it sends must be in the same.
        let version: MDP.Version
        /// The ZAP user id its READY came with (nil without CURVE): a reload checks again
        /// that its key may serve the service.
        let peer: String?
        var expiry: UInt64
        /// Its TCP connection, as its READY came on (nil in tests, or not over TCP): bytes
        /// arriving on it say the worker is there while its heartbeats wait behind a large
        /// reply still on its way.
        var connection: TCPConnection?
        /// Requests sent to it and not yet answered, by the tag its replies echo.
        var inFlight = InFlight()
        /// The error count its last HEARTBEAT reported (the extension).
        var reportedErrors = 0
        /// Takes no new requests: it finishes those in flight, then leaves (a drain).
        var draining = false
        /// Copies of requests to every worker that wait for a place of this worker's own.
        var gatherCopies: Deque<Request> = []
        var hasRoom: Bool { !draining && inFlight.count < window }
        /// Whether `id` names it: its routing id, or its process (the part before the first `/`).
        func isNamed(_ id: String) -> Bool { identity.equals(id) || process.equals(id) }
        init(identity: Frame, service: Service, window: Int, speaksExtension: Bool = true, wantsCallers: Bool = false, cell: String? = nil,
             version: MDP.Version = .v01, peer: String? = nil, expiry: UInt64) {
            self.identity = identity
            self.version = version
            self.peer = peer
            process = identity.withUnsafeBytes { bytes in
                guard bytes.first != 0, let slash = bytes.firstIndex(of: UInt8(ascii: "/")), slash > 0 else { return identity }
                return Frame(copying: UnsafeRawBufferPointer(rebasing: bytes[..<slash]))
            }
            self.service = service
            self.window = window
            self.speaksExtension = speaksExtension
            self.wantsCallers = wantsCallers
            self.cell = cell
            self.expiry = expiry
        }
    }

    final class Service {
        let name: String
        /// The name as the frame every reply for the service carries, made once.
        let nameFrame: Frame
        var requests = FairQueue()
        /// Workers with room for a request, least recently used first; a worker with a
        /// window is in it once per free place.
        var idle: Deque<Worker> = []
        /// Other cells' kernels that offer it (``Worker/cell``), draining ones not counted,
        /// least recently asked first: asked only while ``workers`` is 0
        /// (``Broker/leastLoadedOffer(of:)``).
        var offers: [Worker] = []
        /// Its workers that take requests (a draining one no longer counts), in this cell.
        var workers = 0
        /// Whether a request for it can be served now, here or by another cell.
        var isServed: Bool { workers > 0 || !offers.isEmpty }
        /// The other cells offering it, by name, a draining offer not counted.
        var cells: [String] { Set(offers.compactMap(\.cell)).sorted() }
        /// Places of the workers it is asked through (the sum of their windows: this cell's,
        /// or while it has none the other cells' offers): no client may hold more than its
        /// share of them (``Broker/clientShare(of:)``).
        var places: Int { workers > 0 ? localPlaces : cellPlaces }
        /// The places of this cell's workers, and of the other cells' offers (asked only
        /// while there are none of the first).
        private(set) var localPlaces = 0, cellPlaces = 0
        /// Whether a worker ever offered it; a name nobody serves is forgotten once idle.
        var everServed = false
        var stats = ServiceStats()
        init(name: String) {
            self.name = name
            nameFrame = Frame(name)
        }

        /// Counts a new worker (or another cell's offer) and its places, all idle.
        func join(_ worker: Worker) {
            if worker.cell == nil {
                localPlaces += worker.window
                workers += 1
                for _ in 0..<worker.window { idle.append(worker) }
            } else {
                cellPlaces += worker.window
                offers.append(worker)
            }
        }

        /// Takes `worker` out of the counts and the idle places (it drains, or is gone).
        func leave(_ worker: Worker) {
            if worker.cell == nil {
                localPlaces -= worker.window
                workers -= 1
                idle.removeAll { $0 === worker }
            } else {
                cellPlaces -= worker.window
                offers.removeAll { $0 === worker }
            }
        }
    }

    /// A request to every worker of a service (`all:SERVICE`): a copy to each worker
    /// registered when it came, and to each other cell offering the service (which asks its
    /// own workers and says which), each answer relayed as a part tagged with its worker, and
    /// the FINAL written by the kernel once every worker answered, died or left, or the
    /// deadline passed (docs/PROTOCOL.md, "A request to every worker").
    final class Gather {
        /// A worker that will not answer, and why; `cell` when another cell asked it.
        struct Missing {
            let worker: String
            let cell: String?
            let reason: String
        }
        /// The reply in parts to the client: every part and the FINAL go through it.
        let stream: Request
        /// `all:SERVICE`, as the client's replies name it.
        let asked: Service
        /// The request's JSON-RPC id, for the parts and the FINAL the kernel writes.
        let id: JSONRPCID
        /// Answers expected: one per worker, and one per other cell until it says how many
        /// of its workers it asked.
        var expected: Int
        /// Workers whose answer is still awaited, and other cells' offers (by their name
        /// here) that have not said yet which workers they asked.
        var waiting: Set<String>
        var answered = 0
        var missing: [Missing] = []
        /// The cell of each name in ``waiting`` that is another cell's: its offers', and the
        /// workers each said it asked.
        var cellOf: [String: String] = [:]
        /// The workers each other cell said it asked, by its offer's name.
        var askedByCell: [String: [String]] = [:]
        let deadline: UInt64
        var finished = false
        init(stream: Request, asked: Service, id: JSONRPCID, workers: [String], deadline: UInt64) {
            (self.stream, self.asked, self.id, self.deadline) = (stream, asked, id, deadline)
            expected = workers.count
            waiting = Set(workers)
        }
    }

    /// What the broker tells the kernel, which acts on it after each call into the broker.
    enum Event {
        /// An admitted request for the built-in `kernel` service, with the sender's CURVE key
        /// (nil without CURVE); answered through ``Broker/replyFromKernel(to:_:)``.
        case kernelRequest(Caller, body: [Frame], peer: String?)
        /// A service's worker count in this cell changed.
        case workersChanged(service: String, count: Int)
        /// Another cell began or ceased to offer a service (``Service/cells``).
        case offersChanged(service: String)
        /// A request was answered (told only while spans are recorded: ``recordsSpans``).
        case answered(service: String, body: [Frame], received: UInt64, now: UInt64)
    }

    /// Whether the kernel records a span for each request it routes (telemetry on).
    var recordsSpans = false

    /// Its limits may change while it serves (``KernelParts/reconfigure(_:)``).
    var configuration: KernelConfiguration {
        didSet { timeouts = Timeouts(configuration) }
    }
    /// The configuration's durations in nanoseconds, worked out once rather than for every
    /// message (a `Duration`'s arithmetic is 128-bit).
    private(set) var timeouts: Timeouts

    struct Timeouts {
        let queue: UInt64
        let workerExpiry: UInt64
        /// Another cell's offer (a worker with a cell) is heard more often: ``KernelConfiguration/cellExpiry``.
        let cellExpiry: UInt64
        init(_ configuration: KernelConfiguration) {
            queue = configuration.queueTimeout.nanoseconds
            workerExpiry = configuration.workerExpiry.nanoseconds
            cellExpiry = configuration.cellExpiry.nanoseconds
        }
        /// The silence after which a worker of `cell` (nil: of this cell) is taken for dead.
        func expiry(ofWorkerIn cell: String?) -> UInt64 { cell == nil ? workerExpiry : cellExpiry }
    }
    let logger: Logger
    /// What a peer's messages make the broker say (refusals, protocol errors, streams its
    /// client left), bounded in the log.
    let peerLog: PeerEventLog
    /// Who is served now (one of a pair serves only while active).
    let admission: Admission
    /// Messages for the ROUTER socket, and events for the kernel: taken after each call.
    var outbox = Outbox()
    private(set) var events: [Event] = []

    private(set) var workers: [Frame: Worker] = [:]
    private(set) var services: [String: Service] = [:]
    private(set) var protocolErrors = 0
    private(set) var totalRequests = 0
    /// Replies dropped because their client does not read (its backlog is full).
    private(set) var droppedReplies = 0
    /// Requests answered in parts that have had a part and no FINAL yet, and those whose
    /// client was asked whether it is there (``probeQuietClients(now:)``), by client: where a
    /// failed send to a client finds the streams it breaks.
    private var streams: [Frame: [Request]] = [:]
    /// Bytes of parts gathered for 7/MDP clients, counted with the queued bytes.
    private(set) var gatheredBytes = 0
    /// Streams that ended early (worker died, client overrun or gone, too large to gather).
    private(set) var brokenStreams = 0
    /// Requests their clients cancelled while the kernel held them (CANCEL).
    private(set) var cancelledRequests = 0
    /// Requests of workers removed for silence, by worker and by the client frame the worker
    /// echoes, queued again until `until`: a worker that was only late (its host stalled)
    /// may still answer one before another worker takes it, and that answer is kept.
    private var lateWorkers: [Frame: (service: Service, requests: [Frame: Request], until: UInt64)] = [:]
    /// Bytes of request bodies waiting in all queues.
    private(set) var queuedBytes = 0
    /// Requests to every worker of a service still gathering answers.
    private(set) var gathers: [Gather] = []
    /// Replies in parts under way, a gather's among them: a part relayed, no FINAL yet (`kernel stats`).
    var streamsInProgress: Int { streams.values.reduce(0) { $0 + $1.count } }
    private(set) var refusedRegistrations = 0
    /// By other cell: requests handed to it, its answers and their latency (``Worker/cell``).
    private(set) var cellStats: [String: ServiceStats] = [:]
    /// Requests other cells sent here (``handleForwarded``).
    private(set) var receivedFromCells = 0
    /// Client requests answered -32008: this kernel was not the active one of its pair.
    private(set) var refusedNotActive = 0
    /// Requests refused for the key they came with: for operators only (``OperatorsOnly``)
    /// from another key, or from a key a reload took out.
    private(set) var refusedForKey = 0

    init(configuration: KernelConfiguration, logger: Logger, admission: Admission = Admission(isPaired: false)) {
        self.configuration = configuration
        timeouts = Timeouts(configuration)
        self.logger = logger
        peerLog = PeerEventLog(logger: logger)
        self.admission = admission
    }

    deinit {
        // A waiting request holds its client, which holds the request; an idle worker is
        // held by its service, which it holds: the cycles end with the broker.
        for service in services.values {
            service.requests.removeAll()
            service.idle.removeAll()
            service.offers.removeAll()
        }
    }

    private mutating func send(_ message: Message) { outbox.send(message) }

    /// The events since the last call, for the kernel to act on.
    mutating func takeEvents() -> [Event] {
        // Moved out, not copied and emptied: emptying a shared buffer while keeping its
        // room would allocate new room at every call.
        var taken: [Event] = []
        swap(&taken, &events)
        return taken
    }

    // MARK: Inbound

    /// A message read from the ROUTER, where the socket holds it: frames are made only of
    /// what the broker keeps (routing ids, a request's body).
    /// `pairRefusal`: of a pair, what the pair says of a request only the active kernel serves
    /// (``Admission``); alone, never asked.
    mutating func handle(_ parts: ReceivedParts, now: UInt64, pairRefusal: Admission.PairRefusal = Self.alone) {
        guard let inbound = decoded({ () throws(ProtocolError) in try MDP.decodeAtBroker(parts) }, else: parts.message, now: now) else { return }
        // A worker registering: its connection, read before the message's parts are taken.
        let connection: TCPConnection? = if case .worker(_, .ready, _) = inbound { parts.sourceDescriptor.flatMap(TCPConnection.init(descriptor:)) } else { nil }
        handle(inbound, peer: parts.peerUserID, now: now, pairRefusal: pairRefusal)
        if let connection, case .worker(let identity, _, _) = inbound, let worker = workers[identity], worker.connection == nil {
            worker.connection = connection
        }
    }

    /// The same for a message of frames (tests drive the broker with these).
    mutating func handle(_ message: Message, now: UInt64, pairRefusal: Admission.PairRefusal = Self.alone) {
        guard let inbound = decoded({ () throws(ProtocolError) in try MDP.decodeAtBroker(message) }, else: { message }, now: now) else { return }
        handle(inbound, peer: message.peerUserID, now: now, pairRefusal: pairRefusal)
    }

    /// A kernel alone serves every request it admits.
    static func alone(now: UInt64) -> String? { nil }

    /// What `decode` read, or nil when the message (made by `message` only then) was malformed
    /// and has been dealt with.
    private mutating func decoded(_ decode: () throws(ProtocolError) -> BrokerInbound, else message: () -> Message, now: UInt64) -> BrokerInbound? {
        do {
            return try decode()
        } catch {
            malformed(message(), error, now: now)
            return nil
        }
    }

    /// Each counted once as a protocol error (a worker's by the disconnect).
    private mutating func malformed(_ message: Message, _ error: ProtocolError, now: UInt64) {
        logger.debug("dropped malformed message", metadata: ["problem": "\(error)"])
        // A peer speaking the worker protocol badly is disconnected; a client's request
        // with a bad service name is answered (it would otherwise wait for nothing);
        // anything else is dropped.
        if message.count >= 3, message[2].equals(MDP.workerHeader) {
            disconnect(message[0], version: .v01, reason: "\(error)", now: now)
            return
        } else if message.count >= 2, message[1].equals(MDP.workerHeader02) {
            disconnect(message[0], version: .v02, reason: "\(error)", now: now)
            return
        }
        protocolErrors += 1
        if message.count >= 5,
           let version: MDP.Version = message[1].isEmpty && message[2].equals(MDP.clientHeader) ? .v01
               : message[1].equals(MDP.clientHeader02) && message[2].equals([0x01]) ? .v02 : nil {
            // A REQUEST whose only fault is its service name (0.2's header says REQUEST).
            let shown = String(decoding: message[3].bytes.prefix(64), as: UTF8.self)
            reply(to: Caller(client: message[0], version: version), serviceFrame: message[3], body: message.frames[4...], error: .invalidRequest(
                "the service name must be \(MDP.serviceNameRule), got \(message[3].isEmpty ? "an empty name" : "'\(shown)'")"))
        }
    }

    private mutating func handle(_ inbound: BrokerInbound, peer: String?, now: UInt64, pairRefusal: Admission.PairRefusal) {
        switch inbound {
        case .request(let client, let service, let body, let version):
            admit(Caller(client: client, version: version), service: service, body: body, peer: peer, forwarded: false, now: now, pairRefusal: pairRefusal)
        case .worker(let identity, let command, let version):
            handleWorker(identity, command, version: version, peer: peer, now: now)
        case .cancel(let client, let service, let body):
            cancel(client, service: service, body: body, peer: peer)
        }
    }

    /// A client's CANCEL: it no longer wants the answer to the request it sent to `name`
    /// with `body`, wherever that request is (``stopAnswering(_:in:owner:_:where:)``).
    private mutating func cancel(_ client: Frame, service name: String, body: ArraySlice<Frame>, peer: String?) {
        stopAnswering(client, in: name, owner: peer.map { Frame($0) } ?? client, .cancelled) { $0.body.elementsEqual(body) }
    }

    /// Another cell's kernel says nobody reads its request, sent here under `client`, any
    /// more (``CellLinks``): the same as a CANCEL, for the one request that frame names.
    mutating func linkedClientGone(_ client: Frame, service name: String) {
        stopAnswering(client, in: name, owner: nil, .clientGone) { _ in true }
    }

    /// Ends the answer to `client`'s request for `name` that `matches`, for `reason`,
    /// wherever the request is (``unansweredRequest(of:for:owner:where:)``): nothing more of
    /// it reaches the client, and the worker that holds it, when it knows the extension, is
    /// told `stop`, so its handler ends at its next part (or its next look while it waits for
    /// one) and frees its place.
    private mutating func stopAnswering(_ client: Frame, in name: String, owner: Frame?, _ reason: StreamBreak,
                                        where matches: (Request) -> Bool) {
        guard let request = unansweredRequest(of: client, for: name, owner: owner, where: matches) else { return }
        if reason == .cancelled { cancelledRequests += 1 }
        breakStream(request, reason)
    }

    /// `client`'s request for `name` that `matches`, not yet answered: a reply in parts under
    /// way; one a worker holds with no part yet (set up to be told `stop` as the first would
    /// be: a push stream's reader that left before its first message frees its place at
    /// once); or one still waiting, taken out of its queue.
    /// With `owner` (whose share of the service it counts against, ``FairQueue``), only its
    /// own queue is looked at, and the workers' places only while it holds one of them: asking
    /// for one that is not there costs a lookup, or that look. Without, another cell's kernel
    /// asks.
    private mutating func unansweredRequest(of client: Frame, for name: String, owner: Frame?, where matches: (Request) -> Bool) -> Request? {
        let ofClient = { (request: Request) in request.broken == nil && request.gather == nil && request.client == client && matches(request) }
        if let request = streams[client]?.first(where: ofClient) { return request }
        guard let service = knownService(name) else { return nil }
        if owner.map({ service.requests.held(by: $0) > 0 }) ?? true {
            for worker in workers.values where worker.service === service {
                guard let tag = worker.inFlight.tag(where: ofClient), let request = worker.inFlight.request(tagged: tag) else { continue }
                if worker.speaksExtension { (request.streamWorker, request.streamClient) = (worker, worker.echoedClient(of: request, tag: tag)) }
                return request
            }
        }
        guard let request = service.requests.removeWaiting(of: owner, where: ofClient) else { return nil }
        queuedBytes -= request.size
        return request
    }

    /// Every service that has workers, with how many (for a kernel taking over as active).
    var workerCounts: [(name: String, workers: Int)] {
        services.values.filter { $0.everServed }.map { ($0.name, $0.workers) }
    }

    /// A request another cell sent through this kernel's link to it (``CellLinks``): admitted
    /// as the sender's own would be (`peer` is the key that cell's kernel authenticated),
    /// then served by this cell's workers only.
    mutating func handleForwarded(_ caller: Caller, service: String, body: ArraySlice<Frame>, peer: String?, now: UInt64) {
        receivedFromCells += 1
        admit(caller, service: service, body: body, peer: peer, forwarded: true, now: now, pairRefusal: Self.alone)
    }

    /// Counts a client's request and serves it if ``Admission`` lets it through, else answers why not.
    private mutating func admit(_ caller: Caller, service: String, body: ArraySlice<Frame>, peer: String?, forwarded: Bool, now: UInt64,
                                pairRefusal: Admission.PairRefusal) {
        totalRequests += 1
        // A request to every worker of a service is admitted as one to that service.
        let admitted = service.hasPrefix(Self.everyWorker) ? String(service.dropFirst(Self.everyWorker.count)) : service
        let verdict = admission.verdict(service: admitted, body: body, peer: peer, security: configuration.security, now: now, pairRefusal: pairRefusal)
        guard verdict == .admitted else {
            refuse(caller, service: service, body: body, verdict)
            return
        }
        handleRequest(caller, service: service, body: body, peer: peer, forwarded: forwarded, now: now)
    }

    private mutating func handleRequest(_ caller: Caller, service name: String, body: ArraySlice<Frame>, peer: String?, forwarded: Bool, now: UInt64) {
        let client = caller.client
        if MMI.isManagement(name) {
            let answer = MMI.answer(service: name, body: Array(body)) { [services] in services[$0]?.isServed == true }
            send(MDP.reply(to: client, serviceFrame: Frame(name), body: [Frame(answer)], version: caller.version))
            return
        }
        if name == KernelAPI.service {
            events.append(.kernelRequest(caller, body: Array(body), peer: peer))
            return
        }
        if forwarded, knownService(name.hasPrefix(Self.everyWorker) ? String(name.dropFirst(Self.everyWorker.count)) : name).map({ $0.workers == 0 }) ?? true {
            return reply(to: caller, service: name, body: body, error: JSONRPCError(
                code: JSONRPCError.serviceUnavailableCode, message: "Service unavailable: no worker offers '\(name)' in the cell another cell sent this request to"))
        }
        if name.hasPrefix(Self.everyWorker) {
            scatter(caller, to: String(name.dropFirst(Self.everyWorker.count)), body: body, peer: peer, forwarded: forwarded, now: now)
            return
        }
        // One lookup by name per request: a name not known yet is recorded only while the
        // registry has room.
        guard let service = knownService(name) ?? (services.count < configuration.maxServices ? serviceNamed(name) : nil) else {
            reply(to: caller, service: name, body: body, error: JSONRPCError(
                code: JSONRPCError.serviceUnavailableCode, message: "Service unavailable: no worker offers '\(name)'"))
            return
        }
        service.stats.requests += 1
        let request = Request(client: client, version: caller.version, owner: service.requests.client(peer.map { Frame($0) } ?? client), peer: peer,
                              body: body, deadline: now + timeouts.queue, received: now)
        request.forwarded = forwarded
        let size = request.size
        guard service.requests.count < configuration.maxQueuedPerService,
              queuedBytes + size <= configuration.maxQueuedBytes || service.requests.isEmpty && !service.idle.isEmpty else {
            service.stats.unavailable += 1
            let error = JSONRPCError(code: JSONRPCError.serviceUnavailableCode,
                                     message: "Service unavailable: '\(name)' has \(service.requests.count) requests queued (\(queuedBytes) bytes queued in all)")
            reply(to: caller, service: name, body: body, error: error)
            forgetIfUnserved(service)
            return
        }
        // Nothing waiting and a place free: straight to the worker, as the queue would send it
        // (the client's share allowing), without passing through the queue's turn.
        if service.requests.isEmpty, let worker = service.idle.first, worker.hasRoom,
           service.requests.holdAtOnce(request, share: clientShare(of: service)) {
            service.idle.removeFirst()
            send(request, to: worker)
            return
        }
        service.requests.append(request)
        queuedBytes += size
        dispatch(service, now: now)
    }

    private mutating func handleWorker(_ identity: Frame, _ command: WorkerToBroker, version: MDP.Version, peer: String?, now: UInt64) {
        let known = knownWorker(identity)
        if let known, known.version != version {
            self.disconnect(identity, version: version, reason: "a command in \(version) after a READY in \(known.version)", now: now)
            return
        }
        if let known { known.expiry = now + timeouts.expiry(ofWorkerIn: known.cell) }
        func disconnect(_ reason: String) { self.disconnect(identity, version: version, reason: reason, now: now) }
        switch command {
        case .ready(let name, let window, let callers, let cell):
            guard known == nil else {
                disconnect("a second READY")
                return
            }
            // With CURVE on, only a worker key may offer a service, and a service's own key only that service.
            guard Peer(userID: peer, security: configuration.security).mayServe(name) else {
                refusedRegistrations += 1
                peerLog.warning("refused a READY: the key may not serve it", metadata: ["service": "\(name)", "peer": "\(peer ?? "-")"])
                disconnect("this key may not register '\(name)'")
                return
            }
            guard !MMI.isManagement(name), name != KernelAPI.service, !name.hasPrefix(Self.everyWorker) else {
                disconnect("'\(name)' is reserved for the kernel")
                return
            }
            let service = serviceNamed(name)
            let worker = Worker(identity: identity, service: service, window: window ?? 1, speaksExtension: window != nil, wantsCallers: callers,
                                cell: cell, version: version, peer: peer, expiry: now + timeouts.expiry(ofWorkerIn: cell))
            workers[identity] = worker
            service.everServed = true
            service.join(worker)
            if let cell {
                logger.info("another cell offers a service", metadata: ["service": "\(name)", "cell": "\(cell)", "window": "\(worker.window)"])
                events.append(.offersChanged(service: name))
            } else {
                logger.info("worker registered", metadata: ["service": "\(name)", "workers": "\(service.workers)", "window": "\(worker.window)"])
                events.append(.workersChanged(service: name, count: service.workers))
            }
            dispatch(service, now: now)
        case .partial(let client, let body):
            guard let worker = known else {
                // A worker removed for silence that goes on with a reply in parts: its parts
                // are dropped here, so its FINAL must not reach the client as the whole answer.
                lateWorkers[identity]?.requests[client] = nil
                return askToRegister(identity, version: version, after: "PARTIAL")
            }
            guard let request = worker.holding(client) else {
                disconnect("a PARTIAL with no request in flight")
                return
            }
            if let (gather, name) = request.gather {
                if let cell = worker.cell {
                    cellGatherPart(gather, offer: name, cell: cell, body: body)
                } else if !gather.finished {
                    relayPart([Self.tag(name, partial: true)] + body, of: gather.stream, service: gather.asked)
                }
                return
            }
            if request.parts == 0, worker.speaksExtension { (request.streamWorker, request.streamClient) = (worker, client) }
            relayPart(body, of: request, service: worker.service)
        case .reply(let client, let body):
            guard let worker = known else {
                // The answer of a worker removed for silence is kept while its request still waits.
                answerLate(identity, client: client, body: body, now: now)
                return askToRegister(identity, version: version, after: "REPLY")
            }
            // A reply nobody is waiting for: per 7/MDP an unexpected command earns a DISCONNECT.
            guard let request = worker.answered(client) else {
                disconnect("a REPLY with no request in flight")
                return
            }
            // The body goes back as it came: the kernel never reads it. Error counts come
            // from the workers' heartbeats (below).
            let service = worker.service
            if let (gather, name) = request.gather {
                if let cell = worker.cell {
                    cellStats[cell, default: ServiceStats()].replies += 1
                    cellStats[cell, default: ServiceStats()].latency.record(nanoseconds: now &- request.received)
                    cellGatherEnded(gather, offer: name, body: body)
                } else {
                    gatherAnswered(gather, by: name, body: body)
                }
                placeFreed(worker, now: now)
                return
            }
            service.requests.release(request)
            service.stats.replies += 1
            service.stats.latency.record(nanoseconds: now &- request.received)
            if let cell = worker.cell {
                cellStats[cell, default: ServiceStats()].replies += 1
                cellStats[cell, default: ServiceStats()].latency.record(nanoseconds: now &- request.received)
            }
            if !request.listed, request.broken == nil {
                outbox.send(MDP.BrokerReply(to: request.client, serviceFrame: service.nameFrame, body: body, version: request.version))
            } else {
                endStream(request, service: service, final: body)
            }
            if recordsSpans { events.append(.answered(service: service.name, body: Array(request.body), received: request.received, now: now)) }
            placeFreed(worker, now: now)
        case .heartbeat(let errors):
            guard let worker = known else { return askToRegister(identity, version: version, after: "HEARTBEAT") }
            if let errors, errors >= worker.reportedErrors {
                worker.service.stats.errors += errors - worker.reportedErrors
                worker.reportedErrors = errors
            }
        case .drain:
            guard let worker = known else { return askToRegister(identity, version: version, after: "DRAIN") }
            startDraining(worker, now: now)
        case .disconnect:
            if let worker = known { remove(worker, reason: worker.draining ? "it drained" : "it disconnected", now: now) }
        }
    }

    /// A place of `worker` is free again: a copy of a request to every worker waiting for it
    /// goes first, else the service's queue.
    private mutating func placeFreed(_ worker: Worker, now: UInt64) {
        if worker.draining {
            // A plain 7/MDP worker cannot be told to drain: it is let go once idle.
            if !worker.speaksExtension, worker.inFlight.isEmpty { disconnectDrained(worker, now: now) }
        } else if let copy = worker.gatherCopies.popFirst() {
            stopWaiting([copy])
            send(copy, to: worker)
        } else {
            if worker.cell == nil { worker.service.idle.append(worker) }
            dispatch(worker.service, now: now)
        }
    }

    private mutating func send(_ request: Request, to worker: Worker) {
        // Ranked at each send, as the kernel's own requests are: a key a reload made an
        // operator, or no longer one, is told so at once.
        var caller = worker.wantsCallers ? Frame(Peer(userID: request.peer, security: configuration.security).callerID) : nil
        // Another cell's kernel is told a copy of a request to every worker is one (its
        // caller frame starts `all:`): it asks every worker of its own in turn.
        if worker.cell != nil, request.gather != nil, let known = caller { caller = Frame(Self.everyWorker + (known.string ?? "")) }
        outbox.send(WorkerRequest(worker: worker.identity, client: worker.sent(request), version: worker.version, caller: caller, request: request))
    }

    // MARK: A request to every worker

    static let everyWorker = MDP.everyWorkerPrefix

    /// Sends a copy of the request to each worker of `name` registered now (at once to one
    /// with a free place, else when it has one), and tells the client how many answers to
    /// expect, from which workers. Unless another cell sent it, each other cell that offers
    /// the service gets a copy too: it asks its own workers and says which, and its answers
    /// come as theirs (``cellGatherPart``).
    private mutating func scatter(_ caller: Caller, to name: String, body: ArraySlice<Frame>, peer: String?, forwarded: Bool, now: UInt64) {
        let asked = Service(name: Self.everyWorker + name)
        guard let service = services[name], name != KernelAPI.service, !MMI.isManagement(name) else {
            return reply(to: caller, service: asked.name, body: body, error: JSONRPCError(
                code: JSONRPCError.serviceUnavailableCode, message: "Service unavailable: no worker offers '\(name)'"))
        }
        // Each worker (and other cell's offer) with its name, made once, in the order of the
        // names; a request another cell sent goes to this cell's workers only.
        let chosen = workers.values.filter { $0.service === service && !$0.draining && (!forwarded || $0.cell == nil) }
            .map { ($0, Self.name(of: $0)) }.sorted { $0.1 < $1.1 }
        guard !chosen.isEmpty else {
            return reply(to: caller, service: asked.name, body: body, error: JSONRPCError(
                code: JSONRPCError.serviceUnavailableCode, message: "Service unavailable: no worker offers '\(name)'"))
        }
        // Bounded like the queues: the body is held while it gathers, once more for each copy
        // that waits for a place, counted in the queued bytes; and one client's requests to
        // every worker in progress hold at most its share of a worker's places.
        let size = body.reduce(0) { $0 + $1.count }, waitingCopies = chosen.filter { !$0.0.hasRoom }.count
        let inProgress = gathers.count { $0.stream.client == caller.client && $0.asked.name == asked.name }
        guard queuedBytes + size * (1 + waitingCopies) <= configuration.maxQueuedBytes, inProgress < clientShare(of: service) else {
            service.stats.unavailable += 1
            return reply(to: caller, service: asked.name, body: body, error: JSONRPCError(
                code: JSONRPCError.serviceUnavailableCode,
                message: "Service unavailable: \(inProgress) requests to every '\(name)' worker from this client are in progress (\(queuedBytes) bytes queued in all)"))
        }
        queuedBytes += size
        let owner = FairQueue.Client(id: caller.client)
        let stream = Request(client: caller.client, version: caller.version, owner: owner, body: body, deadline: 0, received: now)
        var id = JSONRPCID.null
        if body.count == 1, case .single(.request(let request)) = JSONRPC.parseRequests(body.first!.bytes) { id = request.id ?? .null }
        let gather = Gather(stream: stream, asked: asked, id: id, workers: chosen.map(\.1), deadline: now + timeouts.queue)
        gathers.append(gather)
        let local = chosen.filter { $0.0.cell == nil }.map(\.1)
        var notice: [String: JSONValue] = ["expected": .int(Int64(local.count)), "workers": .array(local.map(JSONValue.string))]
        let cells = chosen.compactMap { $0.0.cell }
        if !cells.isEmpty { notice["cells"] = .array(cells.map(JSONValue.string)) }
        relayPart([Frame(JSONRPC.partReply(id: id, partText: JSONValue.object(notice).jsonBytes))], of: stream, service: asked)
        for (worker, name) in chosen {
            let copy = Request(client: caller.client, version: caller.version, owner: owner, peer: peer, body: body, deadline: gather.deadline, received: now)
            copy.gather = (gather, name)
            if let cell = worker.cell {
                gather.cellOf[name] = cell
                cellStats[cell, default: ServiceStats()].requests += 1
            }
            if worker.hasRoom, worker.cell == nil, let place = service.idle.firstIndex(where: { $0 === worker }) {
                service.idle.remove(at: place)
                send(copy, to: worker)
            } else if worker.hasRoom, worker.cell != nil {
                send(copy, to: worker)
            } else {
                worker.gatherCopies.append(copy)
                queuedBytes += size
            }
        }
    }

    /// Copies that no longer wait for a place (sent, or dropped) leave the queued bytes.
    private mutating func stopWaiting(_ copies: some Sequence<Request>) {
        for copy in copies { queuedBytes -= copy.size }
    }

    /// A worker's name in what the client gets: its routing id, as text when it is text.
    static func name(of worker: Worker) -> String {
        let bytes = worker.identity.bytes
        if !bytes.isEmpty, bytes.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) { return String(decoding: bytes, as: UTF8.self) }
        return "0x" + bytes.map { String(format: "%02x", $0) }.joined()
    }

    /// The frame that comes first in each part relaying a worker's answer.
    static func tag(_ worker: String, cell: String? = nil, partial: Bool = false) -> Frame {
        var tag: [String: JSONValue] = ["worker": .string(worker)]
        if let cell { tag["cell"] = .string(cell) }
        if partial { tag["partial"] = true }
        return Frame(JSONValue.object(tag).jsonBytes)
    }

    private mutating func gatherAnswered(_ gather: Gather, by worker: String, body: ArraySlice<Frame>) {
        guard !gather.finished, gather.waiting.remove(worker) != nil else { return }
        gather.answered += 1
        relayPart([Self.tag(worker, cell: gather.cellOf[worker])] + body, of: gather.stream, service: gather.asked)
        if gather.waiting.isEmpty { finish(gather) }
    }

    /// `worker` will not answer `gather`: it died, or left. Another cell's offer that does
    /// not answer leaves its workers' answers missing with it.
    private mutating func gatherMissing(_ gather: Gather, _ worker: String, _ reason: String) {
        guard !gather.finished else { return }
        for name in [worker] + (gather.askedByCell[worker] ?? []) where gather.waiting.remove(name) != nil {
            gather.missing.append(.init(worker: name, cell: gather.cellOf[name], reason: reason))
        }
        if gather.waiting.isEmpty { finish(gather) }
    }

    /// A part from another cell's offer of a request to every worker: first which of its
    /// workers it asked (told to the client as a part naming the cell), then each worker's
    /// answer, or one of its parts, tagged with the worker as that cell's kernel tags it.
    private mutating func cellGatherPart(_ gather: Gather, offer: String, cell: String, body: ArraySlice<Frame>) {
        guard !gather.finished else { return }
        if gather.askedByCell[offer] == nil {
            guard body.count == 1, let notice = try? JSONRPC.parsePart(body.first!.bytes).part,
                  let names = notice["workers"]?.arrayValue?.compactMap(\.stringValue), !names.isEmpty, gather.waiting.remove(offer) != nil else {
                return gatherMissing(gather, offer, "unavailable")
            }
            // Its answers replace the one the offer stood for; a name already awaited here is
            // not awaited twice.
            let new = names.filter { !gather.waiting.contains($0) }
            gather.askedByCell[offer] = new
            gather.expected += new.count - 1
            for name in new {
                gather.waiting.insert(name)
                gather.cellOf[name] = cell
            }
            let said: JSONValue = ["cell": .string(cell), "expected": .int(Int64(new.count)), "workers": .array(new.map(JSONValue.string))]
            relayPart([Frame(JSONRPC.partReply(id: gather.id, partText: said.jsonBytes))], of: gather.stream, service: gather.asked)
            if gather.waiting.isEmpty { finish(gather) }
            return
        }
        guard body.count >= 2, let tag = try? JSONValue(parsing: body.first!.bytes), let worker = tag["worker"]?.stringValue,
              gather.askedByCell[offer]?.contains(worker) == true else { return }
        if tag["partial"] == true {
            if gather.waiting.contains(worker) { relayPart([Self.tag(worker, cell: cell, partial: true)] + body.dropFirst(), of: gather.stream, service: gather.asked) }
        } else {
            gatherAnswered(gather, by: worker, body: body.dropFirst())
        }
    }

    /// The FINAL from another cell's offer of a request to every worker: its workers that
    /// did not answer, with why; any it does not account for are timed out; one that asked
    /// none (it answered an error) is `unavailable`.
    private mutating func cellGatherEnded(_ gather: Gather, offer: String, body: ArraySlice<Frame>) {
        guard !gather.finished else { return }
        if body.count == 1, let response = try? JSONRPC.parseResponses(body.first!.bytes).first, case .success(let summary) = response.outcome {
            for entry in summary["missing"]?.arrayValue ?? [] {
                guard let worker = entry["worker"]?.stringValue, let reason = entry["reason"]?.stringValue,
                      gather.askedByCell[offer]?.contains(worker) == true else { continue }
                gatherMissing(gather, worker, reason)
            }
        }
        gatherMissing(gather, offer, gather.askedByCell[offer] == nil ? "unavailable" : "timed_out")
    }

    /// The FINAL: how many were expected and answered, and who did not answer, and why.
    private mutating func finish(_ gather: Gather) {
        gather.finished = true
        gathers.removeAll { $0 === gather }
        for name in gather.waiting.sorted() { gather.missing.append(.init(worker: name, cell: gather.cellOf[name], reason: "timed_out")) }
        gather.waiting = []
        queuedBytes -= gather.stream.size
        for worker in workers.values where !worker.gatherCopies.isEmpty {
            stopWaiting(worker.gatherCopies.filter { $0.gather?.of === gather })
            worker.gatherCopies.removeAll { $0.gather?.of === gather }
        }
        let summary: JSONValue = [
            "expected": .int(Int64(gather.expected)), "answered": .int(Int64(gather.answered)),
            "missing": .array(gather.missing.map { missing in
                var entry: [String: JSONValue] = ["worker": .string(missing.worker), "reason": .string(missing.reason)]
                if let cell = missing.cell { entry["cell"] = .string(cell) }
                return .object(entry)
            }),
        ]
        endStream(gather.stream, service: gather.asked, final: [Frame(JSONRPC.resultReply(id: gather.id, resultText: summary.jsonBytes))])
    }

    /// Ends the gathers whose deadline passed: the workers not heard from are `timed_out`.
    private mutating func expireGathers(now: UInt64) {
        for gather in gathers where gather.deadline <= now { finish(gather) }
    }

    // MARK: Draining

    /// Stops sending `worker` requests and tells it so (`drain=1`, which also answers a
    /// worker that asked): it answers those in flight, then disconnects. A plain 7/MDP
    /// worker, which cannot be told, gets DISCONNECT once it holds nothing.
    private mutating func startDraining(_ worker: Worker, now: UInt64) {
        if !worker.draining {
            worker.draining = true
            let service = worker.service
            service.leave(worker)
            let copies = worker.gatherCopies
            worker.gatherCopies.removeAll()
            stopWaiting(copies)
            for copy in copies { if let (gather, name) = copy.gather { gatherMissing(gather, name, "drained") } }
            logger.info("worker draining", metadata: ["service": "\(service.name)", "inFlight": "\(worker.inFlight.count)", "workers": "\(service.workers)"])
            events.append(worker.cell == nil ? .workersChanged(service: service.name, count: service.workers) : .offersChanged(service: service.name))
        }
        if worker.speaksExtension {
            send(MDP.encode(.drain, to: worker.identity, version: worker.version))
        } else if worker.inFlight.isEmpty {
            disconnectDrained(worker, now: now)
        }
    }

    private mutating func disconnectDrained(_ worker: Worker, now: UInt64) {
        send(MDP.encode(.disconnect, to: worker.identity, version: worker.version))
        remove(worker, reason: "it drained", now: now)
    }

    /// After a reload: each worker whose key may no longer serve its service (taken out, or
    /// now another service's) is told DISCONNECT and removed, its requests in flight going
    /// to another worker as a lost one's do; registering again, it is refused.
    mutating func dropWorkersNoLongerAllowed(now: UInt64) {
        guard let security = configuration.security else { return }
        let refused = workers.values.filter { !Peer(userID: $0.peer, security: security).mayServe($0.service.name) }
        for worker in refused {
            peerLog.warning("disconnecting a worker whose key a reload no longer allows to serve its service", metadata: ["service": "\(worker.service.name)"])
            send(MDP.encode(.disconnect, to: worker.identity, version: worker.version))
            remove(worker, reason: "its key may no longer serve '\(worker.service.name)' (a reload)", now: now)
        }
    }

    /// `kernel` `workers.drain`: drains the workers of `service`, or only those whose routing
    /// id or process (the part before the first `/`) is `worker`; the routing ids drained.
    mutating func drain(service name: String, worker id: String?, now: UInt64) -> [Worker] {
        let chosen = workers.values.filter { worker in
            worker.service.name == name && id.map(worker.isNamed) != false
        }.sorted { $0.identity.bytes.lexicographicallyPrecedes($1.identity.bytes) }
        for worker in chosen { startDraining(worker, now: now) }
        return chosen
    }

    // MARK: Dispatch

    /// Hands waiting requests to workers with room, the clients in turn, none past its share.
    private mutating func dispatch(_ service: Service, now: UInt64) {
        let share = clientShare(of: service)
        while !service.requests.isEmpty, let worker = service.idle.first {
            guard worker.hasRoom else {
                service.idle.removeFirst()
                continue
            }
            guard let request = service.requests.next(share: share, now: now) else { break }
            service.idle.removeFirst()
            queuedBytes -= request.size
            send(request, to: worker)
        }
        if service.workers == 0, !service.offers.isEmpty { dispatchToCells(service, share: share, now: now) }
    }

    /// Hands waiting requests to other cells' kernels, for a service with no worker here, each
    /// to the least loaded; one another cell sent here is answered -32001 instead (it crosses
    /// one link at most).
    private mutating func dispatchToCells(_ service: Service, share: Int, now: UInt64) {
        while !service.requests.isEmpty, let link = leastLoadedOffer(of: service) {
            guard let request = service.requests.next(share: share, now: now) else { break }
            queuedBytes -= request.size
            guard !request.forwarded else {
                service.requests.release(request)
                reply(to: request.caller, service: service.name, body: request.body, error: JSONRPCError(
                    code: JSONRPCError.serviceUnavailableCode, message: "Service unavailable: no worker offers '\(service.name)' in the cell another cell sent this request to"))
                continue
            }
            // Asked last: among offers as loaded, the one asked longest ago goes first.
            service.offers.removeAll { $0 === link }
            service.offers.append(link)
            cellStats[link.cell ?? "", default: ServiceStats()].requests += 1
            send(request, to: link)
        }
    }

    /// Workers of each service in each other cell, as the cells' records in the directory
    /// say (cell, then service): what ``leastLoadedOffer(of:)`` weighs offers by.
    var cellWorkers: [String: [String: Int]] = [:]
    /// More workers than any cell has; a record that says more is weighed as this many.
    static let mostCellWorkersWeighed = 1 << 20

    /// The offer with room whose cell would hold the fewest requests for each of its workers
    /// of the service once handed this one (its requests in flight, plus one, over the
    /// workers its record counts; one when it says none): a cell with three workers is handed
    /// about three requests for each one a cell with one worker gets, whatever each offer's
    /// window.
    private func leastLoadedOffer(of service: Service) -> Worker? {
        var best: Worker?, bestLoad = 0, bestWorkers = 1
        for offer in service.offers where offer.hasRoom {
            // The count is what a record in etcd says: weighed up to a bound, so the products
            // below (in flight at most a window, 4096) cannot overflow.
            let workers = min(max(1, offer.cell.flatMap { cellWorkers[$0]?[service.name] } ?? 1), Self.mostCellWorkersWeighed)
            let load = offer.inFlight.count + 1
            // load / workers < bestLoad / bestWorkers, without division.
            if best == nil || load * bestWorkers < bestLoad * workers { (best, bestLoad, bestWorkers) = (offer, load, workers) }
        }
        return best
    }

    /// The places of `service` one client may hold at once (`kernel.client_share_percent`
    /// of them, at least one): a client with more waiting leaves the rest for others, so it
    /// cannot hold every place with slow requests.
    mutating func clientShare(of service: Service) -> Int {
        max(1, service.places * configuration.clientSharePercent / 100)
    }

    /// Sends heartbeats to this cell's workers, expires the silent ones and requests that
    /// waited too long. Other cells' offers have ``cellTick(now:)``.
    mutating func tick(now: UInt64) {
        heartbeat(cellOffers: false, now: now)
        if !lateWorkers.isEmpty { lateWorkers = lateWorkers.filter { $0.value.until > now } }
        expireQueued(now: now)
        probeQuietClients(now: now)
    }

    /// Heartbeats to the offers of other cells and expires the silent ones, at the links'
    /// quicker interval (``KernelConfiguration/cellHeartbeatInterval``).
    mutating func cellTick(now: UInt64) {
        guard workers.values.contains(where: { $0.cell != nil }) else { return }
        heartbeat(cellOffers: true, now: now)
    }

    /// Expires the silent workers of this cell (`cellOffers` false) or other cells' offers
    /// (true), and heartbeats to the rest of them.
    private mutating func heartbeat(cellOffers: Bool, now: UInt64) {
        for worker in Array(workers.values) where (worker.cell != nil) == cellOffers && worker.expiry <= now {
            // Silent is what sends nothing: over a slow link a large reply takes longer to
            // arrive than the expiry, and the worker's heartbeats wait behind it. Bytes
            // arrived within the expiry, it is asked again at the next heartbeat.
            let silence = cellOffers ? configuration.cellExpiry : configuration.workerExpiry
            if let quiet = worker.connection?.sinceDataReceived, quiet < silence {
                let interval = cellOffers ? configuration.cellHeartbeatInterval : configuration.heartbeatInterval
                worker.expiry = now + UInt64(interval.nanoseconds)
                continue
            }
            remove(worker, reason: "no heartbeat for \(silence)", silent: true, now: now)
        }
        for worker in workers.values where (worker.cell != nil) == cellOffers {
            send(MDP.encode(.heartbeat, to: worker.identity, version: worker.version))
        }
    }

    mutating func expireQueued(now: UInt64) {
        if !gathers.isEmpty { expireGathers(now: now) }
        for service in services.values where !service.requests.isEmpty {
            let expired = service.requests.removeExpired(now: now)
            guard !expired.isEmpty else { continue }
            for request in expired {
                queuedBytes -= request.size
                service.stats.unavailable += 1
                reply(to: request.caller, service: service.name, body: request.body,
                      error: .serviceUnavailable(service.name, within: configuration.queueTimeout.seconds))
            }
            forgetIfUnserved(service)
        }
    }

    /// Empty queues let go of the storage a burst grew them to.
    mutating func releaseIdleQueues() {
        for service in services.values { service.requests.releaseIfEmpty() }
    }

    /// Drops the record of a name no worker ever offered once nothing waits for it, so
    /// requests for made-up names cannot grow the registry.
    private mutating func forgetIfUnserved(_ service: Service) {
        if !service.everServed, service.requests.isEmpty {
            services[service.name] = nil
            if lastService === service { lastService = nil }
        }
    }

    // MARK: Workers leaving

    /// Removes `worker`; its requests in flight go back to the queue. `undelivered`: a
    /// message to it that libzmq could not take (its connection gone, or full): a request it
    /// carried never reached the worker, so that delivery does not count against it.
    private mutating func remove(_ worker: Worker, reason: String, silent: Bool = false, undelivered: Message? = nil, now: UInt64) {
        guard workers.removeValue(forKey: worker.identity) != nil else { return }
        if lastWorker === worker { lastWorker = nil }
        let service = worker.service
        if !worker.draining {  // a draining worker was taken out of the counts already
            service.leave(worker)
            events.append(worker.cell == nil ? .workersChanged(service: service.name, count: service.workers) : .offersChanged(service: service.name))
        }
        logger.info("worker removed", metadata: ["service": "\(service.name)", "reason": "\(reason)", "workers": "\(service.workers)"])
        // Its requests in flight, oldest first, go back to the front of the queue with a
        // fresh wait for another worker (or are answered -32006 for a non-retriable service).
        // The one libzmq could not deliver never reached it: the others count its death.
        var notDelivered: [Request] = []
        // A REQUEST is [worker, "", MDPW01, 0x02, client, …] in 0.1, [worker, MDPW02, 0x02, client, …] in 0.2.
        let commandIndex = worker.version == .v01 ? 3 : 2
        if let undelivered, undelivered.count > commandIndex + 1, undelivered[commandIndex].equals([MDP.Command.request.rawValue]),
           let request = worker.answered(undelivered[commandIndex + 1]) {
            notDelivered.append(request)
        }
        // Copies of requests to every worker are not handed to another: that one has its own.
        let waitingCopies = worker.gatherCopies
        worker.gatherCopies.removeAll()
        stopWaiting(waitingCopies)
        for copy in worker.inFlight.all + waitingCopies + notDelivered {
            if let (gather, name) = copy.gather { gatherMissing(gather, name, "died") }
        }
        notDelivered.removeAll { $0.gather != nil }
        let heldWhenItDied = worker.inFlight.all.filter { $0.gather == nil }
        for request in heldWhenItDied where request.lastDeadProcess != worker.process {
            request.deaths += 1
            request.lastDeadProcess = worker.process
        }
        let orphans = (heldWhenItDied + notDelivered).sorted { $0.received < $1.received }
        let echoed = silent ? worker.inFlight.echoedClients(by: worker) : [:]
        worker.inFlight = InFlight()
        var late: [Frame: Request] = [:]
        let retriable = !configuration.nonRetriableServices.contains(service.name)
        for request in orphans.reversed() {
            // Queued again before its place is released, so its client stays known.
            defer { service.requests.release(request) }
            if request.parts == 0, request.broken == nil {
                // Its client was asked about but sent no part: it is asked again where the
                // request goes next.
                unlist(request)
                (request.streamWorker, request.streamClient) = (nil, nil)
            }
            if request.parts > 0 || request.broken != nil {
                // Its client has parts already (another worker would send them again), or
                // wants none.
                endStream(request, service: service, error: .streamEnded(
                    "the '\(service.name)' worker died", parts: request.parts, reason: "worker_died", service: service.name))
            } else if request.deaths >= configuration.maxDeliveries {
                service.stats.handlerDied += 1
                logger.warning("not handing a request out again: each worker it went to died with it", metadata: [
                    "service": "\(service.name)", "workers": "\(request.deaths)"])
                reply(to: request.caller, service: service.name, body: request.body,
                      error: .handlerDied("the '\(service.name)' worker", times: request.deaths, service: service.name))
            } else if retriable {
                service.stats.redispatched += 1
                // Another worker is waited for as long as the queue timeout; a request that
                // a silent cell held, only for what is left of the one it came with: that
                // cell is most often cut off, and its client is told within that timeout.
                request.deadline = silent && worker.cell != nil ? request.received &+ timeouts.queue : now + timeouts.queue
                service.requests.prepend(request)
                queuedBytes += request.size
                if let client = echoed[ObjectIdentifier(request)] { late[client] = request }
            } else {
                service.stats.outcomeUnknown += 1
                reply(to: request.caller, service: service.name, body: request.body, error: .outcomeUnknown(service.name))
            }
        }
        if !late.isEmpty { lateWorkers[worker.identity] = (service, late, now + timeouts.queue) }
        if retriable { dispatch(service, now: now) }
    }

    /// A REPLY from `identity`, a worker removed for silence, to a request of its that still
    /// waits in the queue: the client gets it, and the request leaves the queue.
    private mutating func answerLate(_ identity: Frame, client: Frame, body: ArraySlice<Frame>, now: UInt64) {
        guard var record = lateWorkers[identity], let request = record.requests.removeValue(forKey: client) else { return }
        lateWorkers[identity] = record.requests.isEmpty ? nil : record
        let service = record.service
        guard service.requests.remove(request) else { return }
        queuedBytes -= request.size
        service.stats.replies += 1
        service.stats.latency.record(nanoseconds: now &- request.received)
        outbox.send(MDP.BrokerReply(to: request.client, serviceFrame: service.nameFrame, body: body, version: request.version))
        logger.info("kept the answer of a worker removed for silence: its request still waited", metadata: ["service": "\(service.name)"])
    }

    /// A send to `identity` found no connection: a worker there died without a word (its
    /// process killed, its link cut), and its request in flight goes to another worker; or a
    /// client left, and its streams send it nothing more.
    mutating func peerGone(_ identity: Frame, undelivered: Message? = nil, now: UInt64) {
        if let worker = workers[identity] {
            remove(worker, reason: "its connection is gone", undelivered: undelivered, now: now)
        } else {
            breakStreams(of: identity, .clientGone)
        }
    }

    /// A send to `identity` hit its backlog limit: it does not read. A worker like that is
    /// dropped (its request goes to another); a client's reply is dropped and counted, and
    /// a part of a stream to it ends the stream (its FINAL says so).
    mutating func peerFull(_ identity: Frame, undelivered: Message? = nil, now: UInt64) {
        if let worker = workers[identity] {
            remove(worker, reason: "it does not read", undelivered: undelivered, now: now)
        } else {
            droppedReplies += 1
            breakStreams(of: identity, .overrun)
        }
    }

    /// A command other than READY from a worker this kernel does not know: most often one it
    /// removed (silent for its expiry) that was slow, not gone, or one registered with this
    /// kernel before it restarted. 7/MDP's answer is DISCONNECT, on which the worker registers
    /// again; that is the protocol's way back, not a peer speaking it badly, so it is not
    /// counted as a protocol error (which an operator watches for broken or hostile peers).
    private mutating func askToRegister(_ identity: Frame, version: MDP.Version, after command: String) {
        peerLog.info("told a worker this kernel does not know to register again", metadata: ["command": "\(command)"])
        send(MDP.encode(.disconnect, to: identity, version: version))
    }

    private mutating func disconnect(_ identity: Frame, version: MDP.Version, reason: String, now: UInt64) {
        protocolErrors += 1
        peerLog.info("disconnecting peer", metadata: ["reason": "\(reason)"])
        send(MDP.encode(.disconnect, to: identity, version: version))
        if let worker = workers[identity] { remove(worker, reason: reason, now: now) }
    }

    // MARK: Replies in parts (18/MDP)

    /// One PARTIAL of `request`'s reply: on to an 18/MDP client now, kept for a 7/MDP one.
    private mutating func relayPart(_ body: ArraySlice<Frame>, of request: Request, service: Service) {
        request.parts += 1
        list(request)
        guard request.broken == nil else { return }
        switch request.version {
        case .v02:
            send(MDP.reply(to: request.client, serviceFrame: service.nameFrame, body: body, version: .v02, final: false))
        case .v01:
            // A 7/MDP client has no partial replies: the parts wait for the FINAL, within
            // bounds (a message part's limit per stream, the queue's bytes in all, and the
            // frames a reader takes in one message).
            let size = body.reduce(0) { $0 + $1.count }
            if request.gatheredBytes + size > configuration.maxMessageSize
                || queuedBytes + gatheredBytes + size > configuration.maxQueuedBytes
                || request.gathered.count + body.count > Self.maxGatheredFrames {
                gatheredBytes -= request.gatheredBytes
                request.gathered = []
                request.gatheredBytes = 0
                breakStream(request, .tooLarge)
            } else {
                request.gathered.append(contentsOf: body.map { $0.keepable() })
                request.gatheredBytes += size
                gatheredBytes += size
            }
        }
    }

    /// Frames gathered into one REPLY for a 7/MDP client at most: with its header, within
    /// what a reader takes in one message (``ZMQSocket/maxParts``).
    static let maxGatheredFrames = ZMQSocket.maxParts - 8

    /// `request`'s stream is over: its FINAL (`final`, the worker's last body) or `error`
    /// goes to the client, unless the stream broke, when the error says so.
    private mutating func endStream(_ request: Request, service: Service, final: ArraySlice<Frame>? = nil, error: JSONRPCError? = nil) {
        unlist(request)
        gatheredBytes -= request.gatheredBytes
        defer {
            request.gathered = []
            request.gatheredBytes = 0
        }
        var error = error
        // Parts gathered for a 7/MDP client, and the FINAL's frames with them: one message.
        if let final, request.broken == nil, !request.gathered.isEmpty, request.gathered.count + final.count > Self.maxGatheredFrames {
            request.broken = .tooLarge
        }
        switch request.broken {
        case nil: break
        case .clientGone, .cancelled: return
        case .overrun:
            error = .streamEnded("the client did not read the parts as fast as they came", parts: request.parts, reason: "overrun", service: service.name)
        case .tooLarge:
            error = JSONRPCError(code: JSONRPCError.tooLargeCode,
                                 message: "Too large: a reply in \(request.parts) parts is more than a 7/MDP client can be sent in one (kernel.max_message_size, max_queued_bytes, \(Self.maxGatheredFrames) frames); ask in MDP/0.2 (MDPC02) to get it part by part",
                                 data: ["parts": .int(Int64(request.parts)), "service": .string(service.name)])
        }
        if error != nil { brokenStreams += 1 }
        if let error {
            reply(to: request.caller, service: service.name, body: request.body, error: error)
        } else if let final {
            send(MDP.reply(to: request.client, serviceFrame: service.nameFrame, body: request.gathered[...] + final, version: request.version))
        }
    }

    private mutating func list(_ request: Request) {
        guard !request.listed else { return }
        request.listed = true
        streams[request.client, default: []].append(request)
    }

    private mutating func unlist(_ request: Request) {
        guard request.listed, var list = streams[request.client] else { return }
        request.listed = false
        list.removeAll { $0 === request }
        streams[request.client] = list.isEmpty ? nil : list
    }

    /// A PARTIAL of one empty frame: the kernel asking an 18/MDP client whether it is still
    /// there (docs/PROTOCOL.md). Clients drop it.
    static let probeBody: ArraySlice<Frame> = [Frame()]

    /// Asks the 18/MDP client of each request a worker holds (of this cell, or another cell's
    /// offer) whether it is still there, once it has been sent nothing of it for a worker's
    /// expiry: a client that left cannot be sent the probe (``peerGone(_:undelivered:now:)``),
    /// its request breaks, and its worker is told `stop`. A reader whose process was killed
    /// while it waited (for a push stream's next message, say) frees its worker's place then,
    /// not when its wait ends; a part sent to it would find it gone, but none may come for a
    /// long time. A request another cell sent here is not asked about: that cell's kernel asks
    /// its own client.
    private mutating func probeQuietClients(now: UInt64) {
        for worker in workers.values where !worker.inFlight.isEmpty {
            worker.inFlight.forEach { tag, request in
                guard request.version == .v02, request.broken == nil, request.gather == nil, !request.forwarded else { return }
                guard request.parts == request.partsSeen else {
                    (request.partsSeen, request.quietSince) = (request.parts, now)
                    return
                }
                guard now &- request.quietSince >= timeouts.workerExpiry else { return }
                request.quietSince = now
                if request.parts == 0, worker.speaksExtension { (request.streamWorker, request.streamClient) = (worker, worker.echoedClient(of: request, tag: tag)) }
                list(request)
                send(MDP.reply(to: request.client, serviceFrame: worker.service.nameFrame, body: Self.probeBody, version: .v02, final: false))
            }
        }
    }

    private mutating func breakStream(_ request: Request, _ reason: StreamBreak) {
        guard request.broken == nil else { return }
        request.broken = reason
        peerLog.info("a reply in parts stopped reaching its client", metadata: ["reason": "\(reason)", "parts": "\(request.parts)"])
        // An extension worker is told to end it; a plain 18/MDP worker sends on to its FINAL,
        // as the RFC has it (the parts are dropped here).
        if let worker = request.streamWorker, let client = request.streamClient, workers[worker.identity] === worker {
            send(MDP.encode(.stop(client: client), to: worker.identity, version: worker.version))
        }
        request.streamWorker = nil
    }

    /// Every stream to `client` breaks: a failed send names the client, not the request.
    private mutating func breakStreams(of client: Frame, _ reason: StreamBreak) {
        for request in streams[client] ?? [] { breakStream(request, reason) }
    }

    // MARK: Replies the kernel writes itself

    /// Answers a request the kernel could not deliver, with `error` for each id in its body.
    private mutating func reply(to caller: Caller, service: String, body: ArraySlice<Frame>, error: JSONRPCError) {
        reply(to: caller, serviceFrame: Frame(service), body: body, error: error)
    }

    private mutating func reply(to caller: Caller, serviceFrame: Frame, body: ArraySlice<Frame>, error: JSONRPCError) {
        let bytes = body.count == 1 ? body.first!.bytes : []
        send(MDP.reply(to: caller.client, serviceFrame: serviceFrame, body: [Frame(JSONRPC.errorReply(to: bytes, error: error))],
                       version: caller.version))
    }

    /// Answers a request ``Admission`` refused: -32008 when this kernel is not the active one
    /// of its pair (the client asks the other), -32011 when only an operator may ask it or its
    /// key was taken out.
    mutating func refuse(_ caller: Caller, service: String, body: ArraySlice<Frame>, _ verdict: Admission.Verdict) {
        switch verdict {
        case .admitted: return
        case .notActive: refusedNotActive += 1
        case .notOperator:
            refusedForKey += 1
            peerLog.warning("refused a request for operators only from another key", metadata: ["service": "\(service)"])
        case .keyRemoved:
            refusedForKey += 1
            peerLog.warning("refused a request from a key a reload took out", metadata: ["service": "\(service)"])
        }
        reply(to: caller, service: service, body: body, error: admission.refusal(verdict, service: service))
    }

    /// The `kernel` service's answer to `caller`.
    mutating func replyFromKernel(to caller: Caller, _ reply: [UInt8]) {
        send(MDP.reply(to: caller.client, serviceFrame: Self.kernelServiceFrame, body: [Frame(reply)], version: caller.version))
    }
    private static let kernelServiceFrame = Frame(KernelAPI.service)

    /// The worker that sent the last worker message, and the service the last request was
    /// for: a worker's replies and a client's requests come in runs, so most lookups end here
    /// instead of hashing a routing id or a name.
    private var lastWorker: Worker?
    private var lastService: Service?

    private mutating func knownWorker(_ identity: Frame) -> Worker? {
        if let lastWorker, lastWorker.identity == identity { return lastWorker }
        let worker = workers[identity]
        if let worker { lastWorker = worker }
        return worker
    }

    private mutating func knownService(_ name: String) -> Service? {
        if let lastService, lastService.name == name { return lastService }
        let service = services[name]
        if let service { lastService = service }
        return service
    }

    private mutating func serviceNamed(_ name: String) -> Service {
        if let service = services[name] { return service }
        let service = Service(name: name)
        services[name] = service
        return service
    }
}

extension Broker.Worker {
    /// Records `request` as sent; returns the client frame to send with it. A worker with a
    /// window gets the client's routing id followed by a 4-byte tag, which it echoes like
    /// any client frame, so its replies can come back in any order.
    func sent(_ request: Broker.Request) -> Frame {
        echoedClient(of: request, tag: inFlight.insert(request))
    }

    /// The client frame this worker is sent `request` with under `tag`, and echoes.
    func echoedClient(of request: Broker.Request, tag: UInt32) -> Frame {
        guard window > 1 else { return request.client }
        return request.client.withUnsafeBytes { client in
            withUnsafeTemporaryAllocation(byteCount: client.count + 4, alignment: 4) { buffer in
                buffer.copyMemory(from: client)
                buffer.storeBytes(of: tag.littleEndian, toByteOffset: client.count, as: UInt32.self)
                return Frame(copying: UnsafeRawBufferPointer(buffer))
            }
        }
    }

    /// The request a PARTIAL with `client` belongs to, still in flight; nil when none is.
    func holding(_ client: Frame) -> Broker.Request? {
        guard let tag = tag(of: client) else { return nil }
        return inFlight.request(tagged: tag)
    }

    /// The request a REPLY (FINAL) with `client` answers, no longer in flight; nil when none is.
    func answered(_ client: Frame) -> Broker.Request? {
        guard let tag = tag(of: client) else { return nil }
        return inFlight.remove(tagged: tag)
    }

    /// The tag of the request in flight that `client` (as a worker echoes it) names.
    private func tag(of client: Frame) -> UInt32? {
        guard window > 1 else {
            // One slot: its request is the one a plain worker's reply names by the client alone.
            guard let tag = inFlight.firstTag, let request = inFlight.request(tagged: tag), request.client == client else { return nil }
            return tag
        }
        let tag: UInt32? = client.withUnsafeBytes { raw in
            raw.count >= 4 ? UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: raw.count - 4, as: UInt32.self)) : nil
        }
        guard let tag, let request = inFlight.request(tagged: tag),
              client.withUnsafeBytes({ $0.count == request.client.count + 4 && request.client.equals(UnsafeRawBufferPointer(rebasing: $0.prefix($0.count - 4))) })
        else { return nil }
        return tag
    }
}

/// The requests a worker holds, by tag: a slot per place of its window, so sending and
/// answering index an array instead of hashing a key. A tag is the slot (low 16 bits) and
/// how many times the slot was used (high 16 bits), so a late reply for an earlier use of a
/// slot does not match the request in it now. A worker with a window of 1 has one slot.
struct InFlight {
    private var held: [Broker.Request?] = []
    /// The tag of each slot's request (or its last one).
    private var tags: [UInt32] = []
    private var free: [Int] = []
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }

    /// The tag of the first slot's request (or its last one).
    var firstTag: UInt32? { tags.first }

    /// The tag of the first request held that `matches`.
    func tag(where matches: (Broker.Request) -> Bool) -> UInt32? {
        for (slot, request) in held.enumerated() where request.map(matches) == true { return tags[slot] }
        return nil
    }

    /// Every request held, oldest slot first.
    var all: [Broker.Request] { held.compactMap { $0 } }

    /// Each request held, with its tag.
    func forEach(_ body: (UInt32, Broker.Request) -> Void) {
        for (slot, request) in held.enumerated() { if let request { body(tags[slot], request) } }
    }

    /// Holds `request`; its tag.
    mutating func insert(_ request: Broker.Request) -> UInt32 {
        let slot: Int, tag: UInt32
        if let reused = free.popLast() {
            slot = reused
            tag = (tags[slot] &+ 0x1_0000) & 0xFFFF_0000 | UInt32(slot)
        } else {
            slot = held.count
            tag = UInt32(slot)
            held.append(nil)
            tags.append(tag)
        }
        tags[slot] = tag
        held[slot] = request
        count += 1
        return tag
    }

    /// The request held under `tag`, if any.
    func request(tagged tag: UInt32) -> Broker.Request? {
        let slot = Int(tag & 0xFFFF)
        guard slot < held.count, tags[slot] == tag else { return nil }
        return held[slot]
    }

    /// The client frame `worker` echoes for each request held, by request.
    func echoedClients(by worker: Broker.Worker) -> [ObjectIdentifier: Frame] {
        var frames: [ObjectIdentifier: Frame] = [:]
        forEach { tag, request in frames[ObjectIdentifier(request)] = worker.echoedClient(of: request, tag: tag) }
        return frames
    }

    /// Lets go of the request under `tag`.
    mutating func remove(tagged tag: UInt32) -> Broker.Request? {
        guard let request = request(tagged: tag) else { return nil }
        let slot = Int(tag & 0xFFFF)
        held[slot] = nil
        free.append(slot)
        count -= 1
        return request
    }
}
