public import BusProtocol
public import Contracts
public import Foundation
public import Supervisor
import Synchronization
public import SwitchboardConfig

/// The configuration a process runs with, read again on SIGHUP or `sb reload`: the same file
/// and `SWITCHBOARD_*` variables, checked as at start. A file that does not read is refused
/// and the running configuration stays; otherwise the changed keys are sorted into those
/// that apply live (``liveKeys``) and those that need a restart. In a process that admits
/// keys (the kernel, and `switchboard up` that runs it) the key folder's `clients/*.pub` and
/// `operators/*.pub` are read again too: each file added, removed or changed is reported as
/// applied, and a file that holds no key refuses the reload as a bad key would.
public final class ConfigReloader: ConfigurationReloading {
    public let url: URL?
    /// Whether `switchboard up` supervises: it applies new worker counts (a rolling restart).
    private let supervised: Bool
    /// Whether this process admits keys from the key folder (``KeyFolder/furtherPublicKeys()``).
    private let admitsKeys: Bool
    private let current: Mutex<Reading>

    /// A configuration as read: the file, its values by key path, and the key folder's
    /// further public keys by file (empty where the folder is not read).
    private struct Reading {
        var file: ConfigFile
        var values: [String: String]
        var keyFiles: [String: String]
    }

    /// Keys applied without a restart (`*`: any one name). Log levels, in every process;
    /// worker counts, by `up` restarting that service the rolling way; the gateway's tokens;
    /// the kernel's allowed keys (and the key folder's `clients/*.pub` and `operators/*.pub`, read again) and limits.
    public static let liveKeys = [
        "log_level", "kernel.log_level", "services.*.log_level", "gateway.log_level",
        "services.*.workers", "gateway.tokens", "security.client_keys", "security.worker_keys", "security.operator_keys",
        "kernel.queue_timeout_ms", "kernel.max_queued", "kernel.max_queued_bytes", "kernel.max_services",
        "kernel.client_share_percent", "kernel.max_deliveries", "kernel.no_retry",
        "kernel.state_max_keys", "kernel.state_max_bytes", "kernel.client_state_max_keys", "kernel.client_state_max_bytes",
        "kernel.state_max_value_bytes",
    ]

    /// Reads the configuration at `path` (nil: none, the defaults) as the process starts;
    /// `admitsKeys` for the kernel's process and the supervisor that runs it.
    public init(path: String?, supervised: Bool = false, admitsKeys: Bool = false) throws {
        url = path.map { URL(fileURLWithPath: $0) }
        self.supervised = supervised
        self.admitsKeys = admitsKeys
        current = Mutex(try Self.read(url, admitsKeys: admitsKeys))
    }

    /// The configuration in effect.
    public var file: ConfigFile { current.withLock { $0.file } }

    /// Reads the file again: the new configuration and what changed; the running one stays
    /// when it does not read (the error names the key).
    public func reread() throws(ConfigError) -> (file: ConfigFile, report: SupervisorAPI.Reloaded) {
        let next: Reading
        do {
            next = try Self.read(url, admitsKeys: admitsKeys)
        } catch let error as ConfigError {
            throw error
        } catch {
            throw ConfigError(path: "", problem: "\(error)")
        }
        let old = current.withLock { state in
            defer { state = next }
            return state
        }
        let changed = Self.changed(old.values, next.values)
        let live = changed.filter { key in
            Self.liveKeys.contains { Self.matches(key, $0) } && (supervised || !Self.matches(key, "services.*.workers"))
        }
        // The kernel reads the folder again at every reload: a changed file always applies.
        let keyFiles = Self.changed(old.keyFiles, next.keyFiles).map { file in
            "\(file) (\(old.keyFiles[file] == nil ? "added" : next.keyFiles[file] == nil ? "removed" : "changed"))"
        }
        return (next.file, SupervisorAPI.Reloaded(file: url?.path, applied: live + keyFiles, needsRestart: changed.filter { !live.contains($0) }))
    }

    /// The keys whose values differ between `old` and `new` (added and removed ones too), sorted.
    private static func changed(_ old: [String: String], _ new: [String: String]) -> [String] {
        Set(old.keys).union(new.keys).filter { old[$0] != new[$0] }.sorted()
    }

    /// ``ConfigurationReloading``, for the supervisor: a refusal is -32013 naming the key.
    public func reload() throws(JSONRPCError) -> ConfigurationChange {
        do {
            let (file, report) = try reread()
            let workers = Dictionary(uniqueKeysWithValues: ConfigFile.serviceNames.compactMap { name in file.services[name].map { (name, $0.workers) } })
            return ConfigurationChange(report: report, workers: workers)
        } catch {
            throw .invalidConfiguration(key: error.path, "\(url?.path ?? "configuration"): \(error)")
        }
    }

    private static func read(_ url: URL?, admitsKeys: Bool) throws -> Reading {
        var values: [String: String] = [:]
        let file = try ConfigDocument.load(url, schema: ConfigFile.schema, environment: ProcessInfo.processInfo.environment) { section in
            flatten(section.values, "", into: &values)
            return try ConfigFile(reading: section)
        }
        var keyFiles: [String: String] = [:]
        // The folder is read only where the kernel takes its keys from it (not given by hand, CURVE not turned off).
        if admitsKeys && file.security.kernelSecretKey == nil && file.security.curve != false {
            do {
                for (path, key) in try file.security.keyFolder.furtherPublicKeys() { keyFiles[path] = key }
            } catch {
                throw ConfigError(path: "security.keys_dir", problem: "\(error)")
            }
        }
        return Reading(file: file, values: values, keyFiles: keyFiles)
    }

    /// Every value by its key path; mappings are walked, anything else is one value.
    private static func flatten(_ tree: [String: Any], _ prefix: String, into values: inout [String: String]) {
        for (key, value) in tree {
            let path = prefix.isEmpty ? key : "\(prefix).\(key)"
            if let mapping = value as? [String: Any] { flatten(mapping, path, into: &values) } else { values[path] = canonical(value) }
        }
    }

    /// The same text for the same value, whatever order a mapping inside a list came in.
    private static func canonical(_ value: Any) -> String {
        switch value {
        case let mapping as [String: Any]: "{" + mapping.keys.sorted().map { "\($0): \(canonical(mapping[$0]!))" }.joined(separator: ", ") + "}"
        case let list as [Any]: "[" + list.map(canonical).joined(separator: ", ") + "]"
        default: "\(value)"
        }
    }

    static func matches(_ key: String, _ pattern: String) -> Bool {
        let keys = key.split(separator: "."), patterns = pattern.split(separator: ".")
        return keys.count == patterns.count && zip(keys, patterns).allSatisfy { $1 == "*" || $0 == $1 }
    }
}
