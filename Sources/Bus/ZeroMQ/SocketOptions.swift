internal import CZeroMQ

/// A socket option with the Swift type of its value, used as
/// `try socket.set(.routerMandatory, true)` or `try socket.get(.lastEndpoint)`.
public struct SocketOption<Value>: Sendable {
    public let code: Int32
    public let name: String
    init(_ code: Int32, _ name: String) {
        self.code = code
        self.name = name
    }
}

extension SocketOption where Value == Int32 {
    /// Milliseconds that closing waits for unsent messages (0: none, -1: forever).
    public static var linger: Self { .init(ZMQ_LINGER, "ZMQ_LINGER") }
    /// Messages queued for sending per peer before sends block or fail.
    public static var sendHighWaterMark: Self { .init(ZMQ_SNDHWM, "ZMQ_SNDHWM") }
    /// Messages queued on receipt per peer before libzmq stops reading.
    public static var receiveHighWaterMark: Self { .init(ZMQ_RCVHWM, "ZMQ_RCVHWM") }
    /// Milliseconds between ZMTP heartbeats (0: off).
    public static var heartbeatInterval: Self { .init(ZMQ_HEARTBEAT_IVL, "ZMQ_HEARTBEAT_IVL") }
    /// Milliseconds to wait for a heartbeat reply before the connection is closed.
    public static var heartbeatTimeout: Self { .init(ZMQ_HEARTBEAT_TIMEOUT, "ZMQ_HEARTBEAT_TIMEOUT") }
    /// Milliseconds the peer should keep the connection without heartbeats.
    public static var heartbeatTTL: Self { .init(ZMQ_HEARTBEAT_TTL, "ZMQ_HEARTBEAT_TTL") }
    /// Milliseconds before the first reconnection attempt.
    public static var reconnectInterval: Self { .init(ZMQ_RECONNECT_IVL, "ZMQ_RECONNECT_IVL") }
    /// Upper bound in milliseconds for the exponential reconnection back-off (0: none).
    public static var reconnectIntervalMax: Self { .init(ZMQ_RECONNECT_IVL_MAX, "ZMQ_RECONNECT_IVL_MAX") }
    /// TCP keepalive: -1 system default, 0 off, 1 on.
    public static var tcpKeepalive: Self { .init(ZMQ_TCP_KEEPALIVE, "ZMQ_TCP_KEEPALIVE") }
    /// Seconds a connection receives nothing before keepalive probes start (-1: system default).
    public static var tcpKeepaliveIdle: Self { .init(ZMQ_TCP_KEEPALIVE_IDLE, "ZMQ_TCP_KEEPALIVE_IDLE") }
    /// Seconds between keepalive probes (-1: system default).
    public static var tcpKeepaliveInterval: Self { .init(ZMQ_TCP_KEEPALIVE_INTVL, "ZMQ_TCP_KEEPALIVE_INTVL") }
    /// Milliseconds data sent may stay unacknowledged before the connection is dropped
    /// (Linux's TCP_USER_TIMEOUT; 0: the system's retransmissions, a quarter of an hour).
    public static var tcpMaxRetransmitTimeout: Self { .init(ZMQ_TCP_MAXRT, "ZMQ_TCP_MAXRT") }
    /// Milliseconds a blocking receive waits before `EAGAIN` (-1: forever).
    public static var receiveTimeout: Self { .init(ZMQ_RCVTIMEO, "ZMQ_RCVTIMEO") }
    /// Milliseconds a blocking send waits before `EAGAIN` (-1: forever).
    public static var sendTimeout: Self { .init(ZMQ_SNDTIMEO, "ZMQ_SNDTIMEO") }
    /// Readiness bits (`ZMQ_EVENTS`); read through ``ZMQSocket/events()``.
    static var events: Self { .init(ZMQ_EVENTS, "ZMQ_EVENTS") }
    /// A descriptor that becomes readable when libzmq has news for the socket, which its
    /// events then tell (`ZMQ_FD`; ``SocketLoop`` waits on it).
    static var fileDescriptor: Self { .init(ZMQ_FD, "ZMQ_FD") }
    /// The security mechanism in use: 0 null, 1 plain, 2 curve, 3 gssapi.
    public static var mechanism: Self { .init(ZMQ_MECHANISM, "ZMQ_MECHANISM") }
}

extension SocketOption where Value == Int64 {
    /// The largest inbound message in bytes; a peer sending more is disconnected (-1: no limit).
    public static var maxMessageSize: Self { .init(ZMQ_MAXMSGSIZE, "ZMQ_MAXMSGSIZE") }
}

extension SocketOption where Value == Bool {
    /// A ROUTER fails sends to unknown peers with `EHOSTUNREACH` instead of dropping them.
    public static var routerMandatory: Self { .init(ZMQ_ROUTER_MANDATORY, "ZMQ_ROUTER_MANDATORY") }
    /// A ROUTER lets a new connection take over a routing id already in use.
    public static var routerHandover: Self { .init(ZMQ_ROUTER_HANDOVER, "ZMQ_ROUTER_HANDOVER") }
    /// Queue messages only to completed connections.
    public static var immediate: Self { .init(ZMQ_IMMEDIATE, "ZMQ_IMMEDIATE") }
    /// This socket is the CURVE server side (it has the secret key clients know the public half of).
    public static var curveServer: Self { .init(ZMQ_CURVE_SERVER, "ZMQ_CURVE_SERVER") }
    /// An XPUB passes every subscription upstream, repeated ones included.
    public static var xpubVerbose: Self { .init(ZMQ_XPUB_VERBOSE, "ZMQ_XPUB_VERBOSE") }
    /// Whether more frames of the current message are waiting.
    public static var receiveMore: Self { .init(ZMQ_RCVMORE, "ZMQ_RCVMORE") }
}

extension SocketOption where Value == [UInt8] {
    /// The routing id a peer ROUTER sees for this socket (set before connecting).
    public static var routingID: Self { .init(ZMQ_ROUTING_ID, "ZMQ_ROUTING_ID") }
    /// A SUB's prefix filter to add (write only; an empty prefix receives everything).
    public static var subscribe: Self { .init(ZMQ_SUBSCRIBE, "ZMQ_SUBSCRIBE") }
    /// A SUB's prefix filter to remove (write only).
    public static var unsubscribe: Self { .init(ZMQ_UNSUBSCRIBE, "ZMQ_UNSUBSCRIBE") }
}

extension SocketOption where Value == String {
    /// The endpoint last bound, with the port chosen for `*` (read only).
    public static var lastEndpoint: Self { .init(ZMQ_LAST_ENDPOINT, "ZMQ_LAST_ENDPOINT") }
    /// The ZAP domain this socket authenticates in.
    public static var zapDomain: Self { .init(ZMQ_ZAP_DOMAIN, "ZMQ_ZAP_DOMAIN") }
    /// This socket's CURVE public key, Z85 text (40 characters).
    public static var curvePublicKey: Self { .init(ZMQ_CURVE_PUBLICKEY, "ZMQ_CURVE_PUBLICKEY") }
    /// This socket's CURVE secret key, Z85 text (40 characters).
    public static var curveSecretKey: Self { .init(ZMQ_CURVE_SECRETKEY, "ZMQ_CURVE_SECRETKEY") }
    /// The server's CURVE public key a client connects to, Z85 text (40 characters).
    public static var curveServerKey: Self { .init(ZMQ_CURVE_SERVERKEY, "ZMQ_CURVE_SERVERKEY") }
}

extension ZMQSocket {
    /// Has TCP drop a connection on which the peer acknowledges nothing for `timeout` (at
    /// least a second): its machine is gone, its link is cut, or it has read nothing that
    /// long. Data sent and unacknowledged that long ends it (TCP_USER_TIMEOUT), and so does
    /// a connection that receives nothing, whose keepalive probes go unanswered.
    ///
    /// TCP rather than ZMTP heartbeats: TCP hears every acknowledgement, so a peer that reads
    /// a large message over a slow link stays, where a PING, or its PONG, waits behind that
    /// message and its heartbeat times out. For connections made after the call.
    public func dropSilentPeers(after timeout: Duration) throws(ZMQError) {
        let milliseconds = max(1_000, Int32(clamping: timeout.nanoseconds / 1_000_000))
        try set(.tcpKeepalive, 1)
        try set(.tcpKeepaliveIdle, max(1, milliseconds / 2_000))
        try set(.tcpKeepaliveInterval, max(1, milliseconds / 10_000))
        try set(.tcpMaxRetransmitTimeout, milliseconds)
    }

    private func setRaw(_ code: Int32, _ name: String, _ value: UnsafeRawPointer?, _ size: Int) throws(ZMQError) {
        let handle = try raw("zmq_setsockopt(\(name))")
        try zmqCall("zmq_setsockopt(\(name))") { zmq_setsockopt(handle, code, value, size) }
    }

    private func getRaw(_ code: Int32, _ name: String, _ value: UnsafeMutableRawPointer, _ size: inout Int) throws(ZMQError) {
        let handle = try raw("zmq_getsockopt(\(name))")
        try zmqCall("zmq_getsockopt(\(name))") { zmq_getsockopt(handle, code, value, &size) }
    }

    public func set(_ option: SocketOption<Int32>, _ value: Int32) throws(ZMQError) {
        var value = value
        try setRaw(option.code, option.name, &value, MemoryLayout<Int32>.size)
    }

    public func get(_ option: SocketOption<Int32>) throws(ZMQError) -> Int32 {
        var value: Int32 = 0
        var size = MemoryLayout<Int32>.size
        try getRaw(option.code, option.name, &value, &size)
        return value
    }

    public func set(_ option: SocketOption<Int64>, _ value: Int64) throws(ZMQError) {
        var value = value
        try setRaw(option.code, option.name, &value, MemoryLayout<Int64>.size)
    }

    public func get(_ option: SocketOption<Int64>) throws(ZMQError) -> Int64 {
        var value: Int64 = 0
        var size = MemoryLayout<Int64>.size
        try getRaw(option.code, option.name, &value, &size)
        return value
    }

    public func set(_ option: SocketOption<Bool>, _ value: Bool) throws(ZMQError) {
        var flag: Int32 = value ? 1 : 0
        try setRaw(option.code, option.name, &flag, MemoryLayout<Int32>.size)
    }

    public func get(_ option: SocketOption<Bool>) throws(ZMQError) -> Bool {
        var flag: Int32 = 0
        var size = MemoryLayout<Int32>.size
        try getRaw(option.code, option.name, &flag, &size)
        return flag != 0
    }

    public func set(_ option: SocketOption<[UInt8]>, _ value: [UInt8]) throws(ZMQError) {
        let result: Result<Void, ZMQError> = value.withUnsafeBytes { buffer in
            do throws(ZMQError) {
                try setRaw(option.code, option.name, buffer.baseAddress, buffer.count)
                return .success(())
            } catch { return .failure(error) }
        }
        try result.get()
    }

    public func get(_ option: SocketOption<[UInt8]>) throws(ZMQError) -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: 256)
        var size = buffer.count
        let result: Result<Void, ZMQError> = buffer.withUnsafeMutableBytes { raw in
            do throws(ZMQError) {
                try getRaw(option.code, option.name, raw.baseAddress!, &size)
                return .success(())
            } catch { return .failure(error) }
        }
        try result.get()
        return Array(buffer.prefix(size))
    }

    public func set(_ option: SocketOption<String>, _ value: String) throws(ZMQError) {
        try set(SocketOption<[UInt8]>(option.code, option.name), Array(value.utf8))
    }

    public func get(_ option: SocketOption<String>) throws(ZMQError) -> String {
        let bytes = try get(SocketOption<[UInt8]>(option.code, option.name))
        // libzmq returns text options with their terminating NUL.
        return String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
    }

    /// Subscribes a SUB socket to messages whose first frame starts with `prefix`.
    public func subscribe(_ prefix: String = "") throws(ZMQError) {
        try set(.subscribe, Array(prefix.utf8))
    }

    public func unsubscribe(_ prefix: String) throws(ZMQError) {
        try set(.unsubscribe, Array(prefix.utf8))
    }
}
