internal import CZeroMQ
import Synchronization
#if canImport(Glibc)
internal import Glibc
#endif

/// The bytes of one frame, held in a libzmq message (`zmq_msg_t`) that never moves.
///
/// A received frame keeps the buffer libzmq filled, so receiving copies nothing; sending
/// hands libzmq a reference-counted copy of the message (`zmq_msg_copy`), so a frame can
/// be sent any number of times, from any thread, without copying its bytes.
final class FrameStorage: @unchecked Sendable {
    // `@unchecked`: the bytes never change after init. `zmq_msg_copy` does write the
    // source's share flag and count the first time, so copies are taken under `copyLock`.
    let message: UnsafeMutablePointer<zmq_msg_t>
    private let copyLock = Mutex<Void>(())

    /// An empty frame.
    init() {
        message = .allocate(capacity: 1)
        zmq_msg_init(message)
    }

    /// A frame holding a copy of `bytes`.
    init(copying bytes: UnsafeRawBufferPointer) {
        message = .allocate(capacity: 1)
        // zmq_msg_init_size only fails when malloc does; treat that as libzmq does.
        precondition(zmq_msg_init_size(message, bytes.count) == 0, "zmq_msg_init_size: out of memory")
        if let base = bytes.baseAddress, bytes.count > 0 {
            zmq_msg_data(message).copyMemory(from: base, byteCount: bytes.count)
        }
    }

    /// Takes over a message libzmq filled in (the caller's message becomes empty).
    init(moving received: UnsafeMutablePointer<zmq_msg_t>) {
        message = .allocate(capacity: 1)
        zmq_msg_init(message)
        zmq_msg_move(message, received)
    }

    var count: Int { zmq_msg_size(message) }

    func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try body(UnsafeRawBufferPointer(start: zmq_msg_data(message), count: zmq_msg_size(message)))
    }

    /// Initialises `target` as a shared copy of this frame, for sending.
    func copy(into target: UnsafeMutablePointer<zmq_msg_t>) {
        zmq_msg_init(target)
        copyLock.withLock { _ in _ = zmq_msg_copy(target, message) }
    }

    deinit {
        zmq_msg_close(message)
        message.deallocate()
    }
}

/// One frame of a multipart ZeroMQ message: immutable bytes, cheap to copy and to send.
public struct Frame: Sendable, Hashable, CustomStringConvertible {
    let storage: FrameStorage

    init(storage: FrameStorage) { self.storage = storage }

    /// An empty (0-byte) frame, such as the delimiter in front of a REQ/REP body.
    public init() { storage = FrameStorage() }

    /// A frame holding these bytes.
    public init(_ bytes: some Sequence<UInt8>) {
        if let done = bytes.withContiguousStorageIfAvailable({ FrameStorage(copying: UnsafeRawBufferPointer($0)) }) {
            storage = done
        } else {
            let array = Array(bytes)
            storage = array.withUnsafeBytes { FrameStorage(copying: $0) }
        }
    }

    /// A frame holding the UTF-8 bytes of `string`.
    public init(_ string: String) {
        var string = string
        storage = string.withUTF8 { FrameStorage(copying: UnsafeRawBufferPointer($0)) }
    }

    /// A frame holding a copy of the bytes `buffer` points at.
    public init(copying buffer: UnsafeRawBufferPointer) {
        storage = FrameStorage(copying: buffer)
    }

    /// The number of bytes.
    public var count: Int { storage.count }
    public var isEmpty: Bool { storage.count == 0 }

    /// Calls `body` with the frame's bytes, without copying them.
    public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try storage.withUnsafeBytes(body)
    }

    /// A copy of the bytes.
    public var bytes: [UInt8] { withUnsafeBytes { Array($0) } }

    /// The bytes as UTF-8 text, or `nil` when they are not valid UTF-8.
    public var string: String? {
        withUnsafeBytes { String(validating: $0.bindMemory(to: UInt8.self), as: UTF8.self) }
    }

    /// Whether the frame holds exactly these bytes.
    public func equals(_ other: some Sequence<UInt8>) -> Bool {
        if let fast = other.withContiguousStorageIfAvailable({ contiguous in
            withUnsafeBytes { mine in
                mine.count == contiguous.count && (mine.count == 0 || memcmp(mine.baseAddress!, contiguous.baseAddress!, mine.count) == 0)
            }
        }) { return fast }
        return withUnsafeBytes { $0.elementsEqual(other) }
    }

    /// Whether the frame holds exactly the UTF-8 bytes of `text`.
    public func equals(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { equals($0) }
    }

    public static func == (lhs: Frame, rhs: Frame) -> Bool {
        lhs.storage === rhs.storage || lhs.withUnsafeBytes { a in rhs.withUnsafeBytes { b in a.elementsEqual(b) } }
    }

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

extension Frame: ExpressibleByStringInterpolation {
    public init(stringLiteral value: String) { self.init(value) }
}

/// A multipart ZeroMQ message: the frames that libzmq delivers or sends as one unit.
public struct Message: Sendable, Hashable, RandomAccessCollection, MutableCollection,
    RangeReplaceableCollection, ExpressibleByArrayLiteral, CustomStringConvertible
{
    public var frames: [Frame]

    public init() { frames = [] }
    public init(_ frames: [Frame]) { self.frames = frames }
    public init(arrayLiteral elements: Frame...) { frames = elements }

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

    /// The total number of bytes over all frames.
    public var byteCount: Int { frames.reduce(0) { $0 + $1.count } }

    public var description: String { "[" + frames.map(\.description).joined(separator: " | ") + "]" }
}
