#if canImport(Glibc)
internal import Glibc
#endif
import Synchronization

/// Nanoseconds on the monotonic clock: for deadlines, timers and latencies, which must
/// not jump when the wall clock is set.
@inline(__always)
public func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// Monotonic time in nanoseconds as the parts that keep deadlines read it (the kernel's
/// broker, state server and pair link): the system's ``SystemClock``, or in a test one it
/// moves by hand, so timing rules are checked in milliseconds with no sleeping.
public protocol NanosecondClock: Sendable {
    var now: UInt64 { get }
}

/// The monotonic clock of the system (``monotonicNanoseconds()``).
public struct SystemClock: NanosecondClock {
    public init() {}
    public var now: UInt64 { monotonicNanoseconds() }
}

/// A clock a test moves by hand: the parts given it read it and nothing else, so a timing
/// rule is checked by moving it past the deadline, in no time at all.
public final class ManualClock: NanosecondClock {
    private let nanoseconds = Atomic<UInt64>(1_000_000_000)
    public init() {}
    public var now: UInt64 { nanoseconds.load(ordering: .relaxed) }
    public func advance(_ duration: Duration) { nanoseconds.add(duration.nanoseconds, ordering: .relaxed) }
}

extension Duration {
    /// The duration in whole nanoseconds: 0 for a negative duration, and at most
    /// ``maxNanoseconds`` (about 146 years), so a deadline `now + duration.nanoseconds` on the
    /// monotonic clock never overflows, whatever duration a setting or a peer gave.
    public var nanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds >= 0 else { return 0 }
        guard seconds < Int64(Self.maxNanoseconds / 1_000_000_000) else { return Self.maxNanoseconds }
        return UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
    }

    /// The ceiling of ``nanoseconds``: 2^62.
    public static let maxNanoseconds: UInt64 = 1 << 62

    /// The duration in seconds, as a `Double`.
    public var seconds: Double { Double(nanoseconds) / 1e9 }

    /// "2 s", "0.25 s": for messages people read.
    public var formatted: String {
        seconds == seconds.rounded() ? "\(Int(seconds)) s" : "\((seconds * 1000).rounded() / 1000) s"
    }
}
