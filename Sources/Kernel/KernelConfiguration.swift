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
    /// The largest inbound message on any kernel socket; a peer sending more is disconnected.
    public var maxMessageSize = 64 * 1024 * 1024
    /// Services whose requests are not re-sent to another worker when theirs dies; they
    /// get -32006 (outcome unknown) instead.
    public var nonRetriableServices: Set<String> = []
    /// Key prefixes the CHP collector accepts KVSET for.
    public var collectorWritablePrefixes = ["/client/"]
    /// Interval of CHP HUGZ when nothing else is published.
    public var hugzInterval: Duration = .seconds(1)

    public init() {}

    /// Milliseconds of silence after which a worker is dead.
    var workerExpiry: Duration { heartbeatInterval * heartbeatLiveness }
}
