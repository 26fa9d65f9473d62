import BusProtocol
import Foundation
import StandardStreams

/// What `sb` prints: data on stdout, diagnostics on stderr; tables and colour for people
/// (colour only on a terminal and never with `NO_COLOR`), JSON for scripts.
enum Output {
    static let stdoutIsTerminal = isatty(STDOUT_FILENO) == 1
    static let stderrIsTerminal = isatty(STDERR_FILENO) == 1
    /// https://no-color.org: any non-empty value turns colour off.
    static let colour = stdoutIsTerminal && (ProcessInfo.processInfo.environment["NO_COLOR"] ?? "").isEmpty

    static func line(_ text: String = "") {
        write(text + "\n")
    }

    /// Writes `text` to stdout whole, or ends sb with exit status 74 when it cannot.
    static func write(_ text: String) {
        StandardStreams.write(text)
    }

    /// `text` from the bus (a key) for a line people read: control characters (a newline, a
    /// terminal's escape) written as JSON writes them (`\n`, `\u001b`), so no key forges a
    /// line of output or moves the cursor.
    static func printable(_ text: String) -> String {
        let isControl = { (scalar: Unicode.Scalar) in scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) || scalar == "\u{2028}" || scalar == "\u{2029}" }
        guard text.unicodeScalars.contains(where: isControl) else { return text }
        var escaped = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\n": escaped += "\\n"
            case "\r": escaped += "\\r"
            case "\t": escaped += "\\t"
            case _ where isControl(scalar): escaped += String(format: "\\u%04x", scalar.value)
            default: escaped.unicodeScalars.append(scalar)
            }
        }
        return escaped
    }

    static func diagnostic(_ text: String) {
        StandardStreams.writeError("sb: " + text + "\n")
    }

    /// A progress note on stderr, only on a terminal (scripts get none).
    static func progress(_ text: String) {
        guard stderrIsTerminal else { return }
        StandardStreams.writeError("\r\u{1B}[2K" + text)
    }

    /// A bar of `width` cells, `fraction` of them full.
    static func bar(_ fraction: Double, width: Int = 30) -> String {
        String(repeating: "█", count: Int(min(1, max(0, fraction)) * Double(width))).padding(toLength: width, withPad: "·", startingAt: 0)
    }

    static func endProgress() {
        guard stderrIsTerminal else { return }
        StandardStreams.writeError("\r\u{1B}[2K")
    }

    /// JSON: indented on a terminal, one line otherwise (or when `compact`).
    static func json(_ value: JSONValue, compact: Bool = false) {
        line(compact || !stdoutIsTerminal ? value.jsonString : pretty(value))
    }

    static func pretty(_ value: JSONValue, indent: String = "") -> String {
        let inner = indent + "  "
        switch value {
        case .array(let items) where !items.isEmpty:
            return "[\n" + items.map { inner + pretty($0, indent: inner) }.joined(separator: ",\n") + "\n\(indent)]"
        case .object(let members) where !members.isEmpty:
            let lines = members.keys.sorted().map { key in inner + JSONValue.string(key).jsonString + ": " + pretty(members[key]!, indent: inner) }
            return "{\n" + lines.joined(separator: ",\n") + "\n\(indent)}"
        default:
            return value.jsonString
        }
    }

    enum Style { case bold, dim, green, red, yellow, cyan }

    static func styled(_ text: String, _ style: Style) -> String {
        guard colour else { return text }
        let code = switch style {
        case .bold: "1"
        case .dim: "2"
        case .green: "32"
        case .red: "31"
        case .yellow: "33"
        case .cyan: "36"
        }
        return "\u{1B}[\(code)m\(text)\u{1B}[0m"
    }

    /// Prints rows under a header, columns aligned (by characters as shown).
    static func table(_ header: [String], _ rows: [[String]]) {
        let widths = header.indices.map { column in ([header[column]] + rows.map { column < $0.count ? $0[column] : "" }).map(\.count).max() ?? 0 }
        func format(_ cells: [String]) -> String {
            cells.enumerated().map { index, cell in
                index == cells.count - 1 ? cell : cell + String(repeating: " ", count: widths[index] - cell.count)
            }.joined(separator: "  ")
        }
        line(styled(format(header), .bold))
        for row in rows { line(format(row)) }
    }

    /// A JSON value as a table cell.
    static func cell(_ value: JSONValue?) -> String {
        switch value {
        case nil, .null?: ""
        case .string(let text)?: text
        case .bool(let flag)?: flag ? "yes" : "no"
        case let other?: other.jsonString
        }
    }

    /// A number as people read it: `3` rather than `3.0`.
    static func number(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? "\(Int(value))" : "\(value)"
    }

    /// A span of time in seconds as sb's flags take it (`ConnectionOptions.seconds`), in the
    /// largest unit that keeps it whole: `7d`, `12h`, `2m`, `30s`, `500ms`; else `1.5s`.
    static func span(_ seconds: Double) -> String {
        let units: [(suffix: String, seconds: Double)] = [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1), ("ms", 0.001)]
        for unit in units where seconds != 0 && abs(seconds) >= unit.seconds {
            let count = seconds / unit.seconds
            // Whole but for the last bits of a unit that has no exact binary form (0.001).
            if abs(count - count.rounded()) < 1e-9 * abs(count) { return number(count.rounded()) + unit.suffix }
        }
        return number(seconds) + "s"
    }
}
