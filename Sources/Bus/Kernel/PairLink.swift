import BusProtocol
import Contracts
import Foundation
import Logging
import ZeroMQ

/// How a kernel takes part in a primary/backup pair (the Guide's Binary Star, chapter 4).
public struct PairConfiguration: Sendable, Equatable {
    public enum Role: String, Sendable, CaseIterable {
        case primary, backup
    }
    public var role: Role
    /// Where this kernel listens for its peer (a ROUTER; CURVE with the kernel's own key).
    public var listen: String
    /// The peer kernel's `listen` endpoint.
    public var peer: String
    /// How often the two kernels tell each other their state; the peer is gone after two
    /// intervals without word.
    public var heartbeatInterval: Duration
    /// The peer's broker endpoint, the clients' way to it: when the link between the kernels
    /// is down, a kernel asks there whether its peer still serves before it takes over (nil:
    /// it takes over on the link's silence alone, Binary Star's rule).
    public var peerBroker: String?

    public init(role: Role, listen: String, peer: String, heartbeatInterval: Duration = .milliseconds(200), peerBroker: String? = nil) {
        self.role = role
        self.listen = listen
        self.peer = peer
        self.heartbeatInterval = heartbeatInterval
        self.peerBroker = peerBroker
    }

    var peerExpiry: Duration { heartbeatInterval * 2 }
    /// How long a freshly started primary waits to hear its peer before it serves alone: a
    /// peer that is active (it took over while this one was down) must be heard first.
    var startupWait: Duration { heartbeatInterval * 5 }
}

/// Where a kernel of a pair stands (Binary Star's states).
public enum PairState: String, Sendable {
    /// Started as primary, not yet paired: serves once its peer is heard as a backup, or
    /// once no peer answered for a while and a client asks.
    case primary
    /// Started as backup, not yet paired: serves nothing until it has heard its peer.
    case backup
    /// Serves clients; replicates its state to the peer before it publishes or acknowledges.
    case active
    /// Follows the active peer's state; takes over when the peer is gone and clients come.
    case passive
}

/// The link between the two kernels of a pair: each kernel sends on a DEALER connected to
/// its peer's ROUTER and reads what the peer sends on its own ROUTER. Frames
/// (docs/PROTOCOL.md, "Kernel pair"): `SBPAIR01`, a command, then its fields.
enum PairWire {
    static let header = Frame("SBPAIR01")
    /// `STATE json`: the sender's state, instance, role and sequence (the heartbeat).
    static let state = Frame("STATE")
    /// `SNAPSHOT? instance [TOLD]`: the passive asks for the whole state (it is new, or it
    /// found a gap). With `TOLD` it counts its copy whole only once the active one's heartbeat
    /// says it waits for it (`waitsForPeer`), so changes need not wait while the copy travels;
    /// without (a kernel from before), the active one holds changes from the moment it sends
    /// the state, because such a passive counts its copy whole as soon as the state is in.
    static let snapshotRequest = Frame("SNAPSHOT?")
    static let told = Frame("TOLD")
    /// `KV key sequence uuid properties value owner expires`: one entry of a snapshot.
    static let entry = Frame("KV")
    /// `SNAPSHOT sequence count`: the snapshot is complete as of `sequence`, `count` entries.
    static let snapshotDone = Frame("SNAPSHOT")
    /// `UPDATE key sequence uuid properties value owner expires`: one change, in order.
    static let update = Frame("UPDATE")
    /// `ACK sequence`: the passive holds every change up to `sequence`.
    static let ack = Frame("ACK")

    static func sequence(_ frame: Frame) -> UInt64? {
        frame.withUnsafeBytes { raw in
            raw.count == 8 ? raw.reduce(0) { $0 << 8 | UInt64($1) } : nil
        }
    }
}

/// A change as it travels to the peer: the CHP frames plus what only the kernel keeps.
struct ReplicatedEntry: Equatable {
    var key: Frame
    var sequence: UInt64
    var uuid: Frame
    var properties: Frame
    var value: Frame
    var quotaOwner: String?
    /// Nanoseconds left until it expires (nil: never).
    var expiresIn: UInt64?

    func frames(_ command: Frame) -> Message {
        [PairWire.header, command, key, CHP.sequenceFrame(sequence), uuid, properties, value,
         Frame(quotaOwner ?? ""), expiresIn.map(CHP.sequenceFrame) ?? Frame()]
    }

    init(key: Frame, sequence: UInt64, uuid: Frame, properties: Frame, value: Frame, quotaOwner: String?, expiresIn: UInt64?) {
        (self.key, self.sequence, self.uuid, self.properties, self.value) = (key, sequence, uuid, properties, value)
        (self.quotaOwner, self.expiresIn) = (quotaOwner, expiresIn)
    }

    /// `key` deleted, as change `sequence`.
    static func deletion(of key: Frame, sequence: UInt64) -> ReplicatedEntry {
        ReplicatedEntry(key: key, sequence: sequence, uuid: Frame(), properties: Frame(), value: Frame(), quotaOwner: nil, expiresIn: nil)
    }

    /// From the frames after the command (`fields` starts at the key); nil when malformed,
    /// an expiry over ``TimeToLive/maxSeconds`` included (no state has one).
    init?(_ fields: ArraySlice<Frame>) {
        guard fields.count == 7, let sequence = PairWire.sequence(fields[fields.startIndex + 1]) else { return nil }
        let f = Array(fields)
        var expiresIn: UInt64?
        if !f[6].isEmpty {
            guard let nanoseconds = PairWire.sequence(f[6]), TimeToLive(nanoseconds: nanoseconds) != nil else { return nil }
            expiresIn = nanoseconds
        }
        self.init(key: f[0], sequence: sequence, uuid: f[2], properties: f[3], value: f[4],
                  quotaOwner: f[5].isEmpty ? nil : f[5].string, expiresIn: expiresIn)
    }
}

/// One kernel's side of the pair: Binary Star's state machine, the heartbeats, and the
/// replication of the CHP state (same sequence numbers on both kernels).
///
/// A value owned by the state server it replicates (``StateServer/pair``), on the kernel's
/// loop. It never calls back into that server: each method takes what it needs of the
/// state (its `sequence`) and says what to do to it (``Replication``); what goes to the peer
/// collects in ``outbox`` and ``probes``, and what the kernel acts on in ``takeEvents()``,
/// taken after each call. The rules:
/// - a kernel becomes active only when clients come to it and its peer has been silent for
///   two heartbeats (a cut between the two kernels alone, with clients still reaching the
///   active one, never makes two actives), or when it hears its peer restarting;
/// - the active one sends each change to the passive and publishes it, or acknowledges the
///   write, only once the passive has it: whatever anyone saw from the active, the passive
///   holds, so subscribers and writers move across with no gap and nothing lost;
/// - a restarted kernel that hears an active peer becomes passive and copies its state.
struct PairLink {
    let configuration: PairConfiguration
    let logger: Logger
    let instance: String
    private(set) var state: PairState
    /// When the kernel entered ``state``.
    private(set) var since = Date()
    /// When this kernel last became active (on its clock), told to the peer as a duration so
    /// two actives can tell which one served first.
    private var activeSince: UInt64?
    /// The peer as last heard: its state and instance, and when it counts as gone.
    private(set) var peerState: PairState?
    private(set) var peerInstance: String?
    private var peerExpiry: UInt64
    private(set) var lastHeard: Date?
    /// The TCP connection the peer's messages come on, named by its last heartbeat: bytes
    /// arriving there while its heartbeats are late are a large message crossing a slow link
    /// ahead of them, not a silent peer (``bytesArrive(now:)``).
    private var peerConnection: TCPConnection?
    /// Said once per wait: the peer's heartbeats are late but its bytes arrive.
    private var saidBytesArrive = false

    /// Passive: holds a complete copy of the active's state (a snapshot and every change since).
    private(set) var synced = false
    /// Passive: whether the active peer waits for this kernel, as its last heartbeat said
    /// (`waitsForPeer`): while it does, the copy holds every change anyone saw from it. nil:
    /// a kernel from before, which does not say, and waits from the state it sent.
    private var activeWaits: Bool? = false
    /// Passive: a snapshot is on its way (asked at this time); changes wait until it is in.
    private var snapshotAskedAt: UInt64?
    private var snapshotEntries: [ReplicatedEntry] = []
    /// Active: the peer holds a complete copy, so changes wait for its acknowledgement.
    private(set) var peerInSync = false
    /// Active: the highest sequence the peer acknowledged.
    private(set) var acknowledged: UInt64 = 0
    /// Active: every change up to this one was sent to the peer, in order.
    private var replicatedUpTo: UInt64 = 0
    /// Active: the sequence of the snapshot sent, until the peer acknowledges it.
    private var snapshotSent: UInt64?
    /// Active: the peer that asked for the state counts its copy whole only once told (`TOLD`).
    private var peerWaitsToBeTold = false
    /// Active: what waits for the peer's acknowledgement, by the sequence it needs.
    private var held: [(sequence: UInt64, item: Held)] = []
    private var heldStart = 0

    /// The clients' way to the peer (a DEALER to its broker): whether its connection got
    /// through a handshake, when the peer last answered a question there, and when the oldest
    /// question since was asked.
    var peerBrokerConnected = false
    private var probeAnsweredAt: UInt64?
    private var probeSentAt: UInt64?

    /// What the link tells the kernel, which acts on it after each call into the link.
    enum Event {
        /// This kernel became the active one: its own keys must say so.
        case becameActive
        /// Something held until the peer acknowledged its change, released now.
        case released(Held)
    }

    /// What waits for the peer's acknowledgement of a change before it goes out.
    enum Held {
        /// A CHP update to publish, with its key (counted under its topics).
        case publish(Message, key: Frame)
        /// The `kernel` service's reply to a client whose write it acknowledges.
        case reply(Broker.Caller, body: [UInt8])
    }

    /// What a message from the peer asks of the state this kernel holds: the state server
    /// does it, then tells the link how it went where the link needs to know.
    enum Replication: Equatable {
        /// Active: the peer asked for the whole state; answer with ``sendSnapshot(_:sequence:)``.
        case sendSnapshot
        /// Passive: replace the whole state with the peer's (as of `sequence`).
        case install([ReplicatedEntry], sequence: UInt64)
        /// Passive: apply the peer's next change; tell ``applied(_:follows:sequence:)`` whether
        /// it followed the last one.
        case apply(ReplicatedEntry)
    }

    /// Messages to the peer (a DEALER, dropped while there is no connection), and
    /// questions for the peer's broker over the clients' path (8/MMI): taken after each call.
    var outbox = Outbox()
    var probes = Outbox()
    private var events: [Event] = []
    private let clock: any NanosecondClock
    /// Said once per loss of the peer: this kernel's copy is incomplete, so it cannot take over.
    private var saidIncomplete = false

    init(configuration: PairConfiguration, instance: String, clock: any NanosecondClock, logger: Logger) {
        self.configuration = configuration
        self.instance = instance
        self.clock = clock
        self.logger = logger
        state = configuration.role == .primary ? .primary : .backup
        peerExpiry = clock.now + configuration.startupWait.nanoseconds
    }

    /// The events since the last call, for the kernel to act on.
    mutating func takeEvents() -> [Event] {
        // Moved out, not copied and emptied: emptying a shared buffer while keeping its
        // room would allocate new room at every call.
        var taken: [Event] = []
        swap(&taken, &events)
        return taken
    }

    var hasEvents: Bool { !events.isEmpty }

    private mutating func send(_ message: Message) { outbox.send(message) }

    var isActive: Bool { state == .active }
    /// Whether this kernel's state is complete: the active one's, or a passive's copy (it
    /// answers subscribers' snapshots).
    var holdsState: Bool { state == .active || state == .passive && synced }
    /// Whether this kernel may serve as the active one: it is, or it is a passive whose copy
    /// holds every change anyone saw from the active one (it waits for this kernel).
    var holdsAllPublished: Bool { state == .active || state == .passive && synced && activeWaits != false }
    private var peerAlive: Bool { lastHeard != nil && clock.now < peerExpiry }
    /// Active: changes wait for the peer's acknowledgement (it holds the whole state, or is
    /// being sent it and counts it whole once it is in).
    private var peerWaitedFor: Bool { peerInSync || snapshotSent != nil && !peerWaitsToBeTold }

    // MARK: Binary Star

    /// A client's request arrived: whether this kernel serves it (possibly by taking over
    /// now). `sequence`: the last change of the state this kernel holds.
    mutating func admitsClient(now: UInt64, sequence: UInt64) -> Bool {
        bytesArrive(now: now)
        switch state {
        case .active:
            return true
        case .primary where now >= peerExpiry:
            guard peerServes(now: now) == .gone else { return false }
            become(.active, "no peer answered within \(configuration.startupWait.formatted) and clients came: serving alone", sequence: sequence)
            return true
        case .passive where now >= peerExpiry:
            guard holdsAllPublished else {
                if !saidIncomplete {
                    saidIncomplete = true
                    let why = synced ? "the peer was not waiting for this kernel's copy, which may lack changes it published"
                                     : "this kernel's copy of its state is incomplete (a copy crossing a slow link holds the peer's heartbeats behind it)"
                    logger.error("the active peer is silent and \(why): not taking over", metadata: ["peer": "\(configuration.peer)"])
                }
                return false
            }
            guard peerServes(now: now) == .gone else { return false }
            become(.active, "the active peer is silent and clients came: failing over", sequence: sequence)
            return true
        case .primary, .backup, .passive:
            return false
        }
    }

    /// Whether the peer, silent on the link between the kernels, still serves clients.
    enum PeerService: Equatable {
        /// It answers at its broker: only the link between the kernels is down.
        case answers
        /// A question is on its way.
        case checking
        /// Its broker is unreachable or does not answer: it is gone.
        case gone
    }

    /// What the clients' way to the peer says (asked again each heartbeat while the link is
    /// silent; asked now if it never was).
    mutating func peerServes(now: UInt64) -> PeerService {
        guard configuration.peerBroker != nil, peerBrokerConnected else { return .gone }
        let window = configuration.peerExpiry.nanoseconds
        if let answered = probeAnsweredAt, now &- answered < window { return .answers }
        if probeSentAt == nil { probe(now: now) }
        if let sent = probeSentAt, now &- sent < window, questionOutstanding { return .checking }
        return .gone
    }

    /// A question was asked after the last answer.
    private var questionOutstanding: Bool {
        guard let sent = probeSentAt else { return false }
        return sent > probeAnsweredAt ?? 0
    }

    /// Asks the peer's broker whether it serves. The wait for an answer runs from the oldest
    /// question still unanswered: asking again each heartbeat must not restart it, or a broker
    /// that greets but never answers would be waited for forever.
    private mutating func probe(now: UInt64) {
        if !questionOutstanding { probeSentAt = now }
        probes.send([Frame(), Frame(MDP.clientHeader), Frame(MMI.serviceQuery), Frame(KernelAPI.service)])
    }

    /// The peer's broker answered the question.
    mutating func probeAnswered(now: UInt64) {
        probeAnsweredAt = now
    }

    /// Why a client was refused, for its error message.
    mutating func refusal() -> String {
        switch state {
        case .backup: "this kernel is the backup of a pair and has not heard its primary yet"
        case .primary: "this kernel is starting as the primary of a pair and waits to hear its peer"
        case .passive where !holdsAllPublished && !peerAlive: "this kernel is the passive one of its pair, its peer is gone and its copy of the state may lack changes the peer published"
        case .passive where !peerAlive && peerServes(now: clock.now) == .answers:
            "the link between the kernels of the pair is down, but the active one still answers clients at \(configuration.peerBroker ?? "its broker"): this passive one does not take over (that would make two active kernels)"
        case .passive where !peerAlive: "this kernel is the passive one of its pair; its peer is silent and it is checking whether the peer still serves"
        case .passive: "this kernel is the passive one of its pair; its peer is active"
        case .active: "this kernel is active"
        }
    }

    private mutating func peerSays(_ peer: PairState, instance: String, activeFor peerActiveFor: UInt64?, now: UInt64, sequence: UInt64) {
        peerExpiry = now + configuration.peerExpiry.nanoseconds
        lastHeard = Date()
        saidBytesArrive = false
        if heard(instance: instance) { peerLeftSync() }
        peerState = peer
        switch (state, peer) {
        case (.primary, .backup):
            become(.active, "paired with the backup", sequence: sequence)
        case (.primary, .active), (.backup, .active):
            become(.passive, "the peer is active: copying its state", sequence: sequence)
        case (.passive, .primary), (.passive, .backup):
            // The peer restarted and holds nothing: this kernel's copy is the state.
            become(.active, "the peer restarted: serving, and it will copy this kernel's state", sequence: sequence)
        case (.active, .active):
            // Two actives: after a partition healed, or a restarted kernel that heard neither
            // its peer nor the peer's broker in time (an overloaded machine) and served alone.
            // The one that became active later gives way: the other has served longer, and a
            // restarted kernel holds nothing, so giving it the state would lose all of it.
            // Too close to tell (or a peer that does not say): the backup gives way.
            let mine = activeSince.map { now &- $0 } ?? 0
            let margin = UInt64(configuration.heartbeatInterval.nanoseconds) * 2
            let givesWay: Bool
            if let theirs = peerActiveFor, (theirs > mine ? theirs - mine : mine - theirs) > margin {
                givesWay = theirs > mine
            } else {
                givesWay = configuration.role == .backup
            }
            if givesWay {
                logger.error("both kernels of the pair were active: this one, active for \(Duration.nanoseconds(mine).formatted), gives way to its peer, active for \(peerActiveFor.map { Duration.nanoseconds($0).formatted } ?? "an unknown time"), and copies its state; writes this one took meanwhile are lost")
                become(.passive, "giving way to the peer, which was active first", sequence: sequence)
            }
        case (.passive, .passive) where configuration.role == .primary && synced:
            become(.active, "both kernels were passive: the primary serves", sequence: sequence)
        default:
            break
        }
        if state == .passive, !synced, snapshotAskedAt.map({ now > $0 && now - $0 > configuration.peerExpiry.nanoseconds * 5 }) ?? true {
            askForSnapshot(now: now)
        }
    }

    /// Notes the peer's instance; true when it is a new one (the peer restarted and holds nothing of this kernel's).
    private mutating func heard(instance: String) -> Bool {
        guard peerInstance != instance else { return false }
        if peerInstance != nil { logger.info("the peer kernel restarted", metadata: ["peer": "\(configuration.peer)"]) }
        peerInstance = instance
        return true
    }

    private mutating func become(_ new: PairState, _ reason: String, sequence: UInt64) {
        guard new != state else { return }
        let old = state
        state = new
        since = Date()
        logger.notice("kernel pair: \(old.rawValue) -> \(new.rawValue)", metadata: ["reason": "\(reason)", "peer": "\(configuration.peer)"])
        switch new {
        case .active:
            activeSince = clock.now
            snapshotAskedAt = nil
            snapshotEntries = []
            acknowledged = sequence
            replicatedUpTo = acknowledged
            snapshotSent = nil
        case .passive:
            synced = false
            activeWaits = false
            peerLeftSync()
            askForSnapshot(now: clock.now)
        case .primary, .backup:
            break
        }
        sendState(sequence: sequence)
        if new == .active { events.append(.becameActive) }
    }

    // MARK: Heartbeats

    mutating func tick(now: UInt64, sequence: UInt64) {
        sendState(sequence: sequence)
        bytesArrive(now: now)
        // While the link is silent, keep asking the clients' way whether the peer still serves.
        if state != .active, configuration.peerBroker != nil, lastHeard == nil || now >= peerExpiry, peerBrokerConnected {
            probe(now: now)
        }
        if state == .active, peerWaitedFor, now >= peerExpiry {
            logger.warning("the passive peer is silent: serving alone until it is back", metadata: ["peer": "\(configuration.peer)"])
            peerLeftSync()
        }
    }

    /// Where silence is judged (each heartbeat, and a client come to a kernel that is not
    /// active): a peer whose heartbeats are late but whose bytes arrived on its connection
    /// within the expiry is heard until the next heartbeat. Silent is what sends nothing: a
    /// change or a copy of the state crossing a slow link holds the heartbeats sent after it,
    /// and a peer taken for silent then would be served without (the active one) or taken
    /// over from while it serves (the passive one, asked by a client, with no answer from the
    /// peer's broker over that same link). A process stopped or gone sends nothing (only
    /// what its machine's TCP still held for the link, at the link's rate).
    private mutating func bytesArrive(now: UInt64) {
        guard now >= peerExpiry, lastHeard != nil, let quiet = peerConnection?.sinceDataReceived,
              quiet < configuration.peerExpiry else { return }
        peerExpiry = now + configuration.heartbeatInterval.nanoseconds
        if !saidBytesArrive {
            saidBytesArrive = true
            logger.info("the peer's heartbeats are late but its bytes arrive (a large message crossing the link ahead of them): not taken for silent",
                        metadata: ["peer": "\(configuration.peer)"])
        }
    }

    /// Active: a passive peer that acknowledged its copy, or that is heard again after a
    /// silence saying it holds one, is waited for when no change was left unsent to it since
    /// the copy (every one went to it in order; it applies them in order and asks for the
    /// whole state at a gap): it holds, or is about to, every change. Told at once (a
    /// heartbeat), it may take over from then on. The second case is why a moment's silence
    /// of the peer costs nothing later: else the active would publish without it for good,
    /// and a failover could lose what it published last. A peer that missed a change copies
    /// the state again first.
    private mutating func waitForPeer(sequence: UInt64) {
        guard state == .active, !peerWaitedFor, snapshotSent == nil, peerAlive, replicatedUpTo == sequence else { return }
        peerInSync = true
        logger.info("the passive peer holds every change: each change is replicated before it is published or acknowledged",
                    metadata: ["peer": "\(configuration.peer)"])
        sendState(sequence: sequence)
    }

    /// The peer may miss changes from now on: nothing waits for it any more.
    private mutating func peerLeftSync() {
        peerInSync = false
        snapshotSent = nil
        releaseHeld()
    }

    private mutating func sendState(sequence: UInt64) {
        var body: [String: JSONValue] = ["state": .string(state.rawValue), "role": .string(configuration.role.rawValue),
                                         "instance": .string(instance), "sequence": .int(Int64(clamping: sequence)),
                                         "synced": .bool(state == .active || synced)]
        if state == .active, let activeSince {
            body["activeForMs"] = .int(Int64(clamping: (clock.now &- activeSince) / 1_000_000))
            body["waitsForPeer"] = .bool(peerWaitedFor)
        }
        send([PairWire.header, PairWire.state, Frame(JSONValue.object(body).jsonBytes)])
    }

    // MARK: Messages from the peer

    /// A message on the pair ROUTER: the peer's routing id, then the frames it sent.
    /// `sequence`: the last change of the state this kernel holds; `connection`: the TCP
    /// connection the message came on, asked of a heartbeat. Returns what the message asks of
    /// that state, if anything.
    mutating func received(_ message: Message, now: UInt64, sequence: UInt64, connection: () -> TCPConnection? = { nil }) -> Replication? {
        guard message.count >= 3, message[1] == PairWire.header else { return nil }
        let command = message[2]
        let fields = message.frames[3...]
        if command == PairWire.state {
            guard let body = fields.first.flatMap({ try? JSONValue(parsing: $0.bytes) }),
                  let peer = body["state"]?.stringValue.flatMap(PairState.init(rawValue:)),
                  let instance = body["instance"]?.stringValue else { return nil }
            // Every change the active peer made before this heartbeat came before it on this
            // connection: a passive copy behind its sequence missed some.
            if state == .passive, peer == .active, synced, snapshotAskedAt == nil,
               let peerSequence = body["sequence"]?.intValue, UInt64(clamping: peerSequence) > sequence {
                synced = false
                logger.warning("the active peer is ahead of this kernel's copy: copying its state again",
                               metadata: ["peer sequence": "\(peerSequence)", "held": "\(sequence)"])
            }
            // From the wire: a figure past what nanoseconds hold is held there, not wrapped.
            let activeFor = body["activeForMs"]?.intValue.map { milliseconds in
                let (nanoseconds, overflow) = UInt64(clamping: milliseconds).multipliedReportingOverflow(by: 1_000_000)
                return overflow ? UInt64.max : nanoseconds
            }
            peerConnection = connection()
            peerSays(peer, instance: instance, activeFor: activeFor, now: now, sequence: sequence)
            if peer == .passive, body["synced"]?.boolValue == true { waitForPeer(sequence: sequence) }
            // Every change the active peer published before this heartbeat came before it:
            // while it says it waits for this kernel, the copy holds all it published.
            if state == .passive, peer == .active { activeWaits = body["waitsForPeer"]?.boolValue }
        } else if command == PairWire.snapshotRequest {
            guard state == .active else { return nil }
            // A restarted peer's request can come before its first heartbeat: noted here, that
            // heartbeat is not taken for news of a restart, which would stop the wait for this copy.
            if let instance = fields.first?.string { _ = heard(instance: instance) }
            peerWaitsToBeTold = fields.dropFirst().first == PairWire.told
            return .sendSnapshot
        } else if command == PairWire.ack {
            guard state == .active, let acked = fields.first.flatMap(PairWire.sequence) else { return nil }
            acknowledged = max(acknowledged, acked)
            if let snapshotSent, acked >= snapshotSent {
                self.snapshotSent = nil
                waitForPeer(sequence: sequence)
            }
            releaseHeld(upTo: acknowledged)
        } else if command == PairWire.entry {
            guard state == .passive, snapshotAskedAt != nil, let entry = ReplicatedEntry(fields) else { return nil }
            snapshotEntries.append(entry)
        } else if command == PairWire.snapshotDone {
            guard state == .passive, snapshotAskedAt != nil, fields.count == 2, let snapshotSequence = PairWire.sequence(fields[fields.startIndex]),
                  let count = PairWire.sequence(fields[fields.startIndex + 1]) else { return nil }
            // An entry lost on the way (the link dropped it): ask again rather than hold a hole.
            guard snapshotEntries.count == Int(count) else {
                logger.warning("the active peer's state came incomplete: asking again", metadata: ["entries": "\(snapshotEntries.count) of \(count)"])
                askForSnapshot(now: now)
                return nil
            }
            let entries = snapshotEntries
            snapshotEntries = []
            snapshotAskedAt = nil
            synced = true
            // The active peer published changes while the copy travelled: the copy holds them
            // once a heartbeat says the peer waits for this kernel (they came before it).
            if activeWaits != nil { activeWaits = false }
            saidIncomplete = false
            logger.info("copied the active peer's state", metadata: ["sequence": "\(snapshotSequence)"])
            send([PairWire.header, PairWire.ack, CHP.sequenceFrame(snapshotSequence)])
            return .install(entries, sequence: snapshotSequence)
        } else if command == PairWire.update {
            guard state == .passive, synced, snapshotAskedAt == nil, let entry = ReplicatedEntry(fields) else { return nil }
            return .apply(entry)
        }
        return nil
    }

    /// Passive: the change ``Replication/apply(_:)`` asked for was applied (`follows`), or
    /// did not follow the last one applied and changed nothing; `sequence`: the last change
    /// now held.
    mutating func applied(_ entry: ReplicatedEntry, follows: Bool, sequence: UInt64) {
        if follows {
            send([PairWire.header, PairWire.ack, CHP.sequenceFrame(entry.sequence)])
        } else {
            synced = false
            logger.warning("a change from the active peer did not follow the last one: copying its state again",
                           metadata: ["sequence": "\(entry.sequence)", "held": "\(sequence)"])
            askForSnapshot(now: clock.now)
        }
    }

    /// Active: sends the whole state the peer asked for (``Replication/sendSnapshot``), as
    /// of `sequence`; every later change goes after it, in order, on the same connection.
    mutating func sendSnapshot(_ entries: [ReplicatedEntry], sequence: UInt64) {
        peerLeftSync()
        for entry in entries { send(entry.frames(PairWire.entry)) }
        send([PairWire.header, PairWire.snapshotDone, CHP.sequenceFrame(sequence), CHP.sequenceFrame(UInt64(entries.count))])
        replicatedUpTo = sequence
        snapshotSent = sequence
        logger.info("sent the state to the peer", metadata: ["sequence": "\(sequence)"])
    }

    private mutating func askForSnapshot(now: UInt64) {
        snapshotAskedAt = now
        snapshotEntries = []
        send([PairWire.header, PairWire.snapshotRequest, Frame(instance), PairWire.told])
    }

    // MARK: Replication (active side)

    /// Sends a change to the peer, in order. One the peer cannot get (it is silent) or that
    /// does not follow what it got puts it out of sync: nothing waits for it any more, and
    /// the gap (or the sequence in the next heartbeat) makes it ask for a snapshot.
    ///
    /// A peer being sent the state gets every change after it even while its heartbeats are
    /// late: they can be held behind the copy on a slow link whose one queue also holds this
    /// kernel's acknowledgements of them, and a copy missing the changes made while it
    /// travelled would be asked for again, over that link, without end. (A silent peer is
    /// otherwise sent nothing: a gone one would have changes queued for it until its
    /// connection times out.)
    mutating func replicate(_ entry: ReplicatedEntry) {
        guard state == .active else { return }
        let sent = peerAlive || snapshotSent != nil
        if sent, entry.sequence == replicatedUpTo + 1 {
            replicatedUpTo = entry.sequence
        } else if peerWaitedFor {
            peerLeftSync()
        }
        if sent { send(entry.frames(PairWire.update)) }
    }

    /// Holds `item` until the peer holds every change up to `sequence`, then releases it as
    /// an event; false when it need not wait (the peer already holds them, or no peer in
    /// sync is waited for): the caller sends it now.
    ///
    /// A peer from before `TOLD` that was sent the snapshot is waited for too: it counts
    /// itself whole (and may take over) as soon as the snapshot is in, before its
    /// acknowledgement gets here, so a change published meanwhile without waiting could be
    /// one it never got.
    mutating func hold(_ item: Held, until sequence: UInt64) -> Bool {
        guard peerWaitedFor, sequence > acknowledged else { return false }
        held.append((sequence, item))
        return true
    }

    private mutating func releaseHeld(upTo sequence: UInt64 = .max) {
        while heldStart < held.count, held[heldStart].sequence <= sequence {
            events.append(.released(held[heldStart].item))
            heldStart += 1
        }
        if heldStart == held.count {
            held.removeAll(keepingCapacity: true)
            heldStart = 0
        }
    }

    /// For `ping`, `services.list` and `stats`.
    var status: KernelAPI.PairStatus {
        KernelAPI.PairStatus(role: configuration.role.rawValue, state: state.rawValue, since: ISO8601DateFormatter().string(from: since),
                             synced: holdsAllPublished, peer: .init(endpoint: configuration.peer, state: peerState?.rawValue,
                                         lastHeardSecondsAgo: lastHeard.map { (Date().timeIntervalSince($0) * 1000).rounded() / 1000 }))
    }
}
