/// Messages to send on one socket, written by code that does no I/O of its own and sent
/// after each batch it handled (``SocketRegistration/afterReading``): the kernel's parts
/// (broker, state server, pair link, ZAP handler) write here, so a test drives a part with
/// a clock of its own and reads what it sent, with no sockets at all; and a batch's messages
/// go to libzmq one after another, one wake-up of its I/O thread per batch rather than per
/// message. Loop-confined.
public final class Outbox {
    /// Every message's frames, one message after another, in one array kept from flush to
    /// flush: a message written here costs no array of its own.
    private var frames: [Frame] = []
    /// Where each message ends in `frames`.
    private var ends: [Int] = []
    /// The arrays of the last flush, written into while a flush delivers the others.
    private var spareFrames: [Frame] = []
    private var spareEnds: [Int] = []
    private var draining = false

    public init() {}

    public func send(_ message: Message) {
        frames.append(contentsOf: message.frames)
        ends.append(frames.count)
    }

    /// Writes one message: `encode` appends its frames.
    public func write(_ encode: (inout [Frame]) -> Void) {
        encode(&frames)
        ends.append(frames.count)
    }

    public var isEmpty: Bool { ends.isEmpty }

    /// Hands every message's frames to `deliver` in order, including those written while
    /// delivering (a failed send can make the broker re-dispatch), and empties the box.
    /// The frames are lent in place, not as slices of the array (each slice retained it):
    /// what is written meanwhile goes to the spare arrays, delivered next.
    public func drain(_ deliver: (UnsafeBufferPointer<Frame>) -> Void) {
        // Drained from within a delivery, the spare arrays would change under it: what is
        // written then is delivered by the drain under way.
        guard !draining else { return }
        draining = true
        defer { draining = false }
        while !ends.isEmpty {
            swap(&frames, &spareFrames)
            swap(&ends, &spareEnds)
            spareFrames.withUnsafeBufferPointer { all in
                var start = 0
                for end in spareEnds {
                    deliver(UnsafeBufferPointer(rebasing: all[start..<end]))
                    start = end
                }
            }
            // The room a burst grew it to (a large snapshot) is let go; a usual flush's is kept.
            let keeps = spareFrames.capacity <= Self.keptCapacity
            spareFrames.removeAll(keepingCapacity: keeps)
            spareEnds.removeAll(keepingCapacity: keeps)
        }
    }

    /// Frames of room kept from one flush to the next (40 bytes each).
    static let keptCapacity = 16_384

    /// Sends every message on `registration`'s socket (drops them when there is none).
    public func drain(to registration: SocketRegistration?) {
        guard let registration else { return drain { _ in } }
        drain { registration.send(frames: $0) }
    }

    /// Takes the messages (tests).
    public func take() -> [Message] {
        var messages: [Message] = []
        drain { messages.append(Message(Array($0))) }
        return messages
    }
}
