internal import CZeroMQ

/// Readiness for ``ZMQPoller`` and ``ZMQSocket/events()``.
public struct PollEvents: OptionSet, Sendable, Hashable {
    public let rawValue: Int16
    public init(rawValue: Int16) { self.rawValue = rawValue }
    public static let readable = PollEvents(rawValue: Int16(ZMQ_POLLIN))
    public static let writable = PollEvents(rawValue: Int16(ZMQ_POLLOUT))
    public static let error = PollEvents(rawValue: Int16(ZMQ_POLLERR))
}

/// Waits on several sockets (and plain file descriptors) at once, with `zmq_poll`.
///
/// Like the sockets it holds, a poller belongs to one thread. Package-wide, not public: for
/// the tests and benchmarks that drive sockets from one thread; the bus waits in a
/// `SocketLoop`. Inside this module so libzmq's socket handle never leaves it.
package struct ZMQPoller {
    private var items: [zmq_pollitem_t] = []
    private var sockets: [ZMQSocket?] = []

    package init() {}

    /// Adds a socket to watch for `events`; returns its index for ``events(at:)``.
    @discardableResult
    package mutating func add(_ socket: ZMQSocket, for events: PollEvents = .readable) throws(ZMQError) -> Int {
        let handle = try socket.raw("zmq_poll")
        items.append(zmq_pollitem_t(socket: handle, fd: -1, events: events.rawValue, revents: 0))
        sockets.append(socket)
        return items.count - 1
    }

    /// Adds a plain file descriptor (an eventfd, a pipe) to watch for `events`.
    @discardableResult
    package mutating func add(fileDescriptor: Int32, for events: PollEvents = .readable) -> Int {
        items.append(zmq_pollitem_t(socket: nil, fd: fileDescriptor, events: events.rawValue, revents: 0))
        sockets.append(nil)
        return items.count - 1
    }

    /// Changes what the item at `index` is watched for.
    package mutating func watch(_ index: Int, for events: PollEvents) {
        items[index].events = events.rawValue
    }

    package var count: Int { items.count }

    /// Waits until at least one item is ready or `timeoutMilliseconds` pass
    /// (-1: no limit, 0: just look). Returns how many items are ready.
    @discardableResult
    package mutating func poll(timeoutMilliseconds: Int = -1) throws(ZMQError) -> Int {
        let count = items.count
        let ready = try items.withUnsafeMutableBufferPointer { buffer throws(ZMQError) in
            try zmqCall("zmq_poll") { zmq_poll(buffer.baseAddress, Int32(count), timeoutMilliseconds) }
        }
        return Int(ready)
    }

    /// What the item at `index` was found ready for by the last ``poll(timeoutMilliseconds:)``.
    package func events(at index: Int) -> PollEvents {
        PollEvents(rawValue: items[index].revents)
    }
}
