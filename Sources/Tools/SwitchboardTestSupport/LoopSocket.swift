public import ZeroMQ
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One socket on a ``SocketLoop``, used from tasks: for tests and benchmarks that drive a
/// socket through the loop. It is built the way the bus's components own their sockets (an
/// actor pinned to the loop; docs/BRIDGE.md), from the loop's public parts only.
///
/// A send is queued to the loop in order, without an `await` (`loop.execute`, then the
/// actor's isolation, as `BusClient` sends). What arrives waits in a ``BoundedBuffer`` for
/// ``receive()``; when the reader falls `bufferSize` behind, the loop stops reading the
/// socket until the reader took half, so libzmq's high-water mark pushes back on the peer.
public actor LoopSocket {
    public nonisolated let loop: SocketLoop
    public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    private nonisolated let inbox: BoundedBuffer<Message>
    private var registration: SocketRegistration?

    /// Opens a socket of `type` on `loop`. `configure` runs on the loop thread before the
    /// socket is registered: options, bind and connect. Throws once the loop has stopped.
    public static func open(_ type: SocketType, on loop: SocketLoop, bufferSize: Int = 1_024,
                            configure: @escaping @Sendable (ZMQSocket) throws -> Void = { _ in }) async throws -> LoopSocket {
        let resumeTarget = Mutex(WeakTarget())
        let socket = LoopSocket(loop: loop, inbox: BoundedBuffer(capacity: bufferSize, whenFull: .pauseProducer(resume: {
            guard let socket = resumeTarget.withLock({ $0.socket }) else { return }
            socket.loop.execute { socket.assumeIsolated { $0.registration?.resumeReading() } }
        })))
        resumeTarget.withLock { $0.socket = socket }
        // `run` refuses work once the loop stopped, where a call onto the actor would run off
        // the loop thread.
        try await loop.run { try socket.assumeIsolated { try $0.start(type, configure) } }
        return socket
    }

    private struct WeakTarget { weak var socket: LoopSocket? }

    private init(loop: SocketLoop, inbox: BoundedBuffer<Message>) {
        self.loop = loop
        self.inbox = inbox
    }

    private func start(_ type: SocketType, _ configure: (ZMQSocket) throws -> Void) throws {
        let socket = try ZMQSocket(loop.context, type)
        try configure(socket)
        // Weak: a socket its test let go of without closing (a test that failed midway) stays
        // registered on a loop that still runs, and what arrives then is dropped.
        let registration = loop.register(socket) { [weak self] message in
            guard let self else { return }
            if inbox.push(message) == .full { assumeIsolated { $0.registration?.pauseReading() } }
        }
        registration.onClose { [inbox] error in inbox.finish(throwing: error) }
        self.registration = registration
    }

    /// Queues `message` for sending and returns at once; throws `ENOTSOCK` once closed. A
    /// failure libzmq reports later (an unroutable peer) is counted by the loop: use
    /// ``sendAndConfirm(_:)`` to see it.
    public nonisolated func send(_ message: Message) throws(ZMQError) {
        guard !inbox.isFinished else { throw ZMQError(call: "send on a closed socket", code: ENOTSOCK) }
        loop.execute { self.assumeIsolated { $0.registration?.send(message) } }
    }

    /// Sends on the loop thread and returns once libzmq took `message`, or throws what libzmq
    /// said (`EAGAIN` at the high-water mark, `EHOSTUNREACH` for an unroutable peer).
    public nonisolated func sendAndConfirm(_ message: Message) async throws {
        try await loop.run {
            try self.assumeIsolated { socket throws in
                guard let registration = socket.registration else { throw ZMQError(call: "send on a closed socket", code: ENOTSOCK) }
                try registration.sendNow(message)
            }
        }
    }

    /// The next message. Throws the socket's closing error once it is closed and nothing is
    /// left, and `CancellationError` when the task is cancelled.
    public nonisolated func receive() async throws -> Message {
        guard let message = try await inbox.next() else { throw ZMQError(call: "receive on a closed socket", code: ENOTSOCK) }
        return message
    }

    /// A message if one waits, without waiting.
    public nonisolated func tryReceive() -> Message? { inbox.tryNext() }

    /// The messages received, until the socket is closed.
    public nonisolated var messages: AsyncThrowingStream<Message, any Error> {
        AsyncThrowingStream {
            do {
                return try await self.receive()
            } catch let error as ZMQError where error.code == ENOTSOCK || error.isTerminated {
                return nil
            }
        }
    }

    /// Runs `body` with the socket on the loop thread: options, binds, connects.
    public nonisolated func withSocket<T: Sendable>(_ body: @escaping @Sendable (ZMQSocket) throws -> T) async throws -> T {
        try await loop.run {
            try self.assumeIsolated { socket throws in
                guard let registration = socket.registration, !registration.isClosed else {
                    throw ZMQError(call: "withSocket on a closed socket", code: ENOTSOCK)
                }
                return try body(registration.socket)
            }
        }
    }

    /// Closes the socket on its loop; a waiting ``receive()`` throws.
    public nonisolated func close() async {
        _ = try? await loop.run { self.assumeIsolated { $0.registration?.close() } }
    }
}
