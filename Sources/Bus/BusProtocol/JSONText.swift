/// JSON text (RFC 8259) to ``JSONValue`` and back, in one pass over the bytes.
///
/// Every request and reply on the bus goes through here twice, so it is written for that:
/// `JSONDecoder` can only learn a value's type by trying each and catching the errors, and
/// `JSONSerialization` builds Foundation objects that must then be bridged. This parser is
/// strict (no trailing commas, no comments, no leading zeros, no unescaped control
/// characters, valid UTF-8 only, nothing after the value) and bounds nesting, so hostile
/// input cannot exhaust the stack.
/// `switchboard-bench json` measures it.
enum JSONText {
    struct SyntaxError: Error, CustomStringConvertible {
        let offset: Int
        let problem: String
        var description: String { "invalid JSON at byte \(offset): \(problem)" }
        /// Whether it is the nesting limit that stopped the parser.
        var isTooDeep: Bool { problem.hasPrefix(Self.tooDeep) }
        static let tooDeep = "nested deeper than"
    }

    static func parse(_ bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int) throws(SyntaxError) -> JSONValue {
        var parser = Parser(bytes: bytes, maxDepth: maxDepth)
        parser.skipWhitespace()
        let value = try parser.value(depth: 0)
        parser.skipWhitespace()
        guard parser.position == bytes.count else { throw parser.error("unexpected text after the value") }
        return value
    }

    /// Parses a top-level array one element at a time, handing each to `body`, so a large
    /// array never exists as one tree (a million records cost what one does at a time).
    static func forEachElement(_ bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int,
                               _ body: (JSONValue) throws -> Void) throws {
        var parser = Parser(bytes: bytes, maxDepth: maxDepth)
        parser.skipWhitespace()
        guard parser.current == UInt8(ascii: "[") else { throw parser.error("expected an array") }
        // The body's own errors end the parse too; they travel out beside the syntax errors.
        var failure: (any Error)?
        do {
            try parser.elements(depth: 1) { parser throws(SyntaxError) in
                let value = try parser.value(depth: 1)
                do { try body(value) } catch { failure = error; throw parser.error("stopped") }
            }
        } catch {
            throw failure ?? error
        }
        parser.skipWhitespace()
        guard parser.position == bytes.count else { throw parser.error("unexpected text after the value") }
    }

    /// A value's outline: for an object its members and for an array its elements, each as
    /// the byte range of its text (validated, not built), so a caller can decode just the
    /// part it needs, straight from the bytes.
    enum Outline {
        case object([(key: String, range: Range<Int>)])
        case array([Range<Int>])
        case scalar
    }

    /// Whether `bytes` are one JSON value, checked as strictly as ``parse``, building
    /// nothing: bytes that cannot begin a value are told at once, without an error's message.
    static func isValid(_ bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int) -> Bool {
        var parser = Parser(bytes: bytes, maxDepth: maxDepth)
        parser.skipWhitespace()
        switch parser.current ?? 0 {
        case UInt8(ascii: "{"), UInt8(ascii: "["), UInt8(ascii: "\""), UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"),
             UInt8(ascii: "t"), UInt8(ascii: "f"), UInt8(ascii: "n"):
            break
        default:
            return false
        }
        do throws(SyntaxError) {
            try parser.skipValue(depth: 0)
        } catch {
            return false
        }
        parser.skipWhitespace()
        return parser.position == bytes.count
    }

    /// Outlines the one JSON value in `bytes`, checking all of it as strictly as ``parse``.
    static func outline(_ bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int) throws(SyntaxError) -> Outline {
        var parser = Parser(bytes: bytes, maxDepth: maxDepth)
        parser.skipWhitespace()
        let outline: Outline
        switch parser.current {
        case UInt8(ascii: "{")?:
            var members: [(key: String, range: Range<Int>)] = []
            // Room for a whole envelope at once (a request has up to eight members): grown
            // from empty, the array was allocated anew at its first, second, third and fifth.
            members.reserveCapacity(8)
            try parser.members(depth: 1) { parser, key throws(SyntaxError) in
                let start = parser.position
                try parser.skipValue(depth: 1)
                members.append((key, start..<parser.position))
            }
            outline = .object(members)
        case UInt8(ascii: "[")?:
            var elements: [Range<Int>] = []
            try parser.elements(depth: 1) { parser throws(SyntaxError) in
                let start = parser.position
                try parser.skipValue(depth: 1)
                elements.append(start..<parser.position)
            }
            outline = .array(elements)
        default:
            try parser.skipValue(depth: 0)
            outline = .scalar
        }
        parser.skipWhitespace()
        guard parser.position == bytes.count else { throw parser.error("unexpected text after the value") }
        return outline
    }

    private struct Parser {
        let bytes: UnsafeBufferPointer<UInt8>
        let maxDepth: Int
        var position = 0

        init(bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int) {
            self.bytes = bytes
            self.maxDepth = maxDepth
        }

        func error(_ problem: String) -> SyntaxError { SyntaxError(offset: position, problem: problem) }

        var current: UInt8? { position < bytes.count ? bytes[position] : nil }

        mutating func skipWhitespace() {
            while position < bytes.count {
                switch bytes[position] {
                case 0x20, 0x09, 0x0A, 0x0D: position += 1
                default: return
                }
            }
        }

        mutating func expect(_ word: StaticString, _ value: JSONValue) throws(SyntaxError) -> JSONValue {
            let count = word.utf8CodeUnitCount
            guard position + count <= bytes.count else { throw error("unexpected end of text") }
            for index in 0..<count where bytes[position + index] != word.utf8Start[index] {
                throw error("unexpected character")
            }
            position += count
            return value
        }

        mutating func value(depth: Int) throws(SyntaxError) -> JSONValue {
            guard let byte = current else { throw error("unexpected end of text") }
            switch byte {
            case UInt8(ascii: "{"): return try object(depth: depth + 1)
            case UInt8(ascii: "["): return try array(depth: depth + 1)
            case UInt8(ascii: "\""): return .string(try string())
            case UInt8(ascii: "t"): return try expect("true", .bool(true))
            case UInt8(ascii: "f"): return try expect("false", .bool(false))
            case UInt8(ascii: "n"): return try expect("null", .null)
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try number()
            default: throw error("unexpected character")
            }
        }

        /// Checks a value and moves past it without building it.
        mutating func skipValue(depth: Int) throws(SyntaxError) {
            guard let byte = current else { throw error("unexpected end of text") }
            switch byte {
            case UInt8(ascii: "{"): try members(depth: depth + 1) { parser, _ throws(SyntaxError) in try parser.skipValue(depth: depth + 1) }
            case UInt8(ascii: "["): try elements(depth: depth + 1) { parser throws(SyntaxError) in try parser.skipValue(depth: depth + 1) }
            case UInt8(ascii: "\""): try skipString()
            default: _ = try value(depth: depth)  // a literal or a number: nothing to allocate
            }
        }

        /// An object (at its `{`): for each member, after its key, `member` reads (or skips)
        /// the value at the parser's position.
        mutating func members(depth: Int, _ member: (inout Parser, String) throws(SyntaxError) -> Void) throws(SyntaxError) {
            guard depth <= maxDepth else { throw error("\(SyntaxError.tooDeep) \(maxDepth) levels") }
            position += 1
            skipWhitespace()
            if current == UInt8(ascii: "}") {
                position += 1
                return
            }
            while true {
                skipWhitespace()
                guard current == UInt8(ascii: "\"") else { throw error("expected a string key") }
                let key = try string()
                skipWhitespace()
                guard current == UInt8(ascii: ":") else { throw error("expected ':'") }
                position += 1
                skipWhitespace()
                try member(&self, key)
                skipWhitespace()
                switch current {
                case UInt8(ascii: ",")?: position += 1
                case UInt8(ascii: "}")?:
                    position += 1
                    return
                default: throw error("expected ',' or '}'")
                }
            }
        }

        /// An array (at its `[`): `element` reads (or skips) each element at the parser's position.
        mutating func elements(depth: Int, _ element: (inout Parser) throws(SyntaxError) -> Void) throws(SyntaxError) {
            guard depth <= maxDepth else { throw error("\(SyntaxError.tooDeep) \(maxDepth) levels") }
            position += 1
            skipWhitespace()
            if current == UInt8(ascii: "]") {
                position += 1
                return
            }
            while true {
                skipWhitespace()
                try element(&self)
                skipWhitespace()
                switch current {
                case UInt8(ascii: ",")?: position += 1
                case UInt8(ascii: "]")?:
                    position += 1
                    return
                default: throw error("expected ',' or ']'")
                }
            }
        }

        /// Checks a string as ``string()`` does (escapes, control characters, UTF-8) without
        /// building it; ASCII text needs no further check.
        mutating func skipString() throws(SyntaxError) {
            position += 1
            let start = position
            var ascii = true
            while position < bytes.count {
                let byte = bytes[position]
                switch byte {
                case UInt8(ascii: "\""):
                    if !ascii { _ = try utf8(start..<position) }
                    position += 1
                    return
                case UInt8(ascii: "\\"):
                    // Escapes are rare in params: let the full reader check this string.
                    position = start - 1
                    _ = try string()
                    return
                case 0..<0x20: throw error("control character in a string")
                case 0x80...: ascii = false
                default: break
                }
                position += 1
            }
            throw error("unterminated string")
        }

        mutating func object(depth: Int) throws(SyntaxError) -> JSONValue {
            var members: [String: JSONValue] = [:]
            try self.members(depth: depth) { parser, key throws(SyntaxError) in members[key] = try parser.value(depth: depth) }
            return .object(members)
        }

        mutating func array(depth: Int) throws(SyntaxError) -> JSONValue {
            var elements: [JSONValue] = []
            try self.elements(depth: depth) { parser throws(SyntaxError) in elements.append(try parser.value(depth: depth)) }
            return .array(elements)
        }

        mutating func string() throws(SyntaxError) -> String {
            position += 1  // the opening quote
            let start = position
            // The common case: no escapes, so the bytes are the string.
            while position < bytes.count {
                let byte = bytes[position]
                if byte == UInt8(ascii: "\"") {
                    let text = try utf8(start..<position)
                    position += 1
                    return text
                }
                if byte == UInt8(ascii: "\\") { break }
                guard byte >= 0x20 else { throw error("control character in a string") }
                position += 1
            }
            var unescaped = Array(bytes[start..<position])
            while position < bytes.count {
                let byte = bytes[position]
                switch byte {
                case UInt8(ascii: "\""):
                    position += 1
                    guard let text = String(validating: unescaped, as: UTF8.self) else { throw error("invalid UTF-8 in a string") }
                    return text
                case UInt8(ascii: "\\"):
                    position += 1
                    guard let escape = current else { throw error("unexpected end of text") }
                    position += 1
                    switch escape {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): unescaped.append(escape)
                    case UInt8(ascii: "b"): unescaped.append(0x08)
                    case UInt8(ascii: "f"): unescaped.append(0x0C)
                    case UInt8(ascii: "n"): unescaped.append(0x0A)
                    case UInt8(ascii: "r"): unescaped.append(0x0D)
                    case UInt8(ascii: "t"): unescaped.append(0x09)
                    case UInt8(ascii: "u"): unescaped.append(contentsOf: try unicodeEscape())
                    default: throw error("unknown escape")
                    }
                default:
                    guard byte >= 0x20 else { throw error("control character in a string") }
                    unescaped.append(byte)
                    position += 1
                }
            }
            throw error("unterminated string")
        }

        func utf8(_ range: Range<Int>) throws(SyntaxError) -> String {
            guard let text = String(checkingUTF8: UnsafeBufferPointer(rebasing: bytes[range])) else {
                throw SyntaxError(offset: range.lowerBound, problem: "invalid UTF-8 in a string")
            }
            return text
        }

        mutating func hex4() throws(SyntaxError) -> UInt32 {
            guard position + 4 <= bytes.count else { throw error("unexpected end of text") }
            var value: UInt32 = 0
            for _ in 0..<4 {
                let byte = bytes[position]
                let digit: UInt8
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
                case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
                default: throw error("bad \\u escape")
                }
                value = value << 4 | UInt32(digit)
                position += 1
            }
            return value
        }

        /// `\uXXXX` (after the `\u`), joining a surrogate pair; returns the UTF-8 bytes.
        mutating func unicodeEscape() throws(SyntaxError) -> [UInt8] {
            var scalar = try hex4()
            if (0xD800...0xDBFF).contains(scalar) {
                guard position + 2 <= bytes.count, bytes[position] == UInt8(ascii: "\\"), bytes[position + 1] == UInt8(ascii: "u") else {
                    throw error("unpaired surrogate")
                }
                position += 2
                let low = try hex4()
                guard (0xDC00...0xDFFF).contains(low) else { throw error("unpaired surrogate") }
                scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
            }
            guard let unicode = Unicode.Scalar(scalar) else { throw error("unpaired surrogate") }
            return Array(String(Character(unicode)).utf8)
        }

        mutating func number() throws(SyntaxError) -> JSONValue {
            let start = position
            if current == UInt8(ascii: "-") { position += 1 }
            guard let first = current, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first) else { throw error("expected a digit") }
            if first == UInt8(ascii: "0") {
                position += 1
            } else {
                skipDigits()
            }
            var integral = true
            if current == UInt8(ascii: ".") {
                integral = false
                position += 1
                guard skipDigits() > 0 else { throw error("expected a digit after '.'") }
            }
            if current == UInt8(ascii: "e") || current == UInt8(ascii: "E") {
                integral = false
                position += 1
                if current == UInt8(ascii: "+") || current == UInt8(ascii: "-") { position += 1 }
                guard skipDigits() > 0 else { throw error("expected a digit in the exponent") }
            }
            let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<position]), as: UTF8.self)
            if integral, let integer = Int64(text) { return .int(integer) }
            guard let double = Double(text), double.isFinite else { throw SyntaxError(offset: start, problem: "number out of range") }
            return .double(double)
        }

        @discardableResult
        mutating func skipDigits() -> Int {
            let start = position
            while let byte = current, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) { position += 1 }
            return position - start
        }
    }

    // MARK: Writing

    /// Compact JSON text; object keys sorted, so equal values give equal bytes.
    static func write(_ value: JSONValue, into output: inout [UInt8]) {
        switch value {
        case .null: output.append(contentsOf: "null".utf8)
        case .bool(let flag): output.append(contentsOf: (flag ? "true" : "false").utf8)
        case .int(let number): output.append(contentsOf: String(number).utf8)
        case .double(let number):
            // JSON has no NaN or infinity.
            if number.isFinite { output.append(contentsOf: number.description.utf8) } else { output.append(contentsOf: "null".utf8) }
        case .string(let text): writeString(text, into: &output)
        case .array(let elements):
            output.append(UInt8(ascii: "["))
            for (index, element) in elements.enumerated() {
                if index > 0 { output.append(UInt8(ascii: ",")) }
                write(element, into: &output)
            }
            output.append(UInt8(ascii: "]"))
        case .object(let members):
            output.append(UInt8(ascii: "{"))
            // One member is in order already (and needs no array of sorted keys).
            if members.count == 1, let (key, member) = members.first {
                writeString(key, into: &output)
                output.append(UInt8(ascii: ":"))
                write(member, into: &output)
                output.append(UInt8(ascii: "}"))
                return
            }
            for (index, key) in members.keys.sorted().enumerated() {
                if index > 0 { output.append(UInt8(ascii: ",")) }
                writeString(key, into: &output)
                output.append(UInt8(ascii: ":"))
                write(members[key]!, into: &output)
            }
            output.append(UInt8(ascii: "}"))
        }
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)

    static func writeString(_ text: String, into output: inout [UInt8]) {
        output.append(UInt8(ascii: "\""))
        // Most strings (methods, ids, keys) need no escape: copied at once.
        let plain = text.utf8.withContiguousStorageIfAvailable { bytes in
            guard !bytes.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) else { return false }
            output.append(contentsOf: bytes)
            return true
        }
        if plain == true {
            output.append(UInt8(ascii: "\""))
            return
        }
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""): output.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
            case UInt8(ascii: "\\"): output.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
            case 0x0A: output.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
            case 0x0D: output.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
            case 0x09: output.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
            case 0x00..<0x20:
                output.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"),
                                           hexDigits[Int(byte >> 4)], hexDigits[Int(byte & 0x0F)]])
            default: output.append(byte)
            }
        }
        output.append(UInt8(ascii: "\""))
    }
}
