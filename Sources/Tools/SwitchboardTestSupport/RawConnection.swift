#if canImport(Glibc)
import Glibc
#endif
import ZeroMQ

public struct ConnectFailed: Error { public let endpoint: String, errno: Int32 }

/// A plain TCP connection to a port on 127.0.0.1, for bytes (or silences) libzmq or an HTTP
/// client would never send.
public final class RawConnection {
    public let fd: Int32

    /// `endpoint`: "tcp://127.0.0.1:PORT".
    public convenience init(_ endpoint: String) throws {
        try self.init(port: Int(endpoint.split(separator: ":").last!)!, endpoint: endpoint)
    }

    public init(port: Int, endpoint: String? = nil) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { throw ConnectFailed(endpoint: endpoint ?? "127.0.0.1:\(port)", errno: errno) }
    }

    public func write(_ bytes: [UInt8]) { _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } }

    deinit { close(fd) }

    /// Whether the peer closes the connection within `seconds` (what it sends meanwhile is
    /// read and dropped).
    public func closedByPeer(within seconds: Double) -> Bool {
        let deadline = monotonicNanoseconds() + UInt64(seconds * 1e9)
        var buffer = [UInt8](repeating: 0, count: 4_096)
        while true {
            let now = monotonicNanoseconds()
            guard now < deadline else { return false }
            var item = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&item, 1, Int32((deadline - now) / 1_000_000) + 1) > 0 else { continue }
            let received = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if received <= 0 { return true }
        }
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
