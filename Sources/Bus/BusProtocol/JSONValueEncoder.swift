import Foundation

/// Encodes an `Encodable` value straight into a ``JSONValue`` tree, with no JSON text in
/// between. A `JSONValue` met inside (a dataset record, a stored result) is taken as it is
/// rather than walked, so a typed result that carries thousands of records costs one node
/// per record. Follows `JSONEncoder`'s defaults: optional properties without a value are left
/// out, `Date` is seconds since 2001, `Data` is base64, `URL` its absolute string.
enum JSONValueEncoder {
    static func encode<T: Encodable>(_ value: T) throws -> JSONValue {
        try node(for: value, at: []).resolved()
    }

    /// The node of one value: a leaf for JSON's own kinds, else what the value's
    /// `encode(to:)` builds.
    fileprivate static func node<T: Encodable>(for value: T, at path: [any CodingKey]) throws -> Node {
        if let json = value as? JSONValue { return Node(json) }
        if let leaf = leaf(value) { return Node(leaf) }
        let node = Node()
        try value.encode(to: TreeEncoder(node: node, codingPath: path))
        return node
    }

    private static func leaf(_ value: Any) -> JSONValue? {
        switch value {
        case let text as String: .string(text)
        case let flag as Bool: .bool(flag)
        case let number as Int: .int(Int64(number))
        case let number as Int64: .int(number)
        case let number as Int32: .int(Int64(number))
        case let number as Int16: .int(Int64(number))
        case let number as Int8: .int(Int64(number))
        case let number as UInt8: .int(Int64(number))
        case let number as UInt16: .int(Int64(number))
        case let number as UInt32: .int(Int64(number))
        case let number as UInt: unsigned(UInt64(number))
        case let number as UInt64: unsigned(number)
        case let number as Double: real(number)
        case let number as Float: real(Double(number))
        case let number as Decimal: real(NSDecimalNumber(decimal: number).doubleValue)
        case let date as Date: real(date.timeIntervalSinceReferenceDate)
        case let data as Data: .string(data.base64EncodedString())
        case let url as URL: .string(url.absoluteString)
        default: nil
        }
    }

    /// Unsigned numbers past `Int64.max` become doubles, as JSON numbers are read here.
    fileprivate static func unsigned(_ number: UInt64) -> JSONValue {
        number <= UInt64(Int64.max) ? .int(Int64(number)) : .double(Double(number))
    }

    /// A whole number held as a double is written as an integer (`5`, not `5.0`), as
    /// `JSONEncoder` writes it and as parsing reads it back.
    fileprivate static func real(_ number: Double) -> JSONValue {
        number == number.rounded() && abs(number) < 9_007_199_254_740_992 ? .int(Int64(number)) : .double(number)
    }
}

/// A value being built: a leaf, or an object or array whose members are nodes still being
/// filled by their own containers (kept apart so that each is mutated in place).
private final class Node {
    var leaf: JSONValue?
    var members: [String: Node]?
    var elements: [Node]?

    init(_ leaf: JSONValue? = nil) { self.leaf = leaf }

    func resolved() -> JSONValue {
        if let members { return .object(members.mapValues { $0.resolved() }) }
        if let elements { return .array(elements.map { $0.resolved() }) }
        // A type that asked for no container at all encodes as `{}`, as with JSONEncoder.
        return leaf ?? .object([:])
    }

    func asObject() -> Node {
        if members == nil { members = [:] }
        return self
    }

    func asArray() -> Node {
        if elements == nil { elements = [] }
        return self
    }
}

private struct TreeEncoder: Encoder {
    let node: Node
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        KeyedEncodingContainer(KeyedContainer<Key>(node: node.asObject(), codingPath: codingPath))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer { UnkeyedContainer(node: node.asArray(), codingPath: codingPath) }

    func singleValueContainer() -> any SingleValueEncodingContainer { SingleContainer(node: node, codingPath: codingPath) }
}

private struct KeyedContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let node: Node
    let codingPath: [any CodingKey]

    private func set(_ child: Node, _ key: Key) { node.members![key.stringValue] = child }

    mutating func encodeNil(forKey key: Key) throws { set(Node(.null), key) }
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        set(try JSONValueEncoder.node(for: value, at: codingPath + [key]), key)
    }
    mutating func encode(_ value: Bool, forKey key: Key) throws { set(Node(.bool(value)), key) }
    mutating func encode(_ value: String, forKey key: Key) throws { set(Node(.string(value)), key) }
    mutating func encode(_ value: Double, forKey key: Key) throws { set(Node(JSONValueEncoder.real(value)), key) }
    mutating func encode(_ value: Float, forKey key: Key) throws { set(Node(JSONValueEncoder.real(Double(value))), key) }
    mutating func encode(_ value: Int, forKey key: Key) throws { set(Node(.int(Int64(value))), key) }
    mutating func encode(_ value: Int8, forKey key: Key) throws { set(Node(.int(Int64(value))), key) }
    mutating func encode(_ value: Int16, forKey key: Key) throws { set(Node(.int(Int64(value))), key) }
    mutating func encode(_ value: Int32, forKey key: Key) throws { set(Node(.int(Int64(value))), key) }
    mutating func encode(_ value: Int64, forKey key: Key) throws { set(Node(.int(value)), key) }
    mutating func encode(_ value: UInt, forKey key: Key) throws { set(Node(JSONValueEncoder.unsigned(UInt64(value))), key) }
    mutating func encode(_ value: UInt8, forKey key: Key) throws { set(Node(.int(Int64(value))), key) }
    mutating func encode(_ value: UInt16, forKey key: Key) throws { set(Node(.int(Int64(value))), key) }
    mutating func encode(_ value: UInt32, forKey key: Key) throws { set(Node(.int(Int64(value))), key) }
    mutating func encode(_ value: UInt64, forKey key: Key) throws { set(Node(JSONValueEncoder.unsigned(value)), key) }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        let child = Node().asObject()
        set(child, key)
        return KeyedEncodingContainer(KeyedContainer<NestedKey>(node: child, codingPath: codingPath + [key]))
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        let child = Node().asArray()
        set(child, key)
        return UnkeyedContainer(node: child, codingPath: codingPath + [key])
    }

    mutating func superEncoder() -> any Encoder {
        let child = Node()
        node.members!["super"] = child
        return TreeEncoder(node: child, codingPath: codingPath)
    }

    mutating func superEncoder(forKey key: Key) -> any Encoder {
        let child = Node()
        set(child, key)
        return TreeEncoder(node: child, codingPath: codingPath + [key])
    }
}

private struct UnkeyedContainer: UnkeyedEncodingContainer {
    let node: Node
    let codingPath: [any CodingKey]
    var count: Int { node.elements!.count }

    private func append(_ child: Node) { node.elements!.append(child) }
    private var nextKey: any CodingKey { IndexKey(index: count) }

    mutating func encodeNil() throws { append(Node(.null)) }
    mutating func encode<T: Encodable>(_ value: T) throws { append(try JSONValueEncoder.node(for: value, at: codingPath + [nextKey])) }
    mutating func encode(_ value: Bool) throws { append(Node(.bool(value))) }
    mutating func encode(_ value: String) throws { append(Node(.string(value))) }
    mutating func encode(_ value: Double) throws { append(Node(JSONValueEncoder.real(value))) }
    mutating func encode(_ value: Int) throws { append(Node(.int(Int64(value)))) }
    mutating func encode(_ value: Int64) throws { append(Node(.int(value))) }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        let child = Node().asObject(), path = codingPath + [nextKey]
        append(child)
        return KeyedEncodingContainer(KeyedContainer<NestedKey>(node: child, codingPath: path))
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let child = Node().asArray(), path = codingPath + [nextKey]
        append(child)
        return UnkeyedContainer(node: child, codingPath: path)
    }

    mutating func superEncoder() -> any Encoder {
        let child = Node(), path = codingPath + [nextKey]
        append(child)
        return TreeEncoder(node: child, codingPath: path)
    }
}

private struct SingleContainer: SingleValueEncodingContainer {
    let node: Node
    let codingPath: [any CodingKey]

    mutating func encodeNil() throws { node.leaf = .null }
    mutating func encode<T: Encodable>(_ value: T) throws {
        let child = try JSONValueEncoder.node(for: value, at: codingPath)
        (node.leaf, node.members, node.elements) = (child.leaf, child.members, child.elements)
    }
    mutating func encode(_ value: Bool) throws { node.leaf = .bool(value) }
    mutating func encode(_ value: String) throws { node.leaf = .string(value) }
    mutating func encode(_ value: Double) throws { node.leaf = JSONValueEncoder.real(value) }
    mutating func encode(_ value: Int) throws { node.leaf = .int(Int64(value)) }
    mutating func encode(_ value: Int64) throws { node.leaf = .int(value) }
}

private struct IndexKey: CodingKey {
    let index: Int
    init(index: Int) { self.index = index }
    init?(stringValue: String) { nil }
    init?(intValue: Int) { index = intValue }
    var stringValue: String { "\(index)" }
    var intValue: Int? { index }
}
