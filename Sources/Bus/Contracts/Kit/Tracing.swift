public import BusProtocol
public import Instrumentation
public import Logging
import Synchronization
public import Tracing
public import W3CTraceContext

/// W3C trace context on the bus, through swift-distributed-tracing's instrumentation API.
///
/// A request carries `traceparent` (and `tracestate` when there is one) as members of its
/// JSON-RPC object, beside `method` and `params`: a JSON-RPC peer ignores members it does not
/// know, and a plain 7/MDP peer never reads bodies. A client sends the trace of the task it
/// runs in (`InstrumentationContext.current`) or starts one; a service runs each handler in
/// the trace it received, so its own requests continue it, and its log lines carry
/// `trace_id` (``loggingMetadata``). A trace with the `sampled` flag (`sb request --trace`)
/// is logged by every service it reaches, once per request.
///
/// Processes opt in with ``bootstrap()``, or with ``bootstrap(spansWith:)`` when they export
/// spans (OpenTelemetry, the Telemetry module): then each request is also a span, at the
/// client (``withClientSpan(service:method:_:)``) and around its handler, parented by the
/// same members.
public enum BusTracing {
    /// The trace a task runs in, in its `InstrumentationContext`.
    public enum Key: InstrumentationContextKey {
        public typealias Value = TraceContext
        public static let nameOverride: String? = "w3c-trace-context"
    }

    /// Propagation of ``Key`` as `traceparent`/`tracestate`: each request sent gets a span id
    /// of its own under the sender's trace.
    public struct Propagation: Instrument {
        public init() {}

        public func extract<Carrier, Extract: Extractor>(_ carrier: Carrier, into context: inout InstrumentationContext, using extractor: Extract)
        where Extract.Carrier == Carrier {
            guard let parent = extractor.extract(key: "traceparent", from: carrier),
                  let trace = Self.trace(parent: parent, state: extractor.extract(key: "tracestate", from: carrier))
            else { return }
            context[Key.self] = trace
        }

        public func inject<Carrier, Inject: Injector>(_ context: InstrumentationContext, into carrier: inout Carrier, using injector: Inject)
        where Inject.Carrier == Carrier {
            guard let trace = context[Key.self] else { return }
            let members = Self.members(sentIn: trace)
            if let parent = members.parent { injector.inject(parent, forKey: "traceparent", into: &carrier) }
            if let state = members.state, !state.isEmpty { injector.inject(state, forKey: "tracestate", into: &carrier) }
        }

        /// The trace a request's members name (nil: none readable). What ``extract`` reads, and
        /// ``BusTracing/context(of:)`` without the instrument API.
        static func trace(parent: String, state: String?) -> TraceContext? {
            try? TraceContext(traceParentHeaderValue: parent, traceStateHeaderValue: state)
        }

        /// The members of a request sent in `trace`: the same trace, a span of its own. What
        /// ``inject`` writes, and ``BusTracing/outgoing()`` without the instrument API.
        static func members(sentIn trace: TraceContext) -> JSONRPCRequest.Trace {
            let sent = TraceContext(traceID: trace.traceID, spanID: .fresh(), flags: trace.flags, state: trace.state)
            return JSONRPCRequest.Trace(parent: traceParent(of: sent), state: sent.traceStateHeaderValue)
        }
    }

    /// A trace of its own (not sampled) for a request sent outside any.
    private static func untracedStart() -> TraceContext {
        TraceContext(traceID: .fresh(), spanID: .fresh(), flags: [], state: TraceState())
    }

    /// Makes ``Propagation`` the process's instrument (once per process, at start).
    public static func bootstrap() {
        InstrumentationSystem.bootstrap(Propagation())
        mode.store(Mode.propagation.rawValue, ordering: .releasing)
    }

    /// Makes ``Propagation`` and `tracer` the process's instruments, and records a span for
    /// every request sent and answered. The tracer's propagation writes `traceparent` last,
    /// so a request's parent is the span that sent it.
    public static func bootstrap(spansWith tracer: any Tracer) {
        InstrumentationSystem.bootstrap(MultiplexInstrument([Propagation(), tracer]))
        mode.store(Mode.spans.rawValue, ordering: .releasing)
    }

    /// What this process bootstrapped. With ``Propagation`` alone (every `switchboard` piece
    /// and `sb` without telemetry) a request's trace members are written and read here at
    /// once: through the instrument API each request took a lock, a dynamic cast, an
    /// existential call, a context dictionary of its own and a header built by interpolation.
    private enum Mode: UInt8 { case unknown, propagation, spans }
    private static let mode = Atomic<UInt8>(Mode.unknown.rawValue)
    private static var propagatesAlone: Bool { mode.load(ordering: .acquiring) == Mode.propagation.rawValue }

    /// Whether requests are spans (a tracer is bootstrapped); when not, no span is begun, so a
    /// bus without telemetry pays nothing for them.
    public static var recordsSpans: Bool { mode.load(ordering: .acquiring) == Mode.spans.rawValue }

    /// Runs `body`, which sends one request, in a client span named `service/method` (none
    /// inside a trace that is not sampled: it would not be recorded).
    public static func withClientSpan<T, E: Error>(service: String, method: String, _ body: () async throws(E) -> T) async throws(E) -> T {
        let context = InstrumentationContext.current ?? .topLevel
        guard recordsSpans(in: context) else { return try await body() }
        return try await withSpan(service: service, method: method, kind: .client, context: context, body)
    }

    /// Whether a span begun in `context` would be recorded: always at the root of a trace
    /// (the tracer's sampler decides), and in a trace only when it is sampled. An unsampled
    /// request (most, at a sampling rate below 1) then costs no span anywhere.
    static func recordsSpans(in context: InstrumentationContext?) -> Bool {
        guard recordsSpans else { return false }
        guard let trace = context?[Key.self] else { return true }
        return trace.flags.contains(.sampled)
    }

    /// Runs `body` in a span of `kind` under `context`, with the RPC's attributes; an error
    /// thrown, or a JSON-RPC error answered (``markFailed(_:)``), marks it failed.
    static func withSpan<T, E: Error>(service: String, method: String, kind: SpanKind, context: InstrumentationContext,
                                      _ body: () async throws(E) -> T) async throws(E) -> T {
        let span = startSpan(service: service, method: method, kind: kind, context: context)
        defer { span.end() }
        let outcome: Result<T, E> = await InstrumentationContext.withValue(span.context) {
            do throws(E) { return .success(try await body()) } catch { return .failure(error) }
        }
        if case .failure(let error) = outcome { markFailed(span, error) }
        return try outcome.get()
    }

    /// A span named `service/method`, of `kind`, under `context`, with the RPC's attributes.
    private static func startSpan(service: String, method: String, kind: SpanKind, context: InstrumentationContext) -> any Span {
        let span = InstrumentationSystem.tracer.startSpan("\(service)/\(method)", context: context, ofKind: kind)
        span.attributes["rpc.system"] = "jsonrpc"
        span.attributes["rpc.service"] = service
        span.attributes["rpc.method"] = method
        return span
    }

    /// The client span of a request whose answer ends apart from the task that sent it (one
    /// answered in parts, read as they come): the request carries ``outgoing``, so the
    /// service's span is its child, and it ends when the answer does (``end(failedWith:)``).
    public struct ClientSpan: Sendable {
        let span: any Span

        /// The trace members for the request: this span's trace, the span its parent.
        public var outgoing: JSONRPCRequest.Trace? { InstrumentationContext.withValue(span.context) { BusTracing.outgoing() } }

        /// Ends the span; with `error`, failed.
        public func end(failedWith error: (any Error)?) {
            if let error { markFailed(span, error) }
            span.end()
        }
    }

    /// A ``ClientSpan`` for a request to `service`'s `method` sent now, in the current task's
    /// trace; nil where it would not be recorded (``withClientSpan(service:method:_:)``'s rule).
    public static func startClientSpan(service: String, method: String) -> ClientSpan? {
        let context = InstrumentationContext.current ?? .topLevel
        guard recordsSpans(in: context) else { return nil }
        return ClientSpan(span: startSpan(service: service, method: method, kind: .client, context: context))
    }

    /// Records the kernel's part in a request it routed to `service`: a span from when the
    /// request arrived (`received`) to when its reply left (`answered`), both on the monotonic
    /// clock whose reading now is `now`, under the trace the request carries. The kernel does
    /// not parse bodies: only the `traceparent` member's value is looked for, and only while
    /// spans are recorded. A request without one, or in a trace not sampled, makes no span.
    public static func recordDispatch(service: String, body: Frame, received: UInt64, answered: UInt64, now: UInt64) {
        // A traceparent ends in its flags, "01" when sampled: an unsampled one makes no span.
        guard let parent = body.withUnsafeBytes({ traceParent(in: $0) }), let flags = UInt8(parent.suffix(2), radix: 16), flags & 1 == 1 else { return }
        var context = InstrumentationContext.topLevel
        InstrumentationSystem.instrument.extract(JSONRPCRequest.Trace(parent: parent), into: &context, using: TraceMembers())
        let wallNow = DefaultTracerClock.now.nanosecondsSinceEpoch
        func wall(_ monotonic: UInt64) -> Instant { Instant(nanosecondsSinceEpoch: wallNow &- (now &- monotonic)) }
        let span = InstrumentationSystem.tracer.startSpan("kernel dispatch \(service)", context: context, ofKind: .server, at: wall(received))
        span.attributes["rpc.system"] = "jsonrpc"
        span.attributes["rpc.service"] = service
        span.end(at: wall(answered))
    }

    /// A point in time as a span takes it.
    struct Instant: TracerInstant {
        var nanosecondsSinceEpoch: UInt64
        static func < (lhs: Self, rhs: Self) -> Bool { lhs.nanosecondsSinceEpoch < rhs.nanosecondsSinceEpoch }
    }

    /// The value of the first `"traceparent"` member in a JSON-RPC body (a request, or the
    /// first of a batch that has one), found by its bytes alone.
    static func traceParent(in body: UnsafeRawBufferPointer) -> String? {
        let name = Array(#""traceparent""#.utf8)
        guard body.count > name.count else { return nil }
        var index = 0
        while index + name.count <= body.count {
            guard body[index] == UInt8(ascii: "\""), body[index..<index + name.count].elementsEqual(name) else {
                index += 1
                continue
            }
            var cursor = index + name.count
            func skipSpace() { while cursor < body.count, [0x20, 0x09, 0x0A, 0x0D].contains(body[cursor]) { cursor += 1 } }
            skipSpace()
            guard cursor < body.count, body[cursor] == UInt8(ascii: ":") else { index += 1; continue }
            cursor += 1
            skipSpace()
            // A W3C traceparent is 55 characters of [0-9a-f-]: no escapes to undo.
            guard cursor + 56 < body.count, body[cursor] == UInt8(ascii: "\""), body[cursor + 56] == UInt8(ascii: "\"") else { return nil }
            return String(decoding: UnsafeRawBufferPointer(rebasing: body[cursor + 1..<cursor + 56]), as: UTF8.self)
        }
        return nil
    }

    static func markFailed(_ span: any Span, _ error: any Error) {
        if let rpc = error as? JSONRPCError { span.attributes["rpc.jsonrpc.error_code"] = rpc.code }
        span.recordError(error)
        span.setStatus(SpanStatus(code: .error))
    }

    /// The trace id `context` carries, as the tracer writes it into `traceparent`.
    static func traceID(of context: InstrumentationContext) -> String? {
        var carrier = JSONRPCRequest.Trace()
        InstrumentationSystem.instrument.inject(context, into: &carrier, using: TraceMembers())
        guard let parent = carrier.parent, let trace = try? TraceContext(traceParentHeaderValue: parent, traceStateHeaderValue: nil) else { return nil }
        return "\(trace.traceID)"
    }

    /// `trace_id` and `span_id` of the current task's trace, for every log line
    /// (`LoggingSystem.bootstrap(_:metadataProvider:)`).
    public static let loggingMetadata = Logger.MetadataProvider {
        guard let trace = InstrumentationContext.current?[Key.self] else { return [:] }
        return ["trace_id": "\(trace.traceID)", "span_id": "\(trace.spanID)"]
    }

    /// Runs `body` in a new trace, `sampled` or not (a sampled trace is logged by every
    /// service it reaches), handing it the trace id.
    /// When spans are recorded, the trace is the tracer's: a root span around `body` (its
    /// sampling is the tracer's too).
    public static func withNewTrace<T>(sampled: Bool, _ body: (_ traceID: String) async throws -> T) async rethrows -> T {
        if recordsSpans {
            let span = InstrumentationSystem.tracer.startSpan("trace", context: InstrumentationContext.current ?? .topLevel, ofKind: .internal)
            defer { span.end() }
            return try await InstrumentationContext.withValue(span.context) { try await body(traceID(of: span.context) ?? "") }
        }
        var context = InstrumentationContext.current ?? .topLevel
        let trace = TraceContext(traceID: .fresh(), spanID: .fresh(), flags: sampled ? .sampled : [], state: TraceState())
        context[Key.self] = trace
        return try await InstrumentationContext.withValue(context) { try await body("\(trace.traceID)") }
    }

    /// The trace members for a request sent now: the current task's trace continued, or a
    /// new one (unsampled). None unless an instrument is bootstrapped.
    public static func outgoing() -> JSONRPCRequest.Trace? {
        if propagatesAlone {
            return Propagation.members(sentIn: InstrumentationContext.current?[Key.self] ?? untracedStart())
        }
        let instrument = InstrumentationSystem.instrument
        if instrument is NoOpInstrument { return nil }
        var context = InstrumentationContext.current ?? .topLevel
        if context[Key.self] == nil { context[Key.self] = untracedStart() }
        var carrier = JSONRPCRequest.Trace()
        instrument.inject(context, into: &carrier, using: TraceMembers())
        return carrier.parent == nil ? nil : carrier
    }

    /// Runs `body` in the trace `trace` carries, when it carries one: for a request that
    /// arrived by another way (the gateway's HTTP `traceparent` header).
    public static func withTrace<T, E: Error>(_ trace: JSONRPCRequest.Trace?, _ body: () async throws(E) -> T) async throws(E) -> T {
        guard let context = context(of: trace) else { return try await body() }
        let outcome: Result<T, E> = await InstrumentationContext.withValue(context) {
            do throws(E) { return .success(try await body()) } catch { return .failure(error) }
        }
        return try outcome.get()
    }

    /// The context a received request runs in: the current one with the request's trace.
    static func context(of trace: JSONRPCRequest.Trace?) -> InstrumentationContext? {
        guard let trace, let parent = trace.parent else { return nil }
        var context = InstrumentationContext.current ?? .topLevel
        if propagatesAlone {
            if let received = Propagation.trace(parent: parent, state: trace.state) { context[Key.self] = received }
        } else {
            InstrumentationSystem.instrument.extract(trace, into: &context, using: TraceMembers())
        }
        return context
    }

    /// `trace`'s `traceparent` value (W3C Trace Context, version 00):
    /// `00-<trace id, 32 hex>-<span id, 16 hex>-<flags, 2 hex>`, lowercase, written in place.
    static func traceParent(of trace: TraceContext) -> String {
        String(unsafeUninitializedCapacity: 55) { buffer in
            let digits: StaticString = "0123456789abcdef"
            var at = 0
            func put(_ byte: UInt8) {
                buffer[at] = byte
                at += 1
            }
            func hex(_ byte: UInt8) {
                put(digits.utf8Start[Int(byte >> 4)])
                put(digits.utf8Start[Int(byte & 0x0F)])
            }
            put(UInt8(ascii: "0")); put(UInt8(ascii: "0")); put(UInt8(ascii: "-"))
            withUnsafeBytes(of: trace.traceID.bytes) { for byte in $0 { hex(byte) } }
            put(UInt8(ascii: "-"))
            withUnsafeBytes(of: trace.spanID.bytes) { for byte in $0 { hex(byte) } }
            put(UInt8(ascii: "-"))
            hex(trace.flags.rawValue)
            return at
        }
    }

    /// Whether `context` carries a trace that asks to be recorded.
    static func isSampled(_ context: InstrumentationContext?) -> Bool {
        context?[Key.self]?.flags.contains(.sampled) == true
    }
}

/// Reads and writes the trace members of a request.
struct TraceMembers: Injector, Extractor {
    func inject(_ value: String, forKey key: String, into carrier: inout JSONRPCRequest.Trace) {
        switch key {
        case "traceparent": carrier.parent = value
        case "tracestate": carrier.state = value
        default: break
        }
    }

    func extract(key: String, from carrier: JSONRPCRequest.Trace) -> String? {
        switch key {
        case "traceparent": carrier.parent
        case "tracestate": carrier.state
        default: nil
        }
    }
}

/// Trace and span ids drawn from ``IDGenerator``: every request sent makes one or three.
extension TraceID {
    static func fresh() -> TraceID {
        var generator = IDGenerator()
        return .random(using: &generator)
    }
}

extension SpanID {
    static func fresh() -> SpanID {
        var generator = IDGenerator()
        return .random(using: &generator)
    }
}

/// Ids that tell traces apart without a system call each: the system generator asks the
/// kernel (`getrandom`) for every 8 bytes, three times for each request a client sends.
/// SplitMix64 over one counter seeded from it at start: distinct for 2^64 draws, and as
/// unguessable across processes as the seed (an id is a label, not a secret).
struct IDGenerator: RandomNumberGenerator {
    private static let state = Atomic<UInt64>(UInt64.random(in: .min ... .max))

    mutating func next() -> UInt64 {
        var z = Self.state.wrappingAdd(0x9E37_79B9_7F4A_7C15, ordering: .relaxed).newValue
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
