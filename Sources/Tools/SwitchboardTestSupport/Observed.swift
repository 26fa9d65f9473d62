import Synchronization

/// A value other threads change (what a child process wrote, what a logger was told), and
/// waits on it that end at the change they wait for rather than polling: each change wakes
/// the waiters, which ask their condition again.
public final class Observed<Value: Sendable>: Sendable {
    private struct State {
        var value: Value
        /// Counts changes, so a waiter that read the value at one version sleeps only while
        /// no later change has come.
        var version = 0
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
        var nextWaiter = 0
        /// Waiters cancelled before they went to sleep: they must not sleep.
        var cancelled: Set<Int> = []
    }

    private let state: Mutex<State>

    public init(_ value: Value) { state = Mutex(State(value: value)) }

    /// The value now.
    public var value: Value { state.withLock { $0.value } }

    /// Changes the value and wakes every waiter.
    @discardableResult
    public func update<Result>(_ change: (inout Value) -> Result) -> Result {
        let (result, waiters) = state.withLock { state in
            let result = change(&state.value)
            state.version += 1
            defer { state.waiters = [:] }
            return (result, state.waiters)
        }
        for waiter in waiters.values { waiter.resume() }
        return result
    }

    /// The value once `condition` holds of it (asked now and after each change); fails with
    /// ``TimedOut`` after `seconds`.
    @discardableResult
    public func wait(within seconds: Double, _ what: String, until condition: @escaping @Sendable (Value) throws -> Bool) async throws -> Value {
        try await within(seconds, what) {
            while true {
                let (value, version) = self.state.withLock { ($0.value, $0.version) }
                if try condition(value) { return value }
                await self.change(after: version)
                try Task.checkCancellation()
            }
        }
    }

    /// Returns once the value has changed since `version` (or the task is cancelled).
    private func change(after version: Int) async {
        let id = state.withLock { state in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let sleeps = state.withLock { state in
                    guard state.version == version, state.cancelled.remove(id) == nil else { return false }
                    state.waiters[id] = continuation
                    return true
                }
                if !sleeps { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { state in
                if let waiter = state.waiters.removeValue(forKey: id) { return Optional(waiter) }
                state.cancelled.insert(id)
                return nil
            }
            waiter?.resume()
        }
    }
}
