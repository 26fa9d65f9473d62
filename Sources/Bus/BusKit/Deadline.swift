import Synchronization

/// Runs `body` and returns its outcome, or throws `expired()` once `timeout` has passed,
/// whichever comes first; cancelling the caller ends the wait with `CancellationError`.
///
/// A task group waits for every child, so a timeout raced in one is only as good as the
/// body's respect for cancellation. Here the body runs in a task of its own, cancelled and
/// left behind when the deadline passes: for awaiting what may never end (a PostgresNIO
/// query on a connection lost mid-flight, an operation under test), so that the caller is
/// always answered. What such a body answers after the deadline is dropped: one that makes
/// something to be closed (a connection) closes it itself rather than answer it.
public func withDeadline<T: Sendable>(_ timeout: Duration, expired: @escaping @Sendable () -> any Error,
                                      _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    let answer = FirstAnswer<T>()
    let operation = Task {
        do { answer.give(.success(try await body())) } catch { answer.give(.failure(error)) }
    }
    defer { operation.cancel() }
    return try await withThrowingTaskGroup(of: T.self) { group in
        group.addTask { try await answer.value() }
        group.addTask {
            try await Task.sleep(for: timeout)
            throw expired()
        }
        defer { group.cancelAll() }
        return try await group.next()!
    }
}

/// The outcome of an operation, for one waiter that may stop waiting (when cancelled) before
/// the operation ends.
private final class FirstAnswer<T: Sendable>: Sendable {
    private enum State {
        case pending(CheckedContinuation<T, any Error>?)
        case given(Result<T, any Error>)
        case taken
    }
    private let state = Mutex(State.pending(nil))

    /// The first outcome counts; later ones are dropped.
    func give(_ outcome: Result<T, any Error>) {
        let waiter: CheckedContinuation<T, any Error>? = state.withLock { state in
            guard case .pending(let waiter) = state else { return nil }
            if let waiter {
                state = .taken
                return waiter
            }
            state = .given(outcome)
            return nil
        }
        waiter?.resume(with: outcome)
    }

    /// Waits for the outcome; cancelling the waiter ends the wait with `CancellationError`.
    func value() async throws -> T {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                let ready: Result<T, any Error>? = state.withLock { state in
                    switch state {
                    case .pending:
                        state = .pending(continuation)
                        return nil
                    case .given(let outcome):
                        state = .taken
                        return outcome
                    case .taken:
                        return .failure(CancellationError())
                    }
                }
                if let ready { continuation.resume(with: ready) }
            }
        } onCancel: {
            give(.failure(CancellationError()))
        }
    }
}
