import BusProtocol
import Foundation
import Testing

@Suite("JSON text: strict parsing and stable writing")
struct JSONTextTests {
    func parse(_ text: String) throws -> JSONValue { try JSONValue(parsing: Array(text.utf8)) }

    @Test("values of every kind")
    func kinds() throws {
        #expect(try parse(#" {"a": [1, -2, 3.5, 1e3, -0.25E-2, true, false, null, "x"], "b": {}} "#) ==
                ["a": [1, -2, 3.5, 1000.0, -0.0025, true, false, nil, "x"], "b": [:]])
        #expect(try parse("9223372036854775807") == .int(Int64.max))
        #expect(try parse("-9223372036854775808") == .int(Int64.min))
        #expect(try parse("9223372036854775808") == .double(9223372036854775808.0))
        #expect(try parse("0") == 0 && (try parse("-0")) == 0)
        #expect(try parse("\"\"") == "")
    }

    @Test("escapes, unicode and surrogate pairs")
    func strings() throws {
        #expect(try parse(#""a\"b\\c\/d\b\f\n\r\t""#) == .string("a\"b\\c/d\u{08}\u{0C}\n\r\t"))
        #expect(try parse(#""\u00e5land \u00C5""#) == "åland Å")
        #expect(try parse(#""\ud83d\ude00""#) == "😀")
        #expect(try parse("\"Åland 😀 日本\"") == "Åland 😀 日本")
    }

    @Test("malformed text is rejected", arguments: [
        "", " ", "{", "[1,]", "{\"a\":1,}", "[1 2]", "{\"a\" 1}", "{a:1}", "01", "1.", ".5", "-", "1e", "+1",
        "tru", "nul", "\"abc", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\ud800\\u0041\"", "\"a\u{01}b\"",
        "1 2", "{} x", "[1]]", "// comment\n1", "NaN", "Infinity", "1e999", "'a'",
    ])
    func rejected(text: String) {
        #expect(throws: (any Error).self) { try parse(text) }
    }

    @Test("invalid UTF-8 is rejected, in a value and in a key; ASCII and valid UTF-8 read as they are")
    func invalidUTF8() throws {
        #expect(throws: (any Error).self) { try JSONValue(parsing: [0x22, 0xC3, 0x28, 0x22]) }
        #expect(throws: (any Error).self) { try JSONValue(parsing: [0x22, 0x5C, 0x6E, 0xFF, 0x22]) }
        #expect(throws: (any Error).self) { try JSONValue(parsing: [0x7B, 0x22, 0xFF, 0x22, 0x3A, 0x31, 0x7D]) }
        #expect(throws: (any Error).self) { try JSONValue(parsing: [0x22, 0x61, 0xED, 0xA0, 0x80, 0x22]) }  // a surrogate's bytes
        #expect(try JSONValue(parsing: Array(#"{"café":"Zürich ✈ 東京","plain":"ascii"}"#.utf8))
            == ["café": "Zürich ✈ 東京", "plain": "ascii"])
    }

    @Test("nesting is bounded")
    func depth() throws {
        let deep = String(repeating: "[", count: 65) + String(repeating: "]", count: 65)
        #expect(throws: (any Error).self) { try JSONValue(parsing: Array(deep.utf8), maxDepth: 64) }
        let fine = String(repeating: "[", count: 64) + String(repeating: "]", count: 64)
        _ = try JSONValue(parsing: Array(fine.utf8), maxDepth: 64)
        let hostile = String(repeating: "{\"a\":", count: 100_000)
        #expect(throws: (any Error).self) { try JSONValue(parsing: Array(hostile.utf8)) }
    }

    @Test("writing: compact, sorted keys, escapes, and what Foundation reads back the same")
    func writing() throws {
        let value: JSONValue = ["b": [1, 2.5, "x\"y\\z\n\u{01}/"], "a": nil, "c": true, "d": -7, "e": "Åland 😀"]
        let text = value.jsonString
        #expect(text == #"{"a":null,"b":[1,2.5,"x\"y\\z\n\u0001/"],"c":true,"d":-7,"e":"Åland 😀"}"#)
        #expect(try JSONValue(parsing: value.jsonBytes) == value)
        // Foundation agrees on what the text means.
        let foundation = try JSONSerialization.jsonObject(with: Data(value.jsonBytes)) as? [String: Any]
        #expect((foundation?["b"] as? [Any])?.count == 3)
        #expect(JSONValue.double(.infinity).jsonString == "null")
    }
}
