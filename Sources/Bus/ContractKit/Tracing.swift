public import BusProtocol
public import Instrumentation
public import Logging
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
/// Processes opt in with ``bootstrap()``; another instrument (an OpenTelemetry tracer) may be
/// bootstrapped instead and propagates through the same members.
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
                  let trace = try? TraceContext(traceParentHeaderValue: parent, traceStateHeaderValue: extractor.extract(key: "tracestate", from: carrier))
            else { return }
            context[Key.self] = trace
        }

        public func inject<Carrier, Inject: Injector>(_ context: InstrumentationContext, into carrier: inout Carrier, using injector: Inject)
        where Inject.Carrier == Carrier {
            guard let trace = context[Key.self] else { return }
            let sent = TraceContext(traceID: trace.traceID, spanID: .random(), flags: trace.flags, state: trace.state)
            injector.inject(sent.traceParentHeaderValue, forKey: "traceparent", into: &carrier)
            if let state = sent.traceStateHeaderValue, !state.isEmpty { injector.inject(state, forKey: "tracestate", into: &carrier) }
        }
    }

    /// Makes ``Propagation`` the process's instrument (once per process, at start).
    public static func bootstrap() {
        InstrumentationSystem.bootstrap(Propagation())
    }

    /// `trace_id` and `span_id` of the current task's trace, for every log line
    /// (`LoggingSystem.bootstrap(_:metadataProvider:)`).
    public static let loggingMetadata = Logger.MetadataProvider {
        guard let trace = InstrumentationContext.current?[Key.self] else { return [:] }
        return ["trace_id": "\(trace.traceID)", "span_id": "\(trace.spanID)"]
    }

    /// Runs `body` in a new trace, `sampled` or not (a sampled trace is logged by every
    /// service it reaches), handing it the trace id.
    public static func withNewTrace<T>(sampled: Bool, _ body: (_ traceID: String) async throws -> T) async rethrows -> T {
        var context = InstrumentationContext.current ?? .topLevel
        let trace = TraceContext(traceID: .random(), spanID: .random(), flags: sampled ? .sampled : [], state: TraceState())
        context[Key.self] = trace
        return try await InstrumentationContext.withValue(context) { try await body("\(trace.traceID)") }
    }

    /// The trace members for a request sent now: the current task's trace continued, or a
    /// new one (unsampled). None unless an instrument is bootstrapped.
    public static func outgoing() -> JSONRPCRequest.Trace? {
        let instrument = InstrumentationSystem.instrument
        if instrument is NoOpInstrument { return nil }
        var context = InstrumentationContext.current ?? .topLevel
        if context[Key.self] == nil {
            context[Key.self] = TraceContext(traceID: .random(), spanID: .random(), flags: [], state: TraceState())
        }
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
        guard let trace, trace.parent != nil else { return nil }
        var context = InstrumentationContext.current ?? .topLevel
        InstrumentationSystem.instrument.extract(trace, into: &context, using: TraceMembers())
        return context
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
