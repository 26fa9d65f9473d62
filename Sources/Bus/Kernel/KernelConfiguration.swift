import BusProtocol

/// Everything the kernel needs to start. Defaults follow DESIGN.md and the Guide's ports.
public struct KernelConfiguration: Sendable, Equatable {
    /// The Majordomo broker's ROUTER endpoint (clients and workers connect here).
    public var brokerEndpoint = "tcp://127.0.0.1:5555"
    /// CHP snapshot (ROUTER), publisher (PUB) and collector (SUB) endpoints.
    public var snapshotEndpoint = "tcp://127.0.0.1:5556"
    public var publisherEndpoint = "tcp://127.0.0.1:5557"
    public var collectorEndpoint = "tcp://127.0.0.1:5558"

    /// How often the broker and its workers exchange MDP heartbeats.
    public var heartbeatInterval: Duration = .milliseconds(2_500)
    /// Missed heartbeats after which a worker is considered dead.
    public var heartbeatLiveness = 3
    /// How long a request waits for a worker before it is answered with -32001.
    public var queueTimeout: Duration = .seconds(5)
    /// Requests queued per service before new ones are refused with -32001 at once.
    public var maxQueuedPerService = 100_000
    /// Bytes of request bodies queued for all services together before new requests are
    /// refused with -32001 at once (a flood of big requests for a missing service).
    public var maxQueuedBytes = 256 * 1024 * 1024
    /// Distinct service names the broker keeps track of; a request for yet another name
    /// with no worker is refused with -32001 at once. A name that never had a worker is
    /// forgotten when its queue empties.
    public var maxServices = 10_000
    /// Messages the broker queues for one peer that does not read (a client that never
    /// takes its replies). Beyond it, replies to that client are dropped and counted, and
    /// a worker is dropped, so a stuck peer neither grows the kernel nor stalls others.
    public var peerBacklog = 50_000
    /// Updates the publisher queues for one subscriber that does not read; beyond it the
    /// subscriber misses updates (and resynchronises when it notices).
    public var subscriberBacklog = 100_000
    /// How long a subscriber may leave its connection undrained (its TCP buffers and the
    /// publisher's queue full) before the kernel drops it: ZMTP heartbeats on the publisher,
    /// which such a subscriber does not answer. Dropping it frees everything queued for it;
    /// it reconnects and resyncs. With the backlog in messages and `state_max_value_bytes`,
    /// this is what bounds what one stuck subscriber holds: libzmq bounds a subscriber's
    /// queue by messages only, fixed when it connects (a bound changed on the fly stalls
    /// subscribers that read, whose queue's writer learns of reads only every half queue).
    public var subscriberTimeout: Duration = .seconds(30)
    /// How long a peer of the broker (a client, a worker), or the pair's peer kernel on the
    /// link, may acknowledge nothing before the kernel drops its connection
    /// (``ZMQSocket/dropSilentPeers(after:)``): its machine is gone, its link is cut, or it
    /// leaves its connection undrained. What it held goes with it (a stream it waited on is
    /// ended, its worker told to stop), instead of staying held until TCP's retransmissions
    /// give up, a quarter of an hour later.
    public var peerTimeout: Duration = .seconds(30)
    /// The largest inbound message on any kernel socket; a peer sending more is disconnected.
    public var maxMessageSize = MDP.defaultMaxMessageSize
    /// The share of a service's places (its workers' windows together) one client may hold
    /// at once, in percent (at least one place): its further requests wait while others are
    /// served, so one client cannot take every place with slow requests.
    public var clientSharePercent = 90
    /// How many workers a request is handed to, at most, when each dies with it in flight:
    /// 2 re-sends it once. After that it is answered -32012 (it may be what kills them), so
    /// one request cannot take down every worker of a service in turn.
    public var maxDeliveries = 2
    /// Services whose requests are not re-sent to another worker when theirs dies; they
    /// get -32006 (outcome unknown) instead.
    public var nonRetriableServices: Set<String> = []
    /// Key prefixes any client may write (through the collector or `state.set`).
    public var collectorWritablePrefixes = ["/client/"]
    /// State prefixes owned by a service other than the one of the same name (`/store/` is
    /// the store's already): with CURVE on only that service's key may write under them.
    public var statePrefixOwners = ["/catalog/": "fetcher"]
    /// The whole state: keys, and bytes of keys and values, beyond which writes are refused
    /// (-32010 from `state.set`, dropped and counted from the collector).
    public var stateMaxKeys = 1_000_000
    public var stateMaxBytes = 1024 * 1024 * 1024
    /// What one client key (without CURVE: all clients together) may hold under the
    /// writable prefixes.
    public var clientStateMaxKeys = 10_000
    public var clientStateMaxBytes = 16 * 1024 * 1024
    /// The largest key and value one state entry may hold (1 MiB): state is what every
    /// subscriber receives and every snapshot carries, so a bigger value belongs in a
    /// service (the store) and its key in state. It also keeps a stuck subscriber's backlog
    /// (`subscriber_backlog` updates of it at most) within reason.
    public var stateMaxValueBytes = 1024 * 1024
    /// The state's recent changes kept: what a subscriber resumes from (`ICANHAZ?` with the
    /// sequence it stopped at) and what `state.history` reads, at most this many changes and
    /// bytes (each change's key, value, UUID and record); the oldest go first.
    public var stateHistoryChanges = 10_000
    public var stateHistoryBytes = 8 * 1024 * 1024
    /// Revisions `state.history` gives of one key, at most.
    public var stateHistoryPerKey = 16
    /// Requests one JSON-RPC batch may carry, at the kernel and at every service: a batch is
    /// answered in one message, so its size is what bounds a reply's.
    public var maxBatchItems = 100
    /// Interval of CHP HUGZ when nothing else is published.
    public var hugzInterval: Duration = .seconds(1)
    /// CURVE on every endpoint with the kernel's allow-lists; nil: plain text (NULL mechanism).
    public var security: KernelSecurity?
    /// When set, every socket also binds `inproc://NAME-broker` (`-snapshot`, `-publisher`,
    /// `-collector`), for services in the same process (`switchboard up --single-process`).
    public var inprocName: String?
    /// One of a primary/backup pair (nil: a kernel alone).
    public var pair: PairConfiguration?
    /// Where the state is kept: nil, in this kernel's memory (copied to its pair's peer);
    /// else in etcd, which keeps every acknowledged write, and which every kernel pointed at
    /// it serves from a copy fed by one watch (`kernel.state.backend: etcd`).
    public var stateEtcd: EtcdStateSettings?
    /// The cell this kernel is of, when the bus is several cells joined through etcd
    /// (`kernel.cell`, docs/CELLS.md); nil: this kernel's workers are the whole bus.
    public var cell: CellConfiguration?

    public init() {}

    /// Milliseconds of silence after which a worker is dead.
    var workerExpiry: Duration { heartbeatInterval * heartbeatLiveness }

    /// How often the links between cells' kernels heartbeat: the workers' interval, at most
    /// half a second. A cell that falls silent is most often a cut link, not a busy worker:
    /// found within `heartbeat_liveness` of these, well inside the queue timeout, the requests
    /// it held still get their `-32001` within that timeout rather than after the clients
    /// gave up (docs/CELLS.md). Kernels of one bus take the same heartbeat and liveness.
    var cellHeartbeatInterval: Duration { min(heartbeatInterval, Self.mostCellHeartbeatInterval) }
    static let mostCellHeartbeatInterval: Duration = .milliseconds(500)
    /// Silence after which another cell's kernel is taken for gone, on either side of a link.
    var cellExpiry: Duration { cellHeartbeatInterval * heartbeatLiveness }

    /// Takes from `new` what a serving kernel can change (a reload, SIGHUP): the limits and
    /// the keys it admits. Endpoints, heartbeats, socket limits and its own key pair stay.
    mutating func takeLiveSettings(from new: KernelConfiguration) {
        queueTimeout = new.queueTimeout
        maxQueuedPerService = new.maxQueuedPerService
        maxQueuedBytes = new.maxQueuedBytes
        maxServices = new.maxServices
        clientSharePercent = new.clientSharePercent
        maxDeliveries = new.maxDeliveries
        nonRetriableServices = new.nonRetriableServices
        stateMaxKeys = new.stateMaxKeys
        stateMaxBytes = new.stateMaxBytes
        clientStateMaxKeys = new.clientStateMaxKeys
        clientStateMaxBytes = new.clientStateMaxBytes
        stateMaxValueBytes = new.stateMaxValueBytes
        stateHistoryChanges = new.stateHistoryChanges
        stateHistoryBytes = new.stateHistoryBytes
        stateHistoryPerKey = new.stateHistoryPerKey
        if var security, let given = new.security {
            security.admit(given)
            self.security = security
        }
    }
}

/// The etcd cluster that keeps the state (`kernel.state.etcd`), as etcd's clients name it.
public struct EtcdStateSettings: Sendable, Equatable {
    /// Each member's client URL, `http://HOST:PORT` or `https://HOST:PORT`.
    public var endpoints: [String]
    /// Where under etcd's keys the state lives: a key `/a` is kept at `PREFIX/a`, so several
    /// buses (or other users) can share one cluster.
    public var prefix = Self.defaultPrefix
    public static let defaultPrefix = "/switchboard/state"
    public var username: String?
    public var password: String?
    /// PEM files for `https://` members: their CA, and this kernel's certificate and key
    /// when they ask clients for one.
    public var caFile: String?
    public var certificateFile: String?
    public var keyFile: String?
    /// The time to live of the kernel's lease, which holds its election and its own keys: a
    /// kernel killed or cut off from etcd holds the election this long, so another kernel
    /// waiting for it takes over after it. Shorter fails over sooner; a kernel that cannot
    /// renew it for that long (etcd choosing a leader, a loaded machine) loses the election.
    public var leaseSeconds = Self.defaultLeaseSeconds
    public static let defaultLeaseSeconds = 10
    /// etcd grants no shorter lease (it raises a shorter one to about this).
    public static let leaseSecondsRange = 2...3_600

    public init(endpoints: [String]) { self.endpoints = endpoints }
}

/// A cell of a bus made of several (`kernel.cell`): its name, where the other cells' kernels
/// reach this one's broker, and the etcd whose directory joins them (docs/CELLS.md).
public struct CellConfiguration: Sendable, Equatable {
    /// Unique on the bus (``MDP/isValidCellName(_:)``).
    public var name: String
    /// The broker endpoint the other cells' kernels connect to; nil: the one the kernel
    /// bound, which must then name a host (not `*` or `0.0.0.0`).
    public var advertise: String?
    /// Requests this cell takes from another cell at once, per service.
    public var window = 64
    /// The directory's etcd: its `prefix` is where each cell's record is kept
    /// (`PREFIX/NAME`), under a lease of `leaseSeconds` that ends with the kernel.
    public var etcd: EtcdStateSettings

    public static let defaultPrefix = "/switchboard/cells"

    public init(name: String, etcd: EtcdStateSettings) {
        self.name = name
        self.etcd = etcd
    }
}

/// CURVE encryption and authentication on every kernel endpoint. The kernel's ZAP handler
/// admits a peer only if its public key is on one of the lists; only worker and service
/// keys may register a service (they may also send requests: services call each other).
public struct KernelSecurity: Sendable, Equatable {
    /// The kernel's secret key (Z85); clients need its public half.
    public var secretKey: String
    /// Public keys (Z85) of clients: requests, subscriptions, state under the writable prefixes.
    public var clientKeys: Set<String>
    /// Public keys (Z85) of hosts that may register any service and write any state but the kernel's.
    public var workerKeys: Set<String>
    /// Public keys (Z85) of one service each (key -> service name): they may register that
    /// service only and write only its state prefixes.
    public var serviceKeys: [String: String]
    /// Public keys (Z85) of operators: clients that may also ask what ``OperatorsOnly``
    /// lists (draining workers, restarts, reloads).
    public var operatorKeys: Set<String>
    /// Keys this kernel admitted until a reload took them out. A connection made with one
    /// before goes on (CURVE checks a key at the handshake only), so what it sends is refused.
    public internal(set) var removedKeys: Set<String> = []

    public init(secretKey: String, clientKeys: Set<String> = [], workerKeys: Set<String> = [], serviceKeys: [String: String] = [:],
                operatorKeys: Set<String> = []) {
        self.secretKey = secretKey
        self.clientKeys = clientKeys
        self.workerKeys = workerKeys
        self.serviceKeys = serviceKeys
        self.operatorKeys = operatorKeys
    }

    /// Takes the keys `given` admits; those admitted before and not now are removed from then on.
    mutating func admit(_ given: KernelSecurity) {
        let before = admittedKeys, now = given.admittedKeys
        removedKeys = removedKeys.union(before.subtracting(now)).subtracting(now)
        clientKeys = given.clientKeys
        workerKeys = given.workerKeys
        serviceKeys = given.serviceKeys
        operatorKeys = given.operatorKeys
    }

    /// Every key admitted, whatever it may do.
    private var admittedKeys: Set<String> { clientKeys.union(workerKeys).union(operatorKeys).union(serviceKeys.keys) }

    /// Whether `userID` (a ZAP user id) carries a key a reload took out: a lookup only once
    /// one has been.
    func wasRemoved(_ userID: String?) -> Bool {
        guard !removedKeys.isEmpty, let userID else { return false }
        return removedKeys.contains(Peer.key(in: userID))
    }
}
