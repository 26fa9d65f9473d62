/// How often a line about something that goes on is said again: once when it starts, then at
/// most once a minute while it lasts (a database away for an hour is not seven hundred lines).
package enum LogCadence {
    /// Whether a line last said at `last` is said again now; if so, now is when.
    package static func dueAgain(_ last: inout ContinuousClock.Instant?) -> Bool {
        let now = ContinuousClock.now
        if let said = last, now - said < .seconds(60) { return false }
        last = now
        return true
    }
}
