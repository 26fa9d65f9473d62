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

/// Up to 32 bytes held inside a ``Frame`` itself: most frames on the bus (protocol
/// headers, routing ids, command bytes, sequence numbers, keys) are this small, and keeping
/// them inline saves two allocations per frame on every receive and send.
struct InlineBytes: Sendable {
    static let capacity = 32
    var count: UInt8
    var bytes: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)

    init(_ buffer: UnsafeRawBufferPointer) {
        count = UInt8(buffer.count)
        if let base = buffer.baseAddress, buffer.count > 0 {
            withUnsafeMutableBytes(of: &bytes) { $0.baseAddress!.copyMemory(from: base, byteCount: buffer.count) }
        }
    }

    func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        var copy = bytes
        let count = Int(self.count)
        return try Swift.withUnsafeBytes(of: &copy) { raw throws(E) in
            try body(UnsafeRawBufferPointer(rebasing: raw.prefix(count)))
        }
    }
}

/// One frame of a multipart ZeroMQ message: immutable bytes, cheap to copy and to send.
/// Frames of up to 32 bytes are held inline; larger ones in a shared libzmq message.
public struct Frame: Sendable, Hashable, CustomStringConvertible {
    enum Storage: Sendable {
        case inline(InlineBytes)
        case shared(FrameStorage)
    }

    let storage: Storage

    init(storage: FrameStorage) { self.storage = .shared(storage) }

    /// Takes over a message libzmq filled in (copying it out when it is small).
    init(moving received: UnsafeMutablePointer<zmq_msg_t>) {
        let size = zmq_msg_size(received)
        if size <= InlineBytes.capacity {
            storage = .inline(InlineBytes(UnsafeRawBufferPointer(start: zmq_msg_data(received), count: size)))
        } else {
            storage = .shared(FrameStorage(moving: received))
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

    /// A frame holding a copy of the bytes `buffer` points at.
    public init(copying buffer: UnsafeRawBufferPointer) {
        if buffer.count <= InlineBytes.capacity {
            storage = .inline(InlineBytes(buffer))
        } else {
            storage = .shared(FrameStorage(copying: buffer))
        }
    }

    /// Initialises `target` as a message to send holding this frame's bytes.
    func prepareForSending(_ target: UnsafeMutablePointer<zmq_msg_t>) {
        switch storage {
        case .inline(let inline):
            inline.withUnsafeBytes { raw in
                // libzmq keeps messages of up to 33 bytes inside zmq_msg_t: no allocation.
                zmq_msg_init_size(target, raw.count)
                if raw.count > 0 { zmq_msg_data(target).copyMemory(from: raw.baseAddress!, byteCount: raw.count) }
            }
        case .shared(let shared):
            shared.copy(into: target)
        }
    }

    /// The number of bytes.
    public var count: Int {
        switch storage {
        case .inline(let inline): Int(inline.count)
        case .shared(let shared): shared.count
        }
    }

    public var isEmpty: Bool { count == 0 }

    /// Calls `body` with the frame's bytes, without copying them.
    public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        switch storage {
        case .inline(let inline): try inline.withUnsafeBytes(body)
        case .shared(let shared): try shared.withUnsafeBytes(body)
        }
    }

    /// A copy of the bytes.
    public var bytes: [UInt8] { withUnsafeBytes { Array($0) } }

    /// Whether the bytes are valid UTF-8, checked without building a string when they are
    /// ASCII (as keys and names on the bus usually are).
    public var isUTF8: Bool {
        withUnsafeBytes { raw in
            raw.allSatisfy { $0 < 0x80 } || String(validating: raw.bindMemory(to: UInt8.self), as: UTF8.self) != nil
        }
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
        lhs.withUnsafeBytes { a in
            rhs.withUnsafeBytes { b in a.count == b.count && (a.count == 0 || memcmp(a.baseAddress!, b.baseAddress!, a.count) == 0) }
        }
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
    /// The peer's ZAP user id (`User-Id` metadata), on messages received by a socket whose
    /// ``ZMQSocket/readsPeerUserID`` is set and whose peer was authenticated.
    public var peerUserID: String?

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
