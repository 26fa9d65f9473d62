public import Logging

/// Keeps what a logger was told, a line each (`LEVEL MESSAGE key=value ...`), for a test to
/// read and to wait on.
public final class LogLines: Sendable {
    public let lines = Observed<[String]>([])

    public init() {}

    /// A logger whose lines at `level` and above are kept here.
    public func logger(_ label: String, level: Logger.Level = .info) -> Logger {
        Logger(label: label) { _ in Handler(lines: self, logLevel: level) }
    }

    public var text: String { lines.value.joined(separator: "\n") }

    /// Waits until a line holds `text`.
    public func waitFor(_ text: String, within seconds: Double, _ what: String) async throws {
        try await lines.wait(within: seconds, what) { $0.contains { $0.contains(text) } }
    }

    struct Handler: LogHandler {
        let lines: LogLines
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level
        init(lines: LogLines, logLevel: Logger.Level) { (self.lines, self.logLevel) = (lines, logLevel) }
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            let fields = (event.metadata ?? [:]).map { "\($0.key)=\($0.value)" }.sorted().joined(separator: " ")
            lines.lines.update { $0.append("\(event.level) \(event.message) \(fields)") }
        }
    }
}
