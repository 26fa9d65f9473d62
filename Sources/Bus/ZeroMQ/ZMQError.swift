internal import CZeroMQ
#if canImport(Glibc)
internal import Glibc
#endif

/// An error from libzmq, naming the call that failed and libzmq's own text for the errno.
///
/// `EAGAIN` (nothing to receive, or a full pipe on a non-blocking send) and `ETERM` (the
/// context was shut down) are the two callers most often tell apart: see ``isAgain`` and
/// ``isTerminated``.
public struct ZMQError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The libzmq call that failed, with its most telling argument where it has one,
    /// such as `zmq_bind(tcp://127.0.0.1:5555)`.
    public let call: String
    /// The `errno` value libzmq reported.
    public let code: Int32

    public init(call: String, code: Int32) {
        self.call = call
        self.code = code
    }

    /// The operation would block (`EAGAIN`): nothing to receive, or no room to send.
    public var isAgain: Bool { code == EAGAIN }
    /// The context was shut down (`ETERM`); the socket should be closed.
    public var isTerminated: Bool { code == czmq_ETERM }
    /// A ROUTER with router-mandatory could not route to the addressed peer.
    public var isUnroutable: Bool { code == czmq_EHOSTUNREACH }
    /// libzmq could not take the message now (`EAGAIN`): a high-water mark was reached.
    public var isWouldBlock: Bool { code == EAGAIN }
    /// The call was interrupted by a signal (`EINTR`); ``retryingEINTR`` retries these.
    public var isInterrupted: Bool { code == EINTR }

    /// libzmq's text for the error, e.g. "Address already in use".
    public var reason: String { String(cString: zmq_strerror(code)) }

    public var description: String { "\(call): \(reason)" }
}

/// Runs one libzmq call that reports failure as `-1` plus `zmq_errno()`, turning that into
/// a thrown ``ZMQError`` naming the call, and retrying when a signal interrupted it.
///
/// It and its two kin below are the only places that read `zmq_errno()`; every wrapper goes
/// through one of them.
@inline(__always)
@discardableResult
func zmqCall(_ name: @autoclosure () -> String, _ body: () -> Int32) throws(ZMQError) -> Int32 {
    guard let rc = try zmqCallUnlessAgain(name(), body) else { throw ZMQError(call: name(), code: EAGAIN) }
    return rc
}

/// The same for a call where `EAGAIN` is an answer (nothing to receive now), returned as nil
/// with no error made: every drain of a socket ends in one, and an error would build its
/// text each time.
@inline(__always)
func zmqCallUnlessAgain(_ name: @autoclosure () -> String, _ body: () -> Int32) throws(ZMQError) -> Int32? {
    while true {
        let rc = body()
        if rc != -1 { return rc }
        let code = zmq_errno()
        if code == EINTR { continue }
        if code == EAGAIN { return nil }
        throw ZMQError(call: name(), code: code)
    }
}

/// The same for calls that return a pointer and report failure as `NULL`.
@inline(__always)
func zmqCall<T>(_ name: @autoclosure () -> String, _ body: () -> T?) throws(ZMQError) -> T {
    while true {
        if let value = body() { return value }
        let code = zmq_errno()
        if code == EINTR { continue }
        throw ZMQError(call: name(), code: code)
    }
}
