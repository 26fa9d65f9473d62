#if canImport(Glibc)
internal import Glibc
#endif

/// The bytes of a frame larger than 32 bytes, shared by every copy of the frame and never
/// changed or moved while it lives. A subclass decides where they are kept: in a heap
/// buffer of their own (``Frame/init(copying:)``), or in the libzmq message they arrived in
/// (the ZeroMQ module's, so a received frame is sent on without copying).
open class FrameBuffer: @unchecked Sendable {
    // `@unchecked`: the bytes never change after init.
    public let bytes: UnsafeRawBufferPointer
    /// Whether the bytes may lie in a buffer shared with other received messages, which this
    /// frame keeps alive whole (see ``Frame/keepable()``). Stored, not overridden: every value
    /// the state keeps is asked (a call through the class's table each time).
    public let mayShareReceiveBuffer: Bool

    public init(bytes: UnsafeRawBufferPointer, mayShareReceiveBuffer: Bool = false) {
        self.bytes = bytes
        self.mayShareReceiveBuffer = mayShareReceiveBuffer
    }
}

/// A copy of some bytes, on the heap.
@usableFromInline
final class HeapFrameBuffer: FrameBuffer, @unchecked Sendable {
    @usableFromInline
    init(copying source: UnsafeRawBufferPointer) {
        let memory = UnsafeMutableRawBufferPointer.allocate(byteCount: source.count, alignment: 16)
        if source.count > 0 { memory.copyMemory(from: source) }
        super.init(bytes: UnsafeRawBufferPointer(memory))
    }

    deinit {
        bytes.deallocate()
    }
}

/// Up to 32 bytes held inside a ``Frame`` itself: most frames on the bus (protocol
/// headers, routing ids, command bytes, sequence numbers, keys) are this small, and keeping
/// them inline saves two allocations per frame on every receive and send.
/// Inlinable with ``Frame``'s readers (below): they are generic over the caller's closure,
/// and a generic call across modules is not specialized, so every read of a frame's bytes in
/// the kernel's hot path went through the unspecialized version.
@usableFromInline
struct InlineBytes: Sendable {
    @usableFromInline static let capacity = 32
    @usableFromInline var count: UInt8
    @usableFromInline var bytes: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)

    @inlinable
    init(_ buffer: UnsafeRawBufferPointer) {
        count = UInt8(buffer.count)
        if let base = buffer.baseAddress, buffer.count > 0 {
            withUnsafeMutableBytes(of: &bytes) { $0.baseAddress!.copyMemory(from: base, byteCount: buffer.count) }
        }
    }

    @inlinable
    func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        var copy = bytes
        let count = Int(self.count)
        return try Swift.withUnsafeBytes(of: &copy) { raw throws(E) in
            try body(UnsafeRawBufferPointer(rebasing: raw.prefix(count)))
        }
    }
}

/// One frame of a multipart message: immutable bytes, cheap to copy and to send.
/// Frames of up to 32 bytes are held inline; larger ones in a shared ``FrameBuffer``.
public struct Frame: Sendable, Hashable, CustomStringConvertible {
    @usableFromInline
    enum Storage: Sendable {
        case inline(InlineBytes)
        case shared(FrameBuffer)
    }

    @usableFromInline let storage: Storage

    /// A frame of the bytes `buffer` holds (which should be more than 32; smaller frames
    /// are kept inline).
    package init(buffer: FrameBuffer) {
        assert(buffer.bytes.count > InlineBytes.capacity, "a frame of up to 32 bytes is held inline")
        storage = .shared(buffer)
    }

    /// The buffer the bytes are kept in; nil for a frame held inline.
    @inlinable
    package var buffer: FrameBuffer? { withBuffer { $0 } }

    /// Calls `body` with the buffer the bytes are kept in (nil for a frame held inline),
    /// borrowed: ``buffer`` returns a reference of its own, a retain and a release per call,
    /// which sending every frame paid.
    @inlinable
    package func withBuffer<R>(_ body: (FrameBuffer?) -> R) -> R {
        switch storage {
        case .inline: body(nil)
        case .shared(let buffer): body(buffer)
        }
    }

    /// An empty (0-byte) frame, such as the delimiter in front of a REQ/REP body.
    public init() { storage = .inline(InlineBytes(UnsafeRawBufferPointer(start: nil, count: 0))) }

    /// A frame holding these bytes.
    public init(_ bytes: some Sequence<UInt8>) {
        if let done = bytes.withContiguousStorageIfAvailable({ Frame(copying: UnsafeRawBufferPointer($0)) }) {
            self = done
        } else {
            self = Array(bytes).withUnsafeBytes { Frame(copying: $0) }
        }
    }

    /// A frame holding the UTF-8 bytes of `string`.
    public init(_ string: String) {
        var string = string
        self = string.withUTF8 { Frame(copying: UnsafeRawBufferPointer($0)) }
    }

    /// This frame with bytes of its own, for keeping: a received frame may point into a
    /// buffer libzmq shares among the messages it read at once (8 KiB and more), which one
    /// kept frame keeps alive whole. A frame of a message libzmq allocated alone (bigger than
    /// `keepLimit`) stays as it is.
    public func keepable() -> Frame {
        guard case .shared(let buffer) = storage, buffer.mayShareReceiveBuffer, count <= Self.keepLimit else { return self }
        return withUnsafeBytes { Frame(copying: $0) }
    }
    /// libzmq reads up to 8 KiB at a time (`ZMQ_IN_BATCH_SIZE`), and messages that fit share it.
    public static let keepLimit = 8_192

    /// A frame holding a copy of the bytes `buffer` points at (inlinable: every received
    /// frame of up to 33 bytes is made by it).
    @inlinable
    public init(copying buffer: UnsafeRawBufferPointer) {
        if buffer.count <= InlineBytes.capacity {
            storage = .inline(InlineBytes(buffer))
        } else {
            storage = .shared(HeapFrameBuffer(copying: buffer))
        }
    }

    /// The number of bytes.
    @inlinable
    public var count: Int {
        switch storage {
        case .inline(let inline): Int(inline.count)
        case .shared(let shared): shared.bytes.count
        }
    }

    @inlinable
    public var isEmpty: Bool { count == 0 }

    /// Memory the frame keeps alive outside its own storage, for bounds in bytes: none for a
    /// frame held inline; for a larger one its bytes and what keeping them costs (the buffer
    /// object and its allocation). A value holding frames counts its own size beside this.
    public var heldBytes: Int { buffer == nil ? 0 : count + Self.bufferOverhead }
    /// A buffer object's header and fields, and the allocator's rounding, near enough.
    static let bufferOverhead = 64

    /// Calls `body` with the frame's bytes, without copying them.
    @inlinable
    public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        switch storage {
        case .inline(let inline): try inline.withUnsafeBytes(body)
        case .shared(let shared): try body(shared.bytes)
        }
    }

    /// A copy of the bytes.
    public var bytes: [UInt8] { withUnsafeBytes { Array($0) } }

    /// Whether the bytes are valid UTF-8, checked without building a string when they are
    /// ASCII (as keys and names on the bus usually are).
    public var isUTF8: Bool { withUnsafeBytes(Self.isUTF8) }

    /// Whether `raw` holds valid UTF-8 (as ``isUTF8``).
    public static func isUTF8(_ raw: UnsafeRawBufferPointer) -> Bool {
        raw.allSatisfy { $0 < 0x80 } || String(validating: raw.bindMemory(to: UInt8.self), as: UTF8.self) != nil
    }

    /// Whether the bytes begin with `prefix`.
    public func hasPrefix(_ prefix: Frame) -> Bool {
        withUnsafeBytes { mine in
            prefix.withUnsafeBytes { other in
                mine.count >= other.count && (other.count == 0 || memcmp(mine.baseAddress!, other.baseAddress!, other.count) == 0)
            }
        }
    }

    /// The bytes as UTF-8 text, or `nil` when they are not valid UTF-8.
    public var string: String? {
        withUnsafeBytes { String(checkingUTF8: $0.bindMemory(to: UInt8.self)) }
    }

    /// Whether the frame holds exactly these bytes.
    public func equals(_ other: some Sequence<UInt8>) -> Bool {
        if let fast = other.withContiguousStorageIfAvailable({ equals(UnsafeRawBufferPointer($0)) }) { return fast }
        return withUnsafeBytes { $0.elementsEqual(other) }
    }

    /// Whether the frame holds exactly the bytes `raw` points at (not generic, so a caller in
    /// another module gets no unspecialized call).
    public func equals(_ raw: UnsafeRawBufferPointer) -> Bool {
        withUnsafeBytes { mine in
            mine.count == raw.count && (mine.count == 0 || memcmp(mine.baseAddress!, raw.baseAddress!, mine.count) == 0)
        }
    }

    /// Whether the frame holds exactly the UTF-8 bytes of `text`.
    public func equals(_ text: String) -> Bool {
        // Read in place: `withUTF8` needs a mutable copy of the string, a retain.
        text.utf8.withContiguousStorageIfAvailable { equals(UnsafeRawBufferPointer($0)) }
            ?? withUnsafeBytes { $0.elementsEqual(text.utf8) }
    }

    /// Whether this frame's bytes sort before `other`'s (lexicographic; for UTF-8 text the
    /// order of code points).
    public func precedes(_ other: Frame) -> Bool {
        withUnsafeBytes { lhs in other.withUnsafeBytes { rhs in lhs.lexicographicallyPrecedes(rhs) } }
    }

    /// Inlinable, and two small frames compare without a call: protocol headers and routing
    /// ids are compared on every message. A frame of up to 32 bytes is always held inline
    /// (zeros after its bytes) and a longer one never is, so frames held differently differ.
    @inlinable
    public static func == (lhs: Frame, rhs: Frame) -> Bool {
        switch (lhs.storage, rhs.storage) {
        case (.inline(let left), .inline(let right)):
            left.count == right.count && left.bytes == right.bytes
        case (.shared(let left), .shared(let right)):
            left === right || rhs.withUnsafeBytes { lhs.equals($0) }
        default:
            false
        }
    }

    @inlinable
    public func hash(into hasher: inout Hasher) {
        withUnsafeBytes { hasher.combine(bytes: $0) }
    }

    /// Printable text as is, anything else as hex (at most 64 bytes shown).
    public var description: String {
        withUnsafeBytes { raw in
            let shown = raw.prefix(64)
            if shown.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) {
                return String(decoding: shown, as: UTF8.self) + (raw.count > 64 ? "…" : "")
            }
            let hex = shown.map { byte in
                let digits = Array("0123456789abcdef")
                return String([digits[Int(byte >> 4)], digits[Int(byte & 0x0F)]])
            }.joined()
            return "0x" + hex + (raw.count > 64 ? "…(\(raw.count) bytes)" : "")
        }
    }
}

extension String {
    /// `bytes` as text, or nil when they are not valid UTF-8. ASCII (keys, names, most text on
    /// the bus) is taken as it is: `String(validating:as:)` is a generic call into the standard
    /// library that looks up type metadata under a lock every time.
    public init?(checkingUTF8 bytes: UnsafeBufferPointer<UInt8>) {
        if bytes.allSatisfy({ $0 < 0x80 }) {
            self = String(decoding: bytes, as: UTF8.self)
        } else {
            guard let text = String(validating: bytes, as: UTF8.self) else { return nil }
            self = text
        }
    }
}

extension Frame: ExpressibleByStringInterpolation {
    public init(stringLiteral value: String) { self.init(value) }
}

/// A message described by its parts, written as frames where it is sent: an ``Outbox``
/// appends a batch's messages one after another into one array, so a message written as
/// an encoding costs no array of its own. The encoding sees only the array it appends to.
public protocol MessageEncoding {
    /// Appends this message's frames, in order, to `frames`.
    func appendFrames(to frames: inout [Frame])
}

extension Array: MessageEncoding where Element == Frame {
    public func appendFrames(to frames: inout [Frame]) { frames.append(contentsOf: self) }
}

/// A multipart message: the frames that are delivered or sent as one unit.
public struct Message: MessageEncoding, Sendable, Hashable, RandomAccessCollection, MutableCollection,
    RangeReplaceableCollection, ExpressibleByArrayLiteral, CustomStringConvertible
{
    public var frames: [Frame]
    /// The peer's ZAP user id (`User-Id` metadata), on messages received by a socket whose
    /// ``ZMQSocket/readsPeerUserID`` is set and whose peer was authenticated.
    public var peerUserID: String?

    public init() { frames = [] }
    public init(_ frames: [Frame]) { self.frames = frames }
    public init(arrayLiteral elements: Frame...) { frames = elements }
    /// The frames `encoding` writes, in an array of their own.
    public init(_ encoding: some MessageEncoding) {
        frames = []
        encoding.appendFrames(to: &frames)
    }

    public var startIndex: Int { frames.startIndex }
    public var endIndex: Int { frames.endIndex }
    public subscript(position: Int) -> Frame {
        get { frames[position] }
        set { frames[position] = newValue }
    }
    public mutating func replaceSubrange<C: Collection<Frame>>(_ subrange: Range<Int>, with newElements: C) {
        frames.replaceSubrange(subrange, with: newElements)
    }
    public mutating func reserveCapacity(_ n: Int) { frames.reserveCapacity(n) }

    public func appendFrames(to frames: inout [Frame]) { frames.append(contentsOf: self.frames) }

    /// The total number of bytes over all frames.
    public var byteCount: Int { frames.reduce(0) { $0 + $1.count } }

    public var description: String { "[" + frames.map(\.description).joined(separator: " | ") + "]" }
}
