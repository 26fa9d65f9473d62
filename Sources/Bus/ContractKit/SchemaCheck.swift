public import BusProtocol

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
