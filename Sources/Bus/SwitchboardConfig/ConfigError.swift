/// An error in a configuration file, naming the key's path and what was expected
/// ("kernel.heartbeat_ms: expected an integer from 1 to 3600000, got \"fast\"").
public struct ConfigError: Error, Sendable, Equatable, CustomStringConvertible {
    public let path: String
    public let problem: String
    /// The environment variable the bad value came from, when it did not come from the file.
    public var variable: String?
    public init(path: String, problem: String, variable: String? = nil) {
        self.path = path
        self.problem = problem
        self.variable = variable
    }
    public var description: String {
        if let variable { return "\(variable) (overrides \(path)): \(problem)" }
        return path.isEmpty ? problem : "\(path): \(problem)"
    }
}
