import DequeModule
import Synchronization

/// A bounded buffer from a producer on a loop thread to tasks awaiting `next()`.
/// `push` reports when the buffer is full, so the producer can react (a subscription
/// resynchronises rather than grow without bound).
final class AsyncBuffer<Element: Sendable>: Sendable {
    typealias Waiter = UnsafeContinuation<Element?, any Error>
    struct State: ~Copyable {
        var items: Deque<Element> = []
        var waiters: Deque<(id: UInt64, continuation: Waiter)> = []
        var nextID: UInt64 = 0
        var finished: (any Error)?
        var done = false
    }

    let capacity: Int
    private let state = Mutex(State())

    init(capacity: Int) { self.capacity = capacity }

    /// Adds an element; returns false (dropping it) when the buffer is full.
    @discardableResult
    func push(_ element: Element) -> Bool {
        let (waiter, accepted) = state.withLock { state -> (Waiter?, Bool) in
            if state.done { return (nil, false) }
            if let waiter = state.waiters.popFirst() { return (waiter.continuation, true) }
            guard state.items.count < capacity else { return (nil, false) }
            state.items.append(element)
            return (nil, true)
        }
        waiter?.resume(returning: element)
        return accepted
    }

    var count: Int { state.withLock { $0.items.count } }

    /// Drops everything buffered (used before a resynchronisation).
    func clear() { state.withLock { $0.items.removeAll() } }

    /// Ends the sequence: waiters get nil (or `error`), later pushes are ignored.
    func finish(throwing error: (any Error)? = nil) {
        let waiters = state.withLock { state -> Deque<(id: UInt64, continuation: Waiter)> in
            state.done = true
            state.finished = error
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters {
            if let error { waiter.continuation.resume(throwing: error) } else { waiter.continuation.resume(returning: nil) }
        }
    }

    func next() async throws -> Element? {
        let id = state.withLock { state -> UInt64 in
            state.nextID += 1
            return state.nextID
        }
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: Waiter) in
                let outcome = state.withLock { state -> BufferOutcome<Element> in
                    if let item = state.items.popFirst() { return .item(item) }
                    if state.done { return .end(state.finished) }
                    if Task.isCancelled { return .end(CancellationError()) }
                    state.waiters.append((id, continuation))
                    return .wait
                }
                switch outcome {
                case .wait: break
                case .item(let item): continuation.resume(returning: item)
                case .end(let error?): continuation.resume(throwing: error)
                case .end(nil): continuation.resume(returning: nil)
                }
            }
        } onCancel: {
            let waiter = state.withLock { state -> Waiter? in
                guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                return state.waiters.remove(at: index).continuation
            }
            waiter?.resume(throwing: CancellationError())
        }
    }
}

/// What a waiting `next()` finds under the lock.
private enum BufferOutcome<Element> {
    case wait
    case item(Element)
    case end((any Error)?)
}
