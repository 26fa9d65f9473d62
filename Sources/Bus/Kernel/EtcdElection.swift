import BusProtocol
import Contracts
import Etcd
import Foundation
import Logging
import ZeroMQ

// Which kernel writes the state kept in etcd: the one holding its election key
// (`PREFIX.active`, under the kernel's lease). The rules:
// - a kernel creates the key when no other holds it, and otherwise waits for it to go: its
//   kernel stopped (and let it go), or its lease ran out;
// - the holder stops serving the state (-32008) once its lease may have run out without a
//   renewal, counted from when it sent the last renewal that succeeded: before etcd lets the
//   key go, so two kernels never serve the state at once, even when the holder is cut off
//   from etcd and from the others (`Kernel.expireLease`). A renewal that finds the lease
//   still its own (etcd had no leader for a moment) lets it serve again; one that finds it
//   gone ends its election, and the kernel;
// - a waiting kernel also asks the holder, at the broker the key names, whether it still
//   serves (8/MMI, as a client would, every 200 ms). A holder it has heard answer whose
//   connection then drops, and whose machine (asked at once, then every 200 ms while the
//   connection stays down) refuses a connection to that broker (the machine is up and
//   nothing listens there: the kernel's process ended), is gone: its key is deleted (only if
//   it is still that holder's), so the waiting kernel takes over within a second rather than
//   at the end of the holder's lease;
// - a holder that names the waiting kernel's own broker, where nothing listens, is an earlier
//   run of that kernel (the holder binds its broker only once elected, and two processes
//   cannot bind one address): its key is deleted at once, so a kernel restarted after a crash
//   does not wait for its own lease;
// - a holder silent without a refusal (its machine gone, cut off from here, frozen, or
//   overloaded) may still be serving clients it reaches: its lease decides, and so does a
//   holder never heard (its broker unreachable from here, or still starting).

/// What the election key holds: the holding kernel's instance and, when it binds one that
/// others can reach, its broker (so a waiting kernel can ask whether it still serves).
struct ElectionValue: Equatable {
    var instance: String
    var broker: String?

    var bytes: [UInt8] {
        JSONValue.object(["instance": .string(instance), "broker": broker.map(JSONValue.string) ?? .null]).jsonBytes
    }

    /// A value this kernel wrote, or any other (an operator's, a test's): its text is then the
    /// instance, and there is no broker to ask.
    init(decoding value: [UInt8]) {
        let json = try? JSONValue(parsing: value)
        instance = json?["instance"]?.stringValue ?? String(decoding: value, as: UTF8.self)
        broker = json?["broker"]?.stringValue
    }

    init(instance: String, broker: String?) { (self.instance, self.broker) = (instance, broker) }

    /// The broker endpoint others can connect to: none for one bound on every interface or on
    /// a port the system picks.
    static func advertised(_ endpoint: String) -> String? {
        guard endpoint.hasPrefix("tcp://") else { return endpoint.hasPrefix("ipc://") ? endpoint : nil }
        let address = endpoint.dropFirst("tcp://".count)
        guard let colon = address.lastIndex(of: ":") else { return nil }
        let host = address[..<colon], port = address[address.index(after: colon)...]
        guard !["*", "0.0.0.0", "[::]", "::"].contains(host), port != "0", port != "*" else { return nil }
        return endpoint
    }
}

/// Asks the kernel holding the election, at its broker, whether it still serves (an 8/MMI
/// question for the `kernel` service every `interval`); `inDoubt` yields, once a kernel
/// answered, as soon as its connection drops (its process ended, or the network between
/// failed) and at each question while it stays down: whether it is gone is for its machine
/// to say (``Kernel/refusesConnection(_:)``), and a process that is ending may still hold its
/// listening socket for a moment after its connections dropped. Lives on the kernel's loop
/// thread.
final class HolderProbe {
    private var registration: SocketRegistration?
    private var monitor: SocketRegistration?
    private var timer: LoopTimer?
    private var answeredAt: UInt64?
    private var connected = false
    let inDoubt: AsyncStream<Void>
    private let continuation: AsyncStream<Void>.Continuation
    /// Called once, when the holder first answers.
    var onFirstAnswer: (() -> Void)?

    init(endpoint: String, loop: SocketLoop, security: KernelSecurity?, every interval: Duration) throws {
        let socket = try ZMQSocket(loop.context, .dealer)
        do {
            if let security {
                // The kernels of one bus share their key pair, and each admits its own key.
                let publicKey = try CurveKeyPair.publicKey(forSecretKey: security.secretKey)
                try CurveClientKeys(serverKey: publicKey, secretKey: security.secretKey).apply(to: socket)
            }
            try socket.set(.immediate, true)
            try socket.set(.linger, 0)
            // A machine gone closes no connection: ZMTP heartbeats notice it.
            let milliseconds = Int32(clamping: Int(interval.nanoseconds / 1_000_000))
            try socket.set(.heartbeatInterval, milliseconds)
            try socket.set(.heartbeatTimeout, milliseconds * 5)
        } catch {
            socket.close()
            throw error
        }
        (inDoubt, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        do {
            let events = try connectionEvents(of: socket, in: loop.context)
            monitor = loop.register(receivingOnly: events) { [weak self] message in
                guard let self, let event = SocketEvent(message) else { return }
                if event.event.contains(.connected) { connected = true }
                if event.event.contains(.disconnected) {
                    connected = false
                    // Whether the holder is gone is for its machine to say now, not after its silence.
                    if answeredAt != nil { continuation.yield() }
                }
            }
            registration = loop.register(socket) { [weak self] _ in self?.answered() }
            registration?.dropsWhenPeerFull = true
            // Connected once its connection events are watched, so the first is seen.
            try socket.connect(endpoint)
        } catch {
            if registration == nil { socket.close() }
            stop()
            throw error
        }
        timer = loop.scheduleRepeating(every: interval) { [weak self] in self?.ask() }
    }

    private func answered() {
        if answeredAt == nil { onFirstAnswer?() }
        answeredAt = monotonicNanoseconds()
    }

    private func ask() {
        if answeredAt != nil, !connected {
            continuation.yield()
        }
        registration?.send([Frame(), Frame(MDP.clientHeader), Frame(MMI.serviceQuery), Frame(KernelAPI.service)])
    }

    func stop() {
        timer?.cancel()
        timer = nil
        registration?.close()
        registration = nil
        monitor?.close()
        monitor = nil
        continuation.finish()
    }
}

extension Kernel {
    /// Whether another kernel than the one at `broker` holds the election of the state
    /// `settings` name now (false too when no etcd member answers): a kernel started at
    /// `broker` on them that does not answer then stands by, rather than still starting.
    public static func stateElectionHeld(_ settings: EtcdStateSettings, cell: String?, byOtherThan broker: String) async -> Bool {
        guard let client = try? EtcdClient(settings: EtcdClient.Settings(settings)) else { return false }
        let holder = try? await client.range(EtcdStateLink.electionKey(Array(settings.prefix.utf8), cell: cell)).keyValues.first
        await client.close()
        guard let holder = holder ?? nil else { return false }
        // A kernel bound on every interface names no broker: then any holder counts.
        let own = ElectionValue.advertised(broker)
        return own == nil || ElectionValue(decoding: holder.value).broker != own
    }

    /// How often a waiting kernel asks the holder whether it still serves, and so how often,
    /// while the connection to a holder that answered is down, it asks the holder's machine
    /// whether anything listens at its broker. Short, because the refusal, not the silence,
    /// is what says the holder is gone.
    static let holderProbeInterval = Duration.milliseconds(200)

    /// Connects to the etcd that keeps the state and wins its election: creates the election
    /// key under a new lease of its own, once no other kernel holds it (waiting, while one
    /// does, for its key to go, or for the holder to fall silent). The election's revision is
    /// where reading the state must reach (the link's ``EtcdStateLink/lastRevision``).
    func connectState(_ settings: EtcdStateSettings) async throws -> EtcdStateLink {
        let client = try EtcdClient(settings: EtcdClient.Settings(settings))
        do {
            let prefix = Array(settings.prefix.utf8), election = EtcdStateLink.electionKey(prefix, cell: configuration.cell?.name)
            let mine = ElectionValue(instance: instance, broker: ElectionValue.advertised(configuration.brokerEndpoint))
            while true {
                try Task.checkCancellation()
                let granted = ContinuousClock.now
                let lease = try await client.grantLease(ttl: Int64(settings.leaseSeconds))
                let campaign = try await client.transaction(when: [.absent(election)], then: [.put(key: election, value: mine.bytes, lease: lease.id)],
                                                            else: [.range(key: election)])
                if campaign.succeeded {
                    return EtcdStateLink(client: client, prefix: prefix, electionKey: election, lease: lease.id, leaseSeconds: settings.leaseSeconds, granted: granted, elected: campaign.revision)
                }
                try? await client.revoke(lease.id)
                guard let holder = campaign.ranges.first?.keyValues.first else { continue }
                try await waitForElection(client, election, held: holder, from: campaign.revision + 1)
            }
        } catch {
            await client.close()
            guard let error = error as? EtcdError else { throw error }
            throw KernelRefusal("the state on etcd (kernel.state.etcd): \(error); the kernel starts once it has read its state")
        }
    }

    /// Returns once the election key `holder` is gone: deleted (its kernel stopped, or its
    /// lease ran out), or deleted here after its kernel, heard before, fell silent.
    private func waitForElection(_ client: EtcdClient, _ election: [UInt8], held holder: EtcdKeyValue, from revision: Int64) async throws {
        let value = ElectionValue(decoding: holder.value)
        let electionName = String(decoding: election, as: UTF8.self)
        // A holder that names this kernel's own broker is an earlier run of it (its supervisor
        // restarting it after a crash): a kernel binds its broker only once it holds the
        // election, and two processes cannot bind one address, so nothing listening there
        // means that run is gone. Taken at once rather than at the end of its lease.
        if let broker = value.broker, broker == ElectionValue.advertised(configuration.brokerEndpoint), await Kernel.refusesConnection(broker) {
            return try await take(election, from: holder, client, why: "it names this kernel's broker, where nothing listens: an earlier run of this kernel")
        }
        logger.notice("another kernel writes this state: waiting for it to go (it stops, its lease runs out, or its process is gone)",
                      metadata: ["election": "\(electionName)", "holder": "\(value.instance)", "broker": "\(value.broker ?? "none named")",
                                 "lease": "\(String(holder.lease, radix: 16))"])
        var probe: HolderProbe?
        if let broker = value.broker {
            do {
                probe = try HolderProbe(endpoint: broker, loop: loop, security: configuration.security, every: Self.holderProbeInterval)
                let logger = self.logger
                probe?.onFirstAnswer = { logger.notice("the kernel holding the election answers at its broker: standing by", metadata: ["broker": "\(broker)"]) }
            } catch {
                logger.warning("cannot ask the kernel holding the election at its broker: waiting for its lease", metadata: ["broker": "\(broker)", "error": "\(error)"])
            }
        }
        defer { probe?.stop() }
        let inDoubt = probe?.inDoubt
        // The first to say: the key's deletion (false), or the holder's machine refusing a
        // connection to its broker once the holder was in doubt (true). A probe that ended
        // without that says nothing (nil).
        let holderGone = try await withThrowingTaskGroup(of: Bool?.self) { group in
            group.addTask {
                for try await update in client.watch(election, from: revision) {
                    if case .events(let events, _) = update, events.contains(where: { $0.kind == .delete }) { return false }
                }
                return false
            }
            if let inDoubt, let broker = value.broker {
                group.addTask {
                    for await _ in inDoubt {
                        if await Kernel.refusesConnection(broker) { return true }
                    }
                    return nil
                }
            }
            defer { group.cancelAll() }
            while let said = try await group.next() {
                if let said { return said }
            }
            return false
        }
        guard holderGone else { return }
        try await take(election, from: holder, client, why: "its connection dropped, and its machine refuses connections to its broker")
    }

    /// Deletes the election key of a holder that is gone, only if it is still that holder's
    /// (one that started meanwhile keeps it): the election is then stood for at once.
    private func take(_ election: [UInt8], from holder: EtcdKeyValue, _ client: EtcdClient, why: String) async throws {
        let taken = try await client.transaction(when: [EtcdCompare(key: election, .equal, .createRevision(holder.createRevision))],
                                                 then: [.delete(key: election)], else: [])
        if taken.succeeded {
            let value = ElectionValue(decoding: holder.value)
            logger.warning("the kernel holding the election is gone (\(why)): taking its election rather than wait for its lease",
                           metadata: ["holder": "\(value.instance)", "broker": "\(value.broker ?? "")"])
        }
    }

    /// Whether the machine at `endpoint` (`tcp://HOST:PORT`) refuses a connection there now:
    /// it answered, and nothing listens (the kernel's process ended). No answer within half a
    /// second (the machine gone, or cut off from here) is no refusal, nor is an endpoint of
    /// another kind (an `ipc://` holder, on this machine, is left to its lease).
    static func refusesConnection(_ endpoint: String) async -> Bool {
        await withCheckedContinuation { done in
            // A connect may wait: off the loop and the cooperative threads.
            DispatchQueue.global().async { done.resume(returning: refusesConnectionNow(endpoint, waiting: 500)) }
        }
    }

    private static func refusesConnectionNow(_ endpoint: String, waiting milliseconds: Int32) -> Bool {
        guard endpoint.hasPrefix("tcp://") else { return false }
        let address = endpoint.dropFirst("tcp://".count)
        guard let colon = address.lastIndex(of: ":") else { return false }
        let host = String(address[..<colon]).trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
        let port = String(address[address.index(after: colon)...])
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var found: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, port, &hints, &found) == 0, let first = found else { return false }
        defer { freeaddrinfo(found) }
        let fd = socket(first.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        if connect(fd, first.pointee.ai_addr, first.pointee.ai_addrlen) == 0 { return false }
        if errno == ECONNREFUSED { return true }
        guard errno == EINPROGRESS else { return false }
        var ready = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
        guard poll(&ready, 1, milliseconds) == 1 else { return false }
        var error: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 else { return false }
        return error == ECONNREFUSED
    }
}
