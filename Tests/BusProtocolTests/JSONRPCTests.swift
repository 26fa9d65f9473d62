import Testing
@testable import BusProtocol

@Suite("JSON-RPC 2.0 codec")
struct JSONRPCTests {
    func parse(_ text: String) -> JSONRPCIncoming { JSONRPC.parseRequests(Array(text.utf8)) }

    @Test("a valid request parses with its id, method and params")
    func validRequest() {
        #expect(parse(#"{"jsonrpc":"2.0","id":7,"method":"ping","params":{"a":1}}"#)
            == .single(.request(JSONRPCRequest(id: .number(7), method: "ping", params: ["a": 1]))))
        #expect(parse(#"{"jsonrpc":"2.0","id":"x","method":"ping"}"#)
            == .single(.request(JSONRPCRequest(id: .string("x"), method: "ping"))))
        #expect(parse(#"{"jsonrpc":"2.0","method":"notify","params":[1,2]}"#)
            == .single(.request(JSONRPCRequest(id: nil, method: "notify", params: [1, 2]))))
    }

    @Test("a member given twice counts once, the last, as in a parsed object; members JSON-RPC does not name are ignored")
    func repeatedAndUnknownMembers() {
        #expect(parse(#"{"jsonrpc":"2.0","id":1,"method":"first","method":"second","id":2,"extra":{"x":[1]},"client":"a","client":"b"}"#)
            == .single(.request(JSONRPCRequest(id: .number(2), method: "second", client: "b"))))
        #expect(parse(#"{"jsonrpc":"2.0","id":1,"method":"m","method":7}"#)
            == .single(.invalid(JSONRPCResponse(id: .number(1), error: .invalidRequest("method must be a non-empty string")))))
    }

    @Test("trace context travels as traceparent/tracestate members, both ways; members of another type are ignored")
    func traceMembers() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        let request = JSONRPCRequest(id: .number(1), method: "m", params: ["a": 1], trace: .init(parent: parent, state: "k=v"))
        let text = String(decoding: request.jsonBytes, as: UTF8.self)
        #expect(text.contains(#""traceparent":"\#(parent)""#) && text.contains(#""tracestate":"k=v""#), "\(text)")
        guard case .single(.request(let parsed)) = parse(text) else { Issue.record("not a request"); return }
        #expect(parsed == request && parsed.trace?.parent == parent && parsed.trace?.state == "k=v")
        guard case .single(.request(let odd)) = parse(#"{"jsonrpc":"2.0","id":1,"method":"m","traceparent":7}"#) else { Issue.record("not a request"); return }
        #expect(odd.trace == nil)
    }

    @Test("asking for parts is the stream member, true only; a part's body carries its request's id and reads back; a part is no response")
    func parts() throws {
        let request = JSONRPCRequest(id: .number(3), method: "m", trace: .init(parent: "p"), stream: true)
        let text = String(decoding: request.jsonBytes, as: UTF8.self)
        #expect(text == #"{"id":3,"jsonrpc":"2.0","method":"m","stream":true,"traceparent":"p"}"#)
        guard case .single(.request(let parsed)) = parse(text) else { Issue.record("not a request"); return }
        #expect(parsed.stream && parsed == request)
        #expect(try JSONValue(parsing: request.jsonBytes) == request.json)
        guard case .single(.request(let other)) = parse(#"{"jsonrpc":"2.0","id":1,"method":"m","stream":"yes"}"#) else { Issue.record("not a request"); return }
        #expect(!other.stream)
        let part = JSONRPC.partReply(id: .string("a"), partText: Array(#"{"n":1}"#.utf8))
        #expect(String(decoding: part, as: UTF8.self) == #"{"id":"a","jsonrpc":"2.0","part":{"n":1}}"#)
        let read = try JSONRPC.parsePart(part)
        #expect(read.id == .string("a") && read.part == ["n": 1])
        #expect(throws: ProtocolError.self) { try JSONRPC.parsePart(Array(#"{"id":1,"jsonrpc":"2.0","result":1}"#.utf8)) }
        #expect(throws: ProtocolError.self) { try JSONRPC.parseResponses(part) }
    }

    @Test("params stay the text they arrived as, checked as strictly as the rest of the body")
    func paramsKeptAsText() {
        let text = #"{ "params" : { "b" : [1, 2.5, "\u00e9\n"], "a": {} } , "method":"m","id":1,"jsonrpc":"2.0"}"#
        guard case .single(.request(let request)) = parse(text) else { Issue.record("expected a request"); return }
        #expect(request.paramsText.map { String(decoding: $0, as: UTF8.self) } == #"{ "b" : [1, 2.5, "\u00e9\n"], "a": {} }"#)
        #expect(request.params == ["a": [:], "b": [1, 2.5, "é\n"]])
        // Sent on, the params go in as they are.
        #expect(String(decoding: request.jsonBytes, as: UTF8.self)
            == #"{"id":1,"jsonrpc":"2.0","method":"m","params":{ "b" : [1, 2.5, "\u00e9\n"], "a": {} }}"#)
        // Broken text inside the params is still a broken body.
        for broken in [#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":tru}}"#,
                       #"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":"\x"}}"#,
                       #"{"jsonrpc":"2.0","id":1,"method":"m","params":["a",]}"#] {
            guard case .unusable(let response) = parse(broken) else { Issue.record("expected -32700 for \(broken)"); continue }
            #expect(response.errorCode == -32700)
        }
        var invalidUTF8 = Array(#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":""#.utf8)
        invalidUTF8 += [0xC3, 0x28] + Array(#""}}"#.utf8)
        guard case .unusable(let response) = JSONRPC.parseRequests(invalidUTF8) else { Issue.record("expected -32700"); return }
        #expect(response.errorCode == -32700)
    }

    @Test("a service's result goes into the reply as the text it encoded")
    func resultText() throws {
        #expect(String(decoding: JSONRPC.resultReply(id: .string("q"), resultText: Array(#"{"z":1,"a":[true]}"#.utf8)), as: UTF8.self)
            == #"{"id":"q","jsonrpc":"2.0","result":{"z":1,"a":[true]}}"#)
        #expect(try JSONRPC.parseResponses(JSONRPC.resultReply(id: .number(3), resultText: Array("null".utf8)))
            == [JSONRPCResponse(id: .number(3), result: .null)])
    }

    @Test("invalid requests get -32600 with the id when it is known", arguments: [
        (#"{"id":1,"method":"ping"}"#, JSONRPCID.number(1)),
        (#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#, .number(1)),
        (#"{"jsonrpc":"2.0","id":2,"method":5}"#, .number(2)),
        (#"{"jsonrpc":"2.0","id":3,"method":"m","params":"str"}"#, .number(3)),
        (#"{"jsonrpc":"2.0","id":{"a":1},"method":"m"}"#, .null),
        (#"{"jsonrpc":"2.0","id":true,"method":"m"}"#, .null),
        (#"42"#, .null),
    ])
    func invalidRequest(text: String, id: JSONRPCID) {
        guard case .single(.invalid(let response)) = parse(text) else {
            Issue.record("expected an invalid request for \(text)")
            return
        }
        #expect(response.id == id)
        #expect(response.outcome == .failure(JSONRPCError(code: -32600, message: response.outcome.errorMessage ?? "")))
    }

    @Test("a fractional id and an integer id past Int64 are valid (SHOULD NOT, not MUST NOT): answered, the id echoed as sent",
          arguments: ["1.5", "-0.25", "9223372036854775808", "123456789012345678901234567890", "1e3"])
    func numberIDs(id: String) throws {
        guard case .single(.request(let request)) = parse(#"{"jsonrpc":"2.0","id":\#(id),"method":"m"}"#) else {
            Issue.record("expected a request for id \(id)")
            return
        }
        #expect(request.id == .numberText(id))
        let reply = JSONRPCResponse(id: try #require(request.id), result: true).jsonBytes
        #expect(String(decoding: reply, as: UTF8.self) == #"{"id":\#(id),"jsonrpc":"2.0","result":true}"#)
        let refused = JSONRPCResponse(id: .numberText(id), error: .methodNotFound("m")).jsonBytes
        #expect(String(decoding: refused, as: UTF8.self).contains(#""id":\#(id),"#))
        #expect(try JSONRPC.parseResponses(reply).first?.id == .numberText(id), "and a client reads it back")
    }

    @Test("not JSON gives -32700; an empty batch -32600")
    func parseErrors() {
        guard case .unusable(let bad) = parse("{not json") else { Issue.record("expected parse error"); return }
        #expect(bad.errorCode == -32700)
        guard case .unusable(let empty) = parse("[]") else { Issue.record("expected invalid request"); return }
        #expect(empty.errorCode == -32600)
        guard case .unusable(let deep) = parse(String(repeating: "[", count: 100_000)) else { Issue.record("expected parse error"); return }
        #expect(deep.errorCode == -32700)
    }

    @Test("a batch keeps each element's outcome")
    func batch() throws {
        guard case .batch(let items) = parse(#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"bad":true},{"jsonrpc":"2.0","method":"n"}]"#) else {
            Issue.record("expected a batch")
            return
        }
        #expect(items.count == 3)
        if case .request(let first) = items[0] { #expect(first.method == "a") } else { Issue.record("first should be valid") }
        if case .invalid(let second) = items[1] { #expect(second.errorCode == -32600) } else { Issue.record("second should be invalid") }
        let unavailable = JSONRPCError.serviceUnavailable("x", within: 1)
        let batchReply = JSONRPC.errorReply(to: Array(#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"n"},{"jsonrpc":"2.0","id":"b","method":"a"}]"#.utf8), error: unavailable)
        #expect(try JSONRPC.parseResponses(batchReply) == [JSONRPCResponse(id: .number(1), error: unavailable), JSONRPCResponse(id: .string("b"), error: unavailable)])
        #expect(batchReply.first == UInt8(ascii: "["))
        let single = JSONRPC.errorReply(to: Array(#"{"jsonrpc":"2.0","id":7,"method":"a"}"#.utf8), error: unavailable)
        #expect(try JSONRPC.parseResponses(single) == [JSONRPCResponse(id: .number(7), error: unavailable)])
        #expect(single.first == UInt8(ascii: "{"))
        #expect(try JSONRPC.parseResponses(JSONRPC.errorReply(to: Array("not json".utf8), error: unavailable)) == [JSONRPCResponse(id: .null, error: unavailable)])
        #expect(JSONRPC.errorReply(to: Array("[1,".utf8), error: unavailable).first == UInt8(ascii: "["))
        #expect(JSONRPC.errorReply(to: Array(#"[{"jsonrpc":"2.0","method":"n"}]"#.utf8), error: unavailable).isEmpty)
    }

    @Test("responses round trip, results and errors with data")
    func responses() throws {
        let ok = JSONRPCResponse(id: .number(1), result: ["pong": true])
        let failed = JSONRPCResponse(id: .string("q"), error: .invalidParams(field: "limit", "must be between 1 and 100"))
        #expect(try JSONRPC.parseResponses(ok.jsonBytes) == [ok])
        #expect(try JSONRPC.parseResponses(failed.jsonBytes) == [failed])
        #expect(failed.json["error"]?["data"]?["field"] == "limit")
        let batch = JSONRPC.encodeReply([ok, failed], batch: true)!
        #expect(try JSONRPC.parseResponses(batch) == [ok, failed])
        #expect(throws: ProtocolError.self) { try JSONRPC.parseResponses(Array(#"{"jsonrpc":"2.0","id":1}"#.utf8)) }
        #expect(throws: ProtocolError.self) { try JSONRPC.parseResponses(Array("nope".utf8)) }
        // The envelope as a parsed object would read it: the last of a repeated member, a
        // missing id as null, members it does not name ignored, an escaped key as its text.
        #expect(try JSONRPC.parseResponses(Array(#"{"id":1,"jsonrpc":"2.0","result":1,"result":{"a":[2]},"x":{}}"#.utf8))
                == [JSONRPCResponse(id: .number(1), result: ["a": [2]])])
        #expect(try JSONRPC.parseResponses(Array(#" {"jsonrpc":"2.0","res\u0075lt":null} "#.utf8)) == [JSONRPCResponse(id: .null, result: .null)])
        for refused in [#"{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"m"}}"#, #"{"jsonrpc":"1.0","id":1,"result":1}"#,
                        #"{"jsonrpc":"2.0","id":[1],"result":1}"#, #"{"jsonrpc":"2.0","id":1,"error":{"code":"1","message":"m"}}"#,
                        #"[{"jsonrpc":"2.0","id":1,"result":1},2]"#, "3", #"{"jsonrpc":"2.0","id":1,"result":1} x"#,
                        #"{"jsonrpc":"2.0","id":1,"result":"# + String(repeating: "[", count: JSONRPC.maxDepth) + String(repeating: "]", count: JSONRPC.maxDepth) + "}"] {
            #expect(throws: ProtocolError.self, "\(refused)") { try JSONRPC.parseResponses(Array(refused.utf8)) }
        }
    }

    @Test("the kernel's -32001 names the service and the wait")
    func unavailable() {
        let error = JSONRPCError.serviceUnavailable("search", within: 2)
        #expect(error.code == -32001)
        #expect(error.message == "Service unavailable: no worker for 'search' within 2 s")
    }

    @Test("JSONValue keeps integers, doubles, strings and nesting")
    func values() throws {
        let value = try JSONValue(parsing: Array(#"{"i":1,"d":1.5,"s":"é","a":[null,true],"o":{}}"#.utf8))
        #expect(value["i"] == .int(1))
        #expect(value["d"] == .double(1.5))
        #expect(value["s"] == "é")
        #expect(value["a"] == [nil, true])
        #expect(value.jsonString == #"{"a":[null,true],"d":1.5,"i":1,"o":{},"s":"é"}"#)
    }
}

extension Result where Success == JSONValue, Failure == JSONRPCError {
    var errorMessage: String? { if case .failure(let error) = self { error.message } else { nil } }
}

extension JSONRPCResponse {
    var errorCode: Int? { if case .failure(let error) = outcome { error.code } else { nil } }
}
