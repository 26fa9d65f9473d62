import BusKit
import BusProtocol
import Contracts
import Foundation
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// Findings 1, 3 and 4 of the hostile-client review, each as it was reproduced against a
/// live kernel process: numbers that trapped it, batches whose replies multiplied, and a
/// stuck subscriber that grew it by the size of the values it was not reading.
@Suite("Hostile numbers, amplifying batches and large values against a live kernel", .serialized)
struct HostileNumbersAndRepliesTests {
    @Test("a huge, negative, NaN or infinite ttl is refused with -32602 naming ttl and its range; the kernel lives on")
    func ttlNumbers() async throws {
        let kernel = try await KernelUnderAttack.start()
        let pid = kernel.process.pid
        for method in ["state.set", "state.publish"] {
            for ttl: JSONValue in [1e300, 1e11, 2e10, -1, .double(31_536_000.5), .int(Int64.max)] {
                let error = await rpcError {
                    try await kernel.bystander.request(service: "kernel", method: method, params: ["key": "/client/t", "value": 1, "ttl": ttl])
                }
                #expect(error?.code == JSONRPCError.invalidParamsCode, "\(method) ttl \(ttl): \(String(describing: error))")
                #expect(error?.data?["field"] == "ttl" && error?.message.contains("from 0 to 31536000") == true, "\(String(describing: error))")
            }
        }
        // A number JSON can write but no Double holds: a parse error, not a trap.
        let body = Frame(Array(#"{"jsonrpc":"2.0","id":7000007,"method":"state.set","params":{"key":"/client/t","value":1,"ttl":1e400}}"#.utf8))
        let raw = try await kernel.bystander.call(service: "kernel", body: [body])
        let reply = try #require(try JSONRPC.parseResponses(raw[0].bytes).first)
        #expect(reply.failure?.code == JSONRPCError.invalidParamsCode || reply.failure?.code == JSONRPCError.parseErrorCode, "\(reply)")

        // The collector: a KVSET whose ttl is out of range, NaN, infinite or no number is
        // malformed (counted), never converted; so is one whose key is not a path.
        // A PUB's first messages are lost until it has connected: the round goes again until
        // the valid KVSET at its end is applied.
        let collector = try kernel.socket(.pub, kernel.collector)
        // Each round's valid KVSET holds the round's number: seen, every KVSET sent before it
        // has been read (one PUB's messages are read in order), so none is still on its way.
        var applied = false
        for round in 0..<500 where !applied {
            for ttl in ["1e11", "1e300", "-5", "nan", "inf", "abc", "31536001"] {
                try collector.send(CHP.kv(KVEntry(key: "/client/kv", properties: [("ttl", ttl)], value: Frame("1"))))
            }
            try collector.send(CHP.kv(KVEntry(key: "/client/kv-ok", properties: [("ttl", "30")], value: Frame("\(round)"))))
            let entries = try await kernel.bystander.request(service: "kernel", method: "state.get", params: ["prefix": "/client/kv"])["entries"]
            applied = entries?.arrayValue?.compactMap { $0["key"]?.stringValue } == ["/client/kv-ok"]
                && entries?.arrayValue?.first?["value"]?.intValue == Int64(round)
        }
        #expect(applied, "the valid KVSET applied after the bad ones")
        // The PUB may have connected in the middle of that round, so count a round sent once
        // it is connected: when its last, valid KVSET is applied, the bad ones before it were read.
        let rejectedBefore = try await kernel.stats()["state"]?["rejectedWrites"]?.intValue ?? 0
        for ttl in ["1e11", "1e300", "-5", "nan", "inf", "abc", "31536001"] {
            try collector.send(CHP.kv(KVEntry(key: "/client/kv", properties: [("ttl", ttl)], value: Frame("1"))))
        }
        // A key that is not a path (no leading '/') is malformed too, whoever sends it.
        for key in ["client/kv", "/"] {
            try collector.send(CHP.kv(KVEntry(key: key, value: Frame("1"))))
        }
        try collector.send(CHP.kv(KVEntry(key: "/client/kv-ok2", properties: [("ttl", "30")], value: Frame("1"))))
        try await kernel.state("/client/kv-ok2", "the round's valid KVSET applied") { !$0.isEmpty }
        let stats = try await kernel.stats()
        #expect((stats["state"]?["rejectedWrites"]?.intValue ?? 0) - rejectedBefore == 9, "\(stats)")
        // A plain CHP client's value that is no JSON comes back from state.get as a string.
        try collector.send(CHP.kv(KVEntry(key: "/client/raw", value: Frame("not json {"))))
        try collector.send(CHP.kv(KVEntry(key: "/client/json", value: Frame(#"{"a": [1, 2]}"#))))
        try await kernel.state("/client/", "both KVSETs applied") { $0["/client/raw"] != nil && $0["/client/json"] != nil }
        let entries = try await kernel.bystander.request(service: "kernel", method: "state.get", params: ["prefix": "/client/"])["entries"]?.arrayValue ?? []
        let values = Dictionary(entries.compactMap { entry in entry["key"]?.stringValue.map { ($0, entry["value"] ?? .null) } }, uniquingKeysWith: { $1 })
        #expect(values["/client/raw"] == "not json {" && values["/client/json"] == ["a": [1, 2]], "\(values)")
        // A ttl in range still works, and expires.
        _ = try await kernel.bystander.request(service: "kernel", method: "state.set", params: ["key": "/client/short", "value": 1, "ttl": 0.2])
        try await kernel.state("/client/short", "the key with a 0.2 s ttl expired") { $0.isEmpty }
        #expect(try await kernel.bystander.request(service: "kernel", method: "state.get", params: ["prefix": "/client/short"])["entries"] == [])
        try await kernel.stillServes()
        #expect(kernel.process.isRunning && kernel.process.pid == pid)
        collector.close()
        await kernel.stop()
    }

    @Test("every numeric param of every kernel method, at its extremes: an answer each time, never a crash")
    func kernelParamsAtExtremes() async throws {
        let kernel = try await KernelUnderAttack.start()
        let extremes: [JSONValue] = [0, -1, 1, .int(Int64.max), .int(Int64.min), 1e300, -1e300, 0.5, 2e10, 1e11, "1", .null, [], [:]]
        let calls: [(String, [String: JSONValue])] = [
            ("state.set", ["key": "/client/x", "value": 1]), ("state.publish", ["key": "/client/x", "value": 1]),
            ("state.get", ["prefix": "/client/"]), ("ping", [:]), ("services.list", [:]), ("stats", [:]),
        ]
        var answered = 0
        for (method, base) in calls {
            for field in ["ttl", "limit", "after", "prefix", "key", "value", "sequence"] {
                for value in extremes {
                    var params = base
                    params[field] = value
                    let body = Frame(JSONRPCRequest(id: .number(Int64(7_100_000 + answered)), method: method, params: .object(params)).jsonBytes)
                    let reply = try await kernel.bystander.call(service: "kernel", body: [body])
                    #expect(!(try JSONRPC.parseResponses(reply[0].bytes)).isEmpty)
                    answered += 1
                }
            }
        }
        #expect(answered == calls.count * 7 * extremes.count)
        try await kernel.stillServes()
        #expect(kernel.process.isRunning)
        await kernel.stop()
    }

    @Test("state.get pages: a batch of state.get over large state stays within the message limit; a huge batch is refused")
    func repliesBounded() async throws {
        // A small message limit so the amplification reaches it with little state.
        let kernel = try await KernelUnderAttack.start(["max_message_size": "4194304", "max_batch_items": "50"])
        let value = JSONValue.string(String(repeating: "v", count: 500_000))
        for index in 0..<30 {
            _ = try await kernel.bystander.request(service: "kernel", method: "state.set", params: ["key": .string("/client/big/\(index)"), "value": value])
        }
        // Paging walks every key once, in order.
        var keys: [String] = []
        var after: JSONValue = .null
        repeat {
            let page = try await kernel.bystander.request(service: "kernel", method: "state.get", params: ["prefix": "/client/big/", "after": after])
            let entries = try #require(page["entries"]?.arrayValue)
            #expect(entries.count <= 3, "a page holds about 1 MiB: \(entries.count) entries of 500 kB")
            keys += entries.compactMap { $0["key"]?.stringValue }
            after = page["next"] ?? .null
        } while !after.isNull
        #expect(keys == (0..<30).map { "/client/big/\($0)" }.sorted())

        // 40 state.get in one batch (1,730 bytes that asked for 337 MB before): the reply stays
        // under the limit; the requests past it are answered -32010, not run.
        let one = JSONRPCRequest(id: .number(0), method: "state.get", params: ["prefix": "/client/big/"])
        // Ids of its own: the client takes a reply whose ids it used itself for a late one.
        let batch = (0..<40).map { index in var request = one; request.id = .number(Int64(9_000_000 + index)); return request }
        let body = Frame(JSONRPC.batchReply(batch.map(\.jsonBytes))!)
        let reply = try await kernel.bystander.call(service: "kernel", body: [body])
        #expect(reply[0].count <= 4_194_304, "the batch's reply is \(reply[0].count) bytes")
        let responses = try JSONRPC.parseResponses(reply[0].bytes)
        #expect(responses.count == 40)
        #expect(responses.contains { $0.failure?.code == JSONRPCError.tooLargeCode && $0.failure?.message.contains("kernel.max_message_size") == true })
        #expect(responses.first?.failure == nil)

        // 10,000 requests in one batch: refused whole, naming the limit.
        let huge = Frame(JSONRPC.batchReply((0..<10_000).map { JSONRPCRequest(id: .number(Int64(8_000_000 + $0)), method: "ping").jsonBytes })!)
        let refused = try await kernel.bystander.call(service: "kernel", body: [huge])
        let refusal = try #require(try JSONRPC.parseResponses(refused[0].bytes).first)
        #expect(refusal.failure?.code == JSONRPCError.tooLargeCode && refusal.failure?.message.contains("kernel.max_batch_items") == true, "\(refusal)")

        // A value over the entry limit is refused, naming it.
        let tooBig = await rpcError {
            try await kernel.bystander.request(service: "kernel", method: "state.set",
                                               params: ["key": "/client/huge", "value": .string(String(repeating: "h", count: 2_000_000))])
        }
        #expect(tooBig?.code == JSONRPCError.tooLargeCode && tooBig?.message.contains("kernel.state_max_value_bytes") == true, "\(String(describing: tooBig))")
        try await kernel.stillServes()
        await kernel.stop()
    }

    @Test("a batch whose results are large is answered a turn at a time: a request sent after it, on the same connection, is answered first")
    func largeBatchTakesTurns() async throws {
        let kernel = try await KernelUnderAttack.start()
        do {
            let value = JSONValue.string(String(repeating: "t", count: 600_000))
            for index in 0..<2 {
                _ = try await kernel.bystander.request(service: "kernel", method: "state.set", params: ["key": .string("/client/turns/\(index)"), "value": value])
            }
            // Eight pages of 600 kB: several turns of the kernel's loop. The connection's
            // messages are read in order, so the ping is taken up only after the batch is.
            let batch = (0..<8).map { JSONRPCRequest(id: .number(Int64(100 + $0)), method: "state.get", params: ["prefix": "/client/turns/", "limit": 1]).jsonBytes }
            let replies = try repliesToBatchThenPing(batch, broker: kernel.broker)
            #expect(replies[0].map(\.id) == [.number(1)], "the ping waited for the batch: \(replies[0].map(\.id))")
            #expect(replies[1].map(\.id) == (0..<8).map { .number(Int64(100 + $0)) })
            #expect(replies[1].allSatisfy { $0.failure == nil })
            try await kernel.stillServes()
        } catch {
            Issue.record(error)
        }
        await kernel.stop()
    }

    @Test("a subscriber that never reads while a key is overwritten with large values: dropped after subscriber_timeout, and the kernel's memory comes back")
    func stuckSubscriberLargeValues() async throws {
        let kernel = try await KernelUnderAttack.start(["subscriber_timeout_ms": "2000"])
        let stuck = try kernel.socket(.sub, kernel.publisher)
        try stuck.set(.receiveHighWaterMark, 1)
        try stuck.subscribe("")
        let reader = try await Subscription.open(snapshot: kernel.snapshot, publisher: kernel.publisher, prefixes: ["/client/mark"])
        let before = kernel.residentMegabytes
        // 200 overwrites of one key with 1 MB values through the collector (paced by an
        // acknowledged write): 200 MB if the kernel queued them all for the stuck subscriber.
        let collector = try kernel.socket(.pub, kernel.collector)
        let value = Frame([UInt8](repeating: 0x77, count: 1_000_000))
        for batch in 0..<20 {
            for _ in 0..<10 { try collector.send(CHP.kv(KVEntry(key: "/client/large", value: value))) }
            _ = try await kernel.bystander.request(service: "kernel", method: "state.set", params: ["key": "/client/mark", "value": .int(Int64(batch))])
        }
        let seen = try await within(30, "the reading subscriber sees the mark") { () -> Bool in
            while let event = try await reader.next() {
                if event.update?.key == "/client/mark", event.update?.json == 19 { return true }
            }
            return false
        }
        #expect(seen)
        let during = kernel.residentMegabytes
        // The stuck subscriber is still connected, but answers no heartbeat: dropped, and what
        // was queued for it freed, while the reader goes on.
        var after = kernel.residentMegabytes
        for _ in 0..<100 where after - before >= 30 {
            try await Task.sleep(for: .milliseconds(200))
            after = kernel.residentMegabytes
        }
        print("kernel memory with a stuck subscriber and 200 values of 1 MB: \(Int(before)) MB before, \(Int(during)) MB with them queued, \(Int(after)) MB once it was dropped")
        #expect(after - before < 30, "the kernel stayed at \(after) MB (\(before) MB before) with a subscriber that does not read")
        _ = try await kernel.bystander.request(service: "kernel", method: "state.set", params: ["key": "/client/mark", "value": 20])
        let goesOn = try await within(30, "the reading subscriber goes on") { () -> Bool in
            while let event = try await reader.next() {
                if event.update?.key == "/client/mark", event.update?.json == 20 { return true }
            }
            return false
        }
        #expect(goesOn)
        stuck.close()
        collector.close()
        await reader.cancel()
        try await kernel.stillServes()
        await kernel.stop()
    }
}

extension JSONRPCResponse {
    /// The error it carries, if it is one.
    var failure: JSONRPCError? { if case .failure(let error) = outcome { error } else { nil } }
}
