public import Foundation
public import Kernel
public import StoreService
public import FetcherService
import Catalog
import Yams

/// An error in a configuration file, naming the key's path and what was expected
/// ("kernel.heartbeat_ms: expected a positive integer, got \"fast\"").
public struct ConfigError: Error, Sendable, Equatable, CustomStringConvertible {
    public let path: String
    public let problem: String
    public var description: String { path.isEmpty ? problem : "\(path): \(problem)" }
}

/// `Config/switchboard.yaml`: the settings of every piece. Every key is optional; flags
/// given on the command line override the file.
public struct ConfigFile: Sendable, Equatable {
    public var kernel = KernelConfiguration()
    public var store = StoreConfiguration()
    public var fetcher = FetcherConfiguration.defaults

    public init() {}

    /// Reads and checks a YAML file. Unknown keys and bad values are errors.
    public static func load(_ url: URL) throws -> ConfigFile {
        let text: String
        do {
            text = try String(contentsOf: url, encoding: .utf8)
        } catch {
            throw ConfigError(path: "", problem: "cannot read \(url.path): \(error.localizedDescription)")
        }
        return try parse(text)
    }

    /// Parses YAML text.
    public static func parse(_ text: String) throws -> ConfigFile {
        let root: Any?
        do {
            root = try Yams.load(yaml: text)
        } catch {
            throw ConfigError(path: "", problem: "not valid YAML: \(error)")
        }
        var file = ConfigFile()
        guard let root else { return file }
        let top = try mapping(root, "")
        try checkKeys(top, allowed: ["kernel", "store", "fetcher"], "")
        if let kernel = top["kernel"] {
            let section = try mapping(kernel, "kernel")
            try checkKeys(section, allowed: ["broker", "snapshot", "publisher", "collector", "heartbeat_ms", "liveness",
                                             "queue_timeout_ms", "max_message_size", "no_retry", "writable_prefixes"], "kernel")
            var k = file.kernel
            if let value = section["broker"] { k.brokerEndpoint = try endpoint(value, "kernel.broker") }
            if let value = section["snapshot"] { k.snapshotEndpoint = try endpoint(value, "kernel.snapshot") }
            if let value = section["publisher"] { k.publisherEndpoint = try endpoint(value, "kernel.publisher") }
            if let value = section["collector"] { k.collectorEndpoint = try endpoint(value, "kernel.collector") }
            if let value = section["heartbeat_ms"] { k.heartbeatInterval = .milliseconds(try positive(value, "kernel.heartbeat_ms")) }
            if let value = section["liveness"] { k.heartbeatLiveness = try positive(value, "kernel.liveness") }
            if let value = section["queue_timeout_ms"] { k.queueTimeout = .milliseconds(try positive(value, "kernel.queue_timeout_ms")) }
            if let value = section["max_message_size"] { k.maxMessageSize = try positive(value, "kernel.max_message_size") }
            if let value = section["no_retry"] { k.nonRetriableServices = Set(try strings(value, "kernel.no_retry")) }
            if let value = section["writable_prefixes"] {
                let prefixes = try strings(value, "kernel.writable_prefixes")
                guard prefixes.allSatisfy({ $0.hasPrefix("/") }) else {
                    throw ConfigError(path: "kernel.writable_prefixes", problem: "expected key prefixes starting with '/'")
                }
                k.collectorWritablePrefixes = prefixes
            }
            file.kernel = k
        }
        if let store = top["store"] {
            let section = try mapping(store, "store")
            try checkKeys(section, allowed: ["path", "history_limit", "max_size_mb"], "store")
            if let value = section["path"] {
                guard let path = value as? String, !path.isEmpty else {
                    throw ConfigError(path: "store.path", problem: "expected a file path, got \(describe(value))")
                }
                file.store.path = path
            }
            if let value = section["history_limit"] { file.store.historyLimit = try positive(value, "store.history_limit") }
            if let value = section["max_size_mb"] { file.store.maxSizeBytes = try positive(value, "store.max_size_mb") * 1_048_576 }
        }
        if let fetcher = top["fetcher"] {
            let section = try mapping(fetcher, "fetcher")
            try checkKeys(section, allowed: ["attempts", "datasets"], "fetcher")
            if let value = section["attempts"] { file.fetcher.attempts = try positive(value, "fetcher.attempts") }
            if let datasets = section["datasets"] {
                let map = try mapping(datasets, "fetcher.datasets")
                try checkKeys(map, allowed: Set(Dataset.allCases.map(\.rawValue)), "fetcher.datasets")
                for (name, value) in map {
                    let path = "fetcher.datasets.\(name)"
                    let dataset = Dataset(rawValue: name)!
                    let entry = try mapping(value, path)
                    try checkKeys(entry, allowed: ["url", "refresh_seconds", "timeout_ms", "max_mb", "headers"], path)
                    var source = file.fetcher.sources[dataset] ?? .init(url: nil)
                    if let url = entry["url"] {
                        guard let text = url as? String, let parsed = URL(string: text), ["http", "https", "file"].contains(parsed.scheme ?? "") else {
                            throw ConfigError(path: "\(path).url", problem: "expected an http, https or file URL, got \(describe(url))")
                        }
                        source.url = parsed
                    }
                    if let value = entry["refresh_seconds"] { source.refreshInterval = .seconds(try positive(value, "\(path).refresh_seconds")) }
                    if let value = entry["timeout_ms"] { source.timeout = .milliseconds(try positive(value, "\(path).timeout_ms")) }
                    if let value = entry["max_mb"] { source.maxBytes = try positive(value, "\(path).max_mb") * 1_048_576 }
                    if let value = entry["headers"] {
                        guard let headers = value as? [String: String] else {
                            throw ConfigError(path: "\(path).headers", problem: "expected a mapping of header names to strings")
                        }
                        source.headers = headers
                    }
                    file.fetcher.sources[dataset] = source
                }
            }
        }
        return file
    }

    private static func mapping(_ value: Any, _ path: String) throws -> [String: Any] {
        guard let map = value as? [String: Any] else {
            throw ConfigError(path: path, problem: "expected a mapping of keys to values, got \(describe(value))")
        }
        return map
    }

    private static func checkKeys(_ map: [String: Any], allowed: Set<String>, _ path: String) throws {
        for key in map.keys.sorted() where !allowed.contains(key) {
            let full = path.isEmpty ? key : "\(path).\(key)"
            throw ConfigError(path: full, problem: "unknown key; expected one of \(allowed.sorted().joined(separator: ", "))")
        }
    }

    private static func positive(_ value: Any, _ path: String) throws -> Int {
        guard let number = value as? Int, number > 0 else {
            throw ConfigError(path: path, problem: "expected a positive integer, got \(describe(value))")
        }
        return number
    }

    private static func endpoint(_ value: Any, _ path: String) throws -> String {
        guard let text = value as? String, ["tcp://", "ipc://", "inproc://"].contains(where: { text.hasPrefix($0) }), text.count > 8 else {
            throw ConfigError(path: path, problem: "expected an endpoint such as tcp://127.0.0.1:5555, got \(describe(value))")
        }
        return text
    }

    private static func strings(_ value: Any, _ path: String) throws -> [String] {
        guard let list = value as? [Any], let strings = list as? [String] else {
            throw ConfigError(path: path, problem: "expected a list of strings, got \(describe(value))")
        }
        return strings
    }

    private static func describe(_ value: Any) -> String {
        switch value {
        case let text as String: "\"\(text)\""
        case is [Any]: "a list"
        case is [String: Any]: "a mapping"
        default: "\(value)"
        }
    }
}
