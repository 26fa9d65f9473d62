internal import CZeroMQ
import DequeModule
import Synchronization
#if canImport(Glibc)
internal import Glibc
#endif

extension SocketLoop {
    /// Opens a socket on this loop and returns a handle to use from async code.
    ///
    /// `configure` runs on the loop thread before the socket is registered: set options,
    /// bind and connect there.
    /// - Parameters:
    ///   - bufferSize: messages held for the consumer before the loop stops reading.
    ///   - sendQueueLimit: messages queued for sending before ``AsyncSocket/send(_:)``
    ///     fails with `EAGAIN`.
    public func open(
        _ type: SocketType,
        bufferSize: Int = 1024,
        sendQueueLimit: Int = 100_000,
        configure: @escaping @Sendable (ZMQSocket) throws -> Void = { _ in }
    ) async throws -> AsyncSocket {
        try await run {
            let socket = try ZMQSocket(self.context, type)
            try configure(socket)
            let inbox = AsyncSocket.Inbox(capacity: max(1, bufferSize))
            let registration = self.register(socket) { message in inbox.deliver(message) }
            inbox.registration = LoopBound(registration, loop: self)
            registration.onClose { error in inbox.finish(error) }
            if registration.isClosed { throw ZMQError(call: "open \(type) on stopped SocketLoop(\(self.name))", code: czmq_ETERM) }
            return AsyncSocket(loop: self, type: type, inbox: inbox, sendQueueLimit: sendQueueLimit)
        }
    }
}

/// A socket on a ``SocketLoop``, used from any task: sends are queued to the loop thread,
/// received messages arrive through ``receive()`` or ``messages``.
///
/// Any number of tasks may send and receive; waiting receivers are served in the order
/// they began to wait. Messages from one sender keep their order.
public final class AsyncSocket: Sendable {
    public let loop: SocketLoop
    public let type: SocketType
    let inbox: Inbox
    private let sendQueueLimit: Int
    private let queuedSends = Atomic<Int>(0)

    init(loop: SocketLoop, type: SocketType, inbox: Inbox, sendQueueLimit: Int) {
        self.loop = loop
        self.type = type
        self.inbox = inbox
        self.sendQueueLimit = sendQueueLimit
    }

    /// Queues `message` for sending and returns at once.
    ///
    /// Throws `EAGAIN` when `sendQueueLimit` messages are already waiting for the peer,
    /// and `ENOTSOCK` after the socket was closed. A failure libzmq reports later (such as
    /// an unroutable peer) is counted by the loop; use ``sendAndConfirm(_:)`` to see it.
    public func send(_ message: Message) throws(ZMQError) {
        guard !inbox.isFinished else { throw ZMQError(call: "send on closed \(type) socket", code: ENOTSOCK) }
        guard let registration = inbox.registration else { return }
        if loop.isLoopThread {
            // Already on the owning thread (a pinned actor, or a task preferring the loop
            // as its executor): hand the message to libzmq directly.
            registration.value.send(message)
            return
        }
        if queuedSends.add(1, ordering: .relaxed).newValue > sendQueueLimit {
            queuedSends.subtract(1, ordering: .relaxed)
            throw ZMQError(call: "send on \(type) socket (\(sendQueueLimit) queued)", code: EAGAIN)
        }
        let counter = CounterRef(self)
        loop.submit(.call {
            counter.socket.queuedSends.subtract(1, ordering: .relaxed)
            registration.value.send(message)
        })
    }

    /// Sends `message` on the loop thread and returns once libzmq took it, or throws what
    /// libzmq said (`EAGAIN` at the high-water mark, `EHOSTUNREACH` for an unroutable peer).
    public func sendAndConfirm(_ message: Message) async throws {
        guard let registration = inbox.registration else { return }
        try await loop.run { try registration.value.sendNow(message) }
    }

    /// Waits for the next message. Throws the socket's closing error once it is closed
    /// and its buffer is empty, and `CancellationError` when the task is cancelled.
    public func receive() async throws -> Message {
        try await inbox.next()
    }

    /// Returns a message if one is buffered, without waiting.
    public func tryReceive() -> Message? {
        inbox.tryNext()
    }

    /// The received messages, as an `AsyncSequence` that ends when the socket is closed.
    public var messages: Messages { Messages(inbox: inbox) }

    /// Runs `body` with the socket on the loop thread: for options, binds and connects.
    public func withSocket<T: Sendable>(_ body: @escaping @Sendable (ZMQSocket) throws -> T) async throws -> T {
        guard let registration = inbox.registration else { throw ZMQError(call: "withSocket", code: ENOTSOCK) }
        return try await loop.run {
            let registration = registration.value
            guard !registration.isClosed else { throw ZMQError(call: "withSocket on closed \(self.type) socket", code: ENOTSOCK) }
            return try body(registration.socket)
        }
    }

    /// Closes the socket on its loop; waiting receivers get `ENOTSOCK`.
    public func close() async {
        guard let registration = inbox.registration else { return }
        _ = try? await loop.run { registration.value.close() }
    }

    /// The sequence of received messages.
    public struct Messages: AsyncSequence, Sendable {
        public typealias Element = Message
        let inbox: Inbox

        public struct AsyncIterator: AsyncIteratorProtocol {
            let inbox: Inbox
            public mutating func next() async throws -> Message? {
                do {
                    return try await inbox.next()
                } catch let error as ZMQError where error.code == ENOTSOCK || error.isTerminated {
                    return nil
                }
            }
        }

        public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(inbox: inbox) }
    }

    // Captures the socket weakly enough for a @Sendable closure: the socket is Sendable.
    private struct CounterRef: Sendable {
        let socket: AsyncSocket
        init(_ socket: AsyncSocket) { self.socket = socket }
    }

    /// The bounded buffer between the loop (producer) and the receiving tasks, which are
    /// served in the order they started waiting.
    final class Inbox: Sendable {
        typealias Waiter = UnsafeContinuation<Message, any Error>
        struct State: ~Copyable {
            var buffer: Deque<Message> = []
            var waiters: Deque<(id: UInt64, continuation: Waiter)> = []
            var nextWaiterID: UInt64 = 0
            var finished: ZMQError?
            var paused = false
        }

        let capacity: Int
        private let state = Mutex(State())
        // Set once, on the loop thread, before the socket is handed out.
        nonisolated(unsafe) var registration: LoopBound<SocketRegistration>?

        init(capacity: Int) { self.capacity = capacity }

        var isFinished: Bool { state.withLock { $0.finished != nil } }

        /// Called on the loop thread for each message read.
        func deliver(_ message: Message) {
            let (waiter, full) = state.withLock { state -> (Waiter?, Bool) in
                if let waiter = state.waiters.popFirst() { return (waiter.continuation, false) }
                state.buffer.append(message)
                if state.buffer.count >= capacity {
                    state.paused = true
                    return (nil, true)
                }
                return (nil, false)
            }
            if let waiter { waiter.resume(returning: message) }
            if full { registration?.value.pauseReading() }
        }

        /// Called on the loop thread when the socket closes.
        func finish(_ error: ZMQError) {
            let waiters = state.withLock { state -> Deque<(id: UInt64, continuation: Waiter)> in
                state.finished = error
                defer { state.waiters.removeAll() }
                return state.waiters
            }
            for waiter in waiters { waiter.continuation.resume(throwing: error) }
        }

        func tryNext() -> Message? {
            let (message, resume) = state.withLock { state -> (Message?, Bool) in
                guard let message = state.buffer.popFirst() else { return (nil, false) }
                return (message, takeResume(&state))
            }
            if resume { resumeReading() }
            return message
        }

        func next() async throws -> Message {
            if let message = tryNext() { return message }
            if let registration, registration.loop.isLoopThread {
                // On the owning thread: read what libzmq already holds, as a blocking
                // receive would, instead of suspending until the next poll.
                registration.value.drain()
                if let message = tryNext() { return message }
            }
            let id = state.withLock { state -> UInt64 in
                state.nextWaiterID += 1
                return state.nextWaiterID
            }
            return try await withTaskCancellationHandler {
                try await withUnsafeThrowingContinuation { (continuation: Waiter) in
                    enum Outcome { case waiting, message(Message, resume: Bool), failed(any Error) }
                    let outcome = state.withLock { state -> Outcome in
                        if let message = state.buffer.popFirst() { return .message(message, resume: takeResume(&state)) }
                        if let finished = state.finished { return .failed(finished) }
                        // Checked under the lock that onCancel takes, so no cancel is missed.
                        if Task.isCancelled { return .failed(CancellationError()) }
                        state.waiters.append((id, continuation))
                        return .waiting
                    }
                    switch outcome {
                    case .waiting: break
                    case .message(let message, let resume):
                        continuation.resume(returning: message)
                        if resume { resumeReading() }
                    case .failed(let error): continuation.resume(throwing: error)
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

        /// Whether the loop should read again: it paused and the buffer is half empty.
        private func takeResume(_ state: inout State) -> Bool {
            guard state.paused, state.buffer.count <= capacity / 2 else { return false }
            state.paused = false
            return true
        }

        private func resumeReading() {
            guard let registration else { return }
            if registration.loop.isLoopThread {
                registration.value.resumeReading()
            } else {
                registration.loop.execute { registration.value.resumeReading() }
            }
        }
    }
}
