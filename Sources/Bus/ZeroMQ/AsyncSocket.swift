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
            let slot = AsyncSocket.RegistrationSlot()
            // Full: the loop stops reading this socket until receivers took half of it.
            let inbox = BoundedBuffer<Message>(capacity: bufferSize, whenFull: .pauseProducer(resume: { slot.resumeReading() }))
            let registration = self.register(socket) { message in
                if inbox.push(message) == .full { slot.registration?.value.pauseReading() }
            }
            slot.registration = LoopBound(registration, loop: self)
            registration.onClose { error in inbox.finish(throwing: error) }
            if registration.isClosed { throw ZMQError(call: "open \(type) on stopped SocketLoop(\(self.name))", code: czmq_ETERM) }
            return AsyncSocket(loop: self, type: type, inbox: inbox, slot: slot, sendQueueLimit: sendQueueLimit)
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
    let inbox: BoundedBuffer<Message>
    private let slot: RegistrationSlot
    private var registration: LoopBound<SocketRegistration>? { slot.registration }
    private let sendQueueLimit: Int
    private let queuedSends = Atomic<Int>(0)

    init(loop: SocketLoop, type: SocketType, inbox: BoundedBuffer<Message>, slot: RegistrationSlot, sendQueueLimit: Int) {
        self.loop = loop
        self.type = type
        self.inbox = inbox
        self.slot = slot
        self.sendQueueLimit = sendQueueLimit
    }

    /// Queues `message` for sending and returns at once.
    ///
    /// Throws `EAGAIN` when `sendQueueLimit` messages are already waiting for the peer,
    /// and `ENOTSOCK` after the socket was closed. A failure libzmq reports later (such as
    /// an unroutable peer) is counted by the loop; use ``sendAndConfirm(_:)`` to see it.
    public func send(_ message: Message) throws(ZMQError) {
        guard !inbox.isFinished else { throw ZMQError(call: "send on closed \(type) socket", code: ENOTSOCK) }
        guard let registration else { return }
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
        guard let registration else { return }
        try await loop.run { try registration.value.sendNow(message) }
    }

    /// Waits for the next message. Throws the socket's closing error once it is closed
    /// and its buffer is empty, and `CancellationError` when the task is cancelled.
    public func receive() async throws -> Message {
        if let message = inbox.tryNext() { return message }
        if let registration, loop.isLoopThread {
            // On the owning thread: read what libzmq already holds, as a blocking
            // receive would, instead of suspending until the next poll.
            registration.value.drain()
            if let message = inbox.tryNext() { return message }
        }
        // The inbox always finishes with the socket's closing error, so nil is not expected.
        guard let message = try await inbox.next() else { throw ZMQError(call: "receive on closed \(type) socket", code: ENOTSOCK) }
        return message
    }

    /// Returns a message if one is buffered, without waiting.
    public func tryReceive() -> Message? {
        inbox.tryNext()
    }

    /// The received messages, as an `AsyncSequence` that ends when the socket is closed.
    public var messages: Messages { Messages(socket: self) }

    /// Runs `body` with the socket on the loop thread: for options, binds and connects.
    public func withSocket<T: Sendable>(_ body: @escaping @Sendable (ZMQSocket) throws -> T) async throws -> T {
        guard let registration else { throw ZMQError(call: "withSocket", code: ENOTSOCK) }
        return try await loop.run {
            let registration = registration.value
            guard !registration.isClosed else { throw ZMQError(call: "withSocket on closed \(self.type) socket", code: ENOTSOCK) }
            return try body(registration.socket)
        }
    }

    /// Closes the socket on its loop; waiting receivers get `ENOTSOCK`.
    public func close() async {
        guard let registration else { return }
        _ = try? await loop.run { registration.value.close() }
    }

    /// The sequence of received messages.
    public struct Messages: AsyncSequence, Sendable {
        public typealias Element = Message
        let socket: AsyncSocket

        public struct AsyncIterator: AsyncIteratorProtocol {
            let socket: AsyncSocket
            public mutating func next() async throws -> Message? {
                do {
                    return try await socket.receive()
                } catch let error as ZMQError where error.code == ENOTSOCK || error.isTerminated {
                    return nil
                }
            }
        }

        public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(socket: socket) }
    }

    // Captures the socket weakly enough for a @Sendable closure: the socket is Sendable.
    private struct CounterRef: Sendable {
        let socket: AsyncSocket
        init(_ socket: AsyncSocket) { self.socket = socket }
    }

    /// The socket's registration on its loop, set once on the loop thread before the
    /// socket is handed out (the inbox's resume call needs it before it exists).
    final class RegistrationSlot: Sendable {
        nonisolated(unsafe) var registration: LoopBound<SocketRegistration>?

        func resumeReading() {
            guard let registration else { return }
            if registration.loop.isLoopThread {
                registration.value.resumeReading()
            } else {
                registration.loop.execute { registration.value.resumeReading() }
            }
        }
    }
}
