import BusProtocol
import Foundation
import Testing

@Suite("JSONValue(encoding:): a typed value straight into a JSON tree, as JSONEncoder would write it")
struct JSONValueEncoderTests {
    struct Inner: Codable, Equatable {
        var name: String
        var note: String?
    }

    enum Kind: String, Codable { case one, two }

    struct Everything: Codable, Equatable {
        var text = "a \"quoted\" / slashed é"
        var flag = true
        var int = -42
        var int8: Int8 = -8
        var uint64 = UInt64.max
        var small: UInt32 = 7
        var whole = 5.0
        var fraction = 0.1
        var float: Float = 1.5
        var missing: String? = nil
        var present: Int? = 3
        var kind = Kind.two
        var inner = Inner(name: "x", note: nil)
        var list = [Inner(name: "a", note: "n"), Inner(name: "b", note: nil)]
        var nested = [[1, 2], [], [3]]
        var table = ["b": 2, "a": 1]
        var record: JSONValue = ["kept": [1, "as", nil, true], "n": 2.5]
        var decimal = Decimal(string: "12.5")!
        var url = URL(string: "https://example.org/a?b=c")!
        var data = Data([0, 1, 2, 250])
        var date = Date(timeIntervalSinceReferenceDate: 86_400)
    }

    @Test("every kind of field gives what JSONEncoder's text parses to")
    func sameAsJSONEncoder() throws {
        let value = Everything()
        let viaText = try JSONValue(parsing: JSONEncoder().encode(value))
        #expect(try JSONValue(encoding: value) == viaText)
        // Absent optionals stay absent; a whole double is an integer, as parsing reads it.
        let tree = try JSONValue(encoding: value)
        #expect(tree["missing"] == nil && tree["present"] == 3 && tree["whole"] == 5 && tree["inner"]?["note"] == nil)
    }

    @Test("top-level arrays, optionals, single values and a JSONValue as it is")
    func topLevel() throws {
        #expect(try JSONValue(encoding: [Inner(name: "a", note: nil)]) == [["name": "a"]])
        #expect(try JSONValue(encoding: Optional<Int>.none) == .null)
        #expect(try JSONValue(encoding: "text") == "text")
        let record: JSONValue = ["z": [1, 2], "a": nil]
        #expect(try JSONValue(encoding: record) == record)
    }
}
