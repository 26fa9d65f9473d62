import BusProtocol
import Foundation
import Logging

/// `--log-format json`: one JSON object per line on stderr, for log collectors: `time` (ISO
/// 8601, UTC, milliseconds), `level`, `label`, `message`, `source` (the module), `trace_id`
/// and `span_id` when the line was written for a traced request, and the rest of the
/// metadata under `metadata` (with `error.message` and `error.type` for a line logged with
/// an error).
struct JSONLogHandler: LogHandler {
    let label: String
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider?

    init(label: String, metadataProvider: Logger.MetadataProvider?) {
        self.label = label
        self.metadataProvider = metadataProvider
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var merged = metadata
        if let provided = metadataProvider?.get() { merged.merge(provided) { $1 } }
        if let given = event.metadata { merged.merge(given) { $1 } }
        // An error logged with the line (`logger.warning(_:error:)`), under the keys the
        // text format gives it.
        if let error = event.error {
            merged["error.message"] = "\(error)"
            merged["error.type"] = "\(String(reflecting: type(of: error)))"
        }
        var line: [String: JSONValue] = [
            "time": .string(Timestamp.format(Date())), "level": .string(event.level.rawValue), "label": .string(label),
            "message": .string(event.message.description), "source": .string(event.source),
        ]
        for key in ["trace_id", "span_id"] {
            if let value = merged.removeValue(forKey: key) { line[key] = Self.json(value) }
        }
        if !merged.isEmpty { line["metadata"] = .object(merged.mapValues(Self.json)) }
        var bytes = JSONValue.object(line).jsonBytes
        bytes.append(UInt8(ascii: "\n"))
        // One write per line, so lines from several threads never interleave.
        bytes.withUnsafeBytes { buffer in _ = write(STDERR_FILENO, buffer.baseAddress, buffer.count) }
    }

    private static func json(_ value: Logger.MetadataValue) -> JSONValue {
        switch value {
        case .string(let text): .string(text)
        case .stringConvertible(let convertible): .string(convertible.description)
        case .array(let values): .array(values.map(json))
        case .dictionary(let members): .object(members.mapValues(json))
        }
    }
}
