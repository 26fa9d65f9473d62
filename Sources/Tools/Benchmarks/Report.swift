import Foundation
import Histogram

/// One row of a results table.
struct Row {
    var name: String
    var rate: Double?
    var p50: UInt64?
    var p99: UInt64?
    var p999: UInt64?
    var note: String = ""

    init(_ name: String, rate: Double? = nil, latencies: Histogram<UInt64>? = nil, note: String = "") {
        self.name = name
        self.rate = rate
        if let latencies {
            p50 = latencies.valueAtPercentile(50)
            p99 = latencies.valueAtPercentile(99)
            p999 = latencies.valueAtPercentile(99.9)
        }
        self.note = note
    }
}

func microseconds(_ nanoseconds: UInt64?) -> String {
    guard let nanoseconds else { return "" }
    return String(format: "%.1f µs", Double(nanoseconds) / 1_000)
}

func perSecond(_ rate: Double?) -> String {
    guard let rate else { return "" }
    return String(format: "%.0f/s", rate).replacingOccurrences(of: #"(\d)(?=(\d{3})+/)"#, with: "$1,", options: .regularExpression)
}

/// Prints rows as a Markdown table, ready for the README.
func printTable(_ rows: [Row]) {
    let header = ["benchmark", "rate", "p50", "p99", "p99.9", "note"]
    let cells = rows.map { [$0.name, perSecond($0.rate), microseconds($0.p50), microseconds($0.p99), microseconds($0.p999), $0.note] }
    let widths = header.indices.map { column in ([header[column]] + cells.map { $0[column] }).map(\.count).max()! }
    func line(_ values: [String]) -> String {
        "| " + values.enumerated().map { $1.padding(toLength: widths[$0], withPad: " ", startingAt: 0) }.joined(separator: " | ") + " |"
    }
    say(line(header))
    say("|" + widths.map { String(repeating: "-", count: $0 + 2) }.joined(separator: "|") + "|")
    for row in cells { say(line(row)) }
}

/// The middle value (the lower middle for an even count).
func median(_ values: [Double]) -> Double {
    values.sorted()[(values.count - 1) / 2]
}

/// The measurement whose p50 latency is the median one.
func medianByP50(_ runs: [(Double, Histogram<UInt64>)]) -> (Double, Histogram<UInt64>) {
    runs.sorted { $0.1.valueAtPercentile(50) < $1.1.valueAtPercentile(50) }[(runs.count - 1) / 2]
}
