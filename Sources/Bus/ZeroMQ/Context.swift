internal import CZeroMQ

/// A libzmq context: the thread-safe owner of libzmq's I/O threads.
///
/// A context is shared freely between threads and tasks. Every ``ZMQSocket`` keeps its
/// context alive, so the context is terminated only after its last socket is closed:
/// releasing a context while sockets are open never blocks. To make blocked calls on all
/// sockets return promptly (with ``ZMQError/isTerminated``), call ``shutdown()``.
public final class ZMQContext: @unchecked Sendable {
    // `@unchecked`: libzmq documents contexts as thread-safe; the handle never changes.
    let handle: UnsafeMutableRawPointer

    /// Creates a context.
    /// - Parameter ioThreads: libzmq I/O threads; one is plenty below a gigabyte a second.
    public init(ioThreads: Int = 1) throws(ZMQError) {
        handle = try zmqCall("zmq_ctx_new") { zmq_ctx_new() }
        if ioThreads != 1 {
            try zmqCall("zmq_ctx_set(ZMQ_IO_THREADS)") { zmq_ctx_set(handle, ZMQ_IO_THREADS, Int32(ioThreads)) }
        }
        // Sockets' own linger is what decides how long closing waits; see ZMQSocket.
        try zmqCall("zmq_ctx_set(ZMQ_BLOCKY)") { zmq_ctx_set(handle, ZMQ_BLOCKY, 0) }
    }

    /// Makes every blocking call on this context's sockets fail with `ETERM`, now and
    /// later. Sockets still have to be closed; the context is terminated when the last
    /// reference to it goes away.
    public func shutdown() {
        _ = zmq_ctx_shutdown(handle)
    }

    deinit {
        // Every socket holds a strong reference to its context, so by now all are closed
        // and zmq_ctx_term cannot wait on an open socket.
        // Retried on EINTR; any other failure has nobody left to report to.
        _ = try? zmqCall("zmq_ctx_term") { zmq_ctx_term(handle) }
    }
}

/// What the linked libzmq can do.
public enum ZMQLibrary {
    /// The linked libzmq's version, e.g. `(4, 3, 4)`.
    public static var version: (major: Int, minor: Int, patch: Int) {
        var major: Int32 = 0, minor: Int32 = 0, patch: Int32 = 0
        zmq_version(&major, &minor, &patch)
        return (Int(major), Int(minor), Int(patch))
    }

    /// The version as text, e.g. "4.3.4".
    public static var versionString: String {
        let v = version
        return "\(v.major).\(v.minor).\(v.patch)"
    }

    /// Whether libzmq was built with a capability such as "curve", "ipc" or "draft".
    public static func has(_ capability: String) -> Bool {
        zmq_has(capability) == 1
    }
}
