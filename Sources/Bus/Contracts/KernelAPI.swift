public import BusProtocol

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
        /// A kernel of a cell (docs/CELLS.md) keeps the same keys under `/kernel/cells/NAME/`:
        /// cells that share one state each keep their own.
        public static func prefix(cell: String?) -> String { cell.map { prefix + "cells/\($0)/" } ?? prefix }
        public static func instance(cell: String?) -> String { prefix(cell: cell) + "instance" }
        public static func servicesPrefix(cell: String?) -> String { prefix(cell: cell) + "services/" }
        public static func service(_ name: String, cell: String?) -> String { servicesPrefix(cell: cell) + name }
    }

    public static let ping = Method<NoParams, Pong>(service, "ping", "Liveness: the kernel's instance (new at each start), pid, uptime and version.")
    public static let servicesList = Method<NoParams, ServiceList>(service, "services.list", "The registered services with their workers, queue and requests in flight.")
    public static let stats = Method<NoParams, Stats>(service, "stats", "Totals and per-service requests, errors, latencies; security and state figures.")
    public static let metrics = Method<NoParams, Metrics>(service, "metrics", "The same figures in the Prometheus text format.")
    public static let stateSet = Method<StateSetParams, StateWritten>(service, "state.set", "Writes a CHP key (null deletes; ttl in seconds), acknowledged with its sequence number, the key's new revision. With revision: only if the key is at that revision (0: absent), else -32004 with data.revision.")
    public static let statePublish = Method<StateSetParams, StateWritten>(service, "state.publish", "Writes a key as a client, under the collector's rule (the writable prefixes, /client/ by default), acknowledged with its sequence number. With revision: compare-and-set, as state.set.")
    public static let stateGet = Method<StateGetParams, StateEntries>(service, "state.get", "The CHP keys under a prefix with their values and sequence numbers (each key's revision), a page at a time (next: the after of the next page).")
    public static let stateHistory = Method<StateHistoryParams, StateRevisions>(service, "state.history", "A key's recent revisions, oldest first, deletions as null values, within the kernel's history bounds (kernel.state_history_*).")
    public static let workersList = Method<WorkersParams, Workers>(service, "workers.list", "Each worker connection (of a service, or all): its id, process, window, requests in flight, and whether it drains.")
    public static let workersDrain = Method<WorkersParams, Workers>(service, "workers.drain", "Drains the workers of a service (or one worker or process by id): they take no new requests, answer those in flight, then leave. For operators' keys only.")

    public struct Pong: Codable, Sendable {
        public var pong: Bool
        public var instance: String
        public var pid: Int
        public var uptimeSeconds: Double
        /// The kernel's `SwitchboardVersion`; nil from a kernel built before it said.
        public var version: String?
        /// The kernel's pair, when it is one of two.
        public var pair: PairStatus?
        public init(pong: Bool, instance: String, pid: Int, uptimeSeconds: Double, version: String?, pair: PairStatus? = nil) {
            (self.pong, self.instance, self.pid, self.uptimeSeconds, self.version, self.pair) = (pong, instance, pid, uptimeSeconds, version, pair)
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
        /// Whether it holds every change of the state anyone saw: always when active; when
        /// passive, once its copy of the active one's is complete and the active one waits
        /// for it (only then can it take over).
        public var synced: Bool
        public var peer: Peer
        /// In `stats` only: requests it refused while not active (-32008).
        public var refusedNotActive: Int?
        public init(role: String, state: String, since: String, synced: Bool, peer: Peer, refusedNotActive: Int? = nil) {
            (self.role, self.state, self.since, self.synced, self.peer, self.refusedNotActive) = (role, state, since, synced, peer, refusedNotActive)
        }
    }

    /// `stats`: the kernel's totals, each service's figures, and its security and state figures.
    public struct Stats: Codable, Sendable {
        public struct Service: Codable, Sendable {
            public var requests: Int
            public var replies: Int
            /// Replies that were JSON-RPC errors, as the workers report them.
            public var errors: Int
            /// Answered -32001: no worker in time, or the queue full.
            public var unavailable: Int
            /// Sent to another worker after theirs died.
            public var redispatched: Int
            /// Answered -32006 (their worker died; sending again was not allowed).
            public var outcomeUnknown: Int
            /// Answered -32012: each worker they were handed to died with them.
            public var handlerDied: Int
            public var queued: Int
            public var workers: Int
            public var meanLatencyMicroseconds: Double
            /// Upper bounds of the latency buckets the quantiles fall in; absent before a reply.
            public var p50LatencyMicroseconds: Int?
            public var p99LatencyMicroseconds: Int?
            public init(requests: Int, replies: Int, errors: Int, unavailable: Int, redispatched: Int, outcomeUnknown: Int, handlerDied: Int,
                        queued: Int, workers: Int, meanLatencyMicroseconds: Double, p50LatencyMicroseconds: Int?, p99LatencyMicroseconds: Int?) {
                (self.requests, self.replies, self.errors, self.unavailable, self.redispatched) = (requests, replies, errors, unavailable, redispatched)
                (self.outcomeUnknown, self.handlerDied, self.queued, self.workers) = (outcomeUnknown, handlerDied, queued, workers)
                (self.meanLatencyMicroseconds, self.p50LatencyMicroseconds, self.p99LatencyMicroseconds) = (meanLatencyMicroseconds, p50LatencyMicroseconds, p99LatencyMicroseconds)
            }
        }
        public struct Security: Codable, Sendable {
            public var curve: Bool
            /// Connections the ZAP handler refused (a key not allowed).
            public var refusedConnections: Int
            /// READYs refused: the key may not serve that service.
            public var refusedRegistrations: Int
            /// Requests refused for their key: for operators only (``OperatorsOnly``) from
            /// another key, or from a key a reload took out.
            public var refusedRequests: Int
            public init(curve: Bool, refusedConnections: Int, refusedRegistrations: Int, refusedRequests: Int = 0) {
                (self.curve, self.refusedConnections, self.refusedRegistrations, self.refusedRequests) = (curve, refusedConnections, refusedRegistrations, refusedRequests)
            }
        }
        public struct State: Codable, Sendable {
            public var keys: Int
            public var bytes: Int
            public var sequence: UInt64
            /// Malformed KVSETs.
            public var rejectedWrites: Int
            /// Writes to a key the writer may not write.
            public var refusedForbidden: Int
            /// Writes past a limit (value size, keys, bytes).
            public var refusedOverLimit: Int
            /// Compare-and-sets refused: the key was not at the revision given (-32004).
            public var refusedConflict: Int
            public var history: History
            /// Where the state is kept when it is not in the kernel's memory (absent: in memory).
            public var etcd: Etcd?
            public init(keys: Int, bytes: Int, sequence: UInt64, rejectedWrites: Int, refusedForbidden: Int, refusedOverLimit: Int,
                        refusedConflict: Int = 0, history: History, etcd: Etcd? = nil) {
                (self.keys, self.bytes, self.sequence, self.rejectedWrites) = (keys, bytes, sequence, rejectedWrites)
                (self.refusedForbidden, self.refusedOverLimit, self.refusedConflict, self.history) = (refusedForbidden, refusedOverLimit, refusedConflict, history)
                self.etcd = etcd
            }
        }
        /// The etcd that keeps the state (`kernel.state.backend: etcd`), as this kernel follows it.
        public struct Etcd: Codable, Sendable {
            public var endpoints: [String]
            public var prefix: String
            /// The revision of the last change the kernel's copy holds.
            public var revision: Int64
            /// Revisions etcd reported past the copy's (other keys' changes count too).
            public var lagRevisions: Int64
            /// The kernel's lease (its own keys hang on it), in hexadecimal as etcdctl shows it.
            public var lease: String
            /// Transactions sent, writes etcd did not take (answered with an error), collector
            /// writes dropped because too many waited for etcd, and writes waiting now.
            public var transactions: Int
            public var failedWrites: Int
            public var droppedWrites: Int
            public var queuedWrites: Int
            public init(endpoints: [String], prefix: String, revision: Int64, lagRevisions: Int64, lease: String,
                        transactions: Int, failedWrites: Int, droppedWrites: Int, queuedWrites: Int) {
                (self.endpoints, self.prefix, self.revision, self.lagRevisions, self.lease) = (endpoints, prefix, revision, lagRevisions, lease)
                (self.transactions, self.failedWrites, self.droppedWrites, self.queuedWrites) = (transactions, failedWrites, droppedWrites, queuedWrites)
            }
        }
        /// The state's recent changes the kernel keeps, and their bounds.
        public struct History: Codable, Sendable {
            public var changes: Int
            public var bytes: Int
            /// Keys with revisions held.
            public var keys: Int
            /// Every change after this sequence is held: a subscriber at it or later resumes exactly.
            public var since: UInt64
            public var maxChanges: Int
            public var maxBytes: Int
            public var perKey: Int
            /// Snapshot requests answered with the changes since the sequence they gave, and
            /// those answered with a whole snapshot (the changes were no longer all held).
            public var resumes: Int
            public var resumesRefused: Int
            public init(changes: Int, bytes: Int, keys: Int, since: UInt64, maxChanges: Int, maxBytes: Int, perKey: Int, resumes: Int, resumesRefused: Int) {
                (self.changes, self.bytes, self.keys, self.since) = (changes, bytes, keys, since)
                (self.maxChanges, self.maxBytes, self.perKey, self.resumes, self.resumesRefused) = (maxChanges, maxBytes, perKey, resumes, resumesRefused)
            }
        }
        public var requests: Int
        /// Messages that were not 7/MDP, CHP or the pair's protocol, and were dropped.
        public var protocolErrors: Int
        /// Replies to clients gone or not reading, dropped.
        public var droppedReplies: Int
        /// Replies in parts (18/MDP) that ended before their FINAL: the worker died, the client
        /// did not read or left, or the parts were too many to gather for a 7/MDP client.
        public var brokenStreams: Int
        /// Requests their clients cancelled while the kernel held them (absent from a kernel
        /// older than the client's CANCEL).
        public var cancelledRequests: Int?
        /// Bytes of parts held for 7/MDP clients until their FINAL.
        public var gatheredBytes: Int
        /// Replies in parts under way now (a part relayed, no FINAL yet), and requests to every
        /// worker of a service still gathering answers (absent from a kernel older than them).
        public var streamsInProgress: Int?
        public var gathersInProgress: Int?
        public var queuedBytes: Int
        public var uptimeSeconds: Double
        /// Files (connections among them) the kernel's process holds open, and how many it may:
        /// near that limit it ends new connections (absent from an older kernel, or where the
        /// system does not say).
        public var openFiles: Int?
        public var maxOpenFiles: Int?
        /// Connections ended as soon as accepted, because the kernel held files into the few it
        /// keeps for its own use (the last twentieth of the limit, at least 16).
        public var refusedForOpenFiles: Int?
        /// By service name.
        public var services: [String: Service]
        public var security: Security
        public var state: State
        /// The kernel's pair, when it is one of two.
        public var pair: PairStatus?
        /// The kernel's cell, on a bus of several (docs/CELLS.md).
        public var cell: Cell?
        public struct Cell: Codable, Sendable {
            /// This kernel's cell.
            public var name: String
            /// Requests other cells sent here.
            public var received: Int
            /// By other cell: the requests handed to it and what came of them.
            public var peers: [String: Peer]
            public struct Peer: Codable, Sendable {
                /// Requests handed to that cell (a request sent again counts again).
                public var sent: Int
                /// Answers it sent back, and the time from each request's arrival here to its answer.
                public var answered: Int
                public var meanLatencyMicroseconds: Double
                public var p50LatencyMicroseconds: Int?
                public var p99LatencyMicroseconds: Int?
                public init(sent: Int, answered: Int, meanLatencyMicroseconds: Double, p50LatencyMicroseconds: Int?, p99LatencyMicroseconds: Int?) {
                    (self.sent, self.answered, self.meanLatencyMicroseconds) = (sent, answered, meanLatencyMicroseconds)
                    (self.p50LatencyMicroseconds, self.p99LatencyMicroseconds) = (p50LatencyMicroseconds, p99LatencyMicroseconds)
                }
            }
            public init(name: String, received: Int, peers: [String: Peer]) { (self.name, self.received, self.peers) = (name, received, peers) }
        }
        public init(requests: Int, protocolErrors: Int, droppedReplies: Int, brokenStreams: Int = 0, cancelledRequests: Int? = nil, gatheredBytes: Int = 0,
                    streamsInProgress: Int? = nil, gathersInProgress: Int? = nil, queuedBytes: Int,
                    uptimeSeconds: Double, openFiles: Int? = nil, maxOpenFiles: Int? = nil, refusedForOpenFiles: Int? = nil, services: [String: Service], security: Security, state: State,
                    pair: PairStatus?, cell: Cell? = nil) {
            (self.cell, self.openFiles, self.maxOpenFiles, self.refusedForOpenFiles) = (cell, openFiles, maxOpenFiles, refusedForOpenFiles)
            (self.requests, self.protocolErrors, self.droppedReplies, self.queuedBytes, self.uptimeSeconds) = (requests, protocolErrors, droppedReplies, queuedBytes, uptimeSeconds)
            (self.brokenStreams, self.cancelledRequests, self.gatheredBytes) = (brokenStreams, cancelledRequests, gatheredBytes)
            (self.streamsInProgress, self.gathersInProgress) = (streamsInProgress, gathersInProgress)
            (self.services, self.security, self.state, self.pair) = (services, security, state, pair)
        }
    }

    public struct ServiceList: Codable, Sendable {
        public struct Entry: Codable, Sendable {
            public var name: String
            public var workers: Int
            public var idle: Int
            public var queued: Int
            public var inFlight: Int
            /// Workers draining (not counted in `workers`): they finish what they hold, then leave.
            public var draining: Int?
            /// The other cells that serve it (`kernel.cell`, docs/CELLS.md), asked while
            /// `workers` is 0; not counted in `workers`, `idle` or `inFlight`.
            public var cells: [String]?
            public init(name: String, workers: Int, idle: Int, queued: Int, inFlight: Int, draining: Int? = nil, cells: [String]? = nil) {
                (self.name, self.workers, self.idle, self.queued, self.inFlight, self.draining) = (name, workers, idle, queued, inFlight, draining)
                self.cells = cells
            }
        }
        public var services: [Entry]
        /// The kernel's pair, when it is one of two.
        public var pair: PairStatus?
        public init(services: [Entry], pair: PairStatus? = nil) { (self.services, self.pair) = (services, pair) }
    }

    /// Which workers: those of `service` (all services when nil; `workers.drain` needs one),
    /// or only the connection or process (the id's part before the first `/`) `worker`.
    public struct WorkersParams: Codable, Sendable {
        public var service: String?
        public var worker: String?
        public init(service: String? = nil, worker: String? = nil) { (self.service, self.worker) = (service, worker) }
    }

    public struct Workers: Codable, Sendable {
        public struct Entry: Codable, Sendable, Equatable {
            public var service: String
            /// The connection's routing id (a `ServiceHost`'s: `HOST:PID:RANDOM/INDEX/GENERATION`).
            public var id: String
            /// The process it belongs to: the id's part before the first `/`.
            public var process: String
            public var window: Int
            public var inFlight: Int
            public var draining: Bool
            public init(service: String, id: String, process: String, window: Int, inFlight: Int, draining: Bool) {
                (self.service, self.id, self.process, self.window, self.inFlight, self.draining) = (service, id, process, window, inFlight, draining)
            }
        }
        public var workers: [Entry]
        public init(workers: [Entry]) { self.workers = workers }
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
        /// Compare-and-set: write only if the key is at this revision (the sequence of its
        /// last change, as `state.get` shows it); 0: only if the key is absent. Otherwise
        /// -32004, with the key's revision in `data.revision`.
        public var revision: UInt64?
        public init(key: String, value: JSONValue?, ttl: Double? = nil, revision: UInt64? = nil) {
            (self.key, self.value, self.ttl, self.revision) = (key, value, ttl, revision)
        }
    }

    public struct StateWritten: Codable, Sendable {
        /// The change's sequence number: the key's new revision.
        public var sequence: UInt64
        public init(sequence: UInt64) { self.sequence = sequence }
    }

    public struct StateHistoryParams: Codable, Sendable {
        public var key: String
        public init(key: String) { self.key = key }
    }

    /// A key's revisions the kernel still holds, oldest first.
    public struct StateRevisions: Codable, Sendable {
        public struct Revision: Codable, Sendable, Equatable {
            public var sequence: UInt64
            /// Null: the key was deleted (or its TTL ran out).
            public var value: JSONValue
            public init(sequence: UInt64, value: JSONValue) { (self.sequence, self.value) = (sequence, value) }
        }
        public var key: String
        public var revisions: [Revision]
        /// The state's sequence now.
        public var sequence: UInt64
        /// The history holds every change after this sequence: an older revision may have
        /// existed before it.
        public var since: UInt64
        public init(key: String, revisions: [Revision], sequence: UInt64, since: UInt64) {
            (self.key, self.revisions, self.sequence, self.since) = (key, revisions, sequence, since)
        }
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
