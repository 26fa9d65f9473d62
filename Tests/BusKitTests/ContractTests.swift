import BusKit
import BusProtocol
import Contracts
import EchoService
import Kernel
import SwitchboardTestSupport
import Testing

/// A params type with every shape the contracts use.
private struct Sample: Codable, Sendable {
    enum Order: String, Codable, CaseIterable, SchemaDescribed { case lexical, natural }
    struct Inner: Codable, Sendable { var id: Int }
    var name: String
    var limit: Int?
    var ratio: Double
    var tags: [String]
    var inner: Inner?
    var order: Order
    var anything: JSONValue
}

@Suite("Contracts: schemas generated from the params types, params checked before handlers, rpc.discover")
struct ContractTests {
    @Test("the schema of a params type: required and optional fields, arrays, nested objects, enums, nothing else allowed")
    func generatedSchema() {
        let schema = JSONSchema.of(Sample.self)
        #expect(schema["type"] == "object")
        #expect(schema["additionalProperties"] == false)
        #expect(Set(schema["required"]?.arrayValue ?? []) == ["name", "ratio", "tags", "order", "anything"])
        let properties = schema["properties"]?.objectValue ?? [:]
        #expect(properties["name"] == ["type": "string"])
        #expect(properties["limit"] == ["type": ["integer", "null"]])
        #expect(properties["ratio"] == ["type": "number"])
        #expect(properties["tags"] == ["type": "array", "items": ["type": "string"]])
        #expect(properties["inner"] == ["type": ["object", "null"], "properties": ["id": ["type": "integer"]], "required": ["id"],
                                        "additionalProperties": false])
        #expect(properties["order"] == ["type": "string", "enum": ["lexical", "natural"]])
        #expect(properties["anything"] == [:])
        #expect(JSONSchema.of(NoParams.self) == ["type": "object", "additionalProperties": false])
    }

    @Test("a value is checked against the schema: the first field that does not fit, and what it should be")
    func schemaCheck() {
        let schema = JSONSchema.of(Sample.self)
        let good: JSONValue = ["name": "a", "ratio": 1, "tags": ["x"], "order": "natural", "anything": [1, "two"], "limit": nil]
        #expect(SchemaCheck.mismatch(good, schema) == nil)
        func mismatch(_ change: (inout [String: JSONValue]) -> Void) -> SchemaCheck.Mismatch? {
            var object = good.objectValue!
            change(&object)
            return SchemaCheck.mismatch(.object(object), schema)
        }
        #expect(mismatch { $0["name"] = 5 }.map { [$0.field, $0.expected] } == ["name", "a string"])
        #expect(mismatch { $0["name"] = nil }.map { [$0.field, $0.expected] } == ["name", "a string"])
        #expect(mismatch { $0["limit"] = 1.5 }.map { [$0.field, $0.expected] } == ["limit", "an integer or null"])
        #expect(mismatch { $0["tags"] = ["x", 2] }?.field == "tags[1]")
        #expect(mismatch { $0["inner"] = ["id": "7"] }?.field == "inner.id")
        #expect(mismatch { $0["inner"] = ["id": 7, "extra": true] }?.field == "inner.extra")
        #expect(mismatch { $0["order"] = "random" }.map { [$0.field, $0.expected] } == ["order", #"one of "lexical", "natural""#])
        let unknown = mismatch { $0["colour"] = "red" }
        #expect(unknown?.field == "colour")
        #expect(unknown?.expected.contains("one of the fields anything, inner, limit, name, order, ratio, tags") == true)
    }

    @Test("through the bus: a wrong type, a missing or an unknown field is -32602 naming the field, and the handler never runs")
    func paramsRefusedBeforeTheHandler() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let echo = EchoService()
        let host = try ServiceHost(service: echo, options: .init(brokers: [kernel.endpoints.broker], connections: 1,
                                                                 heartbeatInterval: .milliseconds(100), heartbeatLiveness: 10))
        try await host.start()
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(10))
        try await kernel.workers(EchoAPI.service)
        for (params, field, expected) in [(["n": "7"], "n", "an integer"), ([:], "n", "an integer"), (["n": 7, "m": 1], "m", "one of the fields n"),
                                          (["n": 7.5], "n", "an integer")] as [(JSONValue, String, String)] {
            let error = await rpcError { try await bus.request(service: EchoAPI.service, method: EchoAPI.count.name, params: params) }
            #expect(error?.code == JSONRPCError.invalidParamsCode, "\(params)")
            #expect(error?.data?["field"] == .string(field), "\(params): \(String(describing: error))")
            #expect(error?.data?["expected"] == .string(expected), "\(params): \(String(describing: error))")
        }
        let positional = await rpcError { try await bus.request(service: EchoAPI.service, method: EchoAPI.count.name, params: [7]) }
        #expect(positional?.data?["field"] == "params")
        #expect(await echo.handled == 0, "no handler ran")
        #expect(try await bus.call(EchoAPI.count, .init(n: 7)) == 7)
        #expect(try await bus.call(EchoAPI.whoami) == "echo")
        #expect(await echo.handled == 2)
        // The kernel's own methods are checked by the same table.
        let kernelError = await rpcError { try await bus.request(service: KernelAPI.service, method: KernelAPI.stateSet.name, params: ["key": 1]) }
        #expect(kernelError?.data?["field"] == "key")
        await bus.close()
        await host.stop()
        await kernel.stop()
    }

    @Test("rpc.discover: the kernel and a service describe every method with a summary and JSON Schema params and result")
    func discovery() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let host = try await hostEcho(kernel)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(10))
        try await kernel.workers(EchoAPI.service)

        let kernelDoc = try await bus.call(Method.discover(KernelAPI.service))
        #expect(kernelDoc.info.title == "kernel" && kernelDoc.openrpc.hasPrefix("1.") && kernelDoc.jsonSchemaDialect == JSONSchema.dialect)
        #expect(kernelDoc.methods.map(\.name) == ["ping", "services.list", "stats", "metrics", "state.set", "state.publish", "state.get", "state.history",
                                                   "workers.list", "workers.drain"])
        let stateSet = try #require(kernelDoc.methods.first { $0.name == KernelAPI.stateSet.name })
        #expect(stateSet.summary == KernelAPI.stateSet.summary)
        #expect(stateSet.params.map(\.name) == ["key", "revision", "ttl", "value"])
        #expect(stateSet.params.first { $0.name == "key" }?.required == true && stateSet.params.first { $0.name == "key" }?.schema == ["type": "string"])
        #expect(stateSet.result.schema["properties"]?["sequence"] == ["type": "integer", "minimum": 0])

        let echoDoc = try await bus.call(Method.discover(EchoAPI.service))
        #expect(echoDoc.methods.map(\.name) == ["echo", "sleep", "fail", "whoami", "count", "numbers"])
        #expect(echoDoc.methods.first { $0.name == "numbers" }?.part?.schema == ["type": "integer"])
        #expect(echoDoc.methods.allSatisfy { !$0.summary.isEmpty })
        #expect(echoDoc.methods.first { $0.name == "whoami" }?.result.schema == ["type": "string"])
        await bus.close()
        await host.stop()
        await kernel.stop()
    }
}

/// A service whose one method has an effect that counts: how often it really ran.
private actor Counter: BusService {
    static let name = "counter"
    static let bump = Method<NoParams, Int>(name, "bump", "Counts one more.", changesState: true)
    static let peek = Method<NoParams, Int>(name, "peek", "The count.")
    var count = 0

    nonisolated func methods(_ table: inout MethodTable<Counter>) {
        table.on(Self.bump) { counter, _ in
            try await Task.sleep(for: .milliseconds(20))
            return await counter.increment()
        }
        table.on(Self.peek) { counter, _ in await counter.count }
    }

    func increment() -> Int {
        count += 1
        return count
    }
}

@Suite("Exactly once: a request sent again is answered with its first result and runs once")
struct ExactlyOnceTests {
    private func body(_ method: String, id: Int64, client: String?) -> [UInt8] {
        JSONRPCRequest(id: .number(id), method: method, paramsText: nil, client: client).jsonBytes
    }

    @Test("the same client and id: one run, the same reply, also for copies that arrive while the first runs")
    func duplicates() async throws {
        let counter = Counter()
        let table = MethodTable(of: counter)
        let first = await table.answer(body: body("bump", id: 1, client: "c1"), on: counter).reply
        #expect(try JSONRPC.parseResponses(first).first?.outcome.get() == 1)
        #expect(await table.answer(body: body("bump", id: 1, client: "c1"), on: counter).reply == first)
        // Five copies at once: the first runs, the others wait for its result.
        let copies = await withTaskGroup(of: [UInt8].self) { group in
            for _ in 0..<5 { group.addTask { await table.answer(body: self.body("bump", id: 2, client: "c1"), on: counter).reply } }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(Set(copies).count == 1)
        #expect(await counter.count == 2)
        // Another id, another client: new requests. No client: nothing to tell copies apart by.
        _ = await table.answer(body: body("bump", id: 2, client: "c2"), on: counter)
        _ = await table.answer(body: body("bump", id: 3, client: nil), on: counter)
        _ = await table.answer(body: body("bump", id: 3, client: nil), on: counter)
        #expect(await counter.count == 5)
    }

    @Test("BusClient names each request with its own client id; a method that changes nothing is not remembered")
    func clientIDs() async throws {
        let kernel = try await TestKernel.start()
        let counter = Counter()
        let host = try ServiceHost(service: counter, options: .init(brokers: [kernel.endpoints.broker], connections: 1))
        try await host.start()
        let one = try await BusClient(brokers: [kernel.endpoints.broker]), two = try await BusClient(brokers: [kernel.endpoints.broker])
        #expect(one.clientID != two.clientID && one.clientID.count >= 20)
        try await kernel.workers("counter")
        #expect(try await one.call(Counter.bump) == 1)
        #expect(try await two.call(Counter.bump) == 2)
        #expect(try await one.call(Counter.peek) == 2)
        await one.close()
        await two.close()
        await host.stop()
        await kernel.stop()
    }
}

@Suite("Batches: one reply holding a response to each request, in order")
struct BatchReplyTests {
    @Test("a response to each request in the batch's order; none to a notification; a member that is no request answered -32600; a batch of notifications alone: no reply")
    func batches() async throws {
        let counter = Counter()
        let table = MethodTable(of: counter)
        let batch = #"[{"jsonrpc":"2.0","method":"bump"},{"jsonrpc":"2.0","id":1,"method":"peek"},42,{"jsonrpc":"2.0","method":"bump"},{"jsonrpc":"2.0","id":"b","method":"nope"}]"#
        let answered = await table.answer(body: Array(batch.utf8), on: counter)
        let responses = try JSONRPC.parseResponses(answered.reply)
        #expect(responses.map(\.id) == [.number(1), .null, .string("b")], "\(String(decoding: answered.reply, as: UTF8.self))")
        #expect(try responses.first?.outcome.get() == 1, "the bump before it ran first")
        let codes = responses.dropFirst().map { response -> Int? in
            guard case .failure(let error) = response.outcome else { return nil }
            return error.code
        }
        #expect(codes == [JSONRPCError.invalidRequestCode, JSONRPCError.methodNotFoundCode])
        #expect(answered.errors == 2)
        let notifications = #"[{"jsonrpc":"2.0","method":"bump"},{"jsonrpc":"2.0","method":"bump"}]"#
        #expect(await table.answer(body: Array(notifications.utf8), on: counter) == ([], 0))
        #expect(await counter.count == 4)
    }
}

/// Isolated methods only, as the kernel's: answered without suspending, a turn at a time.
private actor Pages: BusService {
    static let name = "pages"
    struct Size: Codable, Sendable { var bytes: Int }
    static let page = Method<Size, String>(name, "page", "A string of that many bytes.")
    static let bump = Method<NoParams, Int>(name, "bump", "Counts one more.")
    var count = 0

    nonisolated func methods(_ table: inout MethodTable<Pages>) {
        table.onIsolated(Self.page) { _, size in String(repeating: "p", count: size.bytes) }
        table.onIsolated(Self.bump) { pages, _ in
            pages.count += 1
            return pages.count
        }
    }

    /// `body` answered through every turn it takes, with how many it took.
    func answer(_ body: String, with table: MethodTable<Pages>, turnBytes: Int) -> (reply: [UInt8], errors: Int, turns: Int) {
        switch table.answerNow(body: Array(body.utf8), on: self, turnBytes: turnBytes) {
        case .answered(let reply, let errors): return (reply, errors, 1)
        case .underWay(var rest):
            var turns = 1
            while true {
                turns += 1
                if let answered = table.goOn(&rest, on: self, turnBytes: turnBytes) { return (answered.reply, answered.errors, turns) }
            }
        }
    }
}

@Suite("Bodies answered a turn at a time: the reply is the one a single turn writes")
struct AnswerInTurnsTests {
    @Test("a batch of results, notifications, invalid members and unknown methods, answered one request a turn: the same bytes as in one turn")
    func sameReply() async throws {
        let pages = Pages()
        let table = MethodTable(of: pages)
        let bodies = [
            #"[{"jsonrpc":"2.0","id":1,"method":"page","params":{"bytes":300}},{"jsonrpc":"2.0","method":"bump"},42,{"jsonrpc":"2.0","id":2,"method":"page","params":{"bytes":5}},{"jsonrpc":"2.0","id":"x","method":"nope"},{"jsonrpc":"2.0","method":"bump"},43]"#,
            #"[17,{"jsonrpc":"2.0","method":"bump"},{"jsonrpc":"2.0","id":3,"method":"page","params":{"bytes":2000}}]"#,
            #"[{"jsonrpc":"2.0","method":"bump"},{"jsonrpc":"2.0","method":"bump"}]"#,
            #"{"jsonrpc":"2.0","id":4,"method":"page","params":{"bytes":70}}"#,
            #"{"jsonrpc":"2.0","method":"bump"}"#,
        ]
        for body in bodies {
            let whole = await pages.answer(body, with: table, turnBytes: .max)
            let inTurns = await pages.answer(body, with: table, turnBytes: 1)
            #expect(whole.turns == 1)
            #expect(inTurns.reply == whole.reply && inTurns.errors == whole.errors,
                    "\(String(decoding: inTurns.reply, as: UTF8.self)) against \(String(decoding: whole.reply, as: UTF8.self))")
        }
        let batch = await pages.answer(bodies[0], with: table, turnBytes: 1)
        #expect(batch.turns == 4, "a turn ends at each result: four for five requests (an error and the bump after it share one)")
        #expect(try JSONRPC.parseResponses(batch.reply).map(\.id) == [.number(1), .null, .number(2), .string("x"), .null])
        #expect(await pages.count == 2 * (2 + 1 + 2 + 0 + 1) + 2)
    }
}
