import BusProtocol
import Foundation
import Testing

@Suite("JSONValue.decode(as:): a typed value straight from a JSON tree, as JSONDecoder reads its text")
struct JSONValueDecoderTests {
    typealias Inner = JSONValueEncoderTests.Inner

    /// The encoder's test value, with an integer a tree keeps exact: past `Int64` a tree
    /// holds a double, as parsing reads one (``JSONValueDecoder``).
    static var everything: JSONValueEncoderTests.Everything {
        var value = JSONValueEncoderTests.Everything()
        value.uint64 = UInt64(Int64.max)
        return value
    }

    @Test("every kind of field reads back as JSONDecoder reads it from the text")
    func sameAsJSONDecoder() throws {
        let text = try JSONEncoder().encode(Self.everything)
        let viaText = try JSONDecoder().decode(JSONValueEncoderTests.Everything.self, from: text)
        let viaTree = try JSONValue(parsing: text).decode(as: JSONValueEncoderTests.Everything.self)
        #expect(viaTree == viaText)
        #expect(viaTree == Self.everything)
    }

    @Test("top-level arrays, optionals, single values and a JSONValue as it is")
    func topLevel() throws {
        let list: JSONValue = [["name": "a"]]
        #expect(try list.decode(as: [Inner].self) == [Inner(name: "a", note: nil)])
        #expect(try JSONValue.null.decode(as: Int?.self) == nil)
        #expect(try JSONValue("text").decode(as: String.self) == "text")
        let record: JSONValue = ["z": [1, 2], "a": nil]
        #expect(try record.decode(as: JSONValue.self) == record)
        let table: JSONValue = ["a": 1, "b": 2]
        #expect(try table.decode(as: [String: Int].self) == ["a": 1, "b": 2])
    }

    @Test("a number decodes as any numeric type it fits exactly")
    func numbers() throws {
        #expect(try JSONValue.double(5).decode(as: Int.self) == 5)
        #expect(try JSONValue.int(3).decode(as: Double.self) == 3)
        #expect(try JSONValue.int(255).decode(as: UInt8.self) == 255)
        #expect(throws: DecodingError.self) { try JSONValue.double(5.5).decode(as: Int.self) }
        #expect(throws: DecodingError.self) { try JSONValue.int(300).decode(as: Int8.self) }
        #expect(throws: DecodingError.self) { try JSONValue.int(-1).decode(as: UInt.self) }
        #expect(throws: DecodingError.self) { try JSONValue.string("5").decode(as: Int.self) }
    }

    struct Outer: Codable {
        var inner: Inner
        var list: [Inner]
        var count: Int8
    }

    @Test("each failure is the DecodingError JSONDecoder throws for the same text, at the same coding path",
          arguments: [
              #"{"list": [], "count": 1}"#,
              #"{"inner": {}, "list": [], "count": 1}"#,
              #"{"inner": {"name": 5}, "list": [], "count": 1}"#,
              #"{"inner": {"name": null}, "list": [], "count": 1}"#,
              #"{"inner": {"name": "a"}, "list": [{"name": "b"}, {"name": ["c"]}], "count": 1}"#,
              #"{"inner": {"name": "a"}, "list": {}, "count": 1}"#,
              #"[1]"#,
          ])
    func sameErrors(text: String) throws {
        func failure(_ decode: () throws -> Outer) -> String {
            do {
                _ = try decode()
                return "decoded"
            } catch let error as DecodingError {
                return Self.shape(error)
            } catch {
                return "\(error)"
            }
        }
        let viaText = failure { try JSONDecoder().decode(Outer.self, from: Data(text.utf8)) }
        let viaTree = failure { try JSONValue(parsing: Array(text.utf8)).decode(as: Outer.self) }
        #expect(viaTree == viaText)
    }

    @Test("a number that does not fit its type is named by its own path (JSONDecoder gives an empty one)")
    func numberThatDoesNotFit() throws {
        for text in [#"{"inner": {"name": "a"}, "list": [], "count": 300}"#, #"{"inner": {"name": "a"}, "list": [], "count": 1.5}"#] {
            do {
                _ = try JSONValue(parsing: Array(text.utf8)).decode(as: Outer.self)
                Issue.record("\(text) decoded")
            } catch let error as DecodingError {
                #expect(Self.shape(error) == "dataCorrupted at count")
            }
        }
    }

    /// The kind of a decoding error and where it is, not its wording.
    static func shape(_ error: DecodingError) -> String {
        func path(_ keys: [any CodingKey]) -> String { keys.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".") }
        switch error {
        case .keyNotFound(let key, let context): return "keyNotFound \(key.stringValue) at \(path(context.codingPath))"
        case .typeMismatch(_, let context): return "typeMismatch at \(path(context.codingPath))"
        case .valueNotFound(_, let context): return "valueNotFound at \(path(context.codingPath))"
        case .dataCorrupted(let context): return "dataCorrupted at \(path(context.codingPath))"
        @unknown default: return "\(error)"
        }
    }
}
