/// A message that does not follow its protocol, naming the protocol and what is wrong
/// ("MDP: worker READY has 3 frames, expected 4").
public struct ProtocolError: Error, Sendable, Equatable, CustomStringConvertible {
    public let proto: String
    public let problem: String

    public init(_ proto: String, _ problem: String) {
        self.proto = proto
        self.problem = problem
    }

    public var description: String { "\(proto): \(problem)" }
}
