/// The parts of one received message, read where the socket received them: a handler on a
/// hot path (the broker) compares headers in place and makes a ``Frame`` only of a part it
/// keeps, instead of one of every part. The ZeroMQ module's subclass reads into it; a part's
/// bytes are valid until the next message is read into the same parts, so nothing read here
/// outlives the handler's call unless it was made a frame. Used on one thread at a time.
open class ReceivedParts {
    /// What was read.
    @usableFromInline struct State {
        /// Each part's bytes, the first `count` meaningful.
        @usableFromInline var spans: UnsafeMutableBufferPointer<UnsafeRawBufferPointer>
        @usableFromInline var count = 0
        @usableFromInline var peerUserID: String?

        /// Makes the first `count` parts those `bytes` gives, sent by `peerUserID`.
        @inlinable
        mutating func record(_ count: Int, peerUserID: String?, _ bytes: (Int) -> UnsafeRawBufferPointer) {
            precondition(count <= spans.count, "\(count) parts read with room for \(spans.count)")
            for index in 0..<count { spans[index] = bytes(index) }
            self.count = count
            self.peerUserID = peerUserID
        }
    }
    @usableFromInline final var state: State

    public init() {
        let spans = UnsafeMutableBufferPointer<UnsafeRawBufferPointer>.allocate(capacity: Self.initialRoom)
        spans.initialize(repeating: UnsafeRawBufferPointer(start: nil, count: 0))
        state = State(spans: spans)
    }

    /// Parts there is room for at first, and again after a message of more than
    /// ``keptRoom`` parts was let go.
    package static let initialRoom = 8
    /// Parts there is room for from one batch to the next: a message of more grows the room
    /// (the peer chooses how many parts it sends), which its reader gives back afterwards.
    package static let keptRoom = 64

    deinit {
        state.spans.deallocate()
    }

    /// How many parts the message has.
    @inlinable
    public final var count: Int { state.count }

    /// The peer's ZAP user id, when the socket reads it (``Message/peerUserID``).
    public final var peerUserID: String? { state.peerUserID }

    /// The descriptor of the connection the message came on, when the socket says
    /// (libzmq's `ZMQ_SRCFD`); read only when asked.
    open var sourceDescriptor: Int32? { nil }

    /// The bytes of part `index` (`0 ..< count`), valid until the next message is read.
    @inlinable
    public final subscript(index: Int) -> UnsafeRawBufferPointer {
        precondition(index >= 0 && index < state.count, "part \(index) of \(state.count)")
        return state.spans[index]
    }

    /// Whether part `index` holds exactly `frame`'s bytes (headers, command codes): their
    /// lengths first, then byte by byte, inlined (headers are a few bytes).
    @inlinable
    public final func part(_ index: Int, equals frame: Frame) -> Bool {
        let part = self[index]
        guard part.count == frame.count else { return false }
        // A plain loop: `elementsEqual` stayed a call (a generic one, specialized) per header.
        return frame.withUnsafeBytes { mine in
            for index in 0..<part.count where mine[index] != part[index] { return false }
            return true
        }
    }

    /// Part `index` as a frame of its own, to keep: a copy of a small part (held inline up to
    /// 32 bytes); a larger part's bytes shared where the socket received them, when the
    /// socket can share them (the ZeroMQ module's parts do), copied otherwise.
    open func frame(_ index: Int) -> Frame {
        Frame(copying: self[index])
    }

    /// Part `index` as a frame with bytes of its own, for keeping long: what
    /// `frame(index).keepable()` gives (a part of up to ``Frame/keepLimit`` bytes may lie in a
    /// buffer libzmq shares among messages), without sharing it first.
    public final func keepableFrame(_ index: Int) -> Frame {
        let bytes = self[index]
        return bytes.count <= Frame.keepLimit ? Frame(copying: bytes) : frame(index)
    }

    /// Every part as frames: the message as ``Message`` holds it.
    public final func message() -> Message {
        var message = Message()
        append(to: &message)
        return message
    }

    /// Appends every part, as frames, to `message`, and its user id.
    public final func append(to message: inout Message) {
        message.frames.reserveCapacity(message.frames.count + count)
        for index in 0..<count { message.frames.append(frame(index)) }
        message.peerUserID = peerUserID
    }

    /// The parts from `index` on as frames (a body, kept), in an array these parts reuse
    /// for the next message unless the slice is kept.
    public final func frames(from index: Int) -> ArraySlice<Frame> {
        kept.removeAll(keepingCapacity: true)
        for index in index..<count { kept.append(frame(index)) }
        return kept[...]
    }
    private final var kept: [Frame] = []

    // MARK: For the socket that reads into the parts

    /// Starts a message: no parts yet.
    @inlinable
    package final func clear() {
        state.count = 0
        state.peerUserID = nil
    }

    /// Records the message just read: its `count` parts, the bytes of each from `bytes`, and
    /// its sender's user id; there is room for them (``setRoom(_:)``). One write of the state
    /// a message, not one a part: each write of a class's stored property is a run-time
    /// exclusivity check, and one a part cost the kernel 13 of its 124 checks a request
    /// (`switchboard-costs`, release). The spans are views of libzmq's messages (a pointer
    /// and a length each), read in place, which is why they are raw buffers.
    @inlinable
    package final func received(_ count: Int, peerUserID: String?, _ bytes: (Int) -> UnsafeRawBufferPointer) {
        state.record(count, peerUserID: peerUserID, bytes)
    }

    /// Room for exactly `parts` parts (at least ``count``); what was read is kept.
    package final func setRoom(_ parts: Int) {
        precondition(parts >= count, "room for \(parts) of \(count) parts read")
        let spans = state.spans
        guard parts != spans.count else { return }
        let resized = UnsafeMutableBufferPointer<UnsafeRawBufferPointer>.allocate(capacity: parts)
        resized.initialize(repeating: UnsafeRawBufferPointer(start: nil, count: 0))
        for index in 0..<count { resized[index] = spans[index] }
        spans.deallocate()
        state.spans = resized
    }
}
