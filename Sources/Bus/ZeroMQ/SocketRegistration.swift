internal import CZeroMQ
import DequeModule
#if canImport(Glibc)
internal import Glibc
#endif

/// A socket served by a ``SocketLoop``: its messages go to a handler on the loop thread,
/// and sends that libzmq cannot take yet wait in a backlog. Used on the loop thread only.
public final class SocketRegistration {
    public let socket: ZMQSocket
    unowned let loop: SocketLoop
    /// What a received message is handed to: a ``Message`` of frames, or the parts where
    /// libzmq holds them, for a handler that makes frames only of what it keeps.
    enum Handler {
        case message((Message) -> Void)
        case parts((ReceivedParts) -> Void)
    }
    /// Let go of when the socket closes, with the other handlers: they often hold the
    /// registration's owner, which holds the registration.
    private var handler: Handler?
    private var backlog: Deque<Message> = []
    private var closeHandlers: [(ZMQError) -> Void] = []
    /// Whether the loop reads this socket; ``pauseReading()`` clears it.
    public private(set) var isReading = true
    public private(set) var isClosed = false
    /// Sends that failed after being queued (such as `EHOSTUNREACH` on a ROUTER with
    /// router-mandatory), and the most recent such error.
    public private(set) var failedSends = 0
    public private(set) var lastSendError: ZMQError?
    /// Called for each send that fails after queuing (the message is dropped).
    public var onSendError: ((Message, ZMQError) -> Void)?
    /// Called once after each batch of messages read (up to the read budget), for a handler
    /// that writes out what a batch produced in one go rather than after every message.
    public var afterReading: (() -> Void)?
    /// Called once the backlog has all gone to libzmq: the socket takes messages again, for
    /// an owner that holds its own back while it is full.
    public var onBacklogSent: (() -> Void)?
    /// A message libzmq cannot take at once (`EAGAIN`) is dropped and reported through
    /// ``onSendError`` instead of waiting in the backlog. For a ROUTER with
    /// router-mandatory, whose `EAGAIN` concerns one peer: waiting would hold up the
    /// messages for every other peer behind the one that does not read.
    public var dropsWhenPeerFull = false

    /// How many messages the loop reads from one socket before serving the others.
    static let readBudget = 256

    /// The parts every message is read into.
    private let parts = ZMQReceivedParts()
    private var draining = false
    /// The message a ``Handler/message`` handler is given: made in the same array every time,
    /// unless the handler kept the last one (then it is the handler's, and the next is made
    /// in a new array).
    private var inbox = Message()
    /// Frames the inbox's array keeps room for between messages; a larger one is let go.
    static let inboxCapacity = 64

    /// Received from and used by nothing but its handler (a monitor's events): its events are
    /// read when its descriptor signals, until none is left, and not looked at after every
    /// turn of the loop as those of a socket that is also sent on (``SocketLoop``).
    let onlyReceives: Bool

    init(loop: SocketLoop, socket: ZMQSocket, handler: Handler, onlyReceives: Bool = false) {
        self.loop = loop
        self.socket = socket
        self.onlyReceives = onlyReceives
        self.descriptor = (try? socket.get(.fileDescriptor)) ?? -1
        self.handler = handler
    }

    /// The socket's `ZMQ_FD`, which the loop waits on: readable when libzmq has news for the
    /// socket (a message where there was none, room to send again), not necessarily a message.
    let descriptor: Int32
    /// The socket's operation count when the loop last read its events; nil until it has.
    private var eventsReadAt: UInt?

    /// Serves the events until the socket has none: what it read may have taken in its
    /// descriptor's signal, which only a reading of its events that finds nothing re-arms.
    func serveAllEvents() {
        while serveEvents() {}
    }

    /// Whether the socket was used since its events were read (or was told to be read again):
    /// its descriptor may then not signal what is waiting, as libzmq documents for `ZMQ_FD`.
    var needsEventsRead: Bool { eventsReadAt != socket.operations }

    /// Reads the socket's events (`ZMQ_EVENTS`, which also takes in libzmq's news) and serves
    /// them: reads what is waiting, sends what waits in the backlog once there is room.
    /// Returns whether it read or sent anything.
    @discardableResult
    func serveEvents() -> Bool {
        guard !isClosed else { return false }
        let events: PollEvents
        do {
            events = try socket.events()
        } catch where error.isTerminated || error.code == ENOTSOCK {
            // The context was shut down or the socket closed under the loop: as a receive
            // that fails, the registration closes, so the context's end is not held up.
            close(reason: error)
            return false
        } catch {
            // Interrupted by a signal (EINTR): read again on the next turn, without sleeping.
            eventsReadAt = nil
            return true
        }
        eventsReadAt = socket.operations
        var served = false
        if events.contains(.writable), !backlog.isEmpty {
            flushBacklog()
            served = true
            if backlog.isEmpty { onBacklogSent?() }
        }
        if events.contains(.readable), isReading, !isClosed {
            drain()
            served = true
        }
        return served
    }

    public var backlogCount: Int { backlog.count }

    /// Sends `message` now, or after the messages already waiting when libzmq cannot take
    /// it yet. An error other than `EAGAIN` drops the message and is reported through
    /// ``onSendError`` (and thrown here when it happens at once).
    public func send(_ message: Message) {
        message.frames.withUnsafeBufferPointer { send(frames: $0) }
    }

    /// The same for a message's frames among others' in one array (a kernel part's outbox),
    /// lent in place: they are copied into a message of their own only when they cannot be
    /// sent at once.
    public func send(frames: UnsafeBufferPointer<Frame>) {
        guard !isClosed else { return }
        if backlog.isEmpty {
            do {
                if try socket.trySend(frames: frames) { return }
            } catch {
                sendFailed(Message(Array(frames)), error)
                return
            }
            if dropsWhenPeerFull {
                sendFailed(Message(Array(frames)), ZMQError(call: "zmq_msg_send(peer full)", code: EAGAIN))
                return
            }
        }
        backlog.append(Message(Array(frames)))
    }

    /// Sends now and throws what libzmq says, including `EAGAIN`; nothing is queued.
    public func sendNow(_ message: Message) throws(ZMQError) {
        guard backlog.isEmpty else { throw ZMQError(call: "zmq_msg_send(backlog not empty)", code: EAGAIN) }
        try socket.send(message, options: .dontWait)
    }

    func flushBacklog() {
        while let message = backlog.first {
            do {
                guard try socket.trySend(message) else { return }
            } catch {
                sendFailed(message, error)
            }
            backlog.removeFirst()
        }
    }

    private func sendFailed(_ message: Message, _ error: ZMQError) {
        failedSends += 1
        lastSendError = error
        onSendError?(message, error)
    }

    /// Reads at once everything libzmq holds for this socket, as the loop would: for a
    /// handler that must see what a connection delivered before acting on its end (another
    /// socket's: from this socket's own handler it does nothing, the batch under way reads on).
    public func readQueued() {
        drain(budget: .max)
    }

    func drain(budget: Int = readBudget) {
        // The handler and the message are held in locals for the batch: read from the
        // object, each would be retained and released per message. A drain from within the
        // handler would read over the parts it is looking at: the drain under way reads on.
        guard let handler, !draining else { return }
        draining = true
        var message = Message()
        swap(&message, &inbox)
        let parts = parts
        var budget = budget
        let start = budget
        // However the batch ends (nothing left, the budget spent, the socket closed).
        defer {
            draining = false
            parts.release()
            inbox = message
            if budget < start, let afterReading { afterReading() }
        }
        while isReading && !isClosed && budget > 0 {
            do {
                guard try socket.tryReceive(into: parts) else { return }
            } catch {
                close(reason: error)
                return
            }
            switch handler {
            case .parts(let handle):
                handle(parts)
            case .message(let handle):
                parts.append(to: &message)
                handle(message)
                message.frames.removeAll(keepingCapacity: message.frames.capacity <= Self.inboxCapacity)
            }
            budget -= 1
        }
    }

    /// Stops reading this socket; libzmq queues up to its high-water mark, then pushes back.
    public func pauseReading() { isReading = false }

    /// Reads this socket again, including what arrived while it was paused (whose arrival
    /// the descriptor signalled then).
    public func resumeReading() {
        isReading = true
        eventsReadAt = nil
    }

    /// Calls `handler` once when the socket is closed, with the reason.
    public func onClose(_ handler: @escaping (ZMQError) -> Void) {
        closeHandlers.append(handler)
    }

    /// Unregisters and closes the socket; its backlog is dropped.
    public func close() {
        close(reason: ZMQError(call: "close", code: ENOTSOCK))
    }

    func close(reason: ZMQError) {
        guard !isClosed else { return }
        isClosed = true
        backlog.removeAll()
        handler = nil
        onSendError = nil
        afterReading = nil
        onBacklogSent = nil
        loop.unregister(self)
        socket.close()
        let handlers = closeHandlers
        closeHandlers.removeAll()
        for handler in handlers { handler(reason) }
    }
}
