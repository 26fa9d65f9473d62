public import SwitchboardConfig
import Foundation
import NIOCore

/// The HTTP gateway (`switchboard gateway`, started by `switchboard up`).
public struct GatewaySettings: Sendable, Equatable {
    public var enabled = true
    public var host = "127.0.0.1"
    public var port = 8080
    /// The largest request body `POST /rpc` accepts (bigger: 413, -32010).
    public var maxBodyBytes = 1 << 20
    /// The key prefixes the gateway follows for `/events` (one kernel subscription).
    public var prefixes = [""]
    /// Changes kept, so that a reconnecting browser gets exactly what it missed: at most
    /// this many, and this many bytes of keys, values and each change's record (the oldest go first).
    public var history = 10_000
    public var historyBytes = 8 << 20
    /// Bytes of events one stream may have waiting (its reader slow) beyond its opening
    /// snapshot before it is cut; the browser reconnects and resumes from its last id.
    public var streamBacklogBytes = 4 << 20
    /// Bytes of opening snapshots one caller (an address) may be sent a minute (0: no bound):
    /// past them, `/events` answers 429 with Retry-After until the caller's budget refills.
    public var snapshotBytesPerMinute = 64 << 20
    /// Bus calls one caller (an address) may have in flight through `POST /rpc` (a batch
    /// counts each of its requests; 0: no bound): past them, 429 with Retry-After until some
    /// are answered, so that one address cannot queue everyone else's calls behind its own.
    public var maxCallsPerAddress = 256
    /// Addresses of the proxies in front of the gateway (a load balancer): for a connection
    /// from one of them, the per-address bounds count the address it forwarded for (the last
    /// entry of `X-Forwarded-For`) rather than the proxy's own, which every caller shares.
    public var trustedProxies: [String] = []
    /// The largest response body `POST /rpc` sends; past it the results that do not fit are
    /// answered -32010 (a batch), or the response is (a single request).
    public var maxResponseBytes = 16 << 20
    /// A comment line on every event stream this often, for proxies.
    public var heartbeat: Duration = .seconds(15)
    public var requestTimeout: Duration = .seconds(10)
    /// How long a connection may send nothing while the gateway waits for a request (its
    /// head, or more of its body) before it is closed: an idle keep-alive connection, or one
    /// that opened and says nothing, holds no file descriptor longer. A stream, or a call
    /// waiting on the bus, is not idle.
    public var idleTimeout: Duration = .seconds(60)
    /// The most HTTP connections held at once; past it the next wait to be accepted until
    /// one closes. nil: what the process may open (its limit on open files) less a tenth, and
    /// at least 64, kept for its own files.
    public var maxConnections: Int?
    /// Bearer tokens; none: every caller is let in (only without CURVE; with CURVE on,
    /// `switchboard up` makes one in the key folder when none is configured).
    public var tokens: [GatewayToken] = []
    /// Origins that may call from a browser page of their own (none: no CORS headers).
    public var corsOrigins: [String] = []
    public var logLevel: String?

    public init() {}

    /// The token file `switchboard up` makes when CURVE is on and no token is configured.
    public static let defaultTokenFile = "gateway.token"
}

/// One bearer token the gateway accepts, and what it allows.
public struct GatewayToken: Sendable, Equatable {
    public var token: String
    /// Services it may call ("*": any).
    public var services: [String]
    /// Key prefixes it may write with `kernel` `state.set` (none: no writes).
    public var writablePrefixes: [String]
    /// Key prefixes it may read: stream from `/events` (nil: all the gateway follows), and
    /// read with `kernel` `state.get` and `state.history` (nil: any).
    public var readablePrefixes: [String]?

    public init(token: String, services: [String] = ["*"], writablePrefixes: [String] = [], readablePrefixes: [String]? = nil) {
        self.token = token
        self.services = services
        self.writablePrefixes = writablePrefixes
        self.readablePrefixes = readablePrefixes
    }

    public func allows(service: String) -> Bool { services.contains("*") || services.contains(service) }

    /// Whether it may read the keys under `prefix`.
    public func mayRead(_ prefix: String) -> Bool { readablePrefixes.map { $0.contains { prefix.hasPrefix($0) } } ?? true }
}

extension GatewaySettings {
    public static let schema = ConfigSchema.values([
        "enabled", "listen", "max_body_bytes", "prefixes", "history", "history_bytes", "stream_backlog_bytes", "snapshot_bytes_per_minute", "max_calls_per_address",
        "trusted_proxies", "max_response_bytes", "heartbeat_seconds", "request_timeout_ms", "idle_timeout_ms", "max_connections", "tokens", "cors_origins", "log_level",
    ])

    /// Reads `gateway:` over the defaults.
    public init(reading gateway: ConfigSection) throws(ConfigError) {
        self.init()
        if let value = try gateway.bool("enabled") { enabled = value }
        if let value = try gateway.hostAndPort("listen") { (host, port) = value }
        if let value = try gateway.integer("max_body_bytes", atMost: 1 << 30) { maxBodyBytes = value }
        if let value = try gateway.keyPrefixes("prefixes", everyKey: true, atLeastOne: true) { prefixes = value }
        if let value = try gateway.integer("history", atMost: 10_000_000) { history = value }
        if let value = try gateway.integer("history_bytes", atMost: 1 << 40) { historyBytes = value }
        if let value = try gateway.integer("stream_backlog_bytes", atMost: 1 << 40) { streamBacklogBytes = value }
        if let value = try gateway.integer("snapshot_bytes_per_minute", atMost: 1 << 40) { snapshotBytesPerMinute = value }
        if let value = try gateway.integer("max_calls_per_address", atMost: 1 << 24) { maxCallsPerAddress = value }
        if let value = try gateway.strings("trusted_proxies") {
            trustedProxies = try value.map { address throws(ConfigError) in
                guard let canonical = Self.callerAddress(address) else {
                    throw ConfigError(path: gateway.path("trusted_proxies"), problem: "expected IP addresses (a proxy's, as its connections come from), got '\(address)'")
                }
                return canonical
            }
        }
        if let value = try gateway.integer("max_response_bytes", atMost: 1 << 31) { maxResponseBytes = value }
        if let value = try gateway.seconds("heartbeat_seconds") { heartbeat = value }
        if let value = try gateway.milliseconds("request_timeout_ms") { requestTimeout = value }
        if let value = try gateway.milliseconds("idle_timeout_ms") { idleTimeout = value }
        if let value = try gateway.integer("max_connections", atMost: 1 << 24) { maxConnections = value }
        if let value = try gateway.strings("cors_origins") { corsOrigins = value }
        logLevel = try gateway.logLevel("log_level")
        if let value = gateway.values["tokens"] { tokens = try Self.tokens(value, gateway.path("tokens")) }
    }

    /// `gateway.tokens`: a list of {token | token_file, services, writable_prefixes}.
    static func tokens(_ value: Any, _ path: String) throws(ConfigError) -> [GatewayToken] {
        guard let list = value as? [Any] else { throw ConfigError(path: path, problem: "expected a list of tokens, got \(ConfigSection.describe(value))") }
        var result: [GatewayToken] = []
        for (index, item) in list.enumerated() {
            let here = "\(path)[\(index)]"
            let map = try ConfigSection.mapping(item, here)
            for key in map.keys where !["token", "token_file", "services", "writable_prefixes", "readable_prefixes"].contains(key) {
                throw ConfigError(path: "\(here).\(key)", problem: "unknown key; expected one of readable_prefixes, services, token, token_file, writable_prefixes")
            }
            var token: String
            switch (map["token"], map["token_file"]) {
            case (let text as String, nil):
                token = text
            case (nil, let file as String):
                do {
                    token = try FileContents.text(file, atMost: FileContents.largestKeyFile)
                } catch {
                    throw ConfigError(path: "\(here).token_file", problem: "cannot read \(file): \(error.reason)")
                }
            default:
                throw ConfigError(path: here, problem: "give token (the text) or token_file (a file holding it), one of the two")
            }
            token = token.trimmingCharacters(in: .whitespacesAndNewlines)
            guard token.count >= 16 else { throw ConfigError(path: here, problem: "a token must be at least 16 characters") }
            let entry = ConfigSection(path: here, values: map)
            let services = try entry.strings("services") ?? ["*"]
            let prefixes = try entry.keyPrefixes("writable_prefixes") ?? []
            let readable = try entry.keyPrefixes("readable_prefixes", everyKey: true)
            result.append(GatewayToken(token: token, services: services, writablePrefixes: prefixes, readablePrefixes: readable))
        }
        return result
    }
}

extension GatewaySettings {
    /// `address` written as the gateway compares and counts callers (nil: not an IP address).
    static func callerAddress(_ address: String) -> String? {
        (try? SocketAddress(ipAddress: address, port: 0)).flatMap(callerAddress)
    }

    /// One spelling per address, so that a proxy named in `trusted_proxies` and a caller's
    /// connections match however they are written: IPv6 as `inet_ntop` writes it (it has
    /// several spellings), and an IPv4 address mapped into IPv6 (`::ffff:10.0.0.5`, how a
    /// listener on `::` sees an IPv4 connection) as the IPv4 address it is.
    static func callerAddress(_ address: SocketAddress) -> String? {
        guard let text = address.ipAddress else { return nil }
        let mapped = "::ffff:"
        if case .v6 = address, text.hasPrefix(mapped), text.contains(".") { return String(text.dropFirst(mapped.count)) }
        return text
    }
}
