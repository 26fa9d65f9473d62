/// A state key's time to live, as `state.set`'s `ttl` param and CHP's `ttl` property carry
/// it: seconds from outside, checked against one range before anything converts them.
///
/// The range is the rule, not the arithmetic's luck: a finite number of seconds from 0 to
/// ``maxSeconds`` (a year), so its nanoseconds fit a `UInt64` with room to add to any
/// monotonic clock reading, and its integer part fits an `Int`.
public struct TimeToLive: Sendable, Equatable {
    /// A year: longer than any expiry a bus needs, far below where nanoseconds overflow.
    public static let maxSeconds: Double = 31_536_000
    public static let range: ClosedRange<Double> = 0...maxSeconds
    /// The range in words, for errors.
    public static let rangeDescription = "a number of seconds from 0 to \(Int(maxSeconds)) (a year)"

    public let seconds: Double
    public let nanoseconds: UInt64

    /// Nil when `seconds` is not finite or outside ``range`` (NaN and infinities included).
    public init?(seconds: Double) {
        guard seconds.isFinite, Self.range.contains(seconds) else { return nil }
        self.seconds = seconds
        nanoseconds = UInt64((seconds * 1e9).rounded())
    }

    /// Nil when `nanoseconds` is over a year (a peer's copy of an expiry).
    public init?(nanoseconds: UInt64) {
        guard nanoseconds <= UInt64(Self.maxSeconds) * 1_000_000_000 else { return nil }
        self.nanoseconds = nanoseconds
        seconds = Double(nanoseconds) / 1e9
    }

    /// The CHP properties frame's text: `ttl=SECONDS\n` (whole seconds without a fraction).
    public var property: String {
        "ttl=\(seconds == seconds.rounded() ? String(Int(seconds)) : String(seconds))\n"
    }
}
