public import BusKit
public import BusProtocol
import Foundation
import Hummingbird
import NIOCore
import Synchronization
public import Logging
public import ServiceLifecycle
public import ZeroMQ

/// `switchboard gateway`: the bus over HTTP, for browsers, apps and operators.
///
/// - `POST /rpc/{service}`: a JSON-RPC 2.0 request or batch in, the response out, with the
///   HTTP status of its error (docs/GATEWAY.md has the table).
/// - `GET /events?prefix=P`: the state under `P` as Server-Sent Events: the snapshot, `synced`,
///   then live changes; resumable with `Last-Event-ID` (or `?since=`).
/// - `GET /metrics`, `/healthz`, `/readyz`; `GET /`: the five apps' page.
///
/// One ``BusClient`` carries every HTTP request, one ``Subscription`` feeds every stream;
/// with the gateway they are the parts of its process (``parts(options:logger:)``).
/// The gateway's bearer tokens, shared by its routes and replaced whole by a reload.
public final class GatewayTokens: Sendable {
    private let tokens: Mutex<[GatewayToken]>
    init(_ tokens: [GatewayToken]) { self.tokens = Mutex(tokens) }
    public var current: [GatewayToken] { tokens.withLock { $0 } }
    public func replace(with tokens: [GatewayToken]) { self.tokens.withLock { $0 = tokens } }
}

public struct Gateway: Service {
    public struct Options: Sendable {
        public var settings: GatewaySettings
        /// The kernel, or the two kernels of a pair, with each one's CHP endpoints.
        public var brokers: [String]
        public var state: [StateEndpoints]
        /// The gateway's own CURVE keys (nil: plain).
        public var curve: CurveClientKeys?
        /// The services `/readyz` waits for.
        public var services: [String]
        public var maxMessageSize: Int
        /// The kernel's `max_batch_items`: a bigger batch is refused before it is forwarded.
        public var maxBatchItems: Int
        /// A context shared with the kernel (for inproc:// endpoints); nil: its own.
        public var context: ZMQContext?
        /// Who may call: `settings.tokens` at start, replaced by a reload (SIGHUP).
        public let tokens: GatewayTokens

        public init(settings: GatewaySettings, brokers: [String], state: [StateEndpoints], curve: CurveClientKeys?,
                    services: [String], maxMessageSize: Int = MDP.defaultMaxMessageSize, maxBatchItems: Int = 100, context: ZMQContext? = nil) {
            self.context = context
            self.maxBatchItems = maxBatchItems
            self.settings = settings
            tokens = GatewayTokens(settings.tokens)
            self.brokers = brokers
            self.state = state
            self.curve = curve
            self.services = services
            self.maxMessageSize = maxMessageSize
        }
    }

    public let options: Options
    let client: BusClient
    let subscription: Subscription
    let logger: Logger

    /// A gateway over `client` and `subscription` (to `options.settings.prefixes`), which
    /// stay its caller's to close.
    public init(options: Options, client: BusClient, subscription: Subscription, logger: Logger = Logger(label: "switchboard.gateway")) {
        self.options = options
        self.client = client
        self.subscription = subscription
        self.logger = logger
    }

    /// The gateway's process as its parts, in dependency order for one `ServiceGroup`: the
    /// client to the kernel, the subscription to the state it streams, the gateway.
    public static func parts(options: Options, logger: Logger = Logger(label: "switchboard.gateway")) async throws -> [any Service] {
        let client = try await BusClient(brokers: options.brokers, context: options.context, timeout: options.settings.requestTimeout,
                                         curve: options.curve, maxMessageSize: options.maxMessageSize, maxBatchItems: options.maxBatchItems,
                                         state: options.state)
        let subscription: Subscription
        do {
            subscription = try await client.subscribe(prefixes: options.settings.prefixes)
        } catch {
            await client.close()
            throw error
        }
        return [client, subscription, Gateway(options: options, client: client, subscription: subscription, logger: logger)]
    }

    public func run() async throws {
        try await serve()
    }

    /// Serves HTTP once the first snapshot is in, until the task is cancelled or a
    /// graceful shutdown (ServiceLifecycle) begins: then the event streams end (browsers
    /// reconnect to the next gateway) and requests in flight finish. `onListening` gets the
    /// port bound (useful with port 0).
    public func serve(onListening: @escaping @Sendable (Int) -> Void = { _ in }) async throws {
        let settings = options.settings, subscription = self.subscription
        let feed = StateFeed(prefixes: settings.prefixes, history: settings.history, historyBytes: settings.historyBytes,
                             streamBacklogBytes: settings.streamBacklogBytes, changeLog: client, logger: logger)
        var app = application(feed: feed, onListening: onListening)
        // The gateway's work beside HTTP, as Hummingbird's own services: its ServiceGroup runs
        // them beside the server and stops them after the server has drained.
        app.addServices(
            GatewayWork { await feed.follow(subscription) },
            GatewayWork {
                while !Task.isCancelled {
                    try? await Task.sleep(for: settings.heartbeat)
                    await feed.heartbeat()
                }
            },
            GatewayWork {
                var heap = HeapTrim()
                while !Task.isCancelled {
                    try? await Task.sleep(for: .seconds(1))
                    heap.releaseIfWorthIt()
                }
            })
        app.beforeServerStarts {
            await self.waitForState(feed)
            // Stopping before any kernel answered: the server is not started at all.
            if await feed.closed { throw StoppedBeforeListening() }
        }
        // Graceful shutdown ends the event streams at once (browsers reconnect to the next
        // gateway): the server's drain would otherwise wait for streams that never end.
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask {
                try? await gracefulShutdown()
                await feed.closeAll()
            }
            do {
                try await app.run()
            } catch is StoppedBeforeListening {
            } catch let error as IOError where error.description.hasPrefix("bind(") {
                // (NIO names the call that failed only at the head of its description.)
                throw ListenFailure(host: settings.host, port: settings.port, errno: error.errnoCode)
            }
            group.cancelAll()
        }
    }

    private struct StoppedBeforeListening: Error {}

    /// The gateway could not listen at its address: why, in the system's words, and for an
    /// address in use, what to do about it.
    public struct ListenFailure: Error, CustomStringConvertible {
        public let host: String
        public let port: Int
        public let errno: Int32

        public init(host: String, port: Int, errno: Int32) { (self.host, self.port, self.errno) = (host, port, errno) }

        public var description: String {
            "cannot listen at \(host):\(port) (gateway.listen): \(String(cString: strerror(errno)))"
                + (errno == EADDRINUSE ? "; another program listens there (another switchboard gateway?): stop it, or give the gateway another address" : "")
        }
    }

    /// Until the kernel has answered with a snapshot there is nothing to serve; says so while
    /// waiting rather than sit silent.
    private func waitForState(_ feed: StateFeed) async {
        let settings = options.settings, state = options.state, logger = self.logger
        await withDiscardingTaskGroup { waiting in
            waiting.addTask {
                try? await Task.sleep(for: .seconds(5))
                guard !Task.isCancelled else { return }
                logger.warning("waiting for the kernel's state at \(state.map(\.snapshot).joined(separator: " or ")) before listening on \(settings.host):\(settings.port)")
            }
            await feed.waitUntilSynced()
            waiting.cancelAll()
        }
    }

    private func application(feed: StateFeed, onListening: @escaping @Sendable (Int) -> Void) -> Application<RouterResponder<GatewayContext>> {
        let settings = options.settings
        let page: Page
        do {
            page = try Page.load()
        } catch {
            // The API and the streams work without it (a binary copied without its resources).
            logger.warning("serving no page at /: \(error.localizedDescription)")
            page = Page(files: [:])
        }
        let openFiles = OpenFiles.limit
        let roomy = ConnectionCount.defaultMax(openFiles: openFiles)
        if let most = settings.maxConnections, most > roomy, let openFiles {
            logger.warning("gateway.max_connections is \(most), but this process may open \(openFiles) files and needs some of its own: past ~\(roomy) connections it cannot accept, and tries again at once; lower it, or raise the limit on open files (LimitNOFILE=, ulimit -Hn)")
        }
        let connections = ConnectionCount(max: settings.maxConnections ?? roomy)
        let routes = Routes(options: options, client: client, feed: feed, page: page, logger: logger,
                            snapshotBudget: SnapshotBudget(bytesPerMinute: settings.snapshotBytesPerMinute),
                            callsPerAddress: CallsPerAddress(limit: settings.maxCallsPerAddress), connections: connections)
        return Application(router: routes.router(),
                              server: .http1(configuration: .init(idleTimeout: TimeAmount(settings.idleTimeout))),
                              configuration: .init(address: .hostname(settings.host, port: settings.port), serverName: "switchboard-gateway",
                                                   availableConnectionsDelegate: ConnectionLimit(connections, logger: logger)),
                              onServerRunning: { channel in
                                  let port = channel.localAddress?.port ?? settings.port
                                  onListening(port)
                              },
                              logger: logger)
    }
}

/// A piece of the gateway's work (following the state, heartbeats, trimming the heap) as a
/// service of its Hummingbird application: it runs until graceful shutdown cancels it.
private struct GatewayWork: Service {
    let work: @Sendable () async -> Void

    init(_ work: @escaping @Sendable () async -> Void) { self.work = work }

    func run() async throws {
        await cancelWhenGracefulShutdown { await work() }
    }
}
