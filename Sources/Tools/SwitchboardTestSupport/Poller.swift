internal import CZeroMQ
public import ZeroMQ

/// Waits on several sockets (and plain file descriptors) at once, with `zmq_poll`.
///
/// Like the sockets it holds, a poller belongs to one thread. For tests and benchmarks that
/// drive sockets from one thread: the bus's own code waits in a `SocketLoop`.
public struct ZMQPoller {
    private var items: [zmq_pollitem_t] = []
    private var sockets: [ZMQSocket?] = []

    public init() {}

    /// Adds a socket to watch for `events`; returns its index for ``events(at:)``.
    @discardableResult
    public mutating func add(_ socket: ZMQSocket, for events: PollEvents = .readable) throws(ZMQError) -> Int {
        let handle = try socket.raw("zmq_poll")
        items.append(zmq_pollitem_t(socket: handle, fd: -1, events: events.rawValue, revents: 0))
        sockets.append(socket)
        return items.count - 1
    }

    /// Adds a plain file descriptor (an eventfd, a pipe) to watch for `events`.
    @discardableResult
    public mutating func add(fileDescriptor: Int32, for events: PollEvents = .readable) -> Int {
        items.append(zmq_pollitem_t(socket: nil, fd: fileDescriptor, events: events.rawValue, revents: 0))
        sockets.append(nil)
        return items.count - 1
    }

    /// Changes what the item at `index` is watched for.
    public mutating func watch(_ index: Int, for events: PollEvents) {
        items[index].events = events.rawValue
    }

    public var count: Int { items.count }

    /// Waits until at least one item is ready or `timeoutMilliseconds` pass
    /// (-1: no limit, 0: just look). Returns how many items are ready.
    @discardableResult
    public mutating func poll(timeoutMilliseconds: Int = -1) throws(ZMQError) -> Int {
        let count = items.count
        let ready = try items.withUnsafeMutableBufferPointer { buffer throws(ZMQError) in
            try zmqCall("zmq_poll") { zmq_poll(buffer.baseAddress, Int32(count), timeoutMilliseconds) }
        }
        return Int(ready)
    }

    /// What the item at `index` was found ready for by the last ``poll(timeoutMilliseconds:)``.
    public func events(at index: Int) -> PollEvents {
        PollEvents(rawValue: items[index].revents)
    }
}
