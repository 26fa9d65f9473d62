/// A received message as the decoders read it: frames in an array, or parts where the socket
/// received them (``ReceivedParts``, the kernel's hot paths). One decoder serves both,
/// specialized for each: headers are compared in place, frames made only of what is kept.
protocol MessageParts {
    var count: Int { get }
    func withPart<R>(_ index: Int, _ body: (UnsafeRawBufferPointer) -> R) -> R
    func isEmpty(_ index: Int) -> Bool
    func partCount(_ index: Int) -> Int
    func part(_ index: Int, equals frame: Frame) -> Bool
    /// The part's byte when it is one byte long (a command's code).
    func commandCode(_ index: Int) -> UInt8?
    /// The part, to keep.
    func frame(_ index: Int) -> Frame
    /// The parts from `index` on, to keep.
    func frames(from index: Int) -> ArraySlice<Frame>
}

extension [Frame]: MessageParts {
    func withPart<R>(_ index: Int, _ body: (UnsafeRawBufferPointer) -> R) -> R { self[index].withUnsafeBytes(body) }
    func isEmpty(_ index: Int) -> Bool { self[index].isEmpty }
    func partCount(_ index: Int) -> Int { self[index].count }
    func part(_ index: Int, equals frame: Frame) -> Bool { self[index] == frame }
    func commandCode(_ index: Int) -> UInt8? { self[index].count == 1 ? self[index].withUnsafeBytes { $0[0] } : nil }
    func frame(_ index: Int) -> Frame { self[index] }
    func frames(from index: Int) -> ArraySlice<Frame> { self[index...] }
}

extension ReceivedParts: MessageParts {
    func withPart<R>(_ index: Int, _ body: (UnsafeRawBufferPointer) -> R) -> R { body(self[index]) }
    func isEmpty(_ index: Int) -> Bool { self[index].isEmpty }
    func partCount(_ index: Int) -> Int { self[index].count }
    func commandCode(_ index: Int) -> UInt8? { self[index].count == 1 ? self[index][0] : nil }
}
