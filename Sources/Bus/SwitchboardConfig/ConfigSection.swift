import Foundation

/// One mapping of the file (`kernel:`, `services.store:`, the top level), as the module that
/// owns it reads it: each accessor checks a value's type and range and throws a
/// ``ConfigError`` naming the key's full path; an absent key reads as nil, so the module's
/// own default stands.
public struct ConfigSection: @unchecked Sendable {
    /// The dotted path of this mapping ("" for the top level).
    public let path: String
    /// The mapping as YAML gave it (strings, integers, booleans, lists, mappings).
    public let values: [String: Any]

    public init(path: String = "", values: [String: Any] = [:]) {
        self.path = path
        self.values = values
    }

    /// The full path of `key` here.
    public func path(_ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    public func has(_ key: String) -> Bool { values[key] != nil }

    /// The mapping under `key` (empty when absent).
    public func section(_ key: String) throws(ConfigError) -> ConfigSection {
        ConfigSection(path: path(key), values: try values[key].map { v throws(ConfigError) in try Self.mapping(v, path(key)) } ?? [:])
    }

    /// Each mapping under this one, by name (for `services:` and `datasets:`), sorted.
    public func sections() throws(ConfigError) -> [(name: String, section: ConfigSection)] {
        var result: [(String, ConfigSection)] = []
        for name in values.keys.sorted() { result.append((name, try section(name))) }
        return result
    }

    /// The value of `key`, which must be there.
    public func required(_ key: String, _ why: String) throws(ConfigError) -> Any {
        guard let value = values[key] else { throw ConfigError(path: path(key), problem: why) }
        return value
    }

    /// Throws "expected …, got …" for `key`.
    public func refuse(_ key: String, expected: String) -> ConfigError {
        ConfigError(path: path(key), problem: "expected \(expected), got \(values[key].map(Self.describe) ?? "nothing")")
    }

    // MARK: Values

    /// Every number the file gives is checked against a range here, before anything multiplies
    /// or converts it (megabytes to bytes, milliseconds to nanoseconds, a count to an Int32).
    public func integer(_ key: String, atMost maximum: Int) throws(ConfigError) -> Int? {
        guard let value = values[key] else { return nil }
        guard let number = value as? Int, (1...maximum).contains(number) else {
            throw refuse(key, expected: "an integer from 1 to \(maximum)")
        }
        return number
    }

    public func milliseconds(_ key: String, atMost maximum: Int = Limit.dayMilliseconds) throws(ConfigError) -> Duration? {
        try integer(key, atMost: maximum).map { .milliseconds($0) }
    }

    public func seconds(_ key: String, atMost maximum: Int = Limit.daySeconds) throws(ConfigError) -> Duration? {
        try integer(key, atMost: maximum).map { .seconds($0) }
    }

    /// Upper bounds several keys share.
    public enum Limit {
        public static let hourMilliseconds = 3_600_000
        public static let dayMilliseconds = 86_400_000
        public static let daySeconds = 86_400
        public static let yearSeconds = 31_536_000
    }

    public func bool(_ key: String) throws(ConfigError) -> Bool? {
        guard let value = values[key] else { return nil }
        guard let flag = value as? Bool else { throw refuse(key, expected: "true or false") }
        return flag
    }

    /// A non-empty string (`what` says what it is: "a file path").
    public func text(_ key: String, _ what: String) throws(ConfigError) -> String? {
        guard let value = values[key] else { return nil }
        guard let text = value as? String, !text.isEmpty else { throw refuse(key, expected: what) }
        return text
    }

    /// A TLS client's PEM files: `ca_file`, the CA that signed the server's certificate, and
    /// `cert_file` with `key_file`, the client's own certificate and key for a server that asks
    /// for one (each useless without the other, so one alone is refused).
    public func clientTLSFiles() throws(ConfigError) -> (caFile: String?, certificateFile: String?, keyFile: String?) {
        let files = (caFile: try text("ca_file", "a PEM file"), certificateFile: try text("cert_file", "a PEM file"), keyFile: try text("key_file", "a PEM file"))
        guard (files.certificateFile == nil) == (files.keyFile == nil) else {
            throw ConfigError(path: path(files.keyFile == nil ? "key_file" : "cert_file"), problem: "is required with \(files.keyFile == nil ? "cert_file" : "key_file")")
        }
        return files
    }

    /// One of `choices`.
    public func choice(_ key: String, _ choices: [String]) throws(ConfigError) -> String? {
        guard let value = values[key] else { return nil }
        guard let text = value as? String, choices.contains(text) else {
            throw refuse(key, expected: choices.dropLast().joined(separator: ", ") + " or " + (choices.last ?? ""))
        }
        return text
    }

    public func strings(_ key: String) throws(ConfigError) -> [String]? {
        guard let value = values[key] else { return nil }
        return try Self.strings(value, path(key))
    }

    /// A list of the state's key prefixes. Keys are paths, so a prefix starts with '/': one
    /// without it would match no key, in silence. "" stands for every key where `everyKey`
    /// allows it; `atLeastOne` refuses an empty list.
    public func keyPrefixes(_ key: String, everyKey: Bool = false, atLeastOne: Bool = false) throws(ConfigError) -> [String]? {
        guard let prefixes = try strings(key) else { return nil }
        guard prefixes.allSatisfy({ $0.hasPrefix("/") || (everyKey && $0.isEmpty) }), !(atLeastOne && prefixes.isEmpty) else {
            let expected = atLeastOne ? "at least one key prefix, each starting with '/'" : "key prefixes starting with '/'"
            throw ConfigError(path: path(key), problem: "expected \(expected)\(everyKey ? " (\"\" for every key)" : "")")
        }
        return prefixes
    }

    public static func strings(_ value: Any, _ path: String) throws(ConfigError) -> [String] {
        guard let list = value as? [Any], let strings = list as? [String] else {
            throw ConfigError(path: path, problem: "expected a list of strings, got \(describe(value))")
        }
        return strings
    }

    public static let logLevels = ["trace", "debug", "info", "notice", "warning", "error", "critical"]

    public func logLevel(_ key: String) throws(ConfigError) -> String? {
        guard let value = values[key] else { return nil }
        guard let level = value as? String, Self.logLevels.contains(level) else {
            throw refuse(key, expected: "one of \(Self.logLevels.joined(separator: ", "))")
        }
        return level
    }

    /// A ZeroMQ endpoint as text (``isEndpoint(_:schemes:)``); whether it binds is the
    /// socket's business.
    public func endpoint(_ key: String) throws(ConfigError) -> String? {
        guard let value = values[key] else { return nil }
        guard let text = value as? String, Self.isEndpoint(text) else {
            throw refuse(key, expected: "an endpoint such as tcp://127.0.0.1:5555, ipc:///PATH or inproc://NAME")
        }
        return text
    }

    /// The items of a comma-separated list as a person types one (`a, b`): each without the
    /// spaces around it, empty ones dropped.
    public static func commaSeparated(_ text: String) -> [String] {
        text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }

    /// Whether `text` is an endpoint libzmq takes, of one of `schemes`: tcp://HOST:PORT (HOST
    /// a name, an address, an IPv6 address in brackets or `*`; PORT a number, or `*` to bind
    /// any), ipc://PATH, inproc://NAME. Checked where the endpoint is given, so a mistyped one
    /// is named there rather than refused by libzmq later as an invalid argument.
    public static func isEndpoint(_ text: String, schemes: [String] = ["tcp://", "ipc://", "inproc://"]) -> Bool {
        guard let scheme = schemes.first(where: { text.hasPrefix($0) }) else { return false }
        let rest = text.dropFirst(scheme.count)
        guard scheme == "tcp://" else { return !rest.isEmpty }
        guard let colon = rest.lastIndex(of: ":"), colon != rest.startIndex else { return false }
        let port = rest[rest.index(after: colon)...]
        return port == "*" || UInt16(port) != nil
    }

    /// HOST:PORT, the host bare or an IPv6 address in brackets.
    public func hostAndPort(_ key: String) throws(ConfigError) -> (host: String, port: Int)? {
        guard let value = values[key] else { return nil }
        let problem = refuse(key, expected: "HOST:PORT such as 127.0.0.1:8080 or [::1]:8080")
        guard let text = value as? String, let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
              (0...65535).contains(port) else { throw problem }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { throw problem }
        return (host, port)
    }

    // MARK: Helpers

    public static func mapping(_ value: Any, _ path: String) throws(ConfigError) -> [String: Any] {
        if value is NSNull { return [:] }
        guard let map = value as? [String: Any] else {
            throw ConfigError(path: path, problem: "expected a mapping of keys to values, got \(describe(value))")
        }
        return map
    }

    /// A value as an error message shows it.
    public static func describe(_ value: Any) -> String {
        switch value {
        // A long text (a file that holds no mapping reads as one) is shown by its start: the
        // error names the problem, it does not print the file back.
        case let text as String where text.count > 80: "\"\(text.prefix(80))…\" (\(text.count) characters)"
        case let text as String: "\"\(text)\""
        case is [Any]: "a list"
        case is [String: Any]: "a mapping"
        default: "\(value)"
        }
    }
}
