import ArgumentParser
import BusProtocol
import Foundation
import ZeroMQ

/// The JSON-RPC codec on its own: parsing a request body and encoding a reply, the work
/// every request costs a service on top of the transport.
struct JSONBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "json",
        abstract: "Parse a JSON-RPC request and encode a reply: time per operation."
    )

    @Option(help: "Operations per measurement.")
    var count = 100_000

    func run() throws { printTable(try measure()) }

    /// The figures, as table rows.
    func measure() throws -> [Row] {
        let request = Array(#"{"jsonrpc":"2.0","id":42,"method":"articles.save","params":{"article":{"source":{"id":null,"name":"BBC News"},"author":"A. Writer","title":"A headline of some length","url":"https://example.com/a","publishedAt":"2026-11-21T10:00:00Z","score":1.5,"read":false}}}"#.utf8)
        // As `sb bench` sends the echo service's echo: a trace context and the client's id.
        let traced = Array(#"{"client":"sb-3f2a9c1e","id":1207,"jsonrpc":"2.0","method":"echo","params":{"text":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"},"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}"#.utf8)
        let reply = JSONRPCResponse(id: .number(42), result: ["ids": ["bbc-news", "cnn", "the-verge"], "selectedAt": "2026-11-21T10:00:00.000Z"])
        var rows: [Row] = []
        rows.append(measure("parse a request (JSONRPC.parseRequests)") {
            if case .single(.request(let parsed)) = JSONRPC.parseRequests(request) { return parsed.method.count }
            return 0
        })
        rows.append(measure("parse a traced request as sb sends it") {
            if case .single(.request(let parsed)) = JSONRPC.parseRequests(traced) { return parsed.method.count }
            return 0
        })
        let sent = JSONRPCRequest(id: .number(1207), method: "echo", paramsText: Array(#"{"text":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#.utf8),
                                  trace: .init(parent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"), client: "sb-3f2a9c1e")
        rows.append(measure("encode a traced request as sb sends it (JSONRPCRequest.jsonBytes)") { sent.jsonBytes.count })
        rows.append(measure("encode a reply (JSONRPCResponse.jsonBytes)") { reply.jsonBytes.count })
        let replyBytes = reply.jsonBytes
        rows.append(measure("parse a reply (JSONRPC.parseResponses)") { (try? JSONRPC.parseResponses(replyBytes).count) ?? 0 })
        return rows
    }

    private func measure(_ name: String, _ operation: () -> Int) -> Row {
        var sink = 0
        for _ in 0..<1_000 { sink &+= operation() }
        let start = monotonicNanoseconds()
        for _ in 0..<count { sink &+= operation() }
        let elapsed = Double(monotonicNanoseconds() - start)
        return Row(name, rate: Double(count) / (elapsed / 1e9), note: String(format: "%.2f µs per operation (%d)", elapsed / Double(count) / 1_000, sink % 2))
    }
}
