public import BusProtocol
public import ContractKit

/// The kernel's own service, `kernel`: liveness, the service registry, figures and the CHP
/// state written and read through requests.
public enum KernelAPI {
    public static let service = "kernel"

    /// The CHP keys the kernel writes itself (only it may write under `/kernel/`).
    public enum StateKeys {
        public static let prefix = "/kernel/"
        /// This kernel's instance: a subscriber sees the kernel restart (or its pair fail over).
        public static let instance = "/kernel/instance"
        /// Each service's worker count.
        public static let servicesPrefix = "/kernel/services/"
        public static func service(_ name: String) -> String { servicesPrefix + name }
    }

    public static let ping = Method<NoParams, Pong>(service, "ping", "Liveness: the kernel's instance (new at each start), pid and uptime.")
    public static let servicesList = Method<NoParams, ServiceList>(service, "services.list", "The registered services with their workers, queue and requests in flight.")
    public static let stats = Method<NoParams, JSONValue>(service, "stats", "Totals and per-service requests, errors, latencies; security and state figures.")
    public static let metrics = Method<NoParams, Metrics>(service, "metrics", "The same figures in the Prometheus text format.")
    public static let stateSet = Method<StateSetParams, StateWritten>(service, "state.set", "Writes a CHP key (null deletes; ttl in seconds), acknowledged with its sequence number.")
    public static let statePublish = Method<StateSetParams, StateWritten>(service, "state.publish", "Writes a key as a client, under the collector's rule (the writable prefixes, /client/ by default), acknowledged with its sequence number.")
    public static let stateGet = Method<StateGetParams, StateEntries>(service, "state.get", "The CHP keys under a prefix with their values and sequence numbers, a page at a time (next: the after of the next page).")

    public struct Pong: Codable, Sendable {
        public var pong: Bool
        public var instance: String
        public var pid: Int
        public var uptimeSeconds: Double
        /// The kernel's pair, when it is one of two.
        public var pair: PairStatus?
        public init(pong: Bool, instance: String, pid: Int, uptimeSeconds: Double, pair: PairStatus? = nil) {
            (self.pong, self.instance, self.pid, self.uptimeSeconds, self.pair) = (pong, instance, pid, uptimeSeconds, pair)
        }
    }

    /// Where a kernel of a primary/backup pair stands: the one answering is `active` (clients
    /// are only answered by the active one) since `since`, and how it last heard its peer.
    public struct PairStatus: Codable, Sendable, Equatable {
        public struct Peer: Codable, Sendable, Equatable {
            public var endpoint: String
            /// primary or backup (starting), active, passive; absent: never heard.
            public var state: String?
            public var lastHeardSecondsAgo: Double?
            public init(endpoint: String, state: String?, lastHeardSecondsAgo: Double?) {
                (self.endpoint, self.state, self.lastHeardSecondsAgo) = (endpoint, state, lastHeardSecondsAgo)
            }
        }
        /// primary or backup: the role it was configured with.
        public var role: String
        public var state: String
        /// When it entered `state` (ISO 8601).
        public var since: String
        /// Whether it holds the whole state: always when active; when passive, once its copy
        /// of the active one's is complete (only then can it take over).
        public var synced: Bool
        public var peer: Peer
        public init(role: String, state: String, since: String, synced: Bool, peer: Peer) {
            (self.role, self.state, self.since, self.synced, self.peer) = (role, state, since, synced, peer)
        }
    }

    public struct ServiceList: Codable, Sendable {
        public struct Entry: Codable, Sendable {
            public var name: String
            public var workers: Int
            public var idle: Int
            public var queued: Int
            public var inFlight: Int
            public init(name: String, workers: Int, idle: Int, queued: Int, inFlight: Int) {
                (self.name, self.workers, self.idle, self.queued, self.inFlight) = (name, workers, idle, queued, inFlight)
            }
        }
        public var services: [Entry]
        /// The kernel's pair, when it is one of two.
        public var pair: PairStatus?
        public init(services: [Entry], pair: PairStatus? = nil) { (self.services, self.pair) = (services, pair) }
    }

    public struct Metrics: Codable, Sendable {
        public var contentType: String
        public var text: String
        public init(contentType: String, text: String) { (self.contentType, self.text) = (contentType, text) }
    }

    public struct StateSetParams: Codable, Sendable {
        /// A path starting with `/`.
        public var key: String
        /// Absent or null deletes the key.
        public var value: JSONValue?
        public var ttl: Double?
        public init(key: String, value: JSONValue?, ttl: Double? = nil) { (self.key, self.value, self.ttl) = (key, value, ttl) }
    }

    public struct StateWritten: Codable, Sendable {
        public var sequence: UInt64
        public init(sequence: UInt64) { self.sequence = sequence }
    }

    /// One page of the keys under `prefix`, in byte order: at most `limit` entries (default
    /// ``stateGetDefaultLimit``) and about ``stateGetPageBytes`` of values (at least one
    /// entry); `after` is the previous page's `next`.
    public struct StateGetParams: Codable, Sendable {
        public var prefix: String?
        public var after: String?
        public var limit: Int?
        public init(prefix: String? = nil, after: String? = nil, limit: Int? = nil) { (self.prefix, self.after, self.limit) = (prefix, after, limit) }
    }
    public static let stateGetDefaultLimit = 1_000
    /// Bytes of keys and values past which a page ends: a reply stays far below any message
    /// limit, however large the state, and a batch of pages stays within one.
    public static let stateGetPageBytes = 1_048_576

    public struct StateEntries: Codable, Sendable {
        public struct Entry: Codable, Sendable {
            public var key: String
            public var sequence: UInt64
            public var value: JSONValue
            public init(key: String, sequence: UInt64, value: JSONValue) { (self.key, self.sequence, self.value) = (key, sequence, value) }
        }
        public var sequence: UInt64
        public var entries: [Entry]
        /// Present when more keys follow: the `after` of the next page.
        public var next: String?
        public init(sequence: UInt64, entries: [Entry], next: String? = nil) { (self.sequence, self.entries, self.next) = (sequence, entries, next) }
    }
}

extension KernelAPI.StateSetParams: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["ttl": TimeToLive.range]
}

extension KernelAPI.StateGetParams: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["limit": 1...10_000]
}
