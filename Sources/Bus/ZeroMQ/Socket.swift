internal import CZeroMQ
#if canImport(Glibc)
internal import Glibc
#endif

/// The ZeroMQ socket types the bus uses.
public enum SocketType: Int32, Sendable, CustomStringConvertible {
    case pair = 0, pub = 1, sub = 2, req = 3, rep = 4, dealer = 5, router = 6
    case pull = 7, push = 8, xpub = 9, xsub = 10, stream = 11

    public var description: String {
        switch self {
        case .pair: "PAIR"; case .pub: "PUB"; case .sub: "SUB"; case .req: "REQ"
        case .rep: "REP"; case .dealer: "DEALER"; case .router: "ROUTER"; case .pull: "PULL"
        case .push: "PUSH"; case .xpub: "XPUB"; case .xsub: "XSUB"; case .stream: "STREAM"
        }
    }
}

/// Flags for one send.
public struct SendOptions: OptionSet, Sendable {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    /// Fail with `EAGAIN` instead of blocking.
    public static let dontWait = SendOptions(rawValue: ZMQ_DONTWAIT)
}

/// A libzmq socket.
///
/// A socket belongs to one thread at a time: libzmq sockets are not thread-safe, so this
/// type is deliberately not `Sendable`. To use sockets from async code, open them on a
/// ``SocketLoop``, which keeps them on its own thread.
///
/// New sockets get a linger of 0, so closing one (or shutting down its context) never
/// waits for unsent messages; set ``SocketOption/linger`` where delivery on close matters.
/// The socket closes when ``close()`` is called or when it is released.
public final class ZMQSocket {
    public let context: ZMQContext
    public let type: SocketType
    /// libzmq's socket, an opaque pointer in its C API; nil once closed. A socket is used on
    /// one thread at a time.
    private var handle: UnsafeMutableRawPointer?
    /// Received messages carry the peer's ZAP user id (``Message/peerUserID``).
    public var readsPeerUserID = false
    /// How many libzmq calls were made on this socket. Any of them may take in the wake-up
    /// that the socket's `ZMQ_FD` signalled, so a ``SocketLoop`` reads the socket's events
    /// after every call instead of waiting for a signal that will not come again.
    private(set) var operations: UInt = 0
    /// Whether libzmq sends this socket's events to a monitor (``monitor(_:events:)``).
    var isMonitored = false
    /// Of the reader of another socket's events (``connectionEvents(of:in:also:)``): that
    /// socket, whose events stop when this reader closes.
    weak var monitoredSocket: ZMQSocket?

    /// Opens a socket of `type` in `context`.
    public init(_ context: ZMQContext, _ type: SocketType) throws(ZMQError) {
        self.context = context
        self.type = type
        let handle = try zmqCall("zmq_socket(\(type))") { zmq_socket(context.handle, type.rawValue) }
        self.handle = handle
        try set(.linger, 0)
    }

    deinit { close() }

    /// Closes the socket now; later calls fail with `ENOTSOCK`. Closing twice is harmless.
    ///
    /// A monitored socket's events stop first, and so do those of the socket whose events
    /// this one reads: libzmq's I/O thread sends each event with a blocking send, which waits
    /// forever once the reader has gone (zeromq/libzmq#3575), and with it every connection of
    /// the context.
    public func close() {
        guard let handle else { return }
        stopMonitoring()
        monitoredSocket?.stopMonitoring()
        monitoredSocket = nil
        zmq_close(handle)
        self.handle = nil
    }

    /// Stops sending this socket's events to its monitor (`zmq_socket_monitor` with no
    /// endpoint), which libzmq closes.
    func stopMonitoring() {
        guard isMonitored, let handle else { return }
        isMonitored = false
        zmq_socket_monitor(handle, nil, 0)
    }

    public var isClosed: Bool { handle == nil }

    /// The libzmq socket, for a call about to be made on it (counted in ``operations``).
    @inline(__always)
    func raw(_ call: @autoclosure () -> String) throws(ZMQError) -> UnsafeMutableRawPointer {
        guard let handle else { throw ZMQError(call: call(), code: ENOTSOCK) }
        operations &+= 1
        return handle
    }

    // MARK: Endpoints

    /// Binds to an endpoint such as `tcp://127.0.0.1:5555`, `tcp://127.0.0.1:*`,
    /// `ipc:///tmp/x.sock` or `inproc://name`. Returns the endpoint actually bound
    /// (with the port chosen for `*`).
    @discardableResult
    public func bind(_ endpoint: String) throws(ZMQError) -> String {
        let handle = try raw("zmq_bind(\(endpoint))")
        try zmqCall("zmq_bind(\(endpoint))") { zmq_bind(handle, endpoint) }
        return (try? get(.lastEndpoint)) ?? endpoint
    }

    /// Connects to an endpoint; libzmq reconnects by itself when the peer goes away.
    public func connect(_ endpoint: String) throws(ZMQError) {
        let handle = try raw("zmq_connect(\(endpoint))")
        try zmqCall("zmq_connect(\(endpoint))") { zmq_connect(handle, endpoint) }
    }

    public func unbind(_ endpoint: String) throws(ZMQError) {
        let handle = try raw("zmq_unbind(\(endpoint))")
        try zmqCall("zmq_unbind(\(endpoint))") { zmq_unbind(handle, endpoint) }
    }

    public func disconnect(_ endpoint: String) throws(ZMQError) {
        let handle = try raw("zmq_disconnect(\(endpoint))")
        try zmqCall("zmq_disconnect(\(endpoint))") { zmq_disconnect(handle, endpoint) }
    }

    // MARK: Sending

    /// Sends all frames of `message` as one multipart message.
    ///
    /// With ``SendOptions/dontWait`` it throws an error whose ``ZMQError/isAgain`` is true
    /// when the message cannot be queued now; no frame of it was sent in that case.
    /// A frame over 33 bytes that was received, or any frame of 64 KiB or more, is handed to
    /// libzmq by reference (none of its bytes copied, ``Frame/share(into:)``); any other frame
    /// is copied into the message libzmq sends.
    public func send(_ message: Message, options: SendOptions = []) throws(ZMQError) {
        try message.frames.withUnsafeBufferPointer { frames throws(ZMQError) in try send(frames: frames, options: options) }
    }

    /// Sends `frames` as one multipart message: a message's frames among others' in one
    /// array, lent in place (a copy of a frame, or a slice of the array, is a retain).
    public func send(frames: UnsafeBufferPointer<Frame>, options: SendOptions = []) throws(ZMQError) {
        let handle = try raw("zmq_msg_send")
        guard !frames.isEmpty else { throw ZMQError(call: "zmq_msg_send(no frames)", code: EINVAL) }
        var part = zmq_msg_t()
        let last = frames.count - 1
        for index in 0...last {
            var flags = options.rawValue
            if index < last { flags |= ZMQ_SNDMORE }
            // After the first frame is accepted libzmq takes the rest of the message
            // whole, so an EAGAIN can only happen on frame 0 and nothing half-sent remains.
            // Through the pointer, borrowed in place: the buffer's subscript returns a copy
            // (a retain and a release of a frame held in a buffer).
            let frame = frames.baseAddress! + index
            guard frame.pointee.share(into: &part) else {
                // Any other frame's bytes copied by `zmq_send` into a message of its own: one
                // call into libzmq rather than three (a message made, its data found, sent).
                try frame.pointee.withUnsafeBytes { raw throws(ZMQError) in
                    _ = try zmqCall("zmq_send(\(type))") { zmq_send(handle, raw.baseAddress, raw.count, flags) }
                }
                continue
            }
            do throws(ZMQError) {
                try zmqCall("zmq_msg_send(\(type))") { zmq_msg_send(&part, handle, flags) }
            } catch {
                // Not sent: the frame's reference is ours to release.
                zmq_msg_close(&part)
                throw error
            }
        }
    }

    /// Sends without blocking; returns `false` (sending nothing) when libzmq cannot take
    /// the message now (`EAGAIN`: high-water mark reached, or no peer yet).
    public func trySend(_ message: Message) throws(ZMQError) -> Bool {
        try message.frames.withUnsafeBufferPointer { frames throws(ZMQError) in try trySend(frames: frames) }
    }

    /// The same for a message's frames among others' in one array.
    public func trySend(frames: UnsafeBufferPointer<Frame>) throws(ZMQError) -> Bool {
        do {
            try send(frames: frames, options: .dontWait)
            return true
        } catch where error.isAgain {
            return false
        }
    }

    // MARK: Receiving

    /// Receives one whole multipart message, blocking until one arrives (or until the
    /// receive timeout, if one is set, passes: then it throws `EAGAIN`).
    public func receive() throws(ZMQError) -> Message {
        guard let message = try receive(flags: 0) else {
            throw ZMQError(call: "zmq_msg_recv(\(type))", code: EAGAIN)
        }
        return message
    }

    /// Receives one whole message if one is waiting; `nil` when none is (`EAGAIN`).
    public func tryReceive() throws(ZMQError) -> Message? {
        try receive(flags: ZMQ_DONTWAIT)
    }

    /// Receives one whole message into `parts` if one is waiting; false when none is
    /// (`EAGAIN`). For a reader that looks at parts where libzmq holds them and makes frames
    /// only of those it keeps (``SocketRegistration``'s handlers).
    public func tryReceive(into parts: ZMQReceivedParts) throws(ZMQError) -> Bool {
        try receive(into: parts, flags: ZMQ_DONTWAIT)
    }

    /// The parts the blocking and one-off receives read into (a socket is used on one
    /// thread at a time).
    private lazy var received = ZMQReceivedParts()

    private func receive(flags: Int32) throws(ZMQError) -> Message? {
        let parts = received
        defer { parts.release() }
        return try receive(into: parts, flags: flags) ? parts.message() : nil
    }

    /// Parts read of one message at most. libzmq bounds a part's size (`ZMQ_MAXMSGSIZE`), not
    /// how many parts a message has: a peer's 5 MB message of five million one-byte parts took
    /// the kernel past 1.3 GB, most of it the room this reader made for them. Every protocol
    /// here uses a handful; a message of more is read to its end, let go and counted
    /// (``messagesOverPartLimit``), and the next one is read.
    public static let maxParts = 4_096
    /// Messages let go for having more than ``maxParts`` parts.
    public private(set) var messagesOverPartLimit = 0

    private func receive(into parts: ZMQReceivedParts, flags: Int32) throws(ZMQError) -> Bool {
        let handle = try raw("zmq_msg_recv")
        var slots = parts.slots(forAtLeast: 1)
        var room = parts.slots
        var index = 0
        while true {
            if index == room {
                slots = parts.slots(forAtLeast: index + 1)
                room = parts.slots
            }
            let part = slots + index
            // Only the first part can be missing: the rest of a multipart message arrives
            // with it, so later parts are read without DONTWAIT.
            let received: Int32?
            do throws(ZMQError) {
                received = try zmqCallUnlessAgain("zmq_msg_recv(\(type))") { zmq_msg_recv(part, handle, index == 0 ? flags : 0) }
            } catch {
                // Nothing of a message cut short is read: the parts are empty.
                parts.cutShort(after: index)
                throw error
            }
            if received == nil {
                parts.cutShort(after: index)
                // Nothing waiting for a non-blocking read; else the receive timeout passed.
                if index == 0 && flags & ZMQ_DONTWAIT != 0 { return false }
                throw ZMQError(call: "zmq_msg_recv(\(type))", code: EAGAIN)
            }
            guard zmq_msg_more(part) == 1 else {
                let peerUserID = readsPeerUserID ? zmq_msg_gets(part, "User-Id").map { String(cString: $0) } : nil
                parts.received(count: index + 1, peerUserID: peerUserID)
                return true
            }
            index += 1
            if index == Self.maxParts {
                // The rest through the last slot, each letting go of the one before.
                while zmq_msg_more(part) == 1 {
                    try zmqCall("zmq_msg_recv(\(type))") { zmq_msg_recv(part, handle, 0) }
                }
                messagesOverPartLimit += 1
                index = 0
            }
        }
    }

    // MARK: Readiness

    /// Whether a message can be received / sent right now (`ZMQ_EVENTS`).
    public func events() throws(ZMQError) -> PollEvents {
        PollEvents(rawValue: Int16(truncatingIfNeeded: try get(.events)))
    }
}

@available(*, unavailable, message: "A ZeroMQ socket belongs to one thread; use SocketLoop from async code")
extension ZMQSocket: Sendable {}
