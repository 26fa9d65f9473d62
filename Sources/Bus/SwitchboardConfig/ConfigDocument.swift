public import Foundation
import Yams

/// A YAML configuration file read against a schema, with `SWITCHBOARD_<PATH>` environment
/// variables (the key's path in capitals, dots as underscores: `SWITCHBOARD_KERNEL_BROKER`)
/// overriding its values. Unknown keys and unknown `SWITCHBOARD_*` variables are errors; a
/// bad value a variable gave is reported as that variable's.
public enum ConfigDocument {
    /// The most a configuration file may hold: a few kilobytes in practice, and a name
    /// that points at something endless (/dev/zero) must not fill memory.
    private static let largestFile = 1 << 20

    /// Reads `url` (nil: an empty file) and hands the checked top level to `read`.
    public static func load<Settings>(_ url: URL?, schema: ConfigSchema, environment: [String: String],
                                      read: (ConfigSection) throws -> Settings) throws -> Settings {
        var text = ""
        if let url {
            do {
                text = try FileContents.text(url.path, atMost: largestFile)
            } catch {
                throw ConfigError(path: "", problem: "cannot read \(url.path): \(error.reason)")
            }
        }
        return try parse(text, schema: schema, environment: environment, read: read)
    }

    /// Parses YAML text, applies the overrides from `environment`, checks every key against
    /// `schema` and hands the top level to `read`.
    public static func parse<Settings>(_ text: String, schema: ConfigSchema, environment: [String: String],
                                       read: (ConfigSection) throws -> Settings) throws -> Settings {
        let root: Any?
        do {
            root = try Yams.load(yaml: text)
        } catch {
            throw ConfigError(path: "", problem: "not valid YAML: \(error)")
        }
        var tree = try root.map { try ConfigSection.mapping($0, "") } ?? [:]
        let overridden = try applyOverrides(environment, schema: schema, to: &tree)
        do {
            try schema.check(tree, "")
            return try read(ConfigSection(values: tree))
        } catch var error as ConfigError {
            if let path = overridden.first(where: { error.path == $0 || error.path.hasPrefix($0 + "[") }) {
                error.variable = variable(for: path)
            }
            throw error
        }
    }

    /// The environment variable that overrides a key path.
    public static func variable(for path: String) -> String {
        "SWITCHBOARD_" + path.uppercased().replacingOccurrences(of: ".", with: "_")
    }

    /// Applies the `SWITCHBOARD_*` variables; returns the key paths they set.
    private static func applyOverrides(_ environment: [String: String], schema: ConfigSchema, to tree: inout [String: Any]) throws -> [String] {
        let paths = Dictionary(uniqueKeysWithValues: schema.valuePaths.map { (variable(for: $0.path), $0) })
        var overridden: [String] = []
        for (name, text) in environment.sorted(by: { $0.key < $1.key }) where name.hasPrefix("SWITCHBOARD_") {
            guard let (path, isText) = paths[name] else {
                throw ConfigError(path: name, problem: "unknown variable; SWITCHBOARD_* variables override configuration keys (e.g. SWITCHBOARD_KERNEL_BROKER for kernel.broker)")
            }
            // Numbers, booleans, lists and mappings are read as YAML; anything else is the
            // text as given.
            let parsed = isText ? nil : (try? Yams.load(yaml: text))
            let value: Any = if let parsed, parsed is Int || parsed is Bool || parsed is [Any] || parsed is [String: Any] { parsed } else { text }
            try set(value, at: path.split(separator: ".").map(String.init), in: &tree)
            overridden.append(path)
        }
        return overridden
    }

    private static func set(_ value: Any, at keys: [String], in tree: inout [String: Any]) throws {
        guard let first = keys.first else { return }
        if keys.count == 1 {
            tree[first] = value
            return
        }
        var child = try tree[first].map { try ConfigSection.mapping($0, first) } ?? [:]
        try set(value, at: Array(keys.dropFirst()), in: &child)
        tree[first] = child
    }
}
