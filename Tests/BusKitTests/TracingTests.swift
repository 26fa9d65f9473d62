@testable import Contracts
import Testing
import W3CTraceContext

@Suite struct TracingTests {
    @Test("a traceparent written in place is the one W3CTraceContext writes, and reads back as the same trace")
    func traceParentInPlace() throws {
        var contexts = [
            TraceContext(traceID: .fresh(), spanID: .fresh(), flags: [], state: TraceState()),
            TraceContext(traceID: .fresh(), spanID: .fresh(), flags: .sampled, state: TraceState()),
            TraceContext(traceID: TraceID(bytes: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff)),
                         spanID: SpanID(bytes: (0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89)), flags: TraceFlags(rawValue: 0x10), state: TraceState()),
        ]
        for _ in 0..<100 { contexts.append(TraceContext(traceID: .fresh(), spanID: .fresh(), flags: .sampled, state: TraceState())) }
        for context in contexts {
            let written = BusTracing.traceParent(of: context)
            #expect(written == context.traceParentHeaderValue)
            #expect(try TraceContext(traceParentHeaderValue: written) == context)
        }
        #expect(BusTracing.traceParent(of: contexts[2]) == "00-000000000000000000000000000000ff-abcdef0123456789-10")
    }
}
