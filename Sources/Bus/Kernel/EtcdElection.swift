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
// - a waiting kernel also asks the holder, at the broker the key names, whether it still
//   serves (8/MMI, as a client would, every 200 ms): a holder it has heard answer that then
//   stays silent for a second with its connection down (its process ended, or ZMTP
//   heartbeats found its machine gone) is taken to be gone, and its key is deleted (only if
//   it is still that holder's), so the waiting kernel takes over in about a second rather
//   than at the end of the holder's lease. A holder silent but connected is busy, not gone
//   (an overloaded machine): its lease decides. A holder that was only cut off from this
//   kernel, not from etcd, is fenced by the takeover: its next write fails, it ends;
// - a holder never heard (its broker unreachable from here, or still starting) is waited
//   for until its lease runs out.

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
/// question for the `kernel` service every `interval`); `silent` yields once a kernel that
/// answered has then not answered for `window` and its connection is down. Lives on the
/// kernel's loop thread.
final class HolderProbe {
    private var registration: SocketRegistration?
    private var monitor: SocketRegistration?
    private var timer: LoopTimer?
    private var answeredAt: UInt64?
    private var connected = false
    private let window: UInt64
    let silent: AsyncStream<Void>
    private let continuation: AsyncStream<Void>.Continuation
    /// Called once, when the holder first answers.
    var onFirstAnswer: (() -> Void)?

    init(endpoint: String, loop: SocketLoop, security: KernelSecurity?, every interval: Duration, silentAfter window: Duration) throws {
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
        self.window = window.nanoseconds
        (silent, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        do {
            let events = try connectionEvents(of: socket, in: loop.context)
            monitor = loop.register(events) { [weak self] message in
                guard let self, let event = SocketEvent(message) else { return }
                if event.event.contains(.connected) { connected = true }
                if event.event.contains(.disconnected) { connected = false }
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
        if let answeredAt, !connected, monotonicNanoseconds() &- answeredAt > window {
            continuation.yield()
            stop()
            return
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
    /// How often a waiting kernel asks the holder whether it still serves, and how long a
    /// holder that answered may then stay silent before it is taken to be gone.
    static let holderProbeInterval = Duration.milliseconds(200)
    static let holderSilence = Duration.seconds(1)

    /// Connects to the etcd that keeps the state and wins its election: creates the election
    /// key under a new lease of its own, once no other kernel holds it (waiting, while one
    /// does, for its key to go, or for the holder to fall silent). The election's revision is
    /// where reading the state must reach (the link's ``EtcdStateLink/lastRevision``).
    func connectState(_ settings: EtcdStateSettings) async throws -> EtcdStateLink {
        let client = try EtcdClient(settings: EtcdClient.Settings(settings))
        do {
            let prefix = Array(settings.prefix.utf8), election = EtcdStateLink.electionKey(prefix)
            let mine = ElectionValue(instance: instance, broker: ElectionValue.advertised(configuration.brokerEndpoint))
            while true {
                try Task.checkCancellation()
                let lease = try await client.grantLease(ttl: Int64(settings.leaseSeconds))
                let campaign = try await client.transaction(when: [.absent(election)], then: [.put(key: election, value: mine.bytes, lease: lease.id)],
                                                            else: [.range(key: election)])
                if campaign.succeeded {
                    return EtcdStateLink(client: client, prefix: prefix, lease: lease.id, leaseSeconds: settings.leaseSeconds, elected: campaign.revision)
                }
                try? await client.revoke(lease.id)
                guard let holder = campaign.ranges.first?.keyValues.first else { continue }
                try await waitForElection(client, election, held: holder, from: campaign.revision + 1)
            }
        } catch {
            await client.close()
            throw error
        }
    }

    /// Returns once the election key `holder` is gone: deleted (its kernel stopped, or its
    /// lease ran out), or deleted here after its kernel, heard before, fell silent.
    private func waitForElection(_ client: EtcdClient, _ election: [UInt8], held holder: EtcdKeyValue, from revision: Int64) async throws {
        let value = ElectionValue(decoding: holder.value)
        let electionName = String(decoding: election, as: UTF8.self)
        logger.notice("another kernel writes this state: waiting for it to go (it stops, its lease runs out, or it stops answering at its broker)",
                      metadata: ["election": "\(electionName)", "holder": "\(value.instance)", "broker": "\(value.broker ?? "none named")",
                                 "lease": "\(String(holder.lease, radix: 16))"])
        var probe: HolderProbe?
        if let broker = value.broker {
            do {
                probe = try HolderProbe(endpoint: broker, loop: loop, security: configuration.security, every: Self.holderProbeInterval, silentAfter: Self.holderSilence)
                let logger = self.logger
                probe?.onFirstAnswer = { logger.info("the kernel holding the election answers at its broker", metadata: ["broker": "\(broker)"]) }
            } catch {
                logger.warning("cannot ask the kernel holding the election at its broker: waiting for its lease", metadata: ["broker": "\(broker)", "error": "\(error)"])
            }
        }
        defer { probe?.stop() }
        let silent = probe?.silent
        // The first to say: the key's deletion (false), or the holder's silence (true). A
        // probe that ended without the holder falling silent says nothing (nil).
        let holderFellSilent = try await withThrowingTaskGroup(of: Bool?.self) { group in
            group.addTask {
                for try await update in client.watch(election, from: revision) {
                    if case .events(let events, _) = update, events.contains(where: { $0.kind == .delete }) { return false }
                }
                return false
            }
            if let silent {
                group.addTask {
                    for await _ in silent { return true }
                    return nil
                }
            }
            defer { group.cancelAll() }
            while let said = try await group.next() {
                if let said { return said }
            }
            return false
        }
        guard holderFellSilent else { return }
        // Deleted only if it is still the silent holder's: one that started meanwhile keeps it.
        let taken = try await client.transaction(when: [EtcdCompare(key: election, .equal, .createRevision(holder.createRevision))],
                                                 then: [.delete(key: election)], else: [])
        if taken.succeeded {
            logger.warning("the kernel holding the election stopped answering at its broker: taking its election rather than wait for its lease",
                           metadata: ["holder": "\(value.instance)", "broker": "\(value.broker ?? "")", "silent for": "\(Self.holderSilence.formatted)"])
        }
    }
}
