public import Foundation

/// Times on the wire: ISO 8601 in UTC with milliseconds (`2026-11-21T10:00:00.000Z`).
public enum Timestamp {
    private static let withFraction = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
    private static let withoutFraction = Date.ISO8601FormatStyle()

    public static func format(_ date: Date) -> String { withFraction.format(date) }
    public static func format(seconds: Double) -> String { format(Date(timeIntervalSince1970: seconds)) }

    public static func parse(_ text: String) -> Date? {
        (try? withFraction.parse(text)) ?? (try? withoutFraction.parse(text))
    }
}
