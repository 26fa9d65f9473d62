/// Messages to send on one socket, written by code that does no I/O of its own and sent
/// after each batch it handled (``SocketRegistration/afterReading``): the kernel's parts
/// (broker, state server, pair link, ZAP handler) write here, so a test drives a part with
/// a clock of its own and reads what it sent, with no sockets at all; and a batch's messages
/// go to libzmq one after another, one wake-up of its I/O thread per batch rather than per
/// message.
///
/// A value, owned by the part that writes it. Sending takes what it holds as a ``Batch``
/// (``takeBatch()``) and sends that: the outbox is not held while its messages go out, so a
/// part that writes to it meanwhile (a failed send makes the broker re-dispatch) writes the
/// next batch, which its owner takes and sends in turn:
///
/// ```swift
/// while let batch = broker.outbox.takeBatch() {
///     batch.forEach { router.send(frames: $0) }
///     broker.outbox.reuse(batch)
/// }
/// ```
public struct Outbox {
    /// Every message's frames, one message after another, in one array kept from batch to
    /// batch: a message written here costs no array of its own.
    @usableFromInline var frames: [Frame] = []
    /// Where each message ends in `frames`.
    @usableFromInline var ends: [Int] = []

    public init() {}

    /// Writes one message. The encoding is a value that appends its frames and cannot reach
    /// the outbox, so nothing else touches the outbox while the frames are written.
    @inlinable
    public mutating func send(_ message: some MessageEncoding) {
        message.appendFrames(to: &frames)
        ends.append(frames.count)
    }

    public var isEmpty: Bool { ends.isEmpty }

    /// Messages taken out of an outbox to be sent.
    public struct Batch {
        fileprivate var frames: [Frame] = []
        fileprivate var ends: [Int] = []

        /// Lends each message's frames to `deliver`, in order, in place (a slice of the
        /// array would retain it once a message).
        public func forEach(_ deliver: (UnsafeBufferPointer<Frame>) -> Void) {
            frames.withUnsafeBufferPointer { all in
                var start = 0
                for end in ends {
                    deliver(UnsafeBufferPointer(rebasing: all[start..<end]))
                    start = end
                }
            }
        }
    }

    /// Every message written so far, leaving the outbox empty; nil when there is none.
    public mutating func takeBatch() -> Batch? {
        guard !ends.isEmpty else { return nil }
        var batch = Batch()
        swap(&batch.frames, &frames)
        swap(&batch.ends, &ends)
        return batch
    }

    /// Takes back a batch that was sent, for its room: the next batch is written into its
    /// arrays, unless something was written meanwhile or a burst grew them past what is kept.
    public mutating func reuse(_ batch: consuming Batch) {
        guard ends.isEmpty, batch.frames.capacity <= Self.keptCapacity else { return }
        var batch = batch
        batch.frames.removeAll(keepingCapacity: true)
        batch.ends.removeAll(keepingCapacity: true)
        swap(&frames, &batch.frames)
        swap(&ends, &batch.ends)
    }

    /// Frames of room kept from one batch to the next (40 bytes each).
    static let keptCapacity = 16_384

    /// Takes the messages (tests).
    public mutating func take() -> [Message] {
        var messages: [Message] = []
        takeBatch()?.forEach { messages.append(Message(Array($0))) }
        return messages
    }
}
