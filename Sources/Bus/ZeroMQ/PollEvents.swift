internal import CZeroMQ

/// What a socket is ready for: ``ZMQSocket/events()``, and the loop's poll.
public struct PollEvents: OptionSet, Sendable, Hashable {
    public let rawValue: Int16
    public init(rawValue: Int16) { self.rawValue = rawValue }
    public static let readable = PollEvents(rawValue: Int16(ZMQ_POLLIN))
    public static let writable = PollEvents(rawValue: Int16(ZMQ_POLLOUT))
    public static let error = PollEvents(rawValue: Int16(ZMQ_POLLERR))
}
