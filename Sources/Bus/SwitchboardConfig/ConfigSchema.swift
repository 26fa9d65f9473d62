import Foundation

/// The keys a section of the file may hold, as the module that reads the section declares
/// them: a key not in it is an error naming the keys that are, and every value in it can be
/// overridden by a `SWITCHBOARD_*` environment variable.
public indirect enum ConfigSchema: Sendable {
    /// A value, read as YAML when a variable gives it (a number, a list).
    case value
    /// A value a variable gives as the text it is, never read as YAML (a Z85 key may start
    /// with YAML's `!`, `&` or `*`).
    case text
    case map([String: ConfigSchema])
    /// Keys any of `names`, each with the same schema (the services, the datasets).
    case each(Set<String>, ConfigSchema)

    /// A mapping of plain values.
    public static func values(_ names: [String]) -> ConfigSchema {
        .map(Dictionary(uniqueKeysWithValues: names.map { ($0, .value) }))
    }

    var children: [(String, ConfigSchema)] {
        switch self {
        case .value, .text: []
        case .map(let keys): keys.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
        case .each(let names, let schema): names.sorted().map { ($0, schema) }
        }
    }

    /// The dotted path of every value ("kernel.broker", …), and whether it is ``text``.
    var valuePaths: [(path: String, isText: Bool)] {
        func walk(_ schema: ConfigSchema, _ prefix: String) -> [(String, Bool)] {
            switch schema {
            case .value: [(prefix, false)]
            case .text: [(prefix, true)]
            case .map, .each: schema.children.flatMap { walk($0.1, prefix.isEmpty ? $0.0 : "\(prefix).\($0.0)") }
            }
        }
        return walk(self, "")
    }

    /// Throws for the first key of `map` (at `path`) the schema does not know.
    func check(_ map: [String: Any], _ path: String) throws(ConfigError) {
        let allowed = Dictionary(uniqueKeysWithValues: children)
        for key in map.keys.sorted() {
            let full = path.isEmpty ? key : "\(path).\(key)"
            guard let child = allowed[key] else {
                throw ConfigError(path: full, problem: "unknown key; expected one of \(allowed.keys.sorted().joined(separator: ", "))")
            }
            switch child {
            case .value, .text: continue
            case .map, .each:
                // A section may be written but left empty (`datasets:` with everything commented out).
                guard let value = map[key], !(value is NSNull) else { continue }
                try child.check(try ConfigSection.mapping(value, full), full)
            }
        }
    }
}
