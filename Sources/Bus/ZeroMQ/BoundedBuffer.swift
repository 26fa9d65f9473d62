public import DequeModule
public import Synchronization

/// The bounded buffer between a producer on a loop thread and the tasks awaiting
/// ``next()``, served in the order they started waiting. It is the one buffer of the
/// bridge: a subscription's updates, a stream's parts (BusKit) and a hosted service's
/// requests (for its answerers) all use it.
///
/// What happens when it is full is the owner's choice:
/// - ``WhenFull/pauseProducer(resume:)``: the element is kept and ``push(_:)`` answers
///   ``PushOutcome/full``, so the producer stops reading; `resume` is called once a consumer
///   has taken the buffer down to half (a subscription pauses its sockets: backpressure
///   reaches libzmq's own high-water marks, and the kernel's dropping is then counted).
/// - ``WhenFull/refuse``: the element is dropped and ``push(_:)`` answers
///   ``PushOutcome/refused`` (a stream's reader too far behind ends the stream).
public final class BoundedBuffer<Element: Sendable>: Sendable {
    public enum WhenFull: Sendable {
        case refuse
        case pauseProducer(resume: @Sendable () -> Void)
    }

    public enum PushOutcome: Sendable, Equatable {
        /// Taken (handed to a waiting task, or buffered).
        case accepted
        /// Taken, and the buffer is now full: the producer should pause.
        case full
        /// Not taken: the buffer is full (``WhenFull/refuse``) or finished.
        case refused
    }

    @usableFromInline typealias Waiter = UnsafeContinuation<Element?, any Error>
    @usableFromInline struct State: ~Copyable {
        @usableFromInline var items: Deque<Element> = []
        @usableFromInline var waiters: Deque<(id: UInt64, continuation: Waiter)> = []
        @usableFromInline var nextWaiterID: UInt64 = 0
        /// Finished: later pushes are refused; what is buffered is still handed out.
        @usableFromInline var finished = false
        @usableFromInline var error: (any Error)?
        @usableFromInline var paused = false
        @usableFromInline init() {}
    }

    public let capacity: Int
    @usableFromInline let whenFull: WhenFull
    @usableFromInline let state = Mutex(State())

    public init(capacity: Int, whenFull: WhenFull) {
        self.capacity = max(1, capacity)
        self.whenFull = whenFull
    }

    // The methods a request or an update goes through are inlinable, so a user in another
    // module gets them specialized to its element: unspecialized, each call looks up the
    // metadata of its deque and tuples at run time.

    /// Called by the producer for each element.
    @inlinable @discardableResult
    public func push(_ element: Element) -> PushOutcome {
        let pauses = if case .pauseProducer = whenFull { true } else { false }
        let (waiter, outcome) = state.withLock { state -> (Waiter?, PushOutcome) in
            if state.finished { return (nil, .refused) }
            if let waiter = state.waiters.popFirst() { return (waiter.continuation, .accepted) }
            if !pauses, state.items.count >= capacity { return (nil, .refused) }
            state.items.append(element)
            guard pauses, state.items.count >= capacity else { return (nil, .accepted) }
            state.paused = true
            return (nil, .full)
        }
        waiter?.resume(returning: element)
        return outcome
    }

    public var count: Int { state.withLock { $0.items.count } }
    public var isFinished: Bool { state.withLock { $0.finished } }

    /// Drops everything buffered.
    public func clear() {
        let resume = state.withLock { state -> Bool in
            state.items.removeAll()
            return takeResume(&state)
        }
        if resume { self.resume() }
    }

    /// Ends the sequence: what is buffered is still handed out, then waiters get nil (or
    /// `error` thrown); later pushes are refused.
    public func finish(throwing error: (any Error)? = nil) {
        let waiters = state.withLock { state -> Deque<(id: UInt64, continuation: Waiter)> in
            state.finished = true
            state.error = error
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters {
            if let error { waiter.continuation.resume(throwing: error) } else { waiter.continuation.resume(returning: nil) }
        }
    }

    /// The next element if one is buffered, without waiting.
    @inlinable
    public func tryNext() -> Element? {
        let (element, resume) = state.withLock { state -> (Element?, Bool) in
            guard let element = state.items.popFirst() else { return (nil, false) }
            return (element, takeResume(&state))
        }
        if resume { self.resume() }
        return element
    }

    /// The next element, waiting for one; nil once finished without an error.
    @inlinable
    public func next() async throws -> Element? {
        if let element = tryNext() { return element }
        let id = state.withLock { state -> UInt64 in
            state.nextWaiterID += 1
            return state.nextWaiterID
        }
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: Waiter) in
                let outcome = state.withLock { state -> WaitOutcome<Element> in
                    if let element = state.items.popFirst() { return .element(element, resume: takeResume(&state)) }
                    if state.finished { return .end(state.error) }
                    // Checked under the lock that onCancel takes, so no cancel is missed.
                    if Task.isCancelled { return .end(CancellationError()) }
                    state.waiters.append((id, continuation))
                    return .waiting
                }
                switch outcome {
                case .waiting: break
                case .element(let element, let resume):
                    continuation.resume(returning: element)
                    if resume { self.resume() }
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

    /// Whether a paused producer may go on: the buffer is down to half.
    @usableFromInline func takeResume(_ state: inout State) -> Bool {
        guard state.paused, state.items.count <= capacity / 2 else { return false }
        state.paused = false
        return true
    }

    @usableFromInline func resume() {
        if case .pauseProducer(let resume) = whenFull { resume() }
    }
}

/// What a waiting ``BoundedBuffer/next()`` finds under the lock. (At file level: a local
/// generic enum inside the closure crashes the Swift 6.3 compiler.)
@usableFromInline enum WaitOutcome<Element> {
    case waiting
    case element(Element, resume: Bool)
    case end((any Error)?)
}
