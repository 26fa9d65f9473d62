#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Synchronization
import ZeroMQ

/// A socket call that failed: what it was for, and errno.
public struct SocketFailed: Error { public let what: String, errno: Int32 }

/// A plain TCP connection to a port on 127.0.0.1, for bytes (or silences) libzmq or an HTTP
/// client would never send.
public final class RawConnection {
    public let fd: Int32

    /// `endpoint`: "tcp://127.0.0.1:PORT".
    public convenience init(_ endpoint: String) throws {
        try self.init(port: Int(endpoint.split(separator: ":").last!)!, endpoint: endpoint)
    }

    /// `receiveBuffer`: bytes this side buffers (SO_RCVBUF), small for a reader whose peer
    /// should find it full soon.
    public init(port: Int, endpoint: String? = nil, receiveBuffer: Int32? = nil) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        if var receiveBuffer { setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receiveBuffer, socklen_t(MemoryLayout<Int32>.size)) }
        let connected = withLoopbackAddress(port: port) { connect(fd, $0, $1) }
        guard connected == 0 else { throw SocketFailed(what: "connect to \(endpoint ?? "127.0.0.1:\(port)")", errno: errno) }
    }

    public func write(_ bytes: [UInt8]) { _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } }

    deinit { close(fd) }

    /// Whether the peer has ended the connection (what it sent is read and dropped), now:
    /// never waits.
    public var isEnded: Bool {
        var buffer = [UInt8](repeating: 0, count: 4_096)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if count > 0 { continue }
            return count == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)
        }
    }

    /// Waits up to `milliseconds` for any of `connections` to have something to read (or an end).
    public static func waitForAny(_ connections: [RawConnection], milliseconds: Int32) {
        var items = connections.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
        _ = poll(&items, nfds_t(items.count), milliseconds)
    }

    /// Whether the peer closes the connection within `seconds` (what it sends meanwhile is
    /// read and dropped).
    public func closedByPeer(within seconds: Double) -> Bool {
        receive(within: seconds, keeping: false) { _ in false }.closed
    }

    /// What the peer sends, read until it holds `marker`; nil if it does not within
    /// `seconds`, or the peer closes first.
    public func read(until marker: String, within seconds: Double) -> String? {
        let received = receive(within: seconds, keeping: true) { String(decoding: $0, as: UTF8.self).contains(marker) }
        let text = String(decoding: received.bytes, as: UTF8.self)
        return text.contains(marker) ? text : nil
    }

    /// Reads what the peer sends (kept, or dropped as it comes) until `enough` holds of what
    /// was kept, the peer closes, or `seconds` pass; whether the peer closed.
    private func receive(within seconds: Double, keeping: Bool, until enough: ([UInt8]) -> Bool) -> (bytes: [UInt8], closed: Bool) {
        let deadline = monotonicNanoseconds() + UInt64(seconds * 1e9)
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4_096)
        while !enough(received) {
            let now = monotonicNanoseconds()
            guard now < deadline else { return (received, false) }
            var item = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&item, 1, Int32((deadline - now) / 1_000_000) + 1) > 0 else { continue }
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { return (received, true) }
            if keeping { received += buffer[..<count] }
        }
        return (received, false)
    }

    /// A ZMTP 3.0 greeting (NULL mechanism) and READY for a DEALER: after this the kernel
    /// takes the connection for a peer and reads frames from it.
    public func handshakeAsDealer() {
        var greeting: [UInt8] = [0xFF] + Array(repeating: 0, count: 8) + [0x7F, 3, 0]
        greeting += Array("NULL".utf8) + Array(repeating: 0, count: 16) + [0] + Array(repeating: 0, count: 31)
        let body: [UInt8] = [5] + Array("READY".utf8) + [11] + Array("Socket-Type".utf8) + [0, 0, 0, 6] + Array("DEALER".utf8)
        write(greeting + [0x04, UInt8(body.count)] + body)
    }
}

/// A socket listening on 127.0.0.1 that nobody accepts on: a connection to it completes in
/// the system's backlog, as to a kernel stopped with SIGSTOP or out of open files, and no
/// greeting ever comes. Closed when released.
public final class SilentListener {
    public let port: Int
    private let fd: Int32

    public init() throws {
        port = freePort()
        fd = try listeningOnLoopback(port: port)
    }

    public var endpoint: String { "tcp://127.0.0.1:\(port)" }

    deinit { close(fd) }
}

/// A socket listening on 127.0.0.1 that takes every connection and answers it as an HTTP
/// server answers bytes it cannot read (a 400, then closed): another program on the port a
/// ZeroMQ client was given. Stops listening when released.
public final class ClosingListener: Sendable {
    public let port: Int
    private let fd: Int32
    private let taken = Taken()

    /// The connections taken (and ended) so far.
    public var connections: Int { taken.count.load(ordering: .relaxed) }

    /// The count, shared with the accepting thread (which must not hold the listener).
    private final class Taken: Sendable { let count = Atomic<Int>(0) }

    public init() throws {
        port = freePort()
        let fd = try listeningOnLoopback(port: port)
        self.fd = fd
        // Ends when the listening socket is shut down (accept fails).
        Thread.detachNewThread { [taken] in
            let answer = Array("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".utf8)
            while true {
                let connection = accept(fd, nil, nil)
                guard connection >= 0 else {
                    if errno == EINTR || errno == ECONNABORTED { continue }
                    return
                }
                _ = write(connection, answer, answer.count)
                close(connection)
                taken.count.add(1, ordering: .relaxed)
            }
        }
    }

    public var endpoint: String { "tcp://127.0.0.1:\(port)" }

    deinit {
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
    }
}

/// A TCP socket listening on 127.0.0.1:`port`; closed again when it cannot listen there.
private func listeningOnLoopback(port: Int) throws -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw SocketFailed(what: "make a socket to listen on 127.0.0.1:\(port)", errno: errno) }
    guard bindLoopback(fd, port: port), listen(fd, 16) == 0 else {
        let code = errno
        close(fd)
        throw SocketFailed(what: "listen on 127.0.0.1:\(port)", errno: code)
    }
    return fd
}
