import Foundation

/// Encodes an `Encodable` value straight into a ``JSONValue`` tree, with no JSON text in
/// between. A `JSONValue` met inside (a dataset record, a stored result) is taken as it is
/// rather than walked, so a typed result that carries thousands of records costs one node
/// per record. Follows `JSONEncoder`'s defaults: optional properties without a value are left
/// out, `Date` is seconds since 2001, `Data` is base64, `URL` its absolute string.
enum JSONValueEncoder {
    static func encode<T: Encodable>(_ value: T) throws -> JSONValue {
        try self.value(of: value, at: [])
    }

    /// The JSON of one value: JSON's own kinds directly, else what the value's `encode(to:)`
    /// builds (complete once it returns).
    fileprivate static func value<T: Encodable>(of value: T, at path: [any CodingKey]) throws -> JSONValue {
        // One conformance check (cached by the runtime) rather than a cast per kind.
        if let leaf = value as? any JSONLeaf { return leaf.json }
        let node = Node()
        try value.encode(to: TreeEncoder(node: node, codingPath: path))
        return node.resolved()
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

/// A value being built: a single value, or an object or array. Members already complete are
/// kept as JSON; those of a nested container, still being filled by its caller, as nodes.
private final class Node {
    var single: JSONValue?
    var members: [String: JSONValue]?
    var openMembers: [String: Node] = [:]
    var elements: [Element]?

    enum Element {
        case value(JSONValue)
        case open(Node)
    }

    func resolved() -> JSONValue {
        if var members {
            for (key, node) in openMembers { members[key] = node.resolved() }
            return .object(members)
        }
        if let elements {
            return .array(elements.map { element in
                switch element {
                case .value(let value): value
                case .open(let node): node.resolved()
                }
            })
        }
        // A type that asked for no container at all encodes as `{}`, as with JSONEncoder.
        return single ?? .object([:])
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

    private func set(_ value: JSONValue, _ key: Key) {
        node.members![key.stringValue] = value
        node.openMembers[key.stringValue] = nil
    }

    private func open(_ child: Node, _ key: String) -> Node {
        node.openMembers[key] = child
        return child
    }

    mutating func encodeNil(forKey key: Key) throws { set(.null, key) }
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        set(try JSONValueEncoder.value(of: value, at: codingPath + [key]), key)
    }
    mutating func encode(_ value: Bool, forKey key: Key) throws { set(.bool(value), key) }
    mutating func encode(_ value: String, forKey key: Key) throws { set(.string(value), key) }
    mutating func encode(_ value: Double, forKey key: Key) throws { set(JSONValueEncoder.real(value), key) }
    mutating func encode(_ value: Float, forKey key: Key) throws { set(JSONValueEncoder.real(Double(value)), key) }
    mutating func encode(_ value: Int, forKey key: Key) throws { set(.int(Int64(value)), key) }
    mutating func encode(_ value: Int8, forKey key: Key) throws { set(.int(Int64(value)), key) }
    mutating func encode(_ value: Int16, forKey key: Key) throws { set(.int(Int64(value)), key) }
    mutating func encode(_ value: Int32, forKey key: Key) throws { set(.int(Int64(value)), key) }
    mutating func encode(_ value: Int64, forKey key: Key) throws { set(.int(value), key) }
    mutating func encode(_ value: UInt, forKey key: Key) throws { set(JSONValueEncoder.unsigned(UInt64(value)), key) }
    mutating func encode(_ value: UInt8, forKey key: Key) throws { set(.int(Int64(value)), key) }
    mutating func encode(_ value: UInt16, forKey key: Key) throws { set(.int(Int64(value)), key) }
    mutating func encode(_ value: UInt32, forKey key: Key) throws { set(.int(Int64(value)), key) }
    mutating func encode(_ value: UInt64, forKey key: Key) throws { set(JSONValueEncoder.unsigned(value), key) }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        KeyedEncodingContainer(KeyedContainer<NestedKey>(node: open(Node().asObject(), key.stringValue), codingPath: codingPath + [key]))
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        UnkeyedContainer(node: open(Node().asArray(), key.stringValue), codingPath: codingPath + [key])
    }

    mutating func superEncoder() -> any Encoder {
        TreeEncoder(node: open(Node(), "super"), codingPath: codingPath)
    }

    mutating func superEncoder(forKey key: Key) -> any Encoder {
        TreeEncoder(node: open(Node(), key.stringValue), codingPath: codingPath + [key])
    }
}

private struct UnkeyedContainer: UnkeyedEncodingContainer {
    let node: Node
    let codingPath: [any CodingKey]
    var count: Int { node.elements!.count }

    private func append(_ value: JSONValue) { node.elements!.append(.value(value)) }
    private func open(_ child: Node) -> Node {
        node.elements!.append(.open(child))
        return child
    }
    private var nextKey: any CodingKey { IndexKey(index: count) }

    mutating func encodeNil() throws { append(.null) }
    mutating func encode<T: Encodable>(_ value: T) throws { append(try JSONValueEncoder.value(of: value, at: codingPath + [nextKey])) }
    mutating func encode(_ value: Bool) throws { append(.bool(value)) }
    mutating func encode(_ value: String) throws { append(.string(value)) }
    mutating func encode(_ value: Double) throws { append(JSONValueEncoder.real(value)) }
    mutating func encode(_ value: Int) throws { append(.int(Int64(value))) }
    mutating func encode(_ value: Int64) throws { append(.int(value)) }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        let path = codingPath + [nextKey]
        return KeyedEncodingContainer(KeyedContainer<NestedKey>(node: open(Node().asObject()), codingPath: path))
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let path = codingPath + [nextKey]
        return UnkeyedContainer(node: open(Node().asArray()), codingPath: path)
    }

    mutating func superEncoder() -> any Encoder {
        let path = codingPath + [nextKey]
        return TreeEncoder(node: open(Node()), codingPath: path)
    }
}

private struct SingleContainer: SingleValueEncodingContainer {
    let node: Node
    let codingPath: [any CodingKey]

    mutating func encodeNil() throws { node.single = .null }
    mutating func encode<T: Encodable>(_ value: T) throws { node.single = try JSONValueEncoder.value(of: value, at: codingPath) }
    mutating func encode(_ value: Bool) throws { node.single = .bool(value) }
    mutating func encode(_ value: String) throws { node.single = .string(value) }
    mutating func encode(_ value: Double) throws { node.single = JSONValueEncoder.real(value) }
    mutating func encode(_ value: Int) throws { node.single = .int(Int64(value)) }
    mutating func encode(_ value: Int64) throws { node.single = .int(value) }
}

private struct IndexKey: CodingKey {
    let index: Int
    init(index: Int) { self.index = index }
    init?(stringValue: String) { nil }
    init?(intValue: Int) { index = intValue }
    var stringValue: String { "\(index)" }
    var intValue: Int? { index }
}

/// The kinds written as one JSON value, without a container: JSON's own, and those that
/// `JSONEncoder` writes specially by default.
private protocol JSONLeaf {
    var json: JSONValue { get }
}

extension JSONValue: JSONLeaf { fileprivate var json: JSONValue { self } }
extension String: JSONLeaf { fileprivate var json: JSONValue { .string(self) } }
extension Bool: JSONLeaf { fileprivate var json: JSONValue { .bool(self) } }
extension Int: JSONLeaf { fileprivate var json: JSONValue { .int(Int64(self)) } }
extension Int64: JSONLeaf { fileprivate var json: JSONValue { .int(self) } }
extension Int32: JSONLeaf { fileprivate var json: JSONValue { .int(Int64(self)) } }
extension Int16: JSONLeaf { fileprivate var json: JSONValue { .int(Int64(self)) } }
extension Int8: JSONLeaf { fileprivate var json: JSONValue { .int(Int64(self)) } }
extension UInt8: JSONLeaf { fileprivate var json: JSONValue { .int(Int64(self)) } }
extension UInt16: JSONLeaf { fileprivate var json: JSONValue { .int(Int64(self)) } }
extension UInt32: JSONLeaf { fileprivate var json: JSONValue { .int(Int64(self)) } }
extension UInt: JSONLeaf { fileprivate var json: JSONValue { JSONValueEncoder.unsigned(UInt64(self)) } }
extension UInt64: JSONLeaf { fileprivate var json: JSONValue { JSONValueEncoder.unsigned(self) } }
extension Double: JSONLeaf { fileprivate var json: JSONValue { JSONValueEncoder.real(self) } }
extension Float: JSONLeaf { fileprivate var json: JSONValue { JSONValueEncoder.real(Double(self)) } }
extension Decimal: JSONLeaf { fileprivate var json: JSONValue { JSONValueEncoder.real(NSDecimalNumber(decimal: self).doubleValue) } }
extension Date: JSONLeaf { fileprivate var json: JSONValue { JSONValueEncoder.real(timeIntervalSinceReferenceDate) } }
extension Data: JSONLeaf { fileprivate var json: JSONValue { .string(base64EncodedString()) } }
extension URL: JSONLeaf { fileprivate var json: JSONValue { .string(absoluteString) } }
