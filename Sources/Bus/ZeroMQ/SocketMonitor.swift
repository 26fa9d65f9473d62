internal import CZeroMQ
import Foundation

/// Connection events libzmq reports for a monitored socket (`zmq_socket_monitor`).
public struct SocketEvents: OptionSet, Sendable, Hashable {
    public let rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }
    public static let connected = SocketEvents(rawValue: UInt16(ZMQ_EVENT_CONNECTED))
    public static let accepted = SocketEvents(rawValue: UInt16(ZMQ_EVENT_ACCEPTED))
    public static let disconnected = SocketEvents(rawValue: UInt16(ZMQ_EVENT_DISCONNECTED))
    public static let handshakeSucceeded = SocketEvents(rawValue: UInt16(ZMQ_EVENT_HANDSHAKE_SUCCEEDED))
    /// A connection attempt failed and will be made again: nothing listens there, or it
    /// cannot be reached.
    public static let connectRetried = SocketEvents(rawValue: UInt16(ZMQ_EVENT_CONNECT_RETRIED))
    /// The peer refused the handshake: with CURVE, the server does not accept this key (or
    /// the client has the wrong server key); otherwise a protocol mismatch (CURVE on one side
    /// only).
    public static let handshakeRefused = SocketEvents(rawValue: UInt16(ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL))
    /// The handshake did not complete: refused, or the connection failed during it (a peer
    /// that stopped, or ran out of open files).
    public static let handshakeFailed = SocketEvents(rawValue: handshakeRefused.rawValue | UInt16(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL))
    public static let all = SocketEvents(rawValue: UInt16(ZMQ_EVENT_ALL))
}

/// One event read from a monitor socket: which event, and the endpoint it concerns.
public struct SocketEvent: Sendable, Hashable {
    public let event: SocketEvents
    public let value: UInt32
    public let endpoint: String

    /// Decodes the two-frame monitor message: 2 bytes event, 4 bytes value, then the endpoint.
    public init?(_ message: Message) {
        guard message.count == 2, message[0].count == 6 else { return nil }
        let (event, value) = message[0].withUnsafeBytes { raw -> (UInt16, UInt32) in
            (UInt16(raw[0]) | UInt16(raw[1]) << 8,
             UInt32(raw[2]) | UInt32(raw[3]) << 8 | UInt32(raw[4]) << 16 | UInt32(raw[5]) << 24)
        }
        self.event = SocketEvents(rawValue: event)
        self.value = value
        self.endpoint = message[1].string ?? ""
    }

    /// Why a handshake failed, as far as the event tells (nil: it did not fail, or no detail).
    public var handshakeProblem: HandshakeProblem? {
        if event.contains(SocketEvents(rawValue: UInt16(ZMQ_EVENT_HANDSHAKE_FAILED_AUTH))) { return .keyRefused }
        guard event.contains(SocketEvents(rawValue: UInt16(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL))) else { return nil }
        switch Int(value) {
        case Int(ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH): return .mechanismMismatch
        default: return .otherBreach
        }
    }
}

/// Why a peer and this socket did not complete a ZMTP handshake.
public enum HandshakeProblem: Sendable, Hashable {
    /// The peer's authenticator (ZAP) refused this socket's key.
    case keyRefused
    /// One side speaks CURVE and the other does not.
    case mechanismMismatch
    /// Another breach of the protocol. A peer of a kind that does not go with this socket's
    /// (a DEALER that reached a PUB) is one: the side that reads the other's kind first ends
    /// the connection, so the other sees only a connection ended before its handshake.
    case otherBreach
}

extension ZMQSocket {
    /// Starts publishing `events` of this socket on a PAIR socket bound at `endpoint`
    /// (an `inproc://` name); connect a `.pair` socket there to read them as ``SocketEvent``.
    public func monitor(_ endpoint: String, events: SocketEvents) throws(ZMQError) {
        let handle = try raw("zmq_socket_monitor(\(endpoint))")
        try zmqCall("zmq_socket_monitor(\(endpoint))") { zmq_socket_monitor(handle, endpoint, Int32(events.rawValue)) }
        isMonitored = true
    }
}

/// A PAIR socket that receives `socket`'s connect and disconnect events (as
/// ``SocketEvent``): how the client, the workers, subscriptions and a kernel pair tell a
/// restarted or gone peer from a quiet one. Call before `socket` connects, so no event is
/// missed.
public func connectionEvents(of socket: ZMQSocket, in context: ZMQContext, also: SocketEvents = []) throws -> ZMQSocket {
    try socketEvents(of: socket, in: context, [.connected, .disconnected, also])
}

/// A PAIR socket that receives `socket`'s `events` (as ``SocketEvent``).
public func socketEvents(of socket: ZMQSocket, in context: ZMQContext, _ events: SocketEvents) throws -> ZMQSocket {
    let endpoint = "inproc://connection-monitor-\(UUID().uuidString)"
    try socket.monitor(endpoint, events: events)
    let pair = try ZMQSocket(context, .pair)
    pair.monitoredSocket = socket
    // No bound on the events waiting to be read: libzmq's I/O thread, which sends them, would
    // wait at a bound for as long as the reader is behind, and every connection of the
    // process with it. The events are few and small (a connection made or lost).
    try pair.set(.receiveHighWaterMark, 0)
    try pair.connect(endpoint)
    return pair
}

/// The TCP connection a `connected` or `accepted` event names (libzmq gives its descriptor as
/// the event's value), or a received message came on, as the machine's TCP sees it: what
/// libzmq does not say, such as whether bytes arrive while a large message is still on its
/// way, behind which the peer's heartbeats wait.
///
/// Only read, never changed: libzmq owns the descriptor. Its socket's inode is noted when
/// the connection is named, so a descriptor closed and reused since for another socket (with
/// another inode) is not read.
public struct TCPConnection: Sendable, Equatable {
    let descriptor: Int32
    let inode: UInt64

    /// nil for an event that names no connection, or one that is not TCP (ipc, inproc) or
    /// already closed.
    public init?(_ event: SocketEvent) {
        guard !event.event.intersection([.connected, .accepted]).isEmpty else { return nil }
        self.init(descriptor: Int32(bitPattern: event.value))
    }

    /// The connection a message just received came on (``ReceivedParts/sourceDescriptor``).
    public init?(descriptor: Int32) {
        guard let inode = Self.inode(of: descriptor), Self.info(descriptor) != nil else { return nil }
        self.descriptor = descriptor
        self.inode = inode
    }

    /// How long ago data last arrived on the connection (TCP_INFO); nil once it is closed.
    public var sinceDataReceived: Duration? {
        guard Self.inode(of: descriptor) == inode, let info = Self.info(descriptor) else { return nil }
        return .milliseconds(Int(info.tcpi_last_data_recv))
    }

    /// The inode of the socket `descriptor` names; nil for anything but a socket.
    private static func inode(of descriptor: Int32) -> UInt64? {
        var status = stat()
        guard fstat(descriptor, &status) == 0, status.st_mode & S_IFMT == S_IFSOCK else { return nil }
        return UInt64(status.st_ino)
    }

    /// What TCP says of the socket; nil for one that is not TCP.
    private static func info(_ descriptor: Int32) -> tcp_info? {
        var info = tcp_info()
        var size = socklen_t(MemoryLayout<tcp_info>.size)
        return getsockopt(descriptor, Int32(IPPROTO_TCP), Int32(TCP_INFO), &info, &size) == 0 ? info : nil
    }
}

/// A connection a listening socket has just accepted (an `accepted` event), which the
/// process may end at once (``end()``) when it cannot afford it (``OpenFiles/isInReserve``).
public struct AcceptedConnection: Sendable, Equatable {
    let descriptor: Int32

    /// nil for another event, or when the descriptor is no longer a connection accepted on
    /// the event's endpoint (closed since, and perhaps reused for something else).
    public init?(_ event: SocketEvent) {
        guard event.event.contains(.accepted) else { return nil }
        let descriptor = Int32(bitPattern: event.value)
        guard Self.isAccepted(descriptor, on: event.endpoint) else { return nil }
        self.descriptor = descriptor
    }

    /// Ends the connection: shut down, never closed, since libzmq owns the descriptor; it sees
    /// the connection end as it would any other, and closes it.
    public func end() {
        shutdown(descriptor, Int32(SHUT_RDWR))
    }

    /// Whether `descriptor` is a socket whose own address is `endpoint`'s (its TCP port, or
    /// its IPC path or abstract name), as each connection a listener accepts is.
    private static func isAccepted(_ descriptor: Int32, on endpoint: String) -> Bool {
        var address = sockaddr_storage()
        var size = socklen_t(MemoryLayout<sockaddr_storage>.size)
        // getsockname writes through a `sockaddr` pointer: `sockaddr_storage` is C's room for
        // any address, made to be passed so, and rebound only for the call. Not for speed: the
        // C interface allows no other way, and the size it answers bounds what is read below.
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &size) }
        }
        guard named == 0 else { return false }
        let family = Int32(address.ss_family)
        switch family {
        case AF_INET, AF_INET6:
            guard endpoint.hasPrefix("tcp://"), let colon = endpoint.lastIndex(of: ":"), let port = UInt16(endpoint[endpoint.index(after: colon)...]) else { return false }
            let own = withUnsafeBytes(of: address) { raw in
                family == AF_INET ? raw.load(as: sockaddr_in.self).sin_port : raw.load(as: sockaddr_in6.self).sin6_port
            }
            return UInt16(bigEndian: own) == port
        case AF_UNIX:
            guard endpoint.hasPrefix("ipc://"), let pathOffset = MemoryLayout<sockaddr_un>.offset(of: \.sun_path) else { return false }
            // The path is as long as the address says. An abstract address (Linux) begins
            // with a NUL and is not NUL-terminated; libzmq names it with '@' in its place.
            let path = withUnsafeBytes(of: address) { raw -> String in
                let bytes = raw[pathOffset..<min(raw.count, max(pathOffset, Int(size)))]
                guard bytes.first == 0 else { return String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self) }
                return "@" + String(decoding: bytes.dropFirst(), as: UTF8.self)
            }
            return path == String(endpoint.dropFirst("ipc://".count))
        default:
            return false
        }
    }
}
