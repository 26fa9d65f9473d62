import Logging
import ZeroMQ

/// The log lines a peer causes by what it sends: a refused key, a malformed message, a
/// refused write. There is one per connection or message, so without a bound a hostile or
/// broken peer writes the kernel's log as fast as it sends, fills the disk and buries every
/// other line. Each line (by its message; its metadata may differ) is written at most
/// ``burst`` times an ``interval``; the rest are counted, and once the interval is over one
/// line says how many were left out (``flush()``, each second). What is counted in the
/// kernel's figures (`sb stats`) is counted whether or not its line is written.
///
/// Used on the kernel's loop thread only.
final class PeerEventLog {
    static let burst = 10
    static let interval: UInt64 = 10_000_000_000

    let logger: Logger
    private let clock: any NanosecondClock
    /// By message: when its interval began, the lines written in it, and those left out.
    private var windows: [String: Window] = [:]
    private struct Window {
        var start: UInt64
        var written = 0
        var leftOut = 0
        var level: Logger.Level
    }

    init(logger: Logger, clock: any NanosecondClock = SystemClock()) {
        self.logger = logger
        self.clock = clock
    }

    func log(_ level: Logger.Level, _ message: String, metadata: Logger.Metadata = [:]) {
        let now = clock.now
        var window = windows[message] ?? Window(start: now, level: level)
        if now - window.start >= Self.interval {
            sayLeftOut(message, window)
            window = Window(start: now, level: level)
        }
        if window.written < Self.burst {
            window.written += 1
            logger.log(level: level, "\(message)", metadata: metadata)
        } else {
            window.leftOut += 1
        }
        windows[message] = window
    }

    func warning(_ message: String, metadata: Logger.Metadata = [:]) { log(.warning, message, metadata: metadata) }
    func info(_ message: String, metadata: Logger.Metadata = [:]) { log(.info, message, metadata: metadata) }

    /// Says what was left out in the intervals that are over, and forgets them (so the
    /// messages kept are only those of the last interval).
    func flush() {
        let now = clock.now
        for (message, window) in windows where now - window.start >= Self.interval {
            sayLeftOut(message, window)
            windows[message] = nil
        }
    }

    private func sayLeftOut(_ message: String, _ window: Window) {
        guard window.leftOut > 0 else { return }
        logger.log(level: window.level, "\(window.leftOut) more lines like \"\(message)\" were left out in \(Self.interval / 1_000_000_000) s",
                   metadata: ["leftOut": "\(window.leftOut)"])
    }
}
