import BusProtocol
import Contracts
import Foundation
import Logging
import ZeroMQ

/// What this cell offers the other cells of the bus (docs/CELLS.md): for each other cell in
/// the directory and each service with a worker here, a DEALER to that cell's broker that
/// registers as a worker of the service (READY with a window, `callers=1` and `cell=NAME`).
/// Their kernel hands it requests only while it has no worker of its own; each one is put to
/// this kernel's broker as a request of the sender it names (``Broker/handleForwarded``), and
/// every part of its answer goes back on the same connection as the worker's PARTIAL or FINAL.
///
/// So a request finds a worker in another cell with nothing new on the other kernel's side
/// but the rule of when it is asked: its window, its tags, its heartbeats, a dead worker's
/// requests handed out again and replies in parts are the worker extension's, as they are
/// for any worker. On the loop thread, owned by ``KernelParts``.
final class CellLinks {
    /// Another cell, as its record in the directory says.
    struct Peer: Equatable, Sendable {
        var broker: String
        /// Its kernel's CURVE public key (nil: it runs without CURVE).
        var key: String?
    }

    /// One service offered to one other cell, on a connection of its own.
    final class Offer {
        let id: UInt32
        let cell: String
        let service: String
        let peer: Peer
        let registration: SocketRegistration
        /// Its connection events, and its TCP connection while there is one: bytes arriving
        /// on it say that cell's kernel is there while its heartbeats wait behind a large
        /// request still on its way.
        let monitor: SocketRegistration
        var connection: TCPConnection?
        /// When that cell's kernel was last heard on it (any command is a heartbeat).
        var lastHeard: UInt64
        init(id: UInt32, cell: String, service: String, peer: Peer, registration: SocketRegistration, monitor: SocketRegistration, now: UInt64) {
            (self.id, self.cell, self.service, self.peer, self.registration, self.monitor, lastHeard) = (id, cell, service, peer, registration, monitor, now)
        }
    }

    let configuration: CellConfiguration
    /// Whose cells to trust (its worker keys) and the key to connect with; a reload's.
    var security: KernelSecurity?
    private let loop: SocketLoop
    private let logger: Logger
    private let expiry: UInt64
    private let maxMessageSize: Int
    /// The other cells, by name (the directory's records but this cell's own).
    private(set) var peers: [String: Peer] = [:]
    /// Cells in the directory whose kernel key is not trusted here (said once each).
    private var refused: Set<String> = []
    private var offers: [UInt32: Offer] = [:]
    private var nextID: UInt32 = 1
    /// Where a request another cell sent is handed to, and answers are flushed from.
    weak var parts: KernelParts?

    init(configuration: CellConfiguration, kernel: KernelConfiguration, loop: SocketLoop, logger: Logger) {
        self.configuration = configuration
        security = kernel.security
        self.loop = loop
        self.logger = logger
        expiry = kernel.cellExpiry.nanoseconds
        maxMessageSize = kernel.maxMessageSize
    }

    /// The directory changed: connects to cells that came, lets go of those that left.
    func peersChanged(_ peers: [String: Peer], services: [String], now: UInt64) {
        var peers = peers
        if let security {
            // A cell's kernel tells this one who sent each request it hands over, and is
            // believed: with CURVE only a kernel whose key is among this kernel's worker keys
            // (as it must be there for this kernel's offers to register) is taken for a cell,
            // whatever else the directory holds.
            for (name, peer) in peers where !(peer.key.map(security.workerKeys.contains) ?? false) {
                peers[name] = nil
                if self.peers[name] != nil || !refused.contains(name) {
                    logger.warning("a cell in the directory has a kernel key this kernel does not trust: not offering it anything (add its key to security.worker_keys)",
                                   metadata: ["cell": "\(name)", "key": "\(peer.key ?? "none")"])
                }
                refused.insert(name)
            }
        }
        guard peers != self.peers else { return }
        self.peers = peers
        reconcile(services: services, now: now)
    }

    /// Makes the offers what they should be: every service in `services` (those with a
    /// worker here) to every other cell; any other is withdrawn.
    func reconcile(services: [String], now: UInt64) {
        let wanted = Set(services)
        for offer in offers.values where !wanted.contains(offer.service) || peers[offer.cell] != offer.peer {
            withdraw(offer, saying: .disconnect)
        }
        for (cell, peer) in peers {
            let held = Set(offers.values.filter { $0.cell == cell }.map(\.service))
            for service in wanted.subtracting(held).sorted() { open(service, to: cell, peer, now: now) }
        }
    }

    private func open(_ service: String, to cell: String, _ peer: Peer, now: UInt64) {
        let id = nextID
        nextID &+= 1
        do {
            let socket = try ZMQSocket(loop.context, .dealer)
            let events: ZMQSocket
            do {
                // Long enough for a last DISCONNECT to leave when the offer is withdrawn.
                try socket.set(.linger, 100)
                try socket.set(.maxMessageSize, Int64(maxMessageSize))
                // The other kernel knows a cell's connections by their process, the part
                // before the first `/`: all of this cell's count as one worker process.
                try socket.set(.routingID, Array("cell-\(configuration.name)/\(service)/\(id)".utf8))
                if let security {
                    guard let key = peer.key else { throw KernelRefusal("cell \(cell) records no CURVE key, and this kernel runs with CURVE") }
                    try CurveClientKeys(serverKey: key, secretKey: security.secretKey).apply(to: socket)
                }
                events = try connectionEvents(of: socket, in: loop.context)
            } catch {
                socket.close()
                throw error
            }
            do {
                try socket.connect(peer.broker)
            } catch {
                events.close()
                socket.close()
                throw error
            }
            let registration = loop.register(socket) { [weak self] message in self?.received(id, message) }
            registration.afterReading = { [weak self] in self?.parts?.flush() }
            let monitor = loop.register(receivingOnly: events) { [weak self] message in
                guard let offer = self?.offers[id], let event = SocketEvent(message) else { return }
                if event.event.contains(.disconnected) { offer.connection = nil }
                if let connection = TCPConnection(event) { offer.connection = connection }
            }
            let offer = Offer(id: id, cell: cell, service: service, peer: peer, registration: registration, monitor: monitor, now: now)
            offers[id] = offer
            registration.send(MDP.encode(.ready(service: service, window: configuration.window, callers: true, cell: configuration.name), version: .v02))
            logger.info("offering a service to another cell", metadata: ["service": "\(service)", "cell": "\(cell)", "broker": "\(peer.broker)"])
        } catch {
            logger.warning("cannot offer a service to another cell", metadata: ["service": "\(service)", "cell": "\(cell)", "error": "\(error)"])
        }
    }

    private func withdraw(_ offer: Offer, saying last: WorkerToBroker?) {
        if let last { offer.registration.send(MDP.encode(last, version: .v02)) }
        offer.registration.close()
        offer.monitor.close()
        offers[offer.id] = nil
        logger.info("no longer offering a service to another cell", metadata: ["service": "\(offer.service)", "cell": "\(offer.cell)"])
    }

    /// Heartbeats to every cell offered to; a cell not heard for the cells' expiry is
    /// connected to again (its kernel has removed this worker, or will, and sends what it
    /// held elsewhere).
    func tick(now: UInt64, services: [String]) {
        for offer in Array(offers.values) {
            // Silent is what sends nothing: a large request over a slow link holds that
            // kernel's heartbeats behind it while its bytes arrive.
            if now &- offer.lastHeard > expiry, let quiet = offer.connection?.sinceDataReceived, quiet.nanoseconds < expiry {
                offer.lastHeard = now &- expiry
            }
            if now &- offer.lastHeard > expiry {
                logger.notice("another cell's kernel went silent: offering again", metadata: ["service": "\(offer.service)", "cell": "\(offer.cell)"])
                withdraw(offer, saying: .disconnect)
            } else {
                offer.registration.send(MDP.encode(.heartbeat(), version: .v02))
            }
        }
        // What was withdrawn (silent, or refused) is offered again, a heartbeat later.
        reconcile(services: services, now: now)
    }

    /// Closes every connection (the kernel stops): the other cells send what they had here
    /// elsewhere.
    func close() {
        for offer in Array(offers.values) { withdraw(offer, saying: .disconnect) }
    }

    private func received(_ id: UInt32, _ message: Message) {
        guard let offer = offers[id], let parts else { return }
        let now = parts.clock.now
        offer.lastHeard = now
        switch try? MDP.decodeAtWorker(message) {
        case .request(let client, let body)?:
            // The first frame is who sent it, as the other kernel authenticated it (asked
            // with `callers=1`); the sender's rights here are that key's, as this kernel
            // ranks it (its ZAP user id, which says only whether it is a worker's).
            // A caller frame that starts `all:` marks a copy of a request to every worker:
            // this cell's workers are each asked in turn.
            guard !body.isEmpty else { return }
            var sender = Substring(body[0].string ?? "")
            let everyWorker = sender.hasPrefix(MDP.everyWorkerPrefix)
            if everyWorker { sender = sender.dropFirst(MDP.everyWorkerPrefix.count) }
            let peer = CallerIdentity(sender).map { caller in
                (caller.rank == .worker ? ZAPHandler.workerPrefix : ZAPHandler.clientPrefix) + caller.key
            }
            parts.broker.handleForwarded(Broker.Caller(client: Self.linkClient(offer: id, client: client), version: .v02),
                                         service: everyWorker ? MDP.everyWorkerPrefix + offer.service : offer.service, body: body[1...], peer: peer, now: now)
        case .disconnect?:
            // That kernel dropped this worker (it restarted, found it silent, or refused its
            // key): offered again at the next heartbeat.
            withdraw(offer, saying: nil)
        case .stop(let client)?:
            // Nobody reads that request's parts over there any more: here its client is gone
            // as well, so this kernel tells its worker to stop in turn.
            parts.broker.linkedClientGone(Self.linkClient(offer: id, client: client), service: offer.service)
        case .heartbeat?, .drain?, nil:
            // Any command is a heartbeat; a drain is that kernel's own business (it sends
            // nothing more on this connection until it is offered again).
            break
        }
    }

    // MARK: Answers going back

    /// The client frame of a request another cell sent: two bytes no routing id starts
    /// with (libzmq's own ids are five bytes from a zero; one a peer sets may not start with
    /// zero), the offer, then the client frame the other kernel gave it.
    static func linkClient(offer id: UInt32, client: Frame) -> Frame {
        var bytes: [UInt8] = [0x00, linkMark]
        withUnsafeBytes(of: id.littleEndian) { bytes += $0 }
        client.withUnsafeBytes { bytes += $0 }
        return Frame(bytes)
    }

    private static let linkMark: UInt8 = 0xCE
    /// 18/MDP's PARTIAL to a client (its FINAL is 0x03).
    private static let clientPartial: [UInt8] = [0x02]
    private static let linkHead = 6

    /// Whether a message from the broker is an answer to a request another cell sent.
    static func isAnswer(_ frames: UnsafeBufferPointer<Frame>) -> Bool {
        guard let first = frames.first, first.count > linkHead else { return false }
        return first.withUnsafeBytes { $0[0] == 0x00 && $0[1] == linkMark }
    }

    /// Sends an answer (`[client, MDPC02, PARTIAL or FINAL, service, body…]`, as the broker
    /// writes it for an 18/MDP client) back on the offer's connection, as its worker's.
    func relay(_ frames: UnsafeBufferPointer<Frame>) {
        guard frames.count >= 4 else { return }
        let (id, client): (UInt32, Frame) = frames[0].withUnsafeBytes { raw in
            (raw.loadUnaligned(fromByteOffset: 2, as: UInt32.self).littleEndian, Frame(copying: UnsafeRawBufferPointer(rebasing: raw[Self.linkHead...])))
        }
        // The offer is gone (that cell left, or went silent): the answer has nowhere to go,
        // and that kernel sends the request elsewhere.
        guard let offer = offers[id] else { return }
        let body = Array(frames[4...])[...]
        let isPartial = frames[2].equals(Self.clientPartial)
        offer.registration.send(MDP.encode(isPartial ? .partial(client: client, body: body) : .reply(client: client, body: body), version: .v02))
    }
}
