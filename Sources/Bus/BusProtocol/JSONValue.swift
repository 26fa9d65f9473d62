import Foundation

/// Any JSON value. Integers that fit in 64 bits stay integers; other numbers are doubles
/// (money never travels as a number on this bus: amounts are strings).
public enum JSONValue: Sendable, Hashable, Codable, CustomStringConvertible {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() { self = .null }
        else if let value = try? container.decode(Bool.self) { self = .bool(value) }
        else if let value = try? container.decode(Int64.self) { self = .int(value) }
        else if let value = try? container.decode(Double.self) { self = .double(value) }
        else if let value = try? container.decode(String.self) { self = .string(value) }
        else if let value = try? container.decode([JSONValue].self) { self = .array(value) }
        else { self = .object(try container.decode([String: JSONValue].self)) }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .int(let value): try container.encode(value)
        case .double(let value): try container.encode(value)
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }

    /// Whether `bytes` are one JSON value (nested at most `maxDepth` deep), checked as
    /// strictly as parsing does but without building anything.
    public static func isValidText(_ bytes: some Collection<UInt8>, maxDepth: Int = 512) -> Bool {
        let check = { (buffer: UnsafeBufferPointer<UInt8>) -> Bool in JSONText.isValid(buffer, maxDepth: maxDepth) }
        return bytes.withContiguousStorageIfAvailable(check) ?? Array(bytes).withUnsafeBufferPointer(check)
    }

    /// The same for bytes in memory, such as a frame's (not generic: from another module the
    /// generic one is called unspecialized, and copied the bytes into an array).
    public static func isValidText(_ bytes: UnsafeRawBufferPointer, maxDepth: Int = 512) -> Bool {
        JSONText.isValid(bytes.assumingMemoryBound(to: UInt8.self), maxDepth: maxDepth)
    }

    /// Parses JSON text strictly (see ``JSONText``); nesting deeper than `maxDepth` is an error.
    @inlinable  // specialized where called: a generic call per reply looked up metadata
    public init(parsing bytes: some Collection<UInt8>, maxDepth: Int = 512) throws {
        if let value = try bytes.withContiguousStorageIfAvailable({ buffer throws in try Self.parse(buffer, maxDepth: maxDepth) }) {
            self = value
        } else {
            self = try Array(bytes).withUnsafeBufferPointer { buffer throws in try Self.parse(buffer, maxDepth: maxDepth) }
        }
    }

    @usableFromInline static func parse(_ buffer: UnsafeBufferPointer<UInt8>, maxDepth: Int) throws -> JSONValue {
        try JSONText.parse(buffer, maxDepth: maxDepth)
    }

    /// Parses JSON text that must be an array, handing each element to `body` as soon as it
    /// is parsed (the whole array is never in memory as values). Errors from `body` end the
    /// parse and are rethrown.
    public static func forEachElement(ofArray bytes: some Collection<UInt8>, maxDepth: Int = 512,
                                      _ body: (JSONValue) throws -> Void) throws {
        let handled: Void? = try bytes.withContiguousStorageIfAvailable { buffer in
            try JSONText.forEachElement(buffer, maxDepth: maxDepth, body)
        }
        if handled == nil {
            try Array(bytes).withUnsafeBufferPointer { buffer in try JSONText.forEachElement(buffer, maxDepth: maxDepth, body) }
        }
    }

    /// Compact JSON text with sorted keys (stable output for tests and diffs).
    public var jsonBytes: [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(64)
        JSONText.write(self, into: &output)
        return output
    }

    public var jsonString: String { String(decoding: jsonBytes, as: UTF8.self) }
    public var description: String { jsonString }

    public subscript(key: String) -> JSONValue? {
        if case .object(let object) = self { return object[key] }
        return nil
    }

    public var stringValue: String? { if case .string(let value) = self { value } else { nil } }
    public var intValue: Int64? {
        switch self {
        case .int(let value): value
        case .double(let value) where value.rounded() == value && abs(value) < 9.0e15: Int64(value)
        default: nil
        }
    }
    /// A number as a `Double` (an integer too).
    public var doubleValue: Double? {
        switch self {
        case .double(let value): value
        case .int(let value): Double(value)
        default: nil
        }
    }
    public var boolValue: Bool? { if case .bool(let value) = self { value } else { nil } }
    public var arrayValue: [JSONValue]? { if case .array(let value) = self { value } else { nil } }
    public var objectValue: [String: JSONValue]? { if case .object(let value) = self { value } else { nil } }
    public var isNull: Bool { self == .null }
}

extension JSONValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByBooleanLiteral,
    ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral, ExpressibleByNilLiteral, ExpressibleByFloatLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .int(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        self = .object(Dictionary(elements, uniquingKeysWith: { _, last in last }))
    }
    public init(nilLiteral: ()) { self = .null }
    public init(floatLiteral value: Double) { self = .double(value) }
}

extension JSONValue {
    /// Converts any `Encodable` value to a JSON value.
    public init(encoding value: some Encodable) throws {
        self = try JSONValueEncoder.encode(value)
    }

    /// Decodes this JSON value as `type`, straight from the tree (``JSONValueDecoder``).
    public func decode<T: Decodable>(as type: T.Type = T.self) throws -> T {
        try JSONValueDecoder.decode(T.self, from: self)
    }
}
