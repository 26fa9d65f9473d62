import CZeroMQ
@_exported public import Frames

/// A received frame's bytes, left in the libzmq message (`zmq_msg_t`) that holds them, which
/// never moves. Receiving copies nothing; sending hands libzmq a reference-counted copy of the
/// message (`zmq_msg_copy`), so a frame is sent any number of times, from any thread, without
/// copying its bytes.
final class ZMQFrameBuffer: FrameBuffer, @unchecked Sendable {
    // `@unchecked`: the message is written only in init (below); after that libzmq reads it
    // and counts its references atomically.
    /// The message, held in the object itself: one allocation per received frame, not two.
    private var message = zmq_msg_t()

    /// libzmq keeps up to this many bytes inside a `zmq_msg_t` itself; a larger message's
    /// bytes lie outside it, in a block it counts references to, and stay where they are.
    static let keptInsideMessage = 33

    /// Shares the bytes of a message libzmq filled in, of more than ``keptInsideMessage``
    /// bytes (the received message is left as it is, for its owner to close or read into).
    init(sharing received: UnsafeMutablePointer<zmq_msg_t>) {
        precondition(zmq_msg_size(received) > Self.keptInsideMessage)
        zmq_msg_init(&message)
        // The first copy of a received message marks its block shared, on the thread that read
        // it: later copies for sending, from any thread, only add to its count atomically
        // (`zmq_msg_copy` takes a lock the first time it shares a message, once per frame sent
        // before this).
        _ = zmq_msg_copy(&message, received)
        // libzmq may have read it with other messages into one buffer.
        super.init(bytes: UnsafeRawBufferPointer(start: zmq_msg_data(&message), count: zmq_msg_size(&message)), mayShareReceiveBuffer: true)
    }

    /// Initialises `target` as a shared copy of this frame, for sending.
    func copy(into target: UnsafeMutablePointer<zmq_msg_t>) {
        zmq_msg_init(target)
        _ = zmq_msg_copy(target, &message)
    }

    deinit {
        zmq_msg_close(&message)
    }
}

/// A socket's received parts, each in a libzmq message of its own kept from one message to
/// the next (`zmq_msg_recv` lets go of what a message held before it fills it again), so
/// reading a part initialises and closes nothing. Used on the socket's thread only.
public final class ZMQReceivedParts: ReceivedParts {
    /// One initialised message per part slot; they never move while a part is read from them
    /// (a part of up to 33 bytes lies inside its message), only while a message is read in.
    private var messages: UnsafeMutablePointer<zmq_msg_t>
    private(set) var slots = ReceivedParts.initialRoom
    /// Slots read into since the parts were last released (an earlier message may have had
    /// more parts than the last).
    private var used = 0

    public override init() {
        messages = Self.initialisedMessages(slots)
        super.init()
    }

    deinit {
        Self.close(messages, slots)
    }

    private static func initialisedMessages(_ count: Int) -> UnsafeMutablePointer<zmq_msg_t> {
        let messages = UnsafeMutablePointer<zmq_msg_t>.allocate(capacity: count)
        for slot in 0..<count { zmq_msg_init(messages + slot) }
        return messages
    }

    private static func close(_ messages: UnsafeMutablePointer<zmq_msg_t>, _ count: Int) {
        for slot in 0..<count { zmq_msg_close(messages + slot) }
        messages.deallocate()
    }

    /// Where the parts of a message are read into (by `zmq_msg_recv`, which takes a pointer
    /// to a message), one slot after another, with room for `parts` of them at least. Making
    /// room moves the slots (as libzmq moves messages, never byte for byte): ask again before
    /// reading past the room there was, and record the parts once the whole message is in
    /// (``received(count:peerUserID:)``), when none moves any more.
    func slots(forAtLeast parts: Int) -> UnsafeMutablePointer<zmq_msg_t> {
        if parts > slots { grow(to: parts) }
        return messages
    }

    /// Read from the last part: a part made a frame may have left its slot empty, and the
    /// last (a command's name or field) seldom is. libzmq calls `ZMQ_SRCFD` deprecated but
    /// still answers it; should it stop, this is nil and a peer is judged by its heartbeats
    /// alone.
    public override var sourceDescriptor: Int32? {
        guard count > 0 else { return nil }
        let descriptor = zmq_msg_get(messages + (count - 1), ZMQ_SRCFD)
        return descriptor >= 0 ? descriptor : nil
    }

    /// Records the first `count` slots, just read into, as the message's parts.
    func received(count: Int, peerUserID: String?) {
        let messages = self.messages
        received(count, peerUserID: peerUserID) { UnsafeRawBufferPointer(start: zmq_msg_data(messages + $0), count: zmq_msg_size(messages + $0)) }
        if count > used { used = count }
    }

    /// Empties the parts after a message was cut short by an error, its first `count` slots
    /// read into: they are let go with the others at ``release()``.
    func cutShort(after count: Int) {
        clear()
        // Most often nothing was read (no message waited): `used` stays as it is.
        if count > 0, count > used { used = count }
    }

    private func grow(to needed: Int) {
        let larger = max(needed, slots * 2)
        let moved = Self.initialisedMessages(larger)
        for slot in 0..<slots { zmq_msg_move(moved + slot, messages + slot) }
        Self.close(messages, slots)
        messages = moved
        slots = larger
        setRoom(larger)
    }

    public override func frame(_ index: Int) -> Frame {
        let bytes = self[index]
        guard bytes.count > ZMQFrameBuffer.keptInsideMessage else { return Frame(copying: bytes) }
        return Frame(buffer: ZMQFrameBuffer(sharing: messages + index))
    }

    /// Lets go of the parts read (a large one holds libzmq's receive buffer), after a batch.
    public func release() {
        for slot in 0..<used where zmq_msg_size(messages + slot) > ZMQFrameBuffer.keptInsideMessage {
            zmq_msg_close(messages + slot)
            zmq_msg_init(messages + slot)
        }
        clear()
        used = 0
        // A message of many parts (the peer's choice) grew the slots: their room goes back.
        if slots > ReceivedParts.keptRoom {
            Self.close(messages, slots)
            slots = ReceivedParts.initialRoom
            messages = Self.initialisedMessages(slots)
            setRoom(slots)
        }
    }
}

extension Frame {
    /// Frames from this many bytes that were not received are lent to libzmq too (a
    /// reference to their buffer, let go once libzmq has sent them): copying a large reply
    /// costs the sending loop more than the message's bookkeeping does. Why the unmanaged
    /// reference and the pointer below are worth it, measured: a client asking 40 MB batches
    /// again and again held a bystander's ping at p99 118-125 ms with the reply copied here,
    /// 63-70 ms with it lent (two alternated runs each, a debug kernel).
    static let lentFromBytes = 65_536

    /// For a frame received from libzmq (over 33 bytes), initialises `target` as a shared
    /// copy of the message it arrived in; for another frame of at least ``lentFromBytes``,
    /// as a message over the frame's own bytes, which holds the frame's buffer until libzmq
    /// lets go of it. Either way it returns true, and the bytes are sent without being
    /// copied. For any other frame it returns false and leaves `target` alone (its bytes are
    /// copied by `zmq_send`).
    @inline(__always)
    func share(into target: UnsafeMutablePointer<zmq_msg_t>) -> Bool {
        // Checked, then downcast unchecked: a checked cast's result is a reference of its own
        // (a retain and a release per frame sent).
        withBuffer { buffer in
            guard let buffer else { return false }
            if buffer is ZMQFrameBuffer {
                unsafeDowncast(buffer, to: ZMQFrameBuffer.self).copy(into: target)
                return true
            }
            guard buffer.bytes.count >= Self.lentFromBytes, let base = buffer.bytes.baseAddress else { return false }
            let held = Unmanaged.passRetained(buffer)
            // A frame's bytes never change while it lives: libzmq only reads them.
            guard zmq_msg_init_data(target, UnsafeMutableRawPointer(mutating: base), buffer.bytes.count, releaseLentBuffer, held.toOpaque()) == 0 else {
                held.release()
                return false
            }
            return true
        }
    }
}

/// What libzmq calls, on whichever thread lets go of the message last, when it is done
/// with a frame's bytes it was lent (``Frame/share(into:)``): the frame's buffer goes.
private func releaseLentBuffer(_ data: UnsafeMutableRawPointer?, _ buffer: UnsafeMutableRawPointer?) {
    guard let buffer else { return }
    Unmanaged<FrameBuffer>.fromOpaque(buffer).release()
}
