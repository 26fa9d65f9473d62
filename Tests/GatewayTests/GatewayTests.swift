import AsyncHTTPClient
import BusKit
import BusProtocol
import Contracts
import EchoService
import Foundation
@testable import Gateway
import NIOCore
import NIOHTTP1
import StreamsService
import SwitchboardConfig
import SwitchboardTestSupport
import Testing

/// A kernel, an echo service and a gateway in front of them on a free port.
struct GatewayBed {
    static let fullToken = "full-token-0123456789abcdef"
    static let echoOnlyToken = "echo-token-0123456789abcdef"
    static let clientReaderToken = "client-reader-0123456789abcdef"

    let kernel: TestKernel
    let host: ServiceHost<EchoService>
    let gateway: Task<Void, any Error>
    /// The gateway's parts beside it, stopped after it (as its ServiceGroup would).
    let gatewayClient: BusClient
    let gatewaySubscription: Subscription
    let port: Int
    let http: HTTPClient
    let bus: BusClient

    /// `queueTimeout`: the kernel's; short, so a request nobody serves is answered quickly.
    static func start(queueTimeout: Duration = .milliseconds(300), _ configure: (inout GatewaySettings) -> Void = { _ in }) async throws -> GatewayBed {
        let kernel = try await TestKernel.start {
            fastHeartbeats(&$0)
            $0.queueTimeout = queueTimeout
        }
        let options = ServiceHost<EchoService>.Options(brokers: [kernel.endpoints.broker], connections: 2,
                                                       heartbeatInterval: kernel.configuration.heartbeatInterval,
                                                       heartbeatLiveness: kernel.configuration.heartbeatLiveness)
        let host = try ServiceHost(service: EchoService(instance: "echo"), options: options)
        try await host.start()
        var settings = GatewaySettings()
        settings.port = 0
        settings.maxBodyBytes = 4_096
        settings.prefixes = ["/client/", "/store/"]
        settings.tokens = [GatewayToken(token: fullToken, services: ["*"], writablePrefixes: ["/client/"]),
                           GatewayToken(token: echoOnlyToken, services: ["echo"]),
                           GatewayToken(token: clientReaderToken, services: ["kernel", "streams"], readablePrefixes: ["/client/"])]
        configure(&settings)
        let state = kernel.stateEndpoints
        let client = try await BusClient(brokers: [kernel.endpoints.broker], timeout: settings.requestTimeout, state: [state])
        let subscription = try await client.subscribe(prefixes: settings.prefixes)
        let gateway = Gateway(options: .init(settings: settings, brokers: [kernel.endpoints.broker], state: [state], curve: nil, services: ["echo"]),
                              client: client, subscription: subscription)
        let (ports, portSink) = AsyncStream<Int>.makeStream()
        let task = Task { try await gateway.serve(onListening: { portSink.yield($0) }) }
        let port = try await within(20, "the gateway listens") { () -> Int in
            for await port in ports { return port }
            throw CancellationError()
        }
        return GatewayBed(kernel: kernel, host: host, gateway: task, gatewayClient: client, gatewaySubscription: subscription, port: port,
                          http: HTTPClient(eventLoopGroupProvider: .singleton), bus: try await BusClient(brokers: [kernel.endpoints.broker]))
    }

    /// Runs `body` against a new bed, and stops it however `body` ends.
    static func with(queueTimeout: Duration = .milliseconds(300), _ configure: (inout GatewaySettings) -> Void = { _ in },
                     _ body: (GatewayBed) async throws -> Void) async throws {
        try await stopping(try await start(queueTimeout: queueTimeout, configure), with: { await $0.stop() }, body)
    }

    func stop() async {
        gateway.cancel()
        _ = try? await gateway.value
        await gatewaySubscription.cancel()
        await gatewayClient.close()
        try? await http.shutdown()
        await bus.close()
        await host.stop()
        await kernel.stop()
    }

    var base: String { "http://127.0.0.1:\(port)" }

    /// Runs `body` with a streams service on this bed's kernel (its database in a temporary
    /// folder; one connection with `window` places), stopped however `body` ends.
    func withStreams(window: Int = 16, _ body: () async throws -> Void) async throws {
        let folder = try temporaryDirectory("gateway-streams")
        defer { try? FileManager.default.removeItem(at: folder) }
        let service = StreamsService(configuration: StreamsConfiguration(path: folder.appendingPathComponent("streams.sqlite").path))
        let host = try ServiceHost(service: service, options: .init(brokers: [kernel.endpoints.broker], connections: 1, window: window,
                                                                    heartbeatInterval: kernel.configuration.heartbeatInterval,
                                                                    heartbeatLiveness: kernel.configuration.heartbeatLiveness))
        try await host.start()
        try await stopping(host, with: { await $0.stop() }) { _ in
            try await kernel.workers(StreamsAPI.service)
            try await body()
        }
    }

    /// POSTs `body` to /rpc/`service`; the status and the JSON answer (nil: no body).
    func rpc(_ service: String, _ body: String, token: String? = fullToken, forwardedFor: String? = nil) async throws -> (status: UInt, json: JSONValue?) {
        var request = HTTPClientRequest(url: "\(base)/rpc/\(service)")
        request.method = .POST
        if let token { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
        if let forwardedFor { request.headers.add(name: "X-Forwarded-For", value: forwardedFor) }
        request.body = .bytes(ByteBuffer(string: body))
        let response = try await http.execute(request, timeout: .seconds(10))
        let bytes = try await response.body.collect(upTo: 1 << 20)
        let json: JSONValue? = bytes.readableBytes == 0 ? Optional.none : try JSONValue(parsing: Array(bytes.readableBytesView))
        return (response.status.code, json)
    }

    /// POSTs `body` to /rpc/`service` accepting `accept`: the status, the content type and the body's text.
    func post(_ service: String, _ body: String, accept: String) async throws -> (status: UInt, type: String?, text: String) {
        let response = try await open(service, body, accept: accept)
        let bytes = try await response.body.collect(upTo: 1 << 22)
        return (response.status.code, response.headers.first(name: "Content-Type"), String(buffer: bytes))
    }

    func open(_ service: String, _ body: String, accept: String, forwardedFor: String? = nil) async throws -> HTTPClientResponse {
        var request = HTTPClientRequest(url: "\(base)/rpc/\(service)")
        request.method = .POST
        request.headers.add(name: "Authorization", value: "Bearer \(Self.fullToken)")
        if let forwardedFor { request.headers.add(name: "X-Forwarded-For", value: forwardedFor) }
        request.headers.add(name: "Accept", value: accept)
        request.body = .bytes(ByteBuffer(string: body))
        return try await http.execute(request, timeout: .seconds(30))
    }

    func get(_ path: String, token: String? = fullToken, method: HTTPMethod = .GET) async throws -> (status: UInt, text: String) {
        var request = HTTPClientRequest(url: "\(base)\(path)")
        request.method = method
        if let token { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
        let response = try await http.execute(request, timeout: .seconds(10))
        let bytes = try await response.body.collect(upTo: 1 << 22)
        return (response.status.code, String(buffer: bytes))
    }

    /// Opens /events; the events as they come.
    func events(_ query: String, lastEventID: String? = nil, token: String = fullToken) async throws -> EventStream {
        var request = HTTPClientRequest(url: "\(base)/events?\(query)")
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        if let lastEventID { request.headers.add(name: "Last-Event-ID", value: lastEventID) }
        let response = try await http.execute(request, timeout: .seconds(60))
        #expect(response.status == .ok)
        #expect(response.headers.first(name: "Content-Type") == "text/event-stream")
        return EventStream(body: response.body)
    }
}

/// One Server-Sent Event as a client reads it.
struct SSE: Sendable, Equatable {
    var event: String?
    var id: String?
    var data: String
}

/// One open event stream, read as the EventSource specification says: fields up to a
/// blank line make an event; comment lines (starting with ':') are skipped. (mattt/EventSource
/// 1.1.1, the mirror's SSE client, does not build on Linux: it needs URLSession.bytes.)
final class EventStream: @unchecked Sendable {
    private var chunks: HTTPClientResponse.Body.AsyncIterator
    private var pending: [UInt8] = []

    init(body: HTTPClientResponse.Body) {
        chunks = body.makeAsyncIterator()
    }

    private func line() async throws -> String? {
        while true {
            if let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: pending[..<newline], as: UTF8.self)
                pending.removeSubrange(...newline)
                return line.hasSuffix("\r") ? String(line.dropLast()) : line
            }
            guard let chunk = try await chunks.next() else { return nil }
            pending += chunk.readableBytesView
        }
    }

    /// The next event (nil: the stream ended).
    func next(within seconds: Double = 10) async throws -> SSE? {
        try await within(seconds, "an event") { [self] in
            var event = SSE(event: nil, id: nil, data: "")
            var fields = 0
            while let line = try await line() {
                if line.isEmpty {
                    if fields > 0 { return event }
                    continue
                }
                if line.hasPrefix(":") { continue }
                let (name, value) = line.firstIndex(of: ":").map { (String(line[..<$0]), String(line[line.index(after: $0)...].drop { $0 == " " })) } ?? (line, "")
                fields += 1
                switch name {
                case "event": event.event = value
                case "id": event.id = value
                case "data": event.data += event.data.isEmpty ? value : "\n" + value
                default: fields -= 1
                }
            }
            return nil
        }
    }

    /// Events up to and including the first named `name`.
    func until(_ name: String, within seconds: Double = 10) async throws -> [SSE] {
        var events: [SSE] = []
        while let event = try await next(within: seconds) {
            events.append(event)
            if event.event == name { return events }
        }
        Issue.record("the stream ended before a \(name) event")
        return events
    }
}

extension SSE {
    var json: JSONValue? { try? JSONValue(parsing: Array(data.utf8)) }
}

@Suite("Gateway: the bus over HTTP")
struct GatewayTests {
    @Test("POST /rpc: results, and the HTTP status of each error")
    func rpcStatuses() async throws {
        try await GatewayBed.with { bed in
            let ok = try await bed.rpc("echo", #"{"jsonrpc":"2.0","id":7,"method":"echo","params":{"say":"hi"}}"#)
            #expect(ok.status == 200 && ok.json?["id"] == 7 && ok.json?["result"]?["say"] == "hi")
            let missing = try await bed.rpc("echo", #"{"jsonrpc":"2.0","id":1,"method":"nope"}"#)
            #expect(missing.status == 404 && missing.json?["error"]?["code"] == -32601)
            let wrongType = try await bed.rpc("echo", #"{"jsonrpc":"2.0","id":1,"method":"sleep","params":{"ms":"long"}}"#)
            #expect(wrongType.status == 400 && wrongType.json?["error"]?["code"] == -32602)
            let malformed = try await bed.rpc("echo", #"{"jsonrpc":"2.0","id":1,"#)
            #expect(malformed.status == 400 && malformed.json?["error"]?["code"] == -32700)
            let noWorker = try await bed.rpc("nobody", #"{"jsonrpc":"2.0","id":1,"method":"x"}"#)
            #expect(noWorker.status == 503 && noWorker.json?["error"]?["code"] == -32001)
            let padding = String(repeating: "x", count: 5_000)
            let tooBig = try await bed.rpc("echo", #"{"jsonrpc":"2.0","id":1,"method":"echo","params":{"pad":""# + padding + #""}}"#)
            #expect(tooBig.status == 413 && tooBig.json?["error"]?["code"] == -32010)
            let badName = try await bed.rpc(String(repeating: "n", count: 256), #"{"jsonrpc":"2.0","id":1,"method":"x"}"#)
            #expect(badName.status == 400 && badName.json?["error"]?["code"] == -32600)

            // A batch: one answer per request with an id, in order; a notification gets none.
            let batch = try await bed.rpc("echo", #"[{"jsonrpc":"2.0","id":1,"method":"whoami"},{"jsonrpc":"2.0","method":"whoami"},{"jsonrpc":"2.0","id":2,"method":"nope"},5]"#)
            #expect(batch.status == 200)
            let answers = batch.json?.arrayValue ?? []
            #expect(answers.count == 3)
            #expect(answers.first?["result"] == "echo" && answers.dropFirst().first?["error"]?["code"] == -32601)
            #expect(answers.last?["error"]?["code"] == -32600)
            let onlyNotification = try await bed.rpc("echo", #"{"jsonrpc":"2.0","method":"whoami"}"#)
            #expect(onlyNotification.status == 204 && onlyNotification.json.map { _ in false } ?? true, "no body")
        }
    }

    @Test("a reply in parts over HTTP: NDJSON or Server-Sent Events by the Accept header, each part as the bus carried it, then the response; answered before any part, it is an ordinary reply")
    func replyInParts() async throws {
        try await GatewayBed.with { bed in
            let numbers = #"{"jsonrpc":"2.0","id":5,"method":"numbers","params":{"n":3}}"#
            let lines = try await bed.post("echo", numbers, accept: "application/x-ndjson")
            #expect(lines.status == 200 && lines.type == "application/x-ndjson")
            let json = lines.text.split(separator: "\n").map { try? JSONValue(parsing: Array($0.utf8)) }
            #expect(json.count == 4, "\(lines.text)")
            #expect(json.prefix(3).map { $0?["part"] } == [1, 2, 3] && json.prefix(3).allSatisfy { $0?["id"] == 5 })
            #expect(json.last??["id"] == 5 && json.last??["result"] == ["count": 3, "numbers": []])

            // Server-Sent Events: a part event each, then the end.
            let response = try await bed.open("echo", numbers, accept: "text/event-stream")
            #expect(response.status == .ok && response.headers.first(name: "Content-Type") == "text/event-stream")
            let events = try await EventStream(body: response.body).until("end")
            #expect(events.map(\.event) == ["part", "part", "part", "end"])
            #expect(events.map { $0.json?["part"] ?? $0.json?["result"]?["count"] } == [1, 2, 3, 3])

            // The same request without the Accept header: one reply, the parts gathered in.
            #expect(try await bed.rpc("echo", numbers).json?["result"]?["numbers"] == [1, 2, 3])
            // Refused before any part: the error with its own status, as without the header.
            let refused = try await bed.post("echo", #"{"jsonrpc":"2.0","id":6,"method":"numbers","params":{"n":-1}}"#, accept: "application/x-ndjson")
            #expect(refused.status == 400 && (try? JSONValue(parsing: Array(refused.text.utf8)))?["error"]?["code"] == -32602, "\(refused)")
            // A method that answers in one reply: that reply.
            let echoed = try await bed.post("echo", #"{"jsonrpc":"2.0","id":7,"method":"echo","params":{"a":1}}"#, accept: "application/x-ndjson")
            #expect(echoed.status == 200 && (try? JSONValue(parsing: Array(echoed.text.utf8)))?["result"] == ["a": 1], "\(echoed)")
        }
    }

    @Test("tokens: none is 401, a service or key outside the token's grant is 403, for writes, /events and the kernel's state reads")
    func tokens() async throws {
        try await GatewayBed.with { bed in
            let ping = #"{"jsonrpc":"2.0","id":1,"method":"ping"}"#
            let anonymous = try await bed.rpc("kernel", ping, token: nil)
            #expect(anonymous.status == 401 && anonymous.json?["error"]?["code"] == -32011)
            #expect(try await bed.rpc("kernel", ping, token: "not-a-token-at-all-really").status == 401)
            let echoOnly = try await bed.rpc("kernel", ping, token: GatewayBed.echoOnlyToken)
            #expect(echoOnly.status == 403 && echoOnly.json?["error"]?["code"] == -32011)
            #expect(try await bed.rpc("echo", #"{"jsonrpc":"2.0","id":1,"method":"whoami"}"#, token: GatewayBed.echoOnlyToken).status == 200)
            let outside = try await bed.rpc("kernel", #"{"jsonrpc":"2.0","id":1,"method":"state.set","params":{"key":"/store/x","value":1}}"#)
            #expect(outside.status == 403)
            let published = try await bed.rpc("kernel", #"{"jsonrpc":"2.0","id":1,"method":"state.publish","params":{"key":"/store/x","value":1}}"#)
            #expect(published.status == 403, "state.publish is a state write too")
            let inside = try await bed.rpc("kernel", #"{"jsonrpc":"2.0","id":1,"method":"state.set","params":{"key":"/client/x","value":1}}"#)
            #expect(inside.status == 200 && inside.json?["result"]?["sequence"]?.intValue != nil)
            #expect(try await bed.get("/events", token: nil).status == 401)
            // A token streams only under its readable prefixes.
            #expect(try await bed.get("/events?prefix=/store/", token: GatewayBed.clientReaderToken).status == 403)
            let readable = try await bed.events("prefix=/client/", token: GatewayBed.clientReaderToken)
            #expect(try await readable.until("synced").last?.event == "synced")
            // And reads only those through the kernel's state methods.
            for (params, method, status) in [(#"{"prefix":"/client/"}"#, "state.get", 200), (#"{"key":"/client/x"}"#, "state.history", 200),
                                             ("{}", "state.get", 403), (#"{"prefix":"/store/"}"#, "state.get", 403),
                                             (#"{"key":"/store/x"}"#, "state.history", 403)] {
                let read = try await bed.rpc("kernel", #"{"jsonrpc":"2.0","id":1,"method":"\#(method)","params":\#(params)}"#, token: GatewayBed.clientReaderToken)
                #expect(read.status == status && (status == 200 || read.json?["error"]?["message"]?.stringValue?.contains("readable prefixes: /client/") == true),
                        "\(method) \(params): \(read)")
            }
            #expect(try await bed.get("/metrics", token: nil).status == 401)
            // Health is for probes: no token.
            #expect(try await bed.get("/healthz", token: nil).status == 200)
        }
    }

    @Test("GET /events: snapshot in sequence order, synced, live; a resume gets exactly the changes since, deletions included")
    func eventsAndResume() async throws {
        try await GatewayBed.with { bed in
            let publisher = StatePublisher(client: bed.bus)
            for key in ["b", "a", "c"] { try await publisher.set("/client/t/\(key)", ["v": 1]) }
            let before = try await publisher.set("/client/other", ["v": 1])

            // Opened once the gateway has every write (it follows the kernel a moment behind).
            var events: [SSE] = []
            var first = try await bed.events("prefix=/client/")
            while true {
                events = try await first.until("synced")
                if let synced = events.last?.id.flatMap(UInt64.init), synced >= before { break }
                first = try await bed.events("prefix=/client/t/")
            }
            first = try await bed.events("prefix=/client/t/")
            events = try await first.until("synced")
            let snapshot = events.filter { $0.event == "snapshot" }
            #expect(snapshot.count == 3)
            let ids = snapshot.compactMap { $0.id.flatMap(UInt64.init) }
            #expect(ids == ids.sorted(), "the snapshot comes in sequence order")
            #expect(!events.contains { $0.json?["key"] == "/client/other" }, "only the prefix asked for")

            // A live change arrives with its sequence as id.
            let sequence = try await publisher.set("/client/t/a", ["v": 2])
            let live = try #require(try await first.next())
            #expect(live.event == "update" && live.id == String(sequence) && live.json?["value"]?["v"] == 2)
            let lastID = try #require(live.id)

            // The browser goes (this stream is read no more); meanwhile a change, a deletion
            // and a new key; then it comes back with its last id.
            let changed = try await publisher.set("/client/t/b", ["v": 3])
            let deleted = try await publisher.set("/client/t/c", nil)
            let added = try await publisher.set("/client/t/d", ["v": 1])
            try await publisher.set("/client/other", ["v": 2])
            let resumed = try await bed.events("prefix=/client/t/", lastEventID: lastID)
            // The gateway may learn of the last writes after the stream opens: read until the
            // last one is in.
            var caughtUp: [SSE] = []
            while caughtUp.last?.id != String(added) { caughtUp.append(try #require(try await resumed.next())) }
            let updates = caughtUp.filter { $0.event != "synced" }
            #expect(updates.allSatisfy { $0.event == "update" }, "exactly what changed, no snapshot")
            #expect(updates.map(\.id) == [changed, deleted, added].map { String($0) })
            #expect(updates.count == 3 && updates[1].json?["key"] == "/client/t/c" && updates[1].json?["value"] == .null)
            if !caughtUp.contains(where: { $0.event == "synced" }) { caughtUp += try await resumed.until("synced") }
            #expect(caughtUp.filter { $0.event != "synced" } == updates, "nothing more")

            // Too old to know what changed since: a reset, then a fresh snapshot.
            let reset = try await bed.events("prefix=/client/t/&since=5")
            let fresh = try await reset.until("synced")
            #expect(fresh.first?.event == "reset")
            #expect(Set(fresh.filter { $0.event == "snapshot" }.compactMap { $0.json?["key"]?.stringValue }) == ["/client/t/a", "/client/t/b", "/client/t/d"])

            // A prefix the gateway does not follow is refused.
            #expect(try await bed.get("/events?prefix=/catalog/").status == 400)
            // So is one that matches no key (keys are paths), rather than followed in silence.
            let pathless = try await bed.get("/events?prefix=client/")
            #expect(pathless.status == 400 && pathless.text.contains("matches no key"), "\(pathless.text)")
            let metrics = try await bed.get("/metrics").text
            #expect(metrics.contains("switchboard_gateway_resumes_total 1"))
            #expect(metrics.contains("switchboard_gateway_resets_total 1"))
            #expect(metrics.contains("switchboard_requests_total"), "the kernel's own metrics too")
            // Counted as written, though no stream has ended yet (a browser's ends by leaving).
            let sent = metrics.split(separator: "\n").first { $0.hasPrefix("switchboard_gateway_events_sent_total ") }
                .flatMap { Int($0.split(separator: " ")[1]) } ?? 0
            #expect(sent >= events.count + 1 + caughtUp.count + fresh.count, "events sent: \(sent)")
            // The whole text, the kernel's and the gateway's, as Prometheus' own checker reads it.
            let promtool = repositoryRoot().appendingPathComponent(".build/promtool/usr/bin/promtool")
            try #require(FileManager.default.isExecutableFile(atPath: promtool.path), "no promtool: Scripts/bootstrap --tests takes it out of Debian's prometheus package")
            let checked = try await runCommand(promtool, ["check", "metrics"], input: Data(metrics.utf8))
            #expect(checked.status == 0 && checked.stdout.isEmpty && checked.stderr.isEmpty, "\(checked)")
        }
    }

    @Test("GET /metrics carries each stream's and consumer's figures from the streams service, and the whole text passes Prometheus' checker")
    func streamMetrics() async throws {
        try await GatewayBed.with { bed in
            try await bed.withStreams {
                _ = try await bed.bus.call(StreamsAPI.streamAdd, .init(name: "orders", subjects: ["orders."]))
                _ = try await bed.bus.call(StreamsAPI.consumerAdd, .init(stream: "orders", name: "billing"))
                for number in 1...3 { _ = try await bed.bus.publish(to: "orders.new", .int(Int64(number))) }
                let fetched = try await bed.bus.call(StreamsAPI.fetch, .init(stream: "orders", consumer: "billing", batch: 2))
                _ = try await bed.bus.call(StreamsAPI.ack, .init(stream: "orders", consumer: "billing", sequences: [fetched.messages[0].sequence]))

                let metrics = try await bed.get("/metrics").text
                for line in ["switchboard_stream_messages{stream=\"orders\"} 3", "switchboard_stream_bytes{stream=\"orders\"} 3",
                             "switchboard_stream_messages{stream=\"orders.dead\"} 0",
                             "switchboard_stream_consumer_pending{stream=\"orders\",consumer=\"billing\"} 1",
                             "switchboard_stream_consumer_delivered_total{stream=\"orders\",consumer=\"billing\"} 2",
                             "switchboard_stream_consumer_acknowledged_total{stream=\"orders\",consumer=\"billing\"} 1",
                             "switchboard_stream_consumer_dead_lettered_total{stream=\"orders\",consumer=\"billing\"} 0"] {
                    #expect(metrics.contains(line + "\n"), "\(line) in:\n\(metrics)")
                }
                #expect(metrics.contains("switchboard_gateway_rpc_requests_total"), "the gateway's own figures too")
                let promtool = repositoryRoot().appendingPathComponent(".build/promtool/usr/bin/promtool")
                try #require(FileManager.default.isExecutableFile(atPath: promtool.path), "no promtool: Scripts/bootstrap --tests takes it out of Debian's prometheus package")
                let checked = try await runCommand(promtool, ["check", "metrics"], input: Data(metrics.utf8))
                #expect(checked.status == 0 && checked.stdout.isEmpty && checked.stderr.isEmpty, "\(checked)")
            }
        }
    }

    @Test("a token's readable prefixes bound what it reads through the streams service: no capture stream of other keys made, none read (nor its dead letters), by RPC or by GET /streams; other streams as before")
    func tokensOnCaptureStreams() async throws {
        try await GatewayBed.with { bed in
            try await bed.withStreams {
                for (name, subjects, capture) in [("levels", ["/store/"], true), ("mine", ["/client/mine/"], true), ("orders", ["orders."], false)] {
                    _ = try await bed.bus.call(StreamsAPI.streamAdd, .init(name: name, subjects: subjects, captureState: capture))
                    _ = try await bed.bus.call(StreamsAPI.consumerAdd, .init(stream: name, name: "reader"))
                }
                func call(_ method: String, _ params: String) async throws -> (status: UInt, json: JSONValue?) {
                    try await bed.rpc("streams", #"{"jsonrpc":"2.0","id":1,"method":"\#(method)","params":\#(params)}"#, token: GatewayBed.clientReaderToken)
                }
                for (method, params, status) in [("stream.add", #"{"name":"spy","subjects":["/store/"],"captureState":true}"#, 403),
                                                 ("stream.add", #"{"name":"spy","subjects":["/client/", "/"],"captureState":true}"#, 403),
                                                 ("stream.add", #"{"name":"ok","subjects":["/client/ok/"],"captureState":true}"#, 200),
                                                 ("stream.add", #"{"name":"plain","subjects":["plain."]}"#, 200),
                                                 ("stream.messages", #"{"name":"levels"}"#, 403),
                                                 ("stream.messages", #"{"name":"levels.dead"}"#, 403),
                                                 ("consumer.fetch", #"{"stream":"levels","consumer":"reader"}"#, 403),
                                                 ("consumer.next", #"{"stream":"levels","consumer":"reader","expires":0.001}"#, 403),
                                                 ("stream.messages", #"{"name":"mine"}"#, 200),
                                                 ("stream.messages", #"{"name":"mine.dead"}"#, 200),
                                                 ("consumer.fetch", #"{"stream":"orders","consumer":"reader"}"#, 200),
                                                 ("stream.info", #"{"name":"levels"}"#, 200),
                                                 ("stream.messages", #"{"name":"nothere"}"#, 404)] {
                    let answer = try await call(method, params)
                    #expect(answer.status == status, "\(method) \(params): \(answer)")
                    if status == 403 {
                        #expect(answer.json?["error"]?["message"]?.stringValue?.contains("readable prefixes: /client/") == true, "\(answer)")
                    }
                }
                #expect(try await bed.get("/streams/levels/reader?expires=0.001", token: GatewayBed.clientReaderToken).status == 403)
                // A token without readable prefixes reads every stream.
                let full = try await bed.rpc("streams", #"{"jsonrpc":"2.0","id":1,"method":"stream.messages","params":{"name":"levels"}}"#)
                #expect(full.status == 200, "\(full)")
            }
        }
    }

    @Test("GET /streams/{stream}/{consumer}: a consumer's messages pushed as Server-Sent Events, each with its sequence as id, then the end; acknowledged over POST /rpc; a missing consumer is 404 and a token without the service 403")
    func consumerMessages() async throws {
        try await GatewayBed.with { bed in
            try await bed.withStreams {
                _ = try await bed.bus.call(StreamsAPI.streamAdd, .init(name: "orders", subjects: ["orders."]))
                _ = try await bed.bus.call(StreamsAPI.consumerAdd, .init(stream: "orders", name: "billing", ackWait: 60))
                _ = try await bed.bus.publish(to: "orders.new", ["id": 1])

                var request = HTTPClientRequest(url: "\(bed.base)/streams/orders/billing?max=2&expires=20&access_token=\(GatewayBed.fullToken)")
                request.headers.add(name: "Accept", value: "text/event-stream")
                let response = try await bed.http.execute(request, timeout: .seconds(60))
                #expect(response.status == .ok && response.headers.first(name: "Content-Type") == "text/event-stream")
                let events = EventStream(body: response.body)
                let first = try #require(try await events.next())
                #expect(first.event == nil && first.id == "1" && first.json?["subject"] == "orders.new" && first.json?["data"] == ["id": 1])
                // Pushed as it is published, while the stream is open.
                _ = try await bed.bus.publish(to: "orders.new", ["id": 2])
                let rest = try await events.until("end", within: 30)
                #expect(rest.map(\.id) == ["2", nil] && rest.last?.json == ["count": 2, "missed": 0], "the counts, each message an event of its own: \(rest)")

                let acked = try await bed.rpc("streams", #"{"jsonrpc":"2.0","id":1,"method":"consumer.ack","params":{"stream":"orders","consumer":"billing","sequences":[1,2]}}"#)
                #expect(acked.json?["result"]?["done"] == [1, 2])
                let info = try await bed.bus.call(StreamsAPI.consumerInfo, .init(stream: "orders", name: "billing"))
                #expect(info.acknowledged == 2 && info.pending == 0)

                let missing = try await bed.get("/streams/orders/nobody")
                #expect(missing.status == 404 && missing.text.contains("-32003"), "\(missing)")
                #expect(try await bed.get("/streams/orders/billing", token: GatewayBed.echoOnlyToken).status == 403)
                #expect(try await bed.get("/streams/orders/billing?expires=never").status == 400)
                // Out of the contract's ranges: refused before the events begin, naming the field.
                for query in ["max=0", "max=-3", "max=2000000", "max=many", "expires=0", "expires=7200"] {
                    let refused = try await bed.get("/streams/orders/billing?\(query)")
                    #expect(refused.status == 400 && refused.text.contains("-32602") && refused.text.contains(String(query.prefix { $0 != "=" })), "\(query): \(refused)")
                }
            }
        }
    }

    @Test("GET /streams/{stream}/{consumer}: a browser that leaves before any message frees the streams service's place once a keep-alive comment finds it gone, not when its wait expires")
    func consumerReaderLeaves() async throws {
        // A request may wait for a place as long as the client's 10 s.
        try await GatewayBed.with(queueTimeout: .seconds(10), { $0.heartbeat = .milliseconds(200) }) { bed in
            // One place: what the gateway asks after the reader's waits until that place is free.
            try await bed.withStreams(window: 1) {
                _ = try await bed.bus.call(StreamsAPI.streamAdd, .init(name: "orders", subjects: ["orders."]))
                _ = try await bed.bus.call(StreamsAPI.consumerAdd, .init(stream: "orders", name: "billing"))
                let (opened, open) = AsyncStream.makeStream(of: Void.self)
                let browser = Task {
                    var request = HTTPClientRequest(url: "\(bed.base)/streams/orders/billing?expires=600&access_token=\(GatewayBed.fullToken)")
                    request.headers.add(name: "Accept", value: "text/event-stream")
                    let response = try await bed.http.execute(request, timeout: .seconds(60))
                    var body = response.body.makeAsyncIterator()
                    // The first bytes: the gateway has asked for the messages.
                    _ = try await body.next()
                    open.yield()
                    while try await body.next() != nil {}
                }
                for await _ in opened { break }
                browser.cancel()  // The browser leaves: its connection closes.
                _ = await browser.result
                // Through the gateway's own connection to the kernel, so after the reader's
                // request: answered once its place is free, within the client's 10 s.
                let info = try await bed.rpc("streams", #"{"jsonrpc":"2.0","id":1,"method":"consumer.info","params":{"stream":"orders","name":"billing"}}"#)
                #expect(info.status == 200 && info.json?["result"]?["pending"] == 0, "\(info.status) \(String(describing: info.json))")
            }
        }
    }

    @Test("what one address may make the gateway send: its opening snapshots come out of a budget; past it /events is 429 with Retry-After, and other routes are served")
    func snapshotBudget() async throws {
        try await GatewayBed.with({ $0.snapshotBytesPerMinute = 6_000 }) { bed in
            // A stream opened before the writes (its opening is a few bytes) sees when the
            // gateway has them all.
            let watcher = try await bed.events("prefix=/client/s/")
            _ = try await watcher.until("synced")
            let publisher = StatePublisher(client: bed.bus)
            let value = JSONValue.string(String(repeating: "s", count: 2_000))
            var last: UInt64 = 0
            for index in 0..<4 { last = try await publisher.set("/client/s/\(index)", value) }
            while let event = try await watcher.next(), event.id.flatMap(UInt64.init) != last {}
            // This one snapshot (8 kB) empties the 6 kB budget.
            _ = try await bed.events("prefix=/client/s/").until("synced")
            var request = HTTPClientRequest(url: "\(bed.base)/events?prefix=/client/s/")
            request.headers.add(name: "Authorization", value: "Bearer \(GatewayBed.fullToken)")
            request.headers.add(name: "Last-Event-ID", value: "1")
            let refused = try await bed.http.execute(request, timeout: .seconds(10))
            let body = String(buffer: try await refused.body.collect(upTo: 1 << 16))
            let retryAfter = Int(refused.headers.first(name: "Retry-After") ?? "") ?? 0
            #expect(refused.status == .tooManyRequests && retryAfter >= 1 && retryAfter <= 62, "\(refused.status) \(retryAfter)")
            #expect(body.contains("snapshot_bytes_per_minute") && body.contains("retryAfterSeconds"), "\(body)")
            #expect(try await bed.get("/healthz", token: nil).status == 200)
        }
    }

    @Test("what one address may have in flight through POST /rpc: past gateway.max_calls_per_address, 429 with Retry-After; a batch counts each request; the share comes back when its calls end, a reply in parts included")
    func callsPerAddress() async throws {
        try await GatewayBed.with({ $0.maxCallsPerAddress = 2 }) { bed in
            // A reply in parts holds its call until its last part: two parts 4 s apart.
            let slow = #"{"jsonrpc":"2.0","id":1,"method":"numbers","params":{"n":2,"everyMs":4000}}"#
            let held = try await bed.open("echo", slow, accept: "text/event-stream")
            let parts = EventStream(body: held.body)
            #expect(try await parts.next()?.event == "part")
            // One call in flight, one more fits; a batch of two does not.
            let echo = #"{"jsonrpc":"2.0","id":2,"method":"echo","params":{"a":1}}"#
            #expect(try await bed.rpc("echo", echo).json?["result"] == ["a": 1])
            var request = HTTPClientRequest(url: "\(bed.base)/rpc/echo")
            request.method = .POST
            request.headers.add(name: "Authorization", value: "Bearer \(GatewayBed.fullToken)")
            request.body = .bytes(ByteBuffer(string: "[\(echo),\(echo)]"))
            let refused = try await bed.http.execute(request, timeout: .seconds(10))
            let body = try JSONValue(parsing: Array(try await refused.body.collect(upTo: 1 << 16).readableBytesView))
            #expect(refused.status == .tooManyRequests && refused.headers.first(name: "Retry-After") == "1", "\(refused.status)")
            #expect(body["error"]?["code"] == -32001 && body["error"]?["data"]?["limit"] == 2, "\(body)")
            #expect(body["error"]?["message"]?.stringValue?.contains("gateway.max_calls_per_address") == true, "\(body)")
            // A batch larger than the whole share is told so.
            let tooLarge = try await bed.rpc("echo", "[\(echo),\(echo),\(echo)]")
            #expect(tooLarge.status == 429 && tooLarge.json?["error"]?["message"]?.stringValue?.contains("smaller batches") == true, "\(tooLarge)")
            // The stream ends: its call is given back, and the batch of two fits.
            #expect(try await parts.until("end").last?.json?["result"]?["count"] == 2)
            #expect(try await bed.rpc("echo", "[\(echo),\(echo)]").json?.arrayValue?.count == 2)
            let metrics = try await bed.get("/metrics").text
            #expect(metrics.contains("switchboard_gateway_rpc_refused_total 2\n"), "\(metrics)")
        }
    }

    @Test("behind a proxy in gateway.trusted_proxies, each address it forwards for has its own share (the last X-Forwarded-For entry, the proxy's own); from anyone else the header is not read",
          arguments: [(listen: "127.0.0.1", trusted: true), (listen: "127.0.0.1", trusted: false),
                      // Dual-stack: the proxy's IPv4 connection is seen as ::ffff:127.0.0.1.
                      (listen: "::", trusted: true)])
    func callsBehindProxy(listen: String, trusted: Bool) async throws {
        let slow = #"{"jsonrpc":"2.0","id":1,"method":"numbers","params":{"n":2,"everyMs":4000}}"#
        let echo = #"{"jsonrpc":"2.0","id":2,"method":"echo","params":{"a":1}}"#
        try await GatewayBed.with({ $0.host = listen; $0.maxCallsPerAddress = 1; $0.trustedProxies = trusted ? ["127.0.0.1"] : [] }) { bed in
            let held = try await bed.open("echo", slow, accept: "text/event-stream", forwardedFor: "10.0.0.1")
            let parts = EventStream(body: held.body)
            #expect(try await parts.next()?.event == "part")
            // Another caller the proxy forwards for: its own share, when the proxy is trusted.
            #expect(try await bed.rpc("echo", echo, forwardedFor: "10.0.0.2").status == (trusted ? 200 : 429), "trusted: \(trusted)")
            // What the caller itself put before the proxy's entry is not read.
            #expect(try await bed.rpc("echo", echo, forwardedFor: "10.0.0.2, 10.0.0.1").status == 429, "trusted: \(trusted)")
            _ = try await parts.until("end")
        }
    }

    @Test("calls in flight are counted per address, given back once, and given back when let go")
    func callsPerAddressLedger() {
        let ledger = CallsPerAddress(limit: 3)
        let first = ledger.take(2, for: "10.0.0.1")
        #expect(first != nil && ledger.take(2, for: "10.0.0.1") == nil)
        // Another address has its own share.
        var other = ledger.take(3, for: "10.0.0.2")
        #expect(other != nil && ledger.callers == 2)
        first?.end()
        first?.end()
        #expect(ledger.inFlight(for: "10.0.0.1") == 0 && ledger.take(3, for: "10.0.0.1") != nil)
        // Never ended, only let go: given back all the same, and the address forgotten.
        other = nil
        #expect(ledger.inFlight(for: "10.0.0.2") == 0 && ledger.callers == 0)
        // 0: no bound.
        #expect(CallsPerAddress(limit: 0).take(1_000_000, for: "10.0.0.1") != nil)
    }

    @Test("a snapshot budget refills with time; one larger than a minute's worth passes when the budget is full, then waits for its bytes")
    func snapshotBudgetRefills() {
        let budget = SnapshotBudget(bytesPerMinute: 600)  // 10 bytes a second
        let start = ContinuousClock.now
        #expect(budget.waitBeforeSnapshot(for: "a", now: start) == nil)
        budget.charge(1_600, to: "a", now: start)  // 1,000 bytes past the budget
        #expect(budget.waitBeforeSnapshot(for: "a", now: start) == 101)
        #expect(budget.waitBeforeSnapshot(for: "b", now: start) == nil, "another address has its own")
        #expect(budget.waitBeforeSnapshot(for: "a", now: start + .seconds(99)) == 2)
        #expect(budget.waitBeforeSnapshot(for: "a", now: start + .seconds(101)) == nil)
        #expect(SnapshotBudget(bytesPerMinute: 0).waitBeforeSnapshot(for: "a") == nil, "0: no bound")
    }

    @Test("a snapshot budget tracks at most maxCallers addresses, even when every one of them is in debt")
    func snapshotBudgetIsBounded() {
        let budget = SnapshotBudget(bytesPerMinute: 600)
        let start = ContinuousClock.now
        for index in 0..<SnapshotBudget.maxCallers { budget.charge(1_000, to: "10.0.\(index)", now: start) }
        budget.charge(2_000, to: "deepest", now: start)
        #expect(budget.callers <= SnapshotBudget.maxCallers)
        #expect(budget.waitBeforeSnapshot(for: "deepest", now: start) != nil, "the callers deepest in debt are kept")
    }

    @Test("bounded in bytes: the history, each stream's backlog, and response bodies")
    func boundedInBytes() async throws {
        try await GatewayBed.with({
            $0.historyBytes = 20_000
            $0.streamBacklogBytes = 64 * 1024
            $0.maxResponseBytes = 20_000
            $0.maxBodyBytes = 65_536
        }) { bed in
            let publisher = StatePublisher(client: bed.bus)
            let value = JSONValue.string(String(repeating: "h", count: 1_000))
            var sequences: [UInt64] = []
            for index in 0..<60 { sequences.append(try await publisher.set("/client/h/\(index % 3)", value)) }
            // Wait until the gateway has the last write (a stream's synced id says where it is).
            var synced: UInt64 = 0
            while synced < sequences.last! {
                let probe = try await bed.events("prefix=/client/h/")
                synced = try await probe.until("synced").last?.id.flatMap(UInt64.init) ?? 0
            }
            // 60 changes of about 1 kB against a 20 kB history: the last ones resume exactly from
            // the gateway's memory, the first ones from the kernel's history (exact too).
            let recent = try await bed.events("prefix=/client/h/", lastEventID: String(sequences[50]))
            let resumed = try await recent.until("synced")
            #expect(resumed.filter { $0.event == "update" }.count == 9 && !resumed.contains { $0.event == "reset" }, "\(resumed.map(\.event))")
            let old = try await bed.events("prefix=/client/h/", lastEventID: String(sequences[5]))
            let fromKernel = try await old.until("synced")
            #expect(fromKernel.filter { $0.event == "update" }.count == 54 && !fromKernel.contains { $0.event == "reset" }, "\(fromKernel.map(\.event))")
            #expect(try await bed.get("/metrics").text.contains("switchboard_gateway_kernel_resumes_total 1"))

            // A stream that is never read: cut once its backlog passes 64 kB (the TCP buffers
            // fill first), while another stream is served.
            let stuck = try await bed.events("prefix=/client/flood/")
            let big = JSONValue.string(String(repeating: "f", count: 4_000))
            var overflowed = false
            for round in 0..<100 where !overflowed {
                for _ in 0..<100 { try await publisher.set("/client/flood/x", big) }
                overflowed = try await bed.get("/metrics").text.contains("switchboard_gateway_stream_overflows_total 1")
                if round == 99 { Issue.record("the stream that is not read was never cut") }
            }
            withExtendedLifetime(stuck) {}

            // Response bodies: a single response over the limit is 413 with -32010, a batch's
            // results past it are -32010 each.
            for index in 0..<5 { try await publisher.set("/client/r/\(index)", .string(String(repeating: "r", count: 5_000))) }
            let single = try await bed.rpc("kernel", #"{"jsonrpc":"2.0","id":1,"method":"state.get","params":{"prefix":"/client/"}}"#)
            #expect(single.status == 413 && single.json?["error"]?["code"] == .int(Int64(JSONRPCError.tooLargeCode)), "\(single)")
            #expect(single.json?["error"]?["message"]?.stringValue?.contains("gateway.max_response_bytes") == true)
            let calls = (0..<30).map { #"{"jsonrpc":"2.0","id":\#($0),"method":"state.get","params":{"prefix":"/client/h/0"}}"# }
            let batch = try await bed.rpc("kernel", "[" + calls.joined(separator: ",") + "]")
            let answers = try #require(batch.json?.arrayValue)
            #expect(batch.status == 200 && answers.count == 30)
            #expect(answers.first?["result"] != nil && answers.last?["error"]?["code"] == .int(Int64(JSONRPCError.tooLargeCode)))
            let tooMany = try await bed.rpc("echo", "[" + (0..<101).map { #"{"jsonrpc":"2.0","id":\#($0),"method":"echo"}"# }.joined(separator: ",") + "]")
            #expect(tooMany.status == 413 && tooMany.json?["error"]?["message"]?.stringValue?.contains("kernel.max_batch_items") == true, "\(tooMany)")
        }
    }

    @Test("a connection that sends nothing, or stops inside a request's head, is closed after gateway.idle_timeout_ms; an event stream open longer than that is not")
    func idleConnections() async throws {
        try await GatewayBed.with({ $0.idleTimeout = .milliseconds(500) }) { bed in
            let stream = try await bed.events("prefix=/client/")
            _ = try await stream.until("synced")
            let silent = try RawConnection(port: bed.port)
            let halfway = try RawConnection(port: bed.port)
            halfway.write(Array("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n".utf8))
            #expect(silent.closedByPeer(within: 10), "a connection that said nothing is still open")
            #expect(halfway.closedByPeer(within: 10), "a connection stopped inside a request's head is still open")
            // The stream, open for longer than the idle timeout by now, still carries changes.
            let sequence = try await StatePublisher(client: bed.bus).set("/client/idle", ["v": 1])
            let live = try #require(try await stream.next())
            #expect(live.event == "update" && live.id == String(sequence))
        }
    }

    @Test("at gateway.max_connections the gateway accepts no other connection until one closes: the next waits, and is served then; /metrics counts them")
    func maxConnections() async throws {
        try await GatewayBed.with({ $0.maxConnections = 3 }) { bed in
            let health = Array("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".utf8)
            // Each answered, so each is one the gateway holds.
            var held: [RawConnection] = []
            for index in 0..<3 {
                let connection = try RawConnection(port: bed.port)
                connection.write(health)
                #expect(connection.read(until: #"{"status":"ok"}"#, within: 10) != nil, "connection \(index) was not served")
                held.append(connection)
            }
            let waiting = try RawConnection(port: bed.port)
            waiting.write(health)
            // A short look for what must not come: it would come at once.
            #expect(waiting.read(until: "HTTP/1.1", within: 0.5) == nil, "a fourth connection was served at gateway.max_connections 3")
            held.removeFirst()
            #expect(waiting.read(until: #"{"status":"ok"}"#, within: 10) != nil, "the waiting connection was not served once another closed")
            held[0].write(Array("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(GatewayBed.fullToken)\r\n\r\n".utf8))
            let metrics = held[0].read(until: "switchboard_gateway_max_connections 3\n", within: 10) ?? "(no answer)"
            #expect(metrics.contains("switchboard_gateway_connections 3\n"), "\(metrics)")
        }
    }

    @Test("CORS: headers for a configured origin only")
    func cors() async throws {
        try await GatewayBed.with({ $0.corsOrigins = ["https://apps.example"] }) { bed in
            for (origin, allowed) in [("https://apps.example", true), ("https://evil.example", false)] {
                var preflight = HTTPClientRequest(url: "\(bed.base)/rpc/echo")
                preflight.method = .OPTIONS
                preflight.headers.add(name: "Origin", value: origin)
                preflight.headers.add(name: "Access-Control-Request-Method", value: "POST")
                let response = try await bed.http.execute(preflight, timeout: .seconds(10))
                #expect(response.headers.first(name: "Access-Control-Allow-Origin") == (allowed ? origin : nil), "\(origin)")
            }
        }
        try await GatewayBed.with { bed in
            var request = HTTPClientRequest(url: "\(bed.base)/healthz")
            request.headers.add(name: "Origin", value: "https://apps.example")
            let response = try await bed.http.execute(request, timeout: .seconds(10))
            #expect(response.headers.first(name: "Access-Control-Allow-Origin") == nil, "no CORS unless configured")
        }
    }

    @Test("readiness follows the services; the page is served; shutdown ends open streams")
    func healthPageAndShutdown() async throws {
        try await GatewayBed.with { bed in
            #expect(try await bed.get("/readyz").status == 200)
            await bed.host.stop()
            try await bed.kernel.workers("echo", within: 15, "echo's workers gone") { $0 == 0 }
            #expect(try await bed.get("/readyz").status == 503, "not ready without echo")
            // What switchboard up's supervisor says of a process that keeps ending is part of the answer.
            let failing = SupervisorStatus(name: "echo", state: .failing, restarts: 6, lastExit: "was killed by signal 4", restartInSeconds: 10)
            _ = try await bed.bus.call(KernelAPI.stateSet, .init(key: SupervisorStatus.key("echo"), value: try JSONValue(encoding: failing)))
            let ready = try await bed.get("/readyz")
            #expect(ready.status == 503 && ready.text.contains(#""restarting":[{"#) && ready.text.contains("signal 4"), "\(ready)")
            let page = try await bed.get("/", token: nil)
            #expect(page.status == 200 && page.text.lowercased().contains("<!doctype html"))
            // A path nothing serves, at any depth, is said not found (not an empty answer).
            for path in ["/nothing-here", "/streams/orders", "/rpc", "/a/b/c"] {
                let missing = try await bed.get(path, token: nil)
                #expect(missing.status == 404 && missing.text == "not found\n", "\(path): \(missing)")
            }
            // HEAD as health checks send it: GET's status, no body; not on an event stream, which only a GET opens.
            let head = try await bed.get("/healthz", token: nil, method: .HEAD), pageHead = try await bed.get("/", token: nil, method: .HEAD)
            #expect(head.status == 200 && head.text.isEmpty && pageHead.status == 200 && pageHead.text.isEmpty, "\(head) \(pageHead)")
            #expect(try await bed.get("/events?prefix=/client/", method: .HEAD).status == 405)
            // A call sent with GET is told to POST it, not that the service's path is unknown.
            let notPost = try await bed.get("/rpc/echo")
            #expect(notPost.status == 405 && notPost.text.contains("-32600") && notPost.text.contains("POST"), "\(notPost)")

            let stream = try await bed.events("prefix=/client/")
            _ = try await stream.until("synced")
            bed.gateway.cancel()
            // It ends: cleanly, or cut (either way, not left hanging).
            do {
                #expect(try await stream.next(within: 15) == nil, "the stream ends when the gateway stops")
            } catch is TimedOut {
                Issue.record("the stream did not end when the gateway stopped")
            } catch {}
        }
    }
}
