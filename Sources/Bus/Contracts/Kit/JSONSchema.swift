public import BusProtocol

/// JSON Schema (draft 2020-12) for the contracts' `Codable` types, generated from the types
/// themselves: a type's `init(from:)` is run once against a decoder that records what it asks
/// for (each key, its type, whether it is optional) instead of reading input. So a params
/// struct is written once, and its schema, its check and its decoding all follow from it.
public enum JSONSchema {
    /// The dialect every generated schema follows.
    public static let dialect = "https://json-schema.org/draft/2020-12/schema"

    /// The schema of `type`: objects list their properties, the required ones in `required`,
    /// and allow no others; optional properties also accept null.
    public static func of<T: Decodable>(_ type: T.Type) -> JSONValue {
        (try? SchemaRecorder.describe(type).schema) ?? [:]
    }

    /// Whether `schema` accepts any JSON value (nothing to check).
    public static func acceptsAnything(_ schema: JSONValue) -> Bool { schema == [:] }
}

/// A type that states its own schema instead of having it recorded (open values, enums).
public protocol SchemaDescribed: Decodable {
    static var jsonSchema: JSONValue { get }
    /// Any valid value, handed to the recorder's caller in place of a decoded one.
    static var schemaSample: Self { get }
}

extension JSONValue: SchemaDescribed {
    public static var jsonSchema: JSONValue { [:] }
    public static var schemaSample: JSONValue { .null }
}

/// String enums list their cases.
extension SchemaDescribed where Self: CaseIterable & RawRepresentable, RawValue == String {
    public static var jsonSchema: JSONValue { ["type": "string", "enum": .array(allCases.map { .string($0.rawValue) })] }
    public static var schemaSample: Self { allCases.first! }
}

/// A params type that states the range of each of its numeric fields, by the field's JSON
/// name. The generated schema carries them (`minimum`, `maximum`), so `rpc.discover` shows
/// them and ``SchemaCheck`` refuses a number outside one before any handler converts it
/// (-32602 naming the field and its range): ranges are the contract's rule, written once.
public protocol NumberRanges {
    static var numberRanges: [String: ClosedRange<Double>] { get }
}

/// Records the schema of one value while its `init(from:)` runs.
final class SchemaRecorder {
    enum Shape {
        case unknown
        case object(properties: [(name: String, schema: JSONValue)], optional: Set<String>, open: Bool)
        case array(items: JSONValue)
        case value(JSONValue)
    }
    var shape = Shape.unknown
    var nullable = false

    var schema: JSONValue {
        let base: JSONValue
        switch shape {
        case .unknown: base = [:]
        case .value(let schema): base = schema
        case .array(let items): base = ["type": "array", "items": items]
        case .object(let properties, let optional, let open):
            var object: [String: JSONValue] = ["type": "object"]
            if !properties.isEmpty {
                object["properties"] = .object(Dictionary(properties.map { property in
                    (property.name, optional.contains(property.name) ? Self.orNull(property.schema) : property.schema)
                }, uniquingKeysWith: { $1 }))
            }
            let required = properties.map(\.name).filter { !optional.contains($0) }
            if !required.isEmpty { object["required"] = .array(required.map { .string($0) }) }
            if !open { object["additionalProperties"] = false }
            base = .object(object)
        }
        return nullable ? Self.orNull(base) : base
    }

    /// `schema` that also accepts null.
    static func orNull(_ schema: JSONValue) -> JSONValue {
        if JSONSchema.acceptsAnything(schema) { return schema }
        if case .string(let type)? = schema["type"], var object = schema.objectValue {
            object["type"] = [.string(type), "null"]
            return .object(object)
        }
        return ["anyOf": [schema, ["type": "null"]]]
    }

    /// The schema of `type` and a sample value of it.
    static func describe<T: Decodable>(_ type: T.Type) throws -> (schema: JSONValue, sample: T) {
        if let described = type as? any SchemaDescribed.Type {
            return (described.jsonSchema, described.schemaSample as! T)
        }
        if let primitive = primitive(type) { return primitive }
        let recorder = SchemaRecorder()
        let sample = try T(from: RecordingDecoder(recorder: recorder))
        guard let ranged = type as? any NumberRanges.Type else { return (recorder.schema, sample) }
        return (bounded(recorder.schema, by: ranged.numberRanges, of: type), sample)
    }

    /// `schema` with each named property's `minimum` and `maximum`.
    private static func bounded<T>(_ schema: JSONValue, by ranges: [String: ClosedRange<Double>], of type: T.Type) -> JSONValue {
        guard var object = schema.objectValue, var properties = object["properties"]?.objectValue else { return schema }
        for (name, range) in ranges {
            guard var property = properties[name]?.objectValue else {
                preconditionFailure("\(T.self).numberRanges names '\(name)', which is no field of it")
            }
            property["minimum"] = number(range.lowerBound)
            property["maximum"] = number(range.upperBound)
            properties[name] = .object(property)
        }
        object["properties"] = .object(properties)
        return .object(object)
    }

    private static func number(_ value: Double) -> JSONValue {
        value == value.rounded() && abs(value) < 9e15 ? .int(Int64(value)) : .double(value)
    }

    private static func primitive<T>(_ type: T.Type) -> (schema: JSONValue, sample: T)? {
        switch type {
        case is String.Type: return (["type": "string"], "" as! T)
        case is Bool.Type: return (["type": "boolean"], false as! T)
        case is Double.Type: return (["type": "number"], 0.0 as! T)
        case is Float.Type: return (["type": "number"], Float(0) as! T)
        case is Int.Type: return (["type": "integer"], 0 as! T)
        case is Int64.Type: return (["type": "integer"], Int64(0) as! T)
        case is Int32.Type: return (["type": "integer"], Int32(0) as! T)
        case is UInt64.Type: return (["type": "integer", "minimum": 0], UInt64(0) as! T)
        case is UInt.Type: return (["type": "integer", "minimum": 0], UInt(0) as! T)
        case is UInt32.Type: return (["type": "integer", "minimum": 0], UInt32(0) as! T)
        default: return nil
        }
    }
}

private struct RecordingDecoder: Decoder {
    let recorder: SchemaRecorder
    var codingPath: [any CodingKey] = []
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        if case .unknown = recorder.shape { recorder.shape = .object(properties: [], optional: [], open: false) }
        return KeyedDecodingContainer(RecordingKeyedContainer<Key>(recorder: recorder))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        RecordingUnkeyedContainer(recorder: recorder)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        RecordingSingleValueContainer(recorder: recorder)
    }
}

private struct RecordingKeyedContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let recorder: SchemaRecorder
    var codingPath: [any CodingKey] { [] }

    /// Asked for by dictionaries, which decode whatever keys there are: an open object.
    var allKeys: [Key] {
        if case .object(let properties, let optional, _) = recorder.shape {
            recorder.shape = .object(properties: properties, optional: optional, open: true)
        }
        return []
    }

    func contains(_ key: Key) -> Bool { true }

    /// `decodeIfPresent` asks this first: the key is optional.
    func decodeNil(forKey key: Key) throws -> Bool {
        if case .object(let properties, var optional, let open) = recorder.shape {
            optional.insert(key.stringValue)
            recorder.shape = .object(properties: properties, optional: optional, open: open)
        }
        return false
    }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        let (schema, sample) = try SchemaRecorder.describe(type)
        if case .object(var properties, let optional, let open) = recorder.shape {
            properties.removeAll { $0.name == key.stringValue }
            properties.append((key.stringValue, schema))
            recorder.shape = .object(properties: properties, optional: optional, open: open)
        }
        return sample
    }

    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool { try decode(type as Bool.Type, key) }
    func decode(_ type: String.Type, forKey key: Key) throws -> String { try decode(type as String.Type, key) }
    func decode(_ type: Double.Type, forKey key: Key) throws -> Double { try decode(type as Double.Type, key) }
    func decode(_ type: Float.Type, forKey key: Key) throws -> Float { try decode(type as Float.Type, key) }
    func decode(_ type: Int.Type, forKey key: Key) throws -> Int { try decode(type as Int.Type, key) }
    func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 { try decode(type as Int8.Type, key) }
    func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 { try decode(type as Int16.Type, key) }
    func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 { try decode(type as Int32.Type, key) }
    func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 { try decode(type as Int64.Type, key) }
    func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt { try decode(type as UInt.Type, key) }
    func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 { try decode(type as UInt8.Type, key) }
    func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 { try decode(type as UInt16.Type, key) }
    func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 { try decode(type as UInt32.Type, key) }
    func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 { try decode(type as UInt64.Type, key) }

    /// The generic path for the concrete overloads above (which the protocol requires).
    private func decode<T: Decodable>(_ type: T.Type, _ key: Key) throws -> T { try decode(type, forKey: key) }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        throw DecodingError.dataCorrupted(.init(codingPath: [key], debugDescription: "nested containers have no recorded schema"))
    }
    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        throw DecodingError.dataCorrupted(.init(codingPath: [key], debugDescription: "nested containers have no recorded schema"))
    }
    func superDecoder() throws -> any Decoder { RecordingDecoder(recorder: SchemaRecorder()) }
    func superDecoder(forKey key: Key) throws -> any Decoder { RecordingDecoder(recorder: SchemaRecorder()) }
}

/// Arrays: one element is decoded (its schema is the items'), then the array ends.
private struct RecordingUnkeyedContainer: UnkeyedDecodingContainer {
    let recorder: SchemaRecorder
    var codingPath: [any CodingKey] { [] }
    var count: Int? { nil }
    var currentIndex = 0
    var isAtEnd: Bool { currentIndex > 0 }

    mutating func decodeNil() throws -> Bool { false }

    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T { try decodeAny(type) }
    mutating func decode(_ type: Bool.Type) throws -> Bool { try decodeAny(type) }
    mutating func decode(_ type: String.Type) throws -> String { try decodeAny(type) }
    mutating func decode(_ type: Double.Type) throws -> Double { try decodeAny(type) }
    mutating func decode(_ type: Float.Type) throws -> Float { try decodeAny(type) }
    mutating func decode(_ type: Int.Type) throws -> Int { try decodeAny(type) }
    mutating func decode(_ type: Int8.Type) throws -> Int8 { try decodeAny(type) }
    mutating func decode(_ type: Int16.Type) throws -> Int16 { try decodeAny(type) }
    mutating func decode(_ type: Int32.Type) throws -> Int32 { try decodeAny(type) }
    mutating func decode(_ type: Int64.Type) throws -> Int64 { try decodeAny(type) }
    mutating func decode(_ type: UInt.Type) throws -> UInt { try decodeAny(type) }
    mutating func decode(_ type: UInt8.Type) throws -> UInt8 { try decodeAny(type) }
    mutating func decode(_ type: UInt16.Type) throws -> UInt16 { try decodeAny(type) }
    mutating func decode(_ type: UInt32.Type) throws -> UInt32 { try decodeAny(type) }
    mutating func decode(_ type: UInt64.Type) throws -> UInt64 { try decodeAny(type) }

    private mutating func decodeAny<T: Decodable>(_ type: T.Type) throws -> T {
        let (schema, sample) = try SchemaRecorder.describe(type)
        recorder.shape = .array(items: schema)
        currentIndex += 1
        return sample
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "nested containers have no recorded schema"))
    }
    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "nested containers have no recorded schema"))
    }
    mutating func superDecoder() throws -> any Decoder { RecordingDecoder(recorder: SchemaRecorder()) }
}

private struct RecordingSingleValueContainer: SingleValueDecodingContainer {
    let recorder: SchemaRecorder
    var codingPath: [any CodingKey] { [] }

    /// `Optional` asks this: the value may be null.
    func decodeNil() -> Bool {
        recorder.nullable = true
        return false
    }

    func decode<T: Decodable>(_ type: T.Type) throws -> T { try decodeAny(type) }
    func decode(_ type: Bool.Type) throws -> Bool { try decodeAny(type) }
    func decode(_ type: String.Type) throws -> String { try decodeAny(type) }
    func decode(_ type: Double.Type) throws -> Double { try decodeAny(type) }
    func decode(_ type: Float.Type) throws -> Float { try decodeAny(type) }
    func decode(_ type: Int.Type) throws -> Int { try decodeAny(type) }
    func decode(_ type: Int8.Type) throws -> Int8 { try decodeAny(type) }
    func decode(_ type: Int16.Type) throws -> Int16 { try decodeAny(type) }
    func decode(_ type: Int32.Type) throws -> Int32 { try decodeAny(type) }
    func decode(_ type: Int64.Type) throws -> Int64 { try decodeAny(type) }
    func decode(_ type: UInt.Type) throws -> UInt { try decodeAny(type) }
    func decode(_ type: UInt8.Type) throws -> UInt8 { try decodeAny(type) }
    func decode(_ type: UInt16.Type) throws -> UInt16 { try decodeAny(type) }
    func decode(_ type: UInt32.Type) throws -> UInt32 { try decodeAny(type) }
    func decode(_ type: UInt64.Type) throws -> UInt64 { try decodeAny(type) }

    private func decodeAny<T: Decodable>(_ type: T.Type) throws -> T {
        let (schema, sample) = try SchemaRecorder.describe(type)
        recorder.shape = .value(schema)
        return sample
    }
}

// MARK: - Checking a value against a generated schema

/// Checks a JSON value against a generated schema (the subset ``JSONSchema`` writes: `type`,
/// `properties`, `required`, `additionalProperties: false`, `items`, `enum`, `anyOf`,
/// `minimum`, `maximum`), naming the first field that does not fit and what was expected there.
public enum SchemaCheck {
    public struct Mismatch: Error, Sendable, Equatable {
        /// Where: `params`, `text`, `article.title`, `ids[2]`.
        public var field: String
        /// What the contract wants there, in words: "an integer", "no such field".
        public var expected: String
        public var problem: String

        /// -32602 with `data.field` and `data.expected`.
        public var error: JSONRPCError {
            JSONRPCError(code: JSONRPCError.invalidParamsCode, message: "Invalid params: \(field): \(problem)",
                         data: ["field": .string(field), "expected": .string(expected)])
        }
    }

    /// The first mismatch of `value` with `schema`, or nil when it fits.
    public static func mismatch(_ value: JSONValue, _ schema: JSONValue, at field: String = "") -> Mismatch? {
        if JSONSchema.acceptsAnything(schema) { return nil }
        let here = field.isEmpty ? "params" : field
        if case .array(let choices)? = schema["anyOf"] {
            var first: Mismatch?
            for choice in choices {
                guard let mismatch = mismatch(value, choice, at: field) else { return nil }
                first = first ?? mismatch
            }
            return first
        }
        if case .array(let allowed)? = schema["enum"], !allowed.contains(value) {
            let words = "one of " + allowed.map(\.description).joined(separator: ", ")
            return Mismatch(field: here, expected: words, problem: "must be \(words)")
        }
        if let types = schema["type"] {
            let names: [String] = switch types {
            case .string(let name): [name]
            case .array(let list): list.compactMap(\.stringValue)
            default: []
            }
            guard names.contains(where: { fits(value, $0) }) else {
                let words = names.map(describe).joined(separator: " or ")
                return Mismatch(field: here, expected: words, problem: value.isNull ? "is required to be \(words), not null" : "must be \(words)")
            }
        }
        if let number = value.doubleValue, let range = range(schema), !range.contains(number) {
            return Mismatch(field: here, expected: range.words, problem: "must be \(range.words), got \(value)")
        }
        switch value {
        case .object(let members):
            let properties = schema["properties"]?.objectValue ?? [:]
            for case .string(let name) in schema["required"]?.arrayValue ?? [] where members[name] == nil {
                let path = join(field, name)
                return Mismatch(field: path, expected: properties[name].map(expectation) ?? "a value", problem: "is required")
            }
            for name in members.keys.sorted() {
                if let property = properties[name] {
                    if let mismatch = mismatch(members[name]!, property, at: join(field, name)) { return mismatch }
                } else if schema["additionalProperties"] == false {
                    let known = properties.keys.sorted()
                    let expected = known.isEmpty ? "no fields" : "one of the fields " + known.joined(separator: ", ")
                    return Mismatch(field: join(field, name), expected: expected, problem: "is not a field of this method (\(expected))")
                }
            }
        case .array(let elements):
            if let items = schema["items"] {
                for (index, element) in elements.enumerated() {
                    if let mismatch = mismatch(element, items, at: "\(here)[\(index)]") { return mismatch }
                }
            }
        default:
            break
        }
        return nil
    }

    private static func join(_ field: String, _ name: String) -> String { field.isEmpty ? name : "\(field).\(name)" }

    /// The numeric range a schema allows (`minimum`, `maximum`), with it in words; nil: any number.
    private static func range(_ schema: JSONValue) -> (contains: (Double) -> Bool, words: String)? {
        let minimum = schema["minimum"], maximum = schema["maximum"]
        guard minimum != nil || maximum != nil else { return nil }
        let low = minimum?.doubleValue ?? -.infinity, high = maximum?.doubleValue ?? .infinity
        let integer = schema["type"] == "integer" || schema["type"]?.arrayValue?.contains("integer") == true
        let kind = integer ? "an integer" : "a number"
        let words = switch (minimum, maximum) {
        case (let minimum?, let maximum?): "\(kind) from \(minimum) to \(maximum)"
        case (let minimum?, nil): "\(kind) of at least \(minimum)"
        default: "\(kind) of at most \(maximum!)"
        }
        return ({ low <= $0 && $0 <= high }, words)
    }

    private static func fits(_ value: JSONValue, _ type: String) -> Bool {
        switch (type, value) {
        case ("null", .null), ("boolean", .bool), ("string", .string), ("array", .array), ("object", .object),
             ("integer", .int), ("number", .int), ("number", .double): true
        case ("integer", .double(let number)): number == number.rounded(.towardZero) && abs(number) < 9.2e18
        default: false
        }
    }

    /// A schema in words, for `data.expected`.
    static func expectation(_ schema: JSONValue) -> String {
        if case .array(let allowed)? = schema["enum"] { return "one of " + allowed.map(\.description).joined(separator: ", ") }
        switch schema["type"] {
        case .string(let name)?: return describe(name)
        case .array(let names)?: return names.compactMap(\.stringValue).map(describe).joined(separator: " or ")
        default: return "a value"
        }
    }

    private static func describe(_ type: String) -> String {
        switch type {
        case "integer": "an integer"
        case "number": "a number"
        case "string": "a string"
        case "boolean": "true or false"
        case "array": "an array"
        case "object": "an object"
        default: type
        }
    }
}
