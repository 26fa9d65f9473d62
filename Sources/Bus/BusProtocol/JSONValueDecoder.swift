import Foundation

/// Decodes a ``JSONValue`` tree straight into a `Decodable` type, with no JSON text in
/// between: the twin of ``JSONValueEncoder``. A request's params are parsed once (and checked
/// against their schema as a tree), then decoded from that tree rather than written out and
/// parsed again by `JSONDecoder`.
///
/// Reads what `JSONDecoder`'s defaults read, and fails where they fail, with the same
/// `DecodingError`s and coding paths: a number decodes as any numeric type it fits exactly
/// (`5.0` as `Int`, not `5.5`); `Date` is seconds since 2001, `Data` base64, `URL` a string,
/// `Decimal` a number; a missing key is `keyNotFound`, a null for a value `valueNotFound`.
/// Two differences: a number that does not fit is `dataCorrupted` at its own path (where
/// `JSONDecoder` gives an empty one), and an integer past `Int64` is a double in the tree,
/// so it decodes as an integer only where the double is exact.
enum JSONValueDecoder {
    static func decode<T: Decodable>(_ type: T.Type, from value: JSONValue) throws -> T {
        try TreeDecoder(value, in: [], at: nil).unwrap(T.self)
    }
}

/// A decoder at one value of the tree. Its coding path is made only when asked for (an error,
/// a nested container): most values are leaves read without one.
private struct TreeDecoder: Decoder, SingleValueDecodingContainer {
    let value: JSONValue
    /// The path of the container holding this value, and this value's key in it (nil: the root).
    let parentPath: [any CodingKey]
    let key: (any CodingKey)?
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    init(_ value: JSONValue, in parentPath: [any CodingKey], at key: (any CodingKey)?) {
        self.value = value
        self.parentPath = parentPath
        self.key = key
    }

    var codingPath: [any CodingKey] { key.map { parentPath + [$0] } ?? parentPath }

    /// The value as `T`: JSON's own kinds and Foundation's special cases directly, else what
    /// `T`'s `init(from:)` reads.
    func unwrap<T: Decodable>(_ type: T.Type) throws -> T {
        if T.self == JSONValue.self { return value as! T }
        if T.self == String.self { return try decode(String.self) as! T }
        if T.self == Int.self { return try decode(Int.self) as! T }
        if T.self == Double.self { return try decode(Double.self) as! T }
        if T.self == Bool.self { return try decode(Bool.self) as! T }
        if T.self == Data.self {
            let text = try decode(String.self)
            guard let data = Data(base64Encoded: text) else { throw corrupted("Encountered Data is not valid Base64.") }
            return data as! T
        }
        if T.self == URL.self {
            let text = try decode(String.self)
            guard let url = URL(string: text) else { throw corrupted("Invalid URL string.") }
            return url as! T
        }
        if T.self == Decimal.self {
            switch value {
            case .int(let number): return Decimal(number) as! T
            case .double(let number): return Decimal(number) as! T
            default: throw mismatch(Decimal.self)
            }
        }
        return try T(from: self)
    }

    // MARK: Decoder

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard case .object(let members) = value else { throw mismatch([String: JSONValue].self) }
        return KeyedDecodingContainer(KeyedTree<Key>(members: members, codingPath: codingPath))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard case .array(let elements) = value else { throw mismatch([JSONValue].self) }
        return UnkeyedTree(elements: elements, codingPath: codingPath)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer { self }

    // MARK: SingleValueDecodingContainer

    func decodeNil() -> Bool { value == .null }

    func decode(_ type: Bool.Type) throws -> Bool {
        guard case .bool(let bool) = value else { throw mismatch(type) }
        return bool
    }

    func decode(_ type: String.Type) throws -> String {
        guard case .string(let string) = value else { throw mismatch(type) }
        return string
    }

    func decode(_ type: Double.Type) throws -> Double {
        switch value {
        case .double(let number): return number
        case .int(let number): return Double(number)
        default: throw mismatch(type)
        }
    }

    func decode(_ type: Float.Type) throws -> Float {
        let number = try decode(Double.self)
        guard number.isFinite, abs(number) <= Double(Float.greatestFiniteMagnitude) else {
            throw corrupted("Parsed JSON number <\(number)> does not fit in Float.")
        }
        return Float(number)
    }

    func decode(_ type: Int.Type) throws -> Int { try integer(type) }
    func decode(_ type: Int8.Type) throws -> Int8 { try integer(type) }
    func decode(_ type: Int16.Type) throws -> Int16 { try integer(type) }
    func decode(_ type: Int32.Type) throws -> Int32 { try integer(type) }
    func decode(_ type: Int64.Type) throws -> Int64 { try integer(type) }
    func decode(_ type: UInt.Type) throws -> UInt { try integer(type) }
    func decode(_ type: UInt8.Type) throws -> UInt8 { try integer(type) }
    func decode(_ type: UInt16.Type) throws -> UInt16 { try integer(type) }
    func decode(_ type: UInt32.Type) throws -> UInt32 { try integer(type) }
    func decode(_ type: UInt64.Type) throws -> UInt64 { try integer(type) }
    func decode<T: Decodable>(_ type: T.Type) throws -> T { try unwrap(type) }

    /// A number as `I` when it is one exactly (`3.0` is 3; `3.5`, or 300 as `Int8`, is no `Int8`).
    private func integer<I: FixedWidthInteger>(_ type: I.Type) throws -> I {
        let exact: I?
        switch value {
        case .int(let number): exact = I(exactly: number)
        case .double(let number): exact = I(exactly: number)
        default: throw mismatch(type)
        }
        guard let exact else { throw corrupted("Parsed JSON number <\(value)> does not fit in \(I.self).") }
        return exact
    }

    // MARK: Errors, as JSONDecoder words them

    func mismatch(_ type: Any.Type) -> DecodingError {
        guard value != .null else {
            return .valueNotFound(type, .init(codingPath: codingPath, debugDescription: "Cannot get value of type \(type) -- found null value instead"))
        }
        return .typeMismatch(type, .init(codingPath: codingPath, debugDescription: "Expected to decode \(type) but found \(value.kindName) instead."))
    }

    func corrupted(_ description: String) -> DecodingError {
        .dataCorrupted(.init(codingPath: codingPath, debugDescription: description))
    }
}

/// An object's members.
private struct KeyedTree<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let members: [String: JSONValue]
    let codingPath: [any CodingKey]

    var allKeys: [Key] { members.keys.compactMap { Key(stringValue: $0) } }

    func contains(_ key: Key) -> Bool { members[key.stringValue] != nil }

    private func decoder(for key: some CodingKey) throws -> TreeDecoder {
        guard let value = members[key.stringValue] else {
            throw DecodingError.keyNotFound(key, .init(codingPath: codingPath, debugDescription: "No value associated with key \(key) (\"\(key.stringValue)\")."))
        }
        return TreeDecoder(value, in: codingPath, at: key)
    }

    func decodeNil(forKey key: Key) throws -> Bool { try decoder(for: key).decodeNil() }
    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T { try decoder(for: key).unwrap(type) }
    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool { try decoder(for: key).decode(type) }
    func decode(_ type: String.Type, forKey key: Key) throws -> String { try decoder(for: key).decode(type) }
    func decode(_ type: Double.Type, forKey key: Key) throws -> Double { try decoder(for: key).decode(type) }
    func decode(_ type: Float.Type, forKey key: Key) throws -> Float { try decoder(for: key).decode(type) }
    func decode(_ type: Int.Type, forKey key: Key) throws -> Int { try decoder(for: key).decode(type) }
    func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 { try decoder(for: key).decode(type) }
    func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 { try decoder(for: key).decode(type) }
    func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 { try decoder(for: key).decode(type) }
    func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 { try decoder(for: key).decode(type) }
    func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt { try decoder(for: key).decode(type) }
    func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 { try decoder(for: key).decode(type) }
    func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 { try decoder(for: key).decode(type) }
    func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 { try decoder(for: key).decode(type) }
    func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 { try decoder(for: key).decode(type) }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        try decoder(for: key).container(keyedBy: type)
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        try decoder(for: key).unkeyedContainer()
    }

    func superDecoder() throws -> any Decoder { TreeDecoder(members["super"] ?? .null, in: codingPath, at: TreeKey("super")) }
    func superDecoder(forKey key: Key) throws -> any Decoder { TreeDecoder(members[key.stringValue] ?? .null, in: codingPath, at: key) }
}

/// An array's elements, in order.
private struct UnkeyedTree: UnkeyedDecodingContainer {
    let elements: [JSONValue]
    let codingPath: [any CodingKey]
    private(set) var currentIndex = 0

    init(elements: [JSONValue], codingPath: [any CodingKey]) {
        self.elements = elements
        self.codingPath = codingPath
    }

    var count: Int? { elements.count }
    var isAtEnd: Bool { currentIndex >= elements.count }

    /// The next element's decoder, moving past it once `read` succeeds (as JSONDecoder does).
    private mutating func next<T>(_ type: Any.Type, _ read: (TreeDecoder) throws -> T) throws -> T {
        guard !isAtEnd else {
            throw DecodingError.valueNotFound(type, .init(codingPath: codingPath + [TreeKey(index: currentIndex)], debugDescription: "Unkeyed container is at end."))
        }
        let value = try read(TreeDecoder(elements[currentIndex], in: codingPath, at: TreeKey(index: currentIndex)))
        currentIndex += 1
        return value
    }

    mutating func decodeNil() throws -> Bool {
        guard !isAtEnd, elements[currentIndex] == .null else { return false }
        currentIndex += 1
        return true
    }

    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T { try next(type) { try $0.unwrap(type) } }
    mutating func decode(_ type: Bool.Type) throws -> Bool { try next(type) { try $0.decode(type) } }
    mutating func decode(_ type: String.Type) throws -> String { try next(type) { try $0.decode(type) } }
    mutating func decode(_ type: Double.Type) throws -> Double { try next(type) { try $0.decode(type) } }
    mutating func decode(_ type: Float.Type) throws -> Float { try next(type) { try $0.decode(type) } }
    mutating func decode(_ type: Int.Type) throws -> Int { try next(type) { try $0.decode(type) } }
    mutating func decode(_ type: Int8.Type) throws -> Int8 { try next(type) { try $0.decode(type) } }
    mutating func decode(_ type: Int16.Type) throws -> Int16 { try next(type) { try $0.decode(type) } }
    mutating func decode(_ type: Int32.Type) throws -> Int32 { try next(type) { try $0.decode(type) } }
    mutating func decode(_ type: Int64.Type) throws -> Int64 { try next(type) { try $0.decode(type) } }
    mutating func decode(_ type: UInt.Type) throws -> UInt { try next(type) { try $0.decode(type) } }
    mutating func decode(_ type: UInt8.Type) throws -> UInt8 { try next(type) { try $0.decode(type) } }
    mutating func decode(_ type: UInt16.Type) throws -> UInt16 { try next(type) { try $0.decode(type) } }
    mutating func decode(_ type: UInt32.Type) throws -> UInt32 { try next(type) { try $0.decode(type) } }
    mutating func decode(_ type: UInt64.Type) throws -> UInt64 { try next(type) { try $0.decode(type) } }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        try next([String: JSONValue].self) { try $0.container(keyedBy: type) }
    }

    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        try next([JSONValue].self) { try $0.unkeyedContainer() }
    }

    mutating func superDecoder() throws -> any Decoder { try next(JSONValue.self) { $0 } }
}

/// A key of the coding path: an array's index (named only when asked), or `super`.
private enum TreeKey: CodingKey {
    case index(Int)
    case named(String)

    init(_ string: String) { self = .named(string) }
    init(index: Int) { self = .index(index) }
    init?(stringValue: String) { self = .named(stringValue) }
    init?(intValue: Int) { self = .index(intValue) }

    var stringValue: String {
        switch self {
        case .index(let index): "Index \(index)"
        case .named(let name): name
        }
    }

    var intValue: Int? { if case .index(let index) = self { index } else { nil } }
}

extension JSONValue {
    /// What kind of value it is, as a decoding error names it.
    fileprivate var kindName: String {
        switch self {
        case .null: "null"
        case .bool: "bool"
        case .int, .double: "number"
        case .string: "a string"
        case .array: "an array"
        case .object: "a dictionary"
        }
    }
}
