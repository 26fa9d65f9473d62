public import BusProtocol
public import Contracts
import DequeModule
import Foundation
import Synchronization
public import ZeroMQ

/// A client of the bus: JSON-RPC requests to services through the kernel (7/MDP).
///
/// One DEALER connection carries any number of requests at once; replies are matched by
/// their JSON-RPC id. After a kernel restart libzmq reconnects by itself, and requests that
/// were in flight when the connection dropped are sent again once it is back (their
/// timeout still counts from the first send), so a restart costs a delay, not an answer.
/// Given the two kernels of a pair, it follows the active one: requests in flight when it
/// goes, or refused by a kernel that is not active, go to the other. Each request names its
/// client (``clientID``), so a service answers one sent twice once.
/// Set `resendAfterReconnect` to false for requests that must not run twice: they then
/// fail at once with -32006 (outcome unknown).
///
/// ```swift
/// let bus = try await BusClient(brokers: ["tcp://127.0.0.1:5555"])
/// let pong = try await bus.call(KernelAPI.ping)                    // a method from its contract
/// let quote = try await bus.call(PricingAPI.routeQuote, .init(outboundId: 1, inboundId: 12))
/// let any = try await bus.request(service: "weather", method: "forecast.get")  // any service, by name
/// ```
public final class BusClient: Sendable {
    public let brokers: [String]
    public let defaultTimeout: Duration
    /// The largest request body sent; a bigger one fails at once with -32010, as the
    /// kernel would drop the connection that carried it (`kernel.max_message_size`).
    public let maxMessageSize: Int
    /// The most requests one batch message carries (`kernel.max_batch_items`): the kernel and
    /// every service refuse a bigger batch, so ``batch(service:_:timeout:)`` sends one as several.
    public let maxBatchItems: Int
    /// Each kernel's CHP endpoints (nil: unknown), for ``subscribe(prefixes:includeSnapshot:silenceTimeout:bufferSize:)``.
    public let state: [StateEndpoints]?
    /// Names this client in every request (the JSON-RPC `client` member): with the request's
    /// id it lets a service answer a request sent again with the reply it already gave.
    public let clientID = BusClient.newClientID()
    private let curve: CurveClientKeys?
    private let clock: any NanosecondClock
    /// The loop its socket runs on: other clients made with it (`BusClient(loop:)`) share its
    /// thread, as many connections in one program should (a thread each, and libzmq's I/O
    /// thread each, outnumber the cores and spend their time waking one another).
    public let loop: SocketLoop
    /// The client's loop thread as a task executor: a task that prefers it
    /// (`withTaskExecutorPreference(bus.executor)`) sends and is answered on the thread
    /// that serves the socket, without waking another thread per request.
    public var executor: any TaskExecutor { loop.taskExecutor }
    private let ownsLoop: Bool
    private let core: ClientCore
    /// Set by ``close()``: later requests fail at once with ``BusError/closed`` (the loop
    /// that would answer them may be gone).
    private let isClosed = Atomic<Bool>(false)

    /// Connects to the kernel at `brokers`, or to the two kernels of a pair (primary first).
    /// - Parameters:
    ///   - loop: the loop to run the socket on; by default the client starts its own.
    ///   - timeout: the default time to wait for each reply.
    ///   - curve: keys for a CURVE-secured kernel (nil: plain text).
    ///   - resendAfterReconnect: send requests again that were in flight when the
    ///     connection to a kernel dropped (false: fail them with -32006).
    ///   - maxMessageSize: the kernel's `max_message_size`; bigger requests fail with -32010.
    ///   - maxBatchItems: the kernel's `max_batch_items`; a bigger batch goes as several messages.
    ///   - state: each kernel's CHP endpoints, in the order of `brokers`; by default the three
    ///     ports after each broker's (`tcp://HOST:PORT+1`...), as a kernel binds them unless
    ///     told otherwise.
    ///   - clock: what requests' deadlines are kept by (a test moves its own).
    public init(brokers: [String], context: ZMQContext? = nil, loop: SocketLoop? = nil, timeout: Duration = .seconds(5),
                curve: CurveClientKeys? = nil, resendAfterReconnect: Bool = true,
                maxMessageSize: Int = MDP.defaultMaxMessageSize, maxBatchItems: Int = BodyLimits().maxBatchItems, state: [StateEndpoints]? = nil,
                clock: any NanosecondClock = SystemClock()) async throws {
        precondition(!brokers.isEmpty, "BusClient needs at least one broker endpoint")
        self.brokers = brokers
        let following = brokers.compactMap(StateEndpoints.init(followingBroker:))
        self.state = state ?? (following.count == brokers.count ? following : nil)
        self.curve = curve
        self.defaultTimeout = timeout
        self.maxMessageSize = maxMessageSize
        self.maxBatchItems = max(1, maxBatchItems)
        if let loop {
            self.loop = loop
            ownsLoop = false
        } else {
            self.loop = try SocketLoop(context: try context ?? ZMQContext(), name: "bus-client")
            ownsLoop = true
        }
        self.clock = clock
        core = ClientCore(loop: self.loop, resendAfterReconnect: resendAfterReconnect, clock: clock)
        try await core.connect(brokers, curve: curve)
    }

    /// Sends a JSON-RPC request to `service` and waits for its result.
    ///
    /// - Throws: ``BusError/remote(service:_:)`` when the service answers an error,
    ///   ``BusError/unavailable(service:message:)`` when no worker took it in time,
    ///   ``BusError/timedOut(service:method:after:)`` when nothing came back in `timeout`.
    public func request(service: String, method: String, params: JSONValue? = nil, timeout: Duration? = nil) async throws(BusError) -> JSONValue {
        try await request(service: service, method: method, paramsText: params?.jsonBytes, timeout: timeout)
    }

    /// Calls `method` from its service's contract with typed params, and gives its result as
    /// the contract's type. Errors as ``request(service:method:params:timeout:)``; a result
    /// that does not fit the contract is ``BusError/remote(service:_:)`` with -32603.
    public func call<P, R>(_ method: Method<P, R>, _ params: P, timeout: Duration? = nil) async throws(BusError) -> R {
        let text: [UInt8]?
        do { text = try method.paramsText(params) } catch { throw .remote(service: method.service, .invalidParams(field: "params", "\(error)")) }
        let result = try await request(service: method.service, method: method.name, paramsText: text, timeout: timeout)
        do { return try decodeResult(R.self, result) } catch { throw .remote(service: method.service, error as? JSONRPCError ?? .internalError("\(error)")) }
    }

    /// ``call(_:_:timeout:)`` for a method without params.
    public func call<R>(_ method: Method<NoParams, R>, timeout: Duration? = nil) async throws(BusError) -> R {
        try await call(method, NoParams(), timeout: timeout)
    }

    /// Calls a method that answers in parts (18/MDP) and gives its parts as they come, each as
    /// its contract's part type; the stream's ``PartStream/end()`` is the result less the
    /// parts. `timeout`: the longest wait for the first part, and between parts. A worker
    /// that answers in one reply (7/MDP) gives no part and its whole result as the end.
    /// `bufferSize`, `bufferBytes`: the parts, and their bytes, received and not yet read
    /// that the stream holds; one more ends it (-32014 `reader_behind`).
    public func stream<P, Part, R>(_ method: StreamMethod<P, Part, R>, _ params: P, timeout: Duration? = nil,
                                   bufferSize: Int = 10_000, bufferBytes: Int = 64 << 20) -> PartStream<Part, R> {
        let text: Result<[UInt8]?, BusError> = Result { try method.method.paramsText(params) }
            .mapError { .remote(service: method.service, .invalidParams(field: "params", "\($0)")) }
        return openStream(service: method.service, method: method.name, paramsText: text, timeout: timeout, bufferSize: bufferSize,
                          bufferBytes: bufferBytes)
    }

    /// Sends `method` to every worker of its service registered now (`all:SERVICE`,
    /// docs/PROTOCOL.md), in this cell and the other cells that offer it: first which
    /// workers were asked (again for each other cell as it says), then each answer as it comes,
    /// tagged with its worker; the end says how many answered and who did not, and why
    /// (died, drained, timed out: the kernel's queue timeout is the deadline).
    public func gather<P, R>(_ method: Method<P, R>, _ params: P, timeout: Duration? = nil) -> PartStream<GatherEvent<R>, GatherSummary> {
        let text: Result<[UInt8]?, BusError> = Result { try method.paramsText(params) }
            .mapError { .remote(service: method.service, .invalidParams(field: "params", "\($0)")) }
        return openStream(service: method.service, method: method.name, paramsText: text, timeout: timeout, everyWorker: true)
    }

    /// ``gather(_:_:timeout:)`` without params.
    public func gather<R>(_ method: Method<NoParams, R>, timeout: Duration? = nil) -> PartStream<GatherEvent<R>, GatherSummary> {
        gather(method, NoParams(), timeout: timeout)
    }

    /// ``gather(_:_:timeout:)`` for any service's method, by name, as plain JSON: the parts
    /// are `{"expected", "workers"}` (and `{"cell", "expected", "workers"}` from each other
    /// cell asked), then `{"worker", "result"}` or `{"worker", "error"}` (with `"cell"`).
    public func gather(service: String, method: String, paramsText: [UInt8]?, timeout: Duration? = nil) -> PartStream<JSONValue, JSONValue> {
        openStream(service: service, method: method, paramsText: .success(paramsText), timeout: timeout, everyWorker: true)
    }

    /// ``stream(_:_:timeout:bufferSize:bufferBytes:)`` for any service's method, by name, params as JSON
    /// text, parts and end as plain JSON.
    public func stream(service: String, method: String, paramsText: [UInt8]?, timeout: Duration? = nil,
                       bufferSize: Int = 10_000, bufferBytes: Int = 64 << 20) -> PartStream<JSONValue, JSONValue> {
        openStream(service: service, method: method, paramsText: .success(paramsText), timeout: timeout, bufferSize: bufferSize, bufferBytes: bufferBytes)
    }

    private func openStream<Part, End>(service: String, method: String, paramsText: Result<[UInt8]?, BusError>, timeout: Duration?,
                                       bufferSize: Int = 10_000, bufferBytes: Int = 64 << 20, everyWorker: Bool = false) -> PartStream<Part, End> {
        let rpcService = service
        let service = everyWorker ? MDP.everyWorkerPrefix + service : service
        let state = PartStreamState(service: service, method: method, bufferSize: bufferSize, bufferBytes: bufferBytes)
        let id = ClientCore.nextID()
        let core = self.core, loop = self.loop
        let stream = PartStream<Part, End>(handle: PartStreamHandle(state: state) {
            loop.execute { core.assumeIsolated { $0.cancel(ids: [id]) } }
        })
        let body: Frame
        // Its span lasts until the answer ends, however long the parts take to come.
        let span: BusTracing.ClientSpan?
        switch paramsText {
        case .failure(let error):
            state.ended(.failure(error))
            return stream
        case .success(let text):
            span = BusTracing.startClientSpan(service: rpcService, method: method)
            body = Frame(JSONRPCRequest(id: .number(id), method: method, paramsText: text, trace: span?.outgoing ?? BusTracing.outgoing(), client: clientID,
                                        stream: !everyWorker).jsonBytes)
        }
        let ended: @Sendable (Result<JSONValue, BusError>) -> Void = { outcome in
            // Its reader letting go (a task cancelled, Ctrl-C) is how a followed stream ends:
            // the span ends, not failed.
            switch outcome {
            case .success, .failure(.cancelled): span?.end(failedWith: nil)
            case .failure(let error): span?.end(failedWith: error)
            }
            state.ended(outcome)
        }
        if let error = refusal(body, service: service) {
            ended(.failure(error))
            return stream
        }
        guard !isClosed.load(ordering: .acquiring) else {
            ended(.failure(.closed))
            return stream
        }
        let timeout = timeout ?? defaultTimeout
        let deadline = clock.now + timeout.nanoseconds
        loop.execute {
            var pending = ClientCore.Pending(service: service, method: method, timeout: timeout, deadline: deadline) { ended($0) }
            pending.onPart = { state.received($0, bytes: $1) }
            core.assumeIsolated { $0.send([(id, pending)], message: MDP.request(service: service, body: [body], version: .v02)) }
        }
        return stream
    }

    /// ``request(service:method:params:timeout:)`` with the params as JSON text, forwarded as
    /// they are (the gateway passes a browser's params through without parsing them).
    public func request(service: String, method: String, paramsText: [UInt8]?, timeout: Duration? = nil) async throws(BusError) -> JSONValue {
        guard BusTracing.recordsSpans else { return try await send(service: service, method: method, paramsText: paramsText, timeout: timeout) }
        return try await BusTracing.withClientSpan(service: service, method: method) { () async throws(BusError) in
            try await send(service: service, method: method, paramsText: paramsText, timeout: timeout)
        }
    }

    private func send(service: String, method: String, paramsText: [UInt8]?, timeout: Duration?) async throws(BusError) -> JSONValue {
        let timeout = timeout ?? defaultTimeout
        let core = self.core
        let id = ClientCore.nextID()
        let body = Frame(JSONRPCRequest(id: .number(id), method: method, paramsText: paramsText, trace: BusTracing.outgoing(), client: clientID).jsonBytes)
        if let error = refusal(body, service: service) { throw error }
        guard !isClosed.load(ordering: .acquiring) else { throw .closed }
        let outcome: Result<JSONValue, BusError> = await withTaskCancellationHandler {
            await withUnsafeContinuation { continuation in
                let deadline = clock.now + timeout.nanoseconds
                loop.execute {
                    let pending = ClientCore.Pending(service: service, method: method, timeout: timeout, deadline: deadline) {
                        continuation.resume(returning: $0)
                    }
                    core.assumeIsolated { $0.send([(id, pending)], message: MDP.request(service: service, body: [body])) }
                }
            }
        } onCancel: {
            loop.execute { core.assumeIsolated { $0.cancel(ids: [id]) } }
        }
        return try outcome.get()
    }

    // MARK: State

    /// Sets `key` in the kernel's state to `value`, or deletes it when `value` is nil; `ttl`
    /// in seconds. Returns the update's sequence number once the kernel has applied and
    /// published it. A client writes under the kernel's writable prefixes (`/client/` by
    /// default) as through the CHP collector, but acknowledged (`kernel` `state.publish`);
    /// `asService` writes a service's own keys (`state.set`, see ``StatePublisher``).
    /// `revision`: compare-and-set, written only if the key is at that revision (its last
    /// change's sequence; 0: absent), else ``BusError/remote(service:_:)`` with -32004 and
    /// the key's revision in `data.revision`. The returned sequence is the key's new revision.
    @discardableResult
    public func publish(key: String, value: JSONValue?, ttl: Double? = nil, revision: UInt64? = nil,
                        asService: Bool = false) async throws(BusError) -> UInt64 {
        try await call(asService ? KernelAPI.stateSet : KernelAPI.statePublish,
                       KernelAPI.StateSetParams(key: key, value: value ?? .null, ttl: ttl, revision: revision)).sequence
    }

    // MARK: Streams

    /// Publishes `data` to `subject`, kept by the stream that holds it (the `streams`
    /// service, docs/STREAMS.md) and answered once it is on disk, with the stream and the
    /// message's sequence. With `id`, publishing it again within the stream's duplicate window
    /// keeps it once (the answer says `duplicate` and gives the first one's sequence).
    @discardableResult
    public func publish(to subject: String, _ data: JSONValue, id: String? = nil, timeout: Duration? = nil) async throws(BusError) -> StreamsAPI.Published {
        try await call(StreamsAPI.publish, StreamsAPI.Publish(subject: subject, data: data, id: id), timeout: timeout)
    }

    /// Follows the kernel's state under `prefixes` (12/CHP): a snapshot, then every update,
    /// with gaps reported (see ``Subscription``). It runs on this client's loop with its keys;
    /// cancel it before closing the client.
    public func subscribe(prefixes: [String] = [""], includeSnapshot: Bool = true, since: UInt64? = nil,
                          silenceTimeout: Duration = .seconds(5), bufferSize: Int = 10_000) async throws -> Subscription {
        try await Subscription.open(kernels: try stateKernels(), prefixes: prefixes,
                                           includeSnapshot: includeSnapshot, since: since, loop: loop, silenceTimeout: silenceTimeout,
                                           bufferSize: bufferSize, curve: curve, clock: clock)
    }

    /// The changes under `prefixes` after `since`, in order and deletions included, up to the
    /// sequence given with them; nil when the kernel no longer holds every change after `since`
    /// (`kernel.state_history_*`) or never reached it (then nothing else is sent: no snapshot).
    /// One resuming subscription, read to its first sync and closed.
    public func changes(under prefixes: [String], since: UInt64, timeout: Duration = .seconds(5)) async throws -> StateChanges? {
        let subscription = try await Subscription.open(kernels: try stateKernels(), prefixes: prefixes, since: since,
                                                       changesOnly: true, loop: loop, curve: curve, clock: clock)
        do {
            let changes = try await Self.readChanges(subscription, timeout: timeout)
            await subscription.cancel()
            return changes
        } catch {
            await subscription.cancel()
            throw error
        }
    }

    /// Each kernel's snapshot and publisher endpoints.
    private func stateKernels() throws(BusError) -> [(snapshot: String, publisher: String)] {
        guard let state else {
            throw BusError.invalidArgument("no CHP endpoints: give BusClient(state:) when the broker is not at tcp://HOST:PORT")
        }
        return state.map { ($0.snapshot, $0.publisher) }
    }

    private static func readChanges(_ subscription: Subscription, timeout: Duration) async throws -> StateChanges? {
        try await withThrowingTaskGroup(of: StateChanges?.self) { group in
            group.addTask {
                var changes: [StateUpdate] = []
                for try await event in subscription {
                    switch event {
                    case .update(let update): changes.append(update)
                    case .synced(let sequence): return StateChanges(changes: changes, sequence: sequence)
                    case .reset: return nil
                    case .missed, .resynced: break
                    }
                }
                throw BusError.closed
            }
            group.addTask {
                try await Task.sleep(for: timeout)
                throw BusError.timedOut(service: KernelAPI.service, method: "ICANHAZ?", after: timeout)
            }
            defer { group.cancelAll() }
            return try await group.next()!
        }
    }

    // MARK: Batches

    /// Calls `method` once for each of `params` in one JSON-RPC batch (one message, one
    /// reply) and returns each call's outcome, in order. Cheaper than as many requests when
    /// a service has many small things to say (say, state keys to publish).
    public func batch<P, R>(_ method: Method<P, R>, _ params: [P], timeout: Duration? = nil) async -> [Result<R, BusError>] {
        let texts: [[UInt8]?]
        do { texts = try params.map(method.paramsText) } catch {
            return params.map { _ in .failure(.remote(service: method.service, .invalidParams(field: "params", "\(error)"))) }
        }
        let outcomes = await batch(service: method.service, texts.map { (method.name, $0) }, timeout: timeout)
        return outcomes.map { outcome in
            outcome.flatMap { result in
                Result { try decodeResult(R.self, result) }.mapError { .remote(service: method.service, $0 as? JSONRPCError ?? .internalError("\($0)")) }
            }
        }
    }

    /// Several requests to `service` in one JSON-RPC batch, params as JSON text; more than
    /// ``maxBatchItems`` go as several batches, one after another (each with `timeout`).
    public func batch(service: String, _ calls: [(method: String, paramsText: [UInt8]?)], timeout: Duration? = nil) async -> [Result<JSONValue, BusError>] {
        guard !calls.isEmpty else { return [] }
        guard calls.count <= maxBatchItems else {
            var outcomes: [Result<JSONValue, BusError>] = []
            for start in stride(from: 0, to: calls.count, by: maxBatchItems) {
                outcomes += await batch(service: service, Array(calls[start..<min(start + maxBatchItems, calls.count)]), timeout: timeout)
            }
            return outcomes
        }
        let timeout = timeout ?? defaultTimeout
        let core = self.core
        let ids = calls.map { _ in ClientCore.nextID() }
        let trace = BusTracing.outgoing()
        let requests = zip(ids, calls).map { id, call in JSONRPCRequest(id: .number(id), method: call.method, paramsText: call.paramsText, trace: trace, client: clientID).jsonBytes }
        let body = Frame(Array("[".utf8) + Array(requests.joined(separator: Array(",".utf8))) + Array("]".utf8))
        if let error = refusal(body, service: service) { return calls.map { _ in .failure(error) } }
        guard !isClosed.load(ordering: .acquiring) else { return calls.map { _ in .failure(.closed) } }
        return await withTaskCancellationHandler {
            await withUnsafeContinuation { continuation in
                let deadline = clock.now + timeout.nanoseconds
                loop.execute {
                    // Confined to the loop thread, like every completion below.
                    let collector = BatchCollector(count: calls.count) { continuation.resume(returning: $0) }
                    let pendings = ids.enumerated().map { index, id in
                        (id, ClientCore.Pending(service: service, method: calls[index].method, timeout: timeout, deadline: deadline) {
                            collector.complete(index, $0)
                        })
                    }
                    core.assumeIsolated { $0.send(pendings, message: MDP.request(service: service, body: [body])) }
                }
            }
        } onCancel: {
            loop.execute { core.assumeIsolated { $0.cancel(ids: ids) } }
        }
    }

    /// Sends an opaque request (any frames) and waits for the reply's frames. Replies to
    /// opaque requests carry no id, so they are matched per service and connection in order:
    /// use this for `mmi.*` and non-JSON services, one request per service at a time (a body
    /// of JSON-RPC with ids of its own is fine: the client's own ids are never small). The late
    /// reply of one that timed out is dropped, not taken for the next one's (unless it comes
    /// after as long again as the timeout). One in flight when the connection to the kernel
    /// drops fails at once with -32006: it is not sent again, since it may have been done.
    /// One a pair's passive kernel refuses (-32008) goes to the other kernel.
    public func call(service: String, body: [Frame], timeout: Duration? = nil) async throws(BusError) -> [Frame] {
        let timeout = timeout ?? defaultTimeout
        let core = self.core
        for frame in body { if let error = refusal(frame, service: service) { throw error } }
        guard !isClosed.load(ordering: .acquiring) else { throw .closed }
        let outcome: Result<[Frame], BusError> = await withUnsafeContinuation { continuation in
            loop.execute {
                core.assumeIsolated {
                    $0.sendOpaque(service: service, message: MDP.request(service: service, body: body), timeout: timeout,
                                  continuation: continuation)
                }
            }
        }
        return try outcome.get()
    }

    /// Why a request is not sent, if it would not do: -32600 for a name no service can
    /// have; -32010 for a body the kernel would not take (it drops the connection instead
    /// of answering, so the request would only time out).
    private func refusal(_ body: Frame, service: String) -> BusError? {
        guard MDP.isValidServiceName(service) else {
            return .remote(service: service, .invalidRequest("the service name must be \(MDP.serviceNameRule), got '\(service)'"))
        }
        guard body.count > maxMessageSize else { return nil }
        return .remote(service: service, .overMessageSize("request", bytes: body.count, limit: maxMessageSize))
    }

    /// Whether a service has at least one worker (8/MMI `mmi.service`).
    public func hasWorkers(_ service: String, timeout: Duration? = nil) async throws(BusError) -> Bool {
        try await call(service: MMI.serviceQuery, body: [Frame(service)], timeout: timeout).first?.string == "200"
    }

    deinit {
        if ownsLoop { loop.beginShutdown() }
    }

    /// 128 random bits, base64url: unique among clients for as long as replies are remembered.
    private static func newClientID() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) }
        return Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    /// What the client has counted about its connection since it was opened.
    public struct Counters: Sendable, Equatable {
        /// Requests sent again after the connection to a kernel dropped.
        public var resent = 0
        /// Replies for a request that had already been answered (should stay 0).
        public var duplicateReplies = 0
        /// Replies that came after their request timed out or was cancelled.
        public var lateReplies = 0
    }

    public func counters() async -> Counters {
        let core = self.core
        return await core.counters
    }

    /// Requests waiting for their reply now.
    func waitingCount() async -> Int {
        let core = self.core
        return await core.waitingCount
    }

    /// Whether a connection to a kernel has completed its handshake and not dropped since.
    public func isConnectedToAKernel() async -> Bool {
        let core = self.core
        return await core.isConnected
    }

    /// What became of the connections to the kernels, in words, for a diagnostic when
    /// nothing answers: none accepted a connection, one refused this client's keys, or one
    /// was connected (and maybe lost).
    public func connectionSummary() async -> String {
        let core = self.core
        return await core.connectionSummary()
    }

    /// Closes the connection; waiting requests fail with ``BusError/closed``.
    public func close() async {
        isClosed.store(true, ordering: .releasing)
        let core = self.core
        await core.close()
        if ownsLoop { await loop.shutdown() }
    }
}

/// The client's state: an actor on its loop's thread (the loop is its executor). Requests
/// reach it through `loop.execute` + `assumeIsolated`, which keeps them in order without
/// an `await`; its sockets' handlers the same way.
///
/// One DEALER per kernel endpoint. With one kernel, requests go to it (libzmq queues them
/// while it is away) and those in flight when its connection drops are sent again once it is
/// back. With a pair, requests go to the kernel that last answered as active: one answered
/// -32008 (not active), or in flight on a connection that dropped, goes to the other kernel,
/// at once or, when both refused lately, after a short wait; TCP watches each connection
/// (``pairPeerTimeout``, ``pairStoppedTimeout``), so a kernel whose machine is gone, or
/// whose process is stopped, is noticed too.
actor ClientCore {
    struct Pending {
        let service: String
        let method: String
        let timeout: Duration
        /// For a reply in parts, moved on by each part: the timeout is the longest silence.
        var deadline: UInt64
        /// Called once, on the loop thread, with the outcome.
        let complete: (Result<JSONValue, BusError>) -> Void
        /// A reply in parts: takes each part with the bytes it came in (false: the reader is too far behind).
        var onPart: ((JSONValue, Int) -> Bool)? = nil
        /// Parts received: a request that had some is never sent again (they would repeat).
        var parts = 0
        /// The message to send again; held by the first request of a batch only, so a batch
        /// goes once.
        var message: Message? = nil
        /// The connection it was last sent on; nil: not sent yet (no kernel to send it to),
        /// or to be sent again.
        var sentOn: Int? = nil
        /// Connections that dropped while it was in flight on them.
        var losses = 0
    }

    /// An opaque request. Its reply carries no id: replies are matched to the requests sent on
    /// their connection to their service, in order. One that timed out keeps its place (with
    /// no continuation) so that its late reply is dropped rather than taken as the answer to
    /// the next request; it gives up its place when that reply comes, when its connection
    /// drops, or once as long again as its timeout has passed (a worker that never answers
    /// must not shift every later reply by one).
    struct OpaquePending {
        /// nil once it timed out.
        var continuation: UnsafeContinuation<Result<[Frame], BusError>, Never>?
        let deadline: UInt64
        let timeout: Duration
        let message: Message
        var sentOn: Int
        /// Whether its place is given up by `now`: it timed out, and as long again has passed.
        func isForgotten(at now: UInt64) -> Bool { continuation == nil && deadline &+ timeout.nanoseconds <= now }
    }

    /// One kernel's DEALER and what the client knows of it. The DEALER is replaced each time
    /// its connection drops: libzmq keeps what it had not yet written for a dropped connection
    /// and writes it once reconnected, while the client sends every request in flight again;
    /// with a fresh socket each request goes out once.
    struct Connection {
        let endpoint: String
        var socket: SocketRegistration
        var monitor: SocketRegistration
        var connected = false
        /// When the kernel last answered -32008 (not active).
        var refusedAt: UInt64 = 0
        /// What it went through, for a diagnostic when nothing answers.
        var everConnected = false
        var everHandshaken = false
        var drops = 0
        var handshakeFailures = 0
        /// Why the last failed handshake failed, when the event said.
        var handshakeProblem: HandshakeProblem?
        /// Its handshake completed since it last connected: what was sent may have reached
        /// the kernel (a connection refused at the handshake delivered nothing).
        var handshaken = false
        /// Its TCP connection while connected (a pair's): whether bytes still arrive.
        var tcp: TCPConnection?
    }

    /// How many times a request is sent again after the connection it was in flight on
    /// dropped: once. A request in flight at a second loss fails with -32012: it may be what
    /// ended the kernel, and sending it to each kernel that restarts would end them in turn.
    static let maxResends = 1

    private static let idCounter = IDCounter()
    static func nextID() -> Int64 { idCounter.next() }
    /// How long a kernel that answered "not active" is not asked again.
    static let refusalPause: UInt64 = 50_000_000

    nonisolated let loop: SocketLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    let resendAfterReconnect: Bool
    let clock: any NanosecondClock

    /// Where the client is in its life; checked by every entry point, as each arrives
    /// through `loop.execute` after the caller's state may have changed.
    enum Lifecycle {
        case connecting
        case open
        case closed
    }
    private var lifecycle = Lifecycle.connecting
    private var connections: [Connection] = []
    /// The kernel requests go to (the one believed active).
    private var current = 0
    private var isPair: Bool { connections.count > 1 }
    private var pending: [Int64: Pending] = [:]
    private var opaque: [String: [OpaquePending]] = [:]
    private var sweeper: LoopTimer?
    /// Ids finished lately (true: answered, false: timed out or cancelled), oldest first,
    /// to tell a duplicate reply from a late one.
    private var finished: [Int64: Bool] = [:]
    private var finishedOrder: Deque<Int64> = []
    private static let finishedMemory = 16_384
    /// Ids whose task was cancelled before their request reached the loop. A task already
    /// cancelled when it asks runs its cancellation handler first, so its cancel arrives
    /// here before its send: the send then ends the request at once, rather than leaving it
    /// to wait its whole timeout for a caller that is gone.
    private var cancelledBeforeSending: Set<Int64> = []
    private(set) var counters = BusClient.Counters()
    var waitingCount: Int { pending.count }

    init(loop: SocketLoop, resendAfterReconnect: Bool, clock: any NanosecondClock) {
        self.loop = loop
        self.resendAfterReconnect = resendAfterReconnect
        self.clock = clock
    }

    /// Opens a DEALER to each of `brokers` (one kernel, or the two of a pair) and starts
    /// reading them.
    func connect(_ brokers: [String], curve: CurveClientKeys?) throws {
        guard case .connecting = lifecycle else { throw ZMQError(call: "connect(closed client)", code: ENOTSOCK) }
        self.curve = curve
        for (index, broker) in brokers.enumerated() {
            let (socket, monitor) = try open(broker, index: index, watched: brokers.count > 1)
            connections.append(Connection(endpoint: broker, socket: socket, monitor: monitor))
        }
        lifecycle = .open
    }

    private var curve: CurveClientKeys?

    /// How long a replaced DEALER waits before it connects: libzmq's own reconnect interval,
    /// so a kernel that refuses the client is not asked again at once, again and again.
    static let reconnectInterval = Duration.milliseconds(100)
    /// With a pair, how long a kernel may acknowledge nothing before its connection is taken
    /// for lost (its machine gone, its link cut) and what it held goes to the other kernel:
    /// TCP's acknowledgements, not ZMTP heartbeats, so a reply arriving slowly is no silence.
    static let pairPeerTimeout = Duration.milliseconds(1_500)
    /// With a pair, how long a kernel may send no byte while a request waits on it: one whose
    /// process is stopped (SIGSTOP, a paused container) still has its machine acknowledge,
    /// but sends nothing, not even a PONG to the ZMTP PING asked every tenth of it. A reply
    /// arriving slowly is bytes arriving: it is no stop, however long it takes.
    static let pairStoppedTimeout = Duration.seconds(10)
    /// How often the connections of a pair with requests waiting are looked at for a stop.
    static let stopCheckInterval: UInt64 = 1_000_000_000

    /// A DEALER connecting to `endpoint` as connection `index` (after `delay`, when given),
    /// and its connection events; `watched` (a pair's): dropped once its kernel has
    /// acknowledged nothing for ``pairPeerTimeout``, and PINGed so that a kernel that is
    /// there sends bytes (``pairStoppedTimeout``). What is sent before it connects waits in
    /// its backlog.
    private func open(_ endpoint: String, index: Int, watched: Bool,
                      connectingAfter delay: Duration? = nil) throws -> (socket: SocketRegistration, monitor: SocketRegistration) {
        let socket = try ZMQSocket(loop.context, .dealer)
        try socket.secure(curve)
        try socket.set(.receiveHighWaterMark, 0)
        try socket.set(.sendHighWaterMark, 0)
        if watched {
            try socket.dropSilentPeers(after: Self.pairPeerTimeout)
            // No ZMTP timeout: its PONG waits behind a reply being written, so it would take a
            // long reply for a stop. The client judges by the bytes (``checkForStoppedKernels``).
            try socket.set(.heartbeatInterval, Int32(clamping: Int(Self.pairStoppedTimeout.nanoseconds / 10_000_000)))
            try socket.set(.heartbeatTimeout, 0)
        }
        // Connection events tell when requests in flight were lost with a kernel.
        let pair = try connectionEvents(of: socket, in: loop.context, also: [.handshakeFailed, .handshakeSucceeded])
        if delay == nil { try socket.connect(endpoint) }
        let registration = loop.register(readingParts: socket) { [weak self] parts in
            // Read during this call on the loop thread, where the client's state lives too.
            nonisolated(unsafe) let parts = parts
            self?.assumeIsolated { $0.received(parts, on: index) }
        }
        let monitor = loop.register(receivingOnly: pair) { [weak self] message in self?.assumeIsolated { $0.connectionEvent(message, on: index) } }
        if let delay {
            loop.schedule(after: delay) { [weak registration] in
                // Replaced again or closed meanwhile: nothing to connect.
                guard let registration, !registration.isClosed else { return }
                try? registration.socket.connect(endpoint)
            }
        }
        return (registration, monitor)
    }

    /// Timeouts are checked every 10 ms while anything waits (cheaper than a timer per
    /// request); an idle client leaves its loop asleep.
    private func sweepWhileWaiting() {
        guard sweeper == nil else { return }
        sweeper = loop.scheduleRepeating(every: .milliseconds(10)) { [weak self] in self?.assumeIsolated { $0.sweep() } }
    }

    func send(_ requests: [(id: Int64, pending: Pending)], message: Message) {
        // The ids of one send are cancelled together (one task asked for them all).
        var cancelledEarly = false
        for request in requests where cancelledBeforeSending.remove(request.id) != nil { cancelledEarly = true }
        if cancelledEarly {
            for request in requests { request.pending.complete(.failure(.cancelled(service: request.pending.service, method: request.pending.method))) }
            return
        }
        guard case .open = lifecycle else {
            for request in requests { request.pending.complete(.failure(.closed)) }
            return
        }
        let target = destination()
        for (index, request) in requests.enumerated() {
            var waiting = request.pending
            if index == 0 { waiting.message = message }
            waiting.sentOn = target
            pending[request.id] = waiting
        }
        sweepWhileWaiting()
        if let target { connections[target].socket.send(message) }
    }

    /// The connection to send on now: the only one; or of a pair, the current kernel if its
    /// connection got through the handshake and it did not just refuse, else the other if it
    /// qualifies (it becomes current); nil: none now (the request waits for the next sweep or
    /// connection). A connection the system accepted but no kernel greets (a frozen process)
    /// never qualifies, so requests go to the other kernel rather than wait there.
    private func destination() -> Int? {
        let now = clock.now
        guard isPair else { return now &- connections[0].refusedAt >= Self.refusalPause ? 0 : nil }
        let usable = { (index: Int) in self.connections[index].handshaken && now &- self.connections[index].refusedAt >= Self.refusalPause }
        if usable(current) { return current }
        guard let other = connections.indices.first(where: { $0 != current && usable($0) }) else { return nil }
        current = other
        return other
    }

    /// Sends the requests that wait for a kernel, when one can take them.
    private func sendWaiting() {
        guard pending.values.contains(where: { $0.sentOn == nil }), let target = destination() else { return }
        for id in pending.keys where pending[id]!.sentOn == nil {
            pending[id]!.sentOn = target
            if let message = pending[id]!.message {
                counters.resent += 1
                connections[target].socket.send(message)
            }
        }
    }

    func connectionEvent(_ message: Message, on index: Int) {
        guard let event = SocketEvent(message), case .open = lifecycle else { return }
        if !event.event.isDisjoint(with: .handshakeFailed) {
            connections[index].handshakeFailures += 1
            connections[index].handshakeProblem = event.handshakeProblem ?? connections[index].handshakeProblem
        }
        if event.event.contains(.handshakeSucceeded) {
            connections[index].handshaken = true
            connections[index].everHandshaken = true
            if isPair { sendWaiting() }
        }
        if event.event.contains(.disconnected) {
            connectionLost(index)
        } else if event.event.contains(.connected) {
            connections[index].connected = true
            connections[index].everConnected = true
            if isPair { connections[index].tcp = TCPConnection(event) }
            sendWaiting()
        }
    }

    /// Connection `index` dropped (or its kernel was found stopped): a new socket replaces
    /// it, and what was in flight on it goes again or fails.
    private func connectionLost(_ index: Int) {
        connections[index].connected = false
        connections[index].tcp = nil
        connections[index].drops += 1
        let delivered = connections[index].handshaken
        connections[index].handshaken = false
        // Replies the connection delivered may still wait in the socket (its monitor's
        // events and its messages are not ordered): take them first, so no request that
        // was answered is sent again (and answered twice).
        connections[index].socket.readQueued()
        connections[index].socket.close()
        connections[index].monitor.close()
        do {
            (connections[index].socket, connections[index].monitor) = try open(connections[index].endpoint, index: index, watched: isPair,
                                                                               connectingAfter: Self.reconnectInterval)
        } catch {
            // Only a context being shut down refuses a socket: the process is ending.
            close()
            return
        }
        // Sent on the connection that dropped: in flight with it, and maybe lost.
        let lost = pending.filter { $0.value.sentOn == index }.map(\.key)
        for id in lost {
            if pending[id]!.parts > 0 {
                endStream(id, .streamEnded("the connection to the kernel dropped", parts: pending[id]!.parts, reason: "connection_lost",
                                           service: pending[id]!.service))
                continue
            }
            // Only a connection that got through its handshake may have delivered it.
            if delivered { pending[id]!.losses += 1 }
            let losses = pending[id]!.losses
            guard !resendAfterReconnect || losses > Self.maxResends else {
                if isPair {
                    // The other kernel of a pair takes it (it may have to take over first).
                    pending[id]!.sentOn = nil
                } else if let message = pending[id]!.message {
                    // A lone kernel gets it again once it is back (the new socket holds
                    // it until then).
                    counters.resent += 1
                    connections[index].socket.send(message)
                }
                continue
            }
            let request = pending.removeValue(forKey: id)!
            remember(id, answered: false)
            request.complete(.failure(.remote(service: request.service, resendAfterReconnect
                ? .handlerDied("the connection to the kernel", times: losses, service: request.service,
                               otherCause: "the kernel ends new connections, near its limit on open files: its log says so")
                : .outcomeUnknown(request.service, JSONRPCError.connectionDropped))))
        }
        opaqueLost(on: index, delivered: delivered)
        if isPair { sendWaiting() }
    }

    /// A pair's kernel that sent no byte for ``pairStoppedTimeout`` while requests wait on
    /// it: its process is stopped, and its connection is given up as if it dropped.
    private func checkForStoppedKernels(now: UInt64) {
        guard isPair, case .open = lifecycle, now >= nextStopCheck else { return }
        nextStopCheck = now + Self.stopCheckInterval
        for index in connections.indices where connections[index].connected {
            guard let quiet = connections[index].tcp?.sinceDataReceived, quiet > Self.pairStoppedTimeout,
                  pending.values.contains(where: { $0.sentOn == index }) || opaque.values.contains(where: { $0.contains { $0.sentOn == index } })
            else { continue }
            connectionLost(index)
        }
    }

    var isConnected: Bool { connections.contains { $0.handshaken } }

    func connectionSummary() -> String {
        connections.map { connection in
            if connection.handshakeFailures > 0, !connection.handshaken {
                // Both ends of a mismatch see a failed handshake: say which side this one
                // took, and what the event said of why.
                let times = connection.handshakeFailures == 1 ? "once" : "\(connection.handshakeFailures) times"
                let keys = "sb uses client.key and kernel.pub from --key-dir, default data/keys, or --server-key and --key-file"
                switch (connection.handshakeProblem, curve == nil) {
                case (.keyRefused, _):
                    return "\(connection.endpoint) refused this client's handshake \(times) (the kernel there does not allow this client's key: \(keys); "
                        + "to let a key in, copy its .pub into the kernel's KEYS/clients/ and run sb reload there)"
                case (.mechanismMismatch, true):
                    return "\(connection.endpoint) refused this client's handshake \(times) (this client spoke plain text, and a kernel with CURVE on answers only CURVE clients: \(keys))"
                case (.mechanismMismatch, false):
                    return "\(connection.endpoint) refused this client's handshake \(times) (this client spoke CURVE, which a kernel with CURVE off does not: \(keys))"
                // Ended unsaid, as a kernel's refusal often is too (its reason comes after the
                // connection is gone): every cause that fits.
                case (_, false):
                    return "\(connection.endpoint) refused this client's handshake \(times) (nothing there took it: this client spoke CURVE, which a kernel with CURVE off does not; or the server key is not that kernel's; or the endpoint is not a kernel's broker: \(keys))"
                case (_, true):
                    return "\(connection.endpoint) ended this client's handshake \(times) unsaid (this client spoke plain text, and a kernel with CURVE on answers only CURVE clients; or the endpoint is not a kernel's broker: another program, or a kernel's state endpoint: \(keys))"
                }
            }
            if !connection.everConnected { return "nothing accepted a connection at \(connection.endpoint) (is the kernel running there?)" }
            if !connection.everHandshaken, connection.drops > 0, !connection.connected {
                // Taken and ended again and again, never a ZeroMQ peer: another program listens there.
                let taken = connection.drops == 1 ? "took a connection, and it" : "took \(connection.drops) connections, and each"
                return "\(connection.endpoint) \(taken) ended without a ZeroMQ handshake (not a kernel's broker endpoint: another program listens there)"
            }
            let drops = connection.drops == 0 ? "" : ", and the connection dropped \(connection.drops) time\(connection.drops == 1 ? "" : "s")"
            if connection.connected, !connection.handshaken {
                // The system accepted the connection (a listening socket's backlog), and no
                // ZeroMQ peer took it up.
                return "\(connection.endpoint) accepted a connection, but nothing there answered its handshake\(drops) (a kernel stopped, or out of open files, or not a kernel)"
            }
            if connection.connected, connection.drops == 0 {
                // A ZeroMQ peer took the handshake and answers nothing: a kernel too busy to,
                // or a socket of another kind that takes a client's messages (a kernel's
                // state snapshot endpoint does).
                return "\(connection.endpoint) is connected, and nothing answered (a kernel too busy, or not a kernel's broker endpoint)"
            }
            return "\(connection.endpoint) is \(connection.connected ? "connected" : "not connected now")\(drops)"
        }.joined(separator: "; ")
    }

    private func remember(_ id: Int64, answered: Bool) {
        finished[id] = answered
        finishedOrder.append(id)
        if finishedOrder.count > Self.finishedMemory {
            let forgotten = finishedOrder.removeFirst()
            finished.removeValue(forKey: forgotten)
        }
    }

    func sendOpaque(service: String, message: Message, timeout: Duration, continuation: UnsafeContinuation<Result<[Frame], BusError>, Never>) {
        guard case .open = lifecycle else {
            continuation.resume(returning: .failure(.closed))
            return
        }
        let now = clock.now
        let target = destination() ?? current
        // A place given up is given up before this request takes the next one.
        forgetTimedOutOpaque(service, now: now)
        opaque[service, default: []].append(OpaquePending(continuation: continuation, deadline: now + timeout.nanoseconds, timeout: timeout,
                                                           message: message, sentOn: target))
        sweepWhileWaiting()
        connections[target].socket.send(message)
    }

    /// The opaque requests sent on a connection that dropped. One it may have delivered fails
    /// at once (with no id, a repeat could not be told from a new request, so it is not sent
    /// again); one it cannot have delivered goes out again; the places of timed-out ones go,
    /// as their replies will not come.
    private func opaqueLost(on connection: Int, delivered: Bool) {
        for (service, waiting) in opaque where waiting.contains(where: { $0.sentOn == connection }) {
            opaque[service] = waiting.compactMap { request in
                guard request.sentOn == connection else { return request }
                guard let continuation = request.continuation else { return nil }
                guard !delivered else {
                    continuation.resume(returning: .failure(.remote(service: service, .outcomeUnknown(service, JSONRPCError.connectionDropped))))
                    return nil
                }
                var again = request
                again.sentOn = destination() ?? connection
                counters.resent += 1
                connections[again.sentOn].socket.send(request.message)
                return again
            }
        }
    }

    /// A kernel that is not active refused an opaque request (-32008): it goes to the other
    /// kernel of the pair, unless that one refused lately too (or there is none), when the
    /// refusal is its answer.
    private func opaqueNotActive(_ refusal: ClientReply, from connection: Int) {
        guard var waiting = opaque[refusal.service], let first = waiting.firstIndex(where: { $0.sentOn == connection }) else { return }
        var request = waiting.remove(at: first)
        defer { opaque[refusal.service] = waiting }
        guard let continuation = request.continuation else {
            counters.lateReplies += 1
            return
        }
        let now = clock.now
        guard let other = connections.indices.first(where: { $0 != connection }), now &- connections[other].refusedAt >= Self.refusalPause else {
            continuation.resume(returning: .success(refusal.body))
            return
        }
        // On its socket even before it connects (libzmq holds it until then); the last of
        // those sent to that kernel, as their replies come in order.
        request.sentOn = other
        waiting.append(request)
        connections[other].socket.send(request.message)
    }

    /// Drops the places of `service`'s timed-out opaque requests that are past being kept.
    private func forgetTimedOutOpaque(_ service: String, now: UInt64) {
        guard let waiting = opaque[service], waiting.contains(where: { $0.isForgotten(at: now) }) else { return }
        opaque[service] = waiting.filter { !$0.isForgotten(at: now) }
    }

    /// The opaque reply for `service` that came on `connection`: to the first request sent
    /// there, or dropped as late when that one timed out.
    private func receivedOpaque(_ reply: ClientReply, on connection: Int) {
        forgetTimedOutOpaque(reply.service, now: clock.now)
        guard var waiting = opaque[reply.service], let first = waiting.firstIndex(where: { $0.sentOn == connection }) else { return }
        let request = waiting.remove(at: first)
        opaque[reply.service] = waiting
        if let continuation = request.continuation {
            continuation.resume(returning: .success(reply.body))
        } else {
            counters.lateReplies += 1
        }
    }

    /// Ends the requests of a cancelled task with ``BusError/cancelled(service:method:)``.
    func cancel(ids: [Int64]) {
        for id in ids {
            guard let request = pending.removeValue(forKey: id) else {
                // Not finished either: its send is still on its way to the loop.
                if finished[id] == nil, case .open = lifecycle { cancelledBeforeSending.insert(id) }
                continue
            }
            remember(id, answered: false)
            sendCancel(of: request)
            request.complete(.failure(.cancelled(service: request.service, method: request.method)))
        }
    }

    /// Tells the kernel that `request`, a reply in parts it was sent, is read no more (a
    /// CANCEL, the client extension), whether a part came yet or not, so its worker stops
    /// making parts nobody reads and frees its place. A kernel that does not know CANCEL
    /// drops it, and the worker runs to its end as before.
    private func sendCancel(of request: Pending) {
        guard request.onPart != nil, let sentOn = request.sentOn, let message = request.message, let cancel = MDP.cancel(of: message) else { return }
        connections[sentOn].socket.send(cancel)
    }

    /// A reply, read where the socket received it: a JSON-RPC reply's one body part is parsed
    /// in place, and frames are made only of a part or an opaque reply.
    func received(_ parts: ReceivedParts, on connection: Int) {
        guard let isFinal = try? MDP.clientReplyIsFinal(parts) else { return }
        func reply() -> ClientReply {
            ClientReply(service: String(decoding: parts[MDP.clientReplyService], as: UTF8.self),
                        body: Array(parts.frames(from: MDP.clientReplyBody)), isFinal: isFinal)
        }
        guard isFinal else { return receivedPart(reply()) }
        let responses = parts.count == MDP.clientReplyBody + 1 ? try? JSONRPC.parseResponses(parts[MDP.clientReplyBody]) : nil
        if let responses, !responses.isEmpty, responses.allSatisfy(\.isNotActive) {
            // Refusing no id of this client's, it refuses an opaque request.
            let refusesOpaque = !responses.contains { response in
                if case .number(let id) = response.id { Self.idCounter.handedOut(id) } else { false }
            }
            notActive(responses, from: connection)
            if refusesOpaque { opaqueNotActive(reply(), from: connection) }
            return
        }
        var matched = false
        for response in responses ?? [] {
            guard case .number(let id) = response.id else { continue }
            guard let request = pending.removeValue(forKey: id) else {
                switch finished[id] {
                case true?: counters.duplicateReplies += 1
                case false?: counters.lateReplies += 1
                case nil: break
                }
                // One of this client's ids, even one finished too long ago to be remembered,
                // is never an opaque request's reply.
                matched = matched || Self.idCounter.handedOut(id)
                continue
            }
            matched = true
            remember(id, answered: true)
            switch response.outcome {
            case .success(let result):
                request.complete(.success(result))
            case .failure(let error) where error.code == JSONRPCError.serviceUnavailableCode:
                request.complete(.failure(.unavailable(service: request.service, message: error.message)))
            case .failure(let error):
                request.complete(.failure(.remote(service: request.service, error)))
            }
        }
        if !matched, !opaque.isEmpty { receivedOpaque(reply(), on: connection) }
    }

    /// One part of a reply in parts: to its stream's reader, if it still reads.
    private func receivedPart(_ reply: ClientReply) {
        guard let (id, part) = Self.part(of: reply.body), case .number(let number) = id else { return }
        guard let onPart = pending[number]?.onPart else { return }
        guard onPart(part, reply.body.reduce(0) { $0 + $1.count }) else {
            let request = pending[number]!
            sendCancel(of: request)
            return endStream(number, .streamEnded("this reader fell a whole buffer of parts behind", parts: request.parts, reason: "reader_behind",
                                                  service: request.service))
        }
        pending[number]!.parts += 1
        pending[number]!.deadline = clock.now + pending[number]!.timeout.nanoseconds
    }

    /// A PARTIAL's id and part: one frame `{"id","jsonrpc","part"}`; or, from a request to
    /// every worker, the worker's tag and its answer (`{"worker", "result"}` or `{"worker",
    /// "error"}`), or one of its own parts (`{"worker", "part"}`), with `"cell"` when
    /// another cell's worker answered.
    static func part(of body: [Frame]) -> (id: JSONRPCID, part: JSONValue)? {
        if body.count == 1 { return try? JSONRPC.parsePart(body[0].bytes) }
        guard body.count == 2, let tag = try? JSONValue(parsing: body[0].bytes), let worker = tag["worker"] else { return nil }
        var part: [String: JSONValue] = ["worker": worker]
        if let cell = tag["cell"] { part["cell"] = cell }
        if tag["partial"] == true {
            guard let (id, answer) = try? JSONRPC.parsePart(body[1].bytes) else { return nil }
            part["part"] = answer
            return (id, .object(part))
        }
        guard let response = try? JSONRPC.parseResponses(body[1].bytes).first else { return nil }
        switch response.outcome {
        case .success(let result): part["result"] = result
        case .failure: part["error"] = response.json["error"] ?? .null
        }
        return (response.id, .object(part))
    }

    /// Ends a reply in parts early on this side, telling its reader why.
    private func endStream(_ id: Int64, _ error: JSONRPCError) {
        guard let request = pending.removeValue(forKey: id) else { return }
        remember(id, answered: false)
        request.complete(.failure(.remote(service: request.service, error)))
    }

    /// A kernel that is not active refused a message: its requests go to the other kernel
    /// (or wait a moment, when both refused lately); until their deadline, the refusal is
    /// what they fail with.
    private func notActive(_ responses: [JSONRPCResponse], from connection: Int) {
        connections[connection].refusedAt = clock.now
        for response in responses {
            guard case .number(let id) = response.id, pending[id]?.sentOn == connection else { continue }
            pending[id]!.sentOn = nil
            if case .failure(let error) = response.outcome { refusals[id] = error.message }
        }
        sendWaiting()
    }

    /// The last "not active" answer each waiting request got, for its time-out message.
    private var refusals: [Int64: String] = [:]
    /// When a pair's connections are next looked at for a stopped kernel.
    private var nextStopCheck: UInt64 = 0

    private func sweep() {
        let now = clock.now
        checkForStoppedKernels(now: now)
        if !pending.isEmpty {
            sendWaiting()
            let expired = pending.filter { $0.value.deadline <= now }
            for (id, request) in expired {
                pending.removeValue(forKey: id)
                remember(id, answered: false)
                if let refusal = refusals.removeValue(forKey: id) {
                    let kernels = connections.map(\.endpoint).joined(separator: ", ")
                    request.complete(.failure(.unavailable(service: request.service, message: "no kernel of \(kernels) is active: \(refusal)")))
                } else {
                    request.complete(.failure(.timedOut(service: request.service, method: request.method, after: request.timeout)))
                }
            }
        }
        if refusals.count > pending.count { refusals = refusals.filter { pending[$0.key] != nil } }
        for (service, waiting) in opaque where waiting.contains(where: { $0.deadline <= now }) {
            opaque[service] = waiting.compactMap { request in
                guard request.deadline <= now else { return request }
                guard let continuation = request.continuation else { return request.isForgotten(at: now) ? nil : request }
                continuation.resume(returning: .failure(.timedOut(service: service, method: "(opaque)", after: request.timeout)))
                var timedOut = request
                timedOut.continuation = nil
                return timedOut
            }
        }
        if pending.isEmpty && opaque.values.allSatisfy(\.isEmpty) {
            sweeper?.cancel()
            sweeper = nil
        }
    }

    func close() {
        for connection in connections {
            // What the client sent last (the CANCEL of a reply in parts it stopped reading, as
            // an interrupted `sb stream sub` sends) still leaves as the process ends: its
            // context waits for it for at most this long.
            try? connection.socket.socket.set(.linger, 100)
            connection.socket.close()
            connection.monitor.close()
        }
        connections.removeAll()
        lifecycle = .closed
        sweeper?.cancel()
        for request in pending.values { request.complete(.failure(.closed)) }
        pending.removeAll()
        for waiting in opaque.values { for request in waiting { request.continuation?.resume(returning: .failure(.closed)) } }
        opaque.removeAll()
    }
}

extension JSONRPCResponse {
    /// Whether it says the kernel that sent it is not the active one of its pair.
    var isNotActive: Bool {
        if case .failure(let error) = outcome { error.code == JSONRPCError.notActiveCode } else { false }
    }
}

/// Gathers the outcomes of a batch's requests and hands them over once all are in.
/// Used on the client's loop thread only.
final class BatchCollector {
    private var results: [Result<JSONValue, BusError>?]
    private var remaining: Int
    private let done: ([Result<JSONValue, BusError>]) -> Void

    init(count: Int, done: @escaping ([Result<JSONValue, BusError>]) -> Void) {
        results = Array(repeating: nil, count: count)
        remaining = count
        self.done = done
    }

    func complete(_ index: Int, _ result: Result<JSONValue, BusError>) {
        guard results[index] == nil else { return }
        results[index] = result
        remaining -= 1
        if remaining == 0 { done(results.map { $0! }) }
    }
}

/// Request ids unique within the process, counted from a random start far above the numbers
/// people write by hand (1, 2, 42): an opaque request (``BusClient/call(service:body:timeout:)``)
/// may carry JSON-RPC of its own, with ids of its own, and its reply must not be taken for the
/// answer to one of the client's requests, nor theirs for its. Every id stays under 2^53, exact
/// as a JSON number in any language.
final class IDCounter: Sendable {
    /// Ids handed out are above it.
    let start: Int64
    private let value: Atomic<Int64>

    init(start: Int64 = .random(in: (1 << 40)..<(1 << 41))) {
        self.start = start
        value = Atomic(start)
    }

    func next() -> Int64 { value.add(1, ordering: .relaxed).newValue }

    /// Whether `id` is one this counter handed out.
    func handedOut(_ id: Int64) -> Bool { id > start && id <= value.load(ordering: .relaxed) }
}
