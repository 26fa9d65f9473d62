internal import CZeroMQ
@_exported public import Frames

/// A received frame's bytes, left in the libzmq message (`zmq_msg_t`) that holds them, which
/// never moves. Receiving copies nothing; sending hands libzmq a reference-counted copy of the
/// message (`zmq_msg_copy`), so a frame is sent any number of times, from any thread, without
/// copying its bytes.
final class ZMQFrameBuffer: FrameBuffer, @unchecked Sendable {
    // `@unchecked`: the message is written only in init (below); after that libzmq reads it
    // and counts its references atomically.
    /// The message, held in the object itself: one allocation per received frame, not two.
    @exclusivity(unchecked) private var message = zmq_msg_t()

    /// libzmq keeps up to this many bytes inside a `zmq_msg_t` itself; a larger message's
    /// bytes lie outside it and stay where they are when the message is moved.
    static let keptInsideMessage = 33

    /// Takes over a message libzmq filled in, of more than ``keptInsideMessage`` bytes (the
    /// caller's message becomes empty).
    init(moving received: UnsafeMutablePointer<zmq_msg_t>) {
        precondition(zmq_msg_size(received) > Self.keptInsideMessage)
        super.init(bytes: UnsafeRawBufferPointer(start: zmq_msg_data(received), count: zmq_msg_size(received)))
        zmq_msg_init(&message)
        zmq_msg_move(&message, received)
        // Made a shared message now, on the thread that read it: `zmq_msg_copy` writes the
        // source's share flag and count the first time it copies it, and only adds to the
        // count (atomically) after that, so copies for sending are then taken from any
        // thread without a lock (one lock and unlock per frame sent, before).
        var share = zmq_msg_t()
        zmq_msg_init(&share)
        _ = zmq_msg_copy(&share, &message)
        zmq_msg_close(&share)
    }

    /// libzmq may have read it with other messages into one buffer.
    override var mayShareReceiveBuffer: Bool { true }

    /// Initialises `target` as a shared copy of this frame, for sending.
    func copy(into target: UnsafeMutablePointer<zmq_msg_t>) {
        zmq_msg_init(target)
        _ = zmq_msg_copy(target, &message)
    }

    deinit {
        zmq_msg_close(&message)
    }
}

extension Frame {
    /// Takes over a message libzmq filled in, leaving it empty; a small one is copied out
    /// instead (held inline up to 32 bytes, a 33-byte one in a heap buffer of its own) and
    /// left as it was, for its owner to close or receive into again.
    init(moving received: UnsafeMutablePointer<zmq_msg_t>) {
        let size = zmq_msg_size(received)
        if size <= ZMQFrameBuffer.keptInsideMessage {
            self.init(copying: UnsafeRawBufferPointer(start: zmq_msg_data(received), count: size))
        } else {
            self.init(buffer: ZMQFrameBuffer(moving: received))
        }
    }

    /// For a frame received from libzmq (over 33 bytes), initialises `target` as a shared
    /// copy of the message it arrived in, for sending without copying its bytes, and returns
    /// true; for any other frame returns false and leaves `target` alone (its bytes are
    /// copied by `zmq_send`).
    @inline(__always)
    func shareReceived(into target: UnsafeMutablePointer<zmq_msg_t>) -> Bool {
        // Checked, then downcast unchecked: a checked cast's result is a reference of its own
        // (a retain and a release per frame sent).
        withBuffer { buffer in
            guard let buffer, buffer is ZMQFrameBuffer else { return false }
            unsafeDowncast(buffer, to: ZMQFrameBuffer.self).copy(into: target)
            return true
        }
    }
}
