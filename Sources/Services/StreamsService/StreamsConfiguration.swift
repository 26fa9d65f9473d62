public import Storage
public import SwitchboardConfig

/// Where the streams service keeps its database, how big it may grow, and the defaults a
/// stream or consumer takes for what its creator leaves out.
public struct StreamsConfiguration: Sendable, Equatable {
    /// The SQLite file; its folder is created when missing.
    public var path = "data/streams.sqlite"
    /// A PostgreSQL database instead of the SQLite file: what several streams processes, on
    /// several machines, share (its tables in the schema `switchboard_streams`).
    public var postgres: PostgresSettings?
    /// The largest the database may grow, in bytes (nil: no limit). Beyond it, publishes fail
    /// with "full", as they would on a full disk.
    public var maxSizeBytes: Int?
    /// How long each write's result is kept with it, for a request sent again.
    public var replyWindow: Duration = .seconds(600)
    /// The largest message's data (its JSON text), in bytes.
    public var maxMessageBytes = 1_048_576
    /// Streams the service holds at most (their dead-letter streams not counted), and
    /// consumers per stream: each stream may hold up to its `maxBytes`, so their number is
    /// what bounds the file when no `maxSizeBytes` does.
    public var maxStreams = 1_000
    public var maxConsumers = 100
    /// What one client key may add (with CURVE on; operators' and services' keys are not
    /// bound): streams, the bytes their `maxBytes` come to, and consumers over all streams.
    public var clientMaxStreams = 100
    public var clientMaxBytes = 16 << 30
    public var clientMaxConsumers = 1_000
    var clientQuota: StreamsDatabase.ClientQuota {
        StreamsDatabase.ClientQuota(streams: clientMaxStreams, bytes: clientMaxBytes, consumers: clientMaxConsumers)
    }
    /// A stream's limits when its creator gives none: the oldest go past them.
    public var defaultMaxMessages = 1_000_000
    public var defaultMaxBytes = 1 << 30
    /// Seconds a message id is remembered when the stream says nothing.
    public var defaultDuplicateWindow = 120.0
    /// A consumer's ack deadline and deliveries when its creator says nothing.
    public var defaultAckWait = 30.0
    public var defaultMaxDeliver = 5
    /// The most messages a consumer's readers may have pending at once: a consumer's own
    /// `maxAckPending` may be lower, and one without has this. It bounds what a reader that
    /// never acknowledges makes the service keep (a row for each message pending).
    public var maxAckPending = 10_000
    /// Messages (and as many of each of their other rows) one transaction removes of what a
    /// purge, a lowered limit, a deleted stream or the age removes: few enough that the other
    /// writes waiting for it barely notice, however many go.
    public var removedPerTransaction = 10_000
    /// The most reads that wait at once in this process (fetches with a `wait` while nothing
    /// is ready, `consumer.next`): each holds one of the places its host offers the kernel
    /// for as long as it waits, and with every place so held no publish or acknowledgement
    /// would reach the service. Past it, another read that would wait is refused (`-32001`).
    /// Nil: no bound (a host whose places the caller keeps free otherwise).
    public var mostWaitingReads: Int?
    /// Streams the service makes at its start (when missing) to capture the kernel's state:
    /// each name with the key prefixes it keeps every change of.
    public var capture: [String: [String]] = [:]

    /// ``mostWaitingReads`` for a host of `connections` each holding `window` requests: a
    /// quarter of its places, at least one, stay for publishes, acknowledgements and the
    /// rest. The counts come from the command line or the file: their product saturates.
    public static func mostWaitingReads(connections: Int, window: Int) -> Int {
        let (product, overflow) = connections.multipliedReportingOverflow(by: window)
        let places = overflow ? Int.max : product
        return max(1, places - max(1, places / 4))
    }

    public init(path: String = "data/streams.sqlite", maxSizeBytes: Int? = nil, replyWindow: Duration = .seconds(600), postgres: PostgresSettings? = nil) {
        (self.path, self.maxSizeBytes, self.replyWindow, self.postgres) = (path, maxSizeBytes, replyWindow, postgres)
    }
}

/// `streams:` as the file gives it; what it leaves out keeps the service's default.
public struct StreamsSettings: Sendable, Equatable {
    public var path: String?
    public var maxSizeBytes: Int?
    public var rememberSeconds: Int?
    public var maxMessageBytes: Int?
    public var maxStreams: Int?
    public var maxConsumers: Int?
    public var clientMaxStreams: Int?
    public var clientMaxBytes: Int?
    public var clientMaxConsumers: Int?
    public var maxAckPending: Int?
    /// `backend: postgres` (and how to reach it) instead of the SQLite file.
    public var postgres: PostgresSection?
    /// `capture:`, stream names with the state's key prefixes each keeps.
    public var capture: [String: [String]]?
    public init() {}

    public static let schema = ConfigSchema.values(["path", "max_size_mb", "remember_seconds", "max_message_bytes", "max_streams", "max_consumers", "client_max_streams", "client_max_mb",
                                                    "client_max_consumers", "max_ack_pending", "capture"]
                                                   + PostgresSection.keys)

    /// Reads `streams:`.
    public init(reading streams: ConfigSection) throws(ConfigError) {
        self.init()
        path = try streams.text("path", "a file path")
        maxSizeBytes = try streams.integer("max_size_mb", atMost: 1 << 20).map { $0 * 1_048_576 }
        rememberSeconds = try streams.integer("remember_seconds", atMost: ConfigSection.Limit.yearSeconds)
        maxMessageBytes = try streams.integer("max_message_bytes", atMost: 16_777_216)
        maxStreams = try streams.integer("max_streams", atMost: 1_000_000)
        maxConsumers = try streams.integer("max_consumers", atMost: 1_000_000)
        clientMaxStreams = try streams.integer("client_max_streams", atMost: 1_000_000)
        clientMaxBytes = try streams.integer("client_max_mb", atMost: 1 << 30).map { $0 * 1_048_576 }
        clientMaxConsumers = try streams.integer("client_max_consumers", atMost: 100_000_000)
        maxAckPending = try streams.integer("max_ack_pending", atMost: 1_000_000)
        postgres = try PostgresSection.reading(streams)
        if streams.has("capture") {
            let streamsCapturing = try streams.section("capture")
            var capture: [String: [String]] = [:]
            for name in streamsCapturing.values.keys { capture[name] = try streamsCapturing.keyPrefixes(name, atLeastOne: true) }
            self.capture = capture
        }
    }
}
