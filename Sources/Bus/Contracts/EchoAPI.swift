public import BusProtocol
public import ContractKit

/// `echo`, the service for tests, benchmarks and trying the bus.
public enum EchoAPI {
    public static let service = "echo"

    public static let echo = Method<JSONValue, JSONValue>(service, "echo", "Answers with its params.")
    public static let sleep = Method<Sleep, JSONValue>(service, "sleep", "Answers after ms milliseconds (0 to 600000).")
    public static let fail = Method<Fail, JSONValue>(service, "fail", "Answers with this JSON-RPC error (default -32000).")
    public static let whoami = Method<NoParams, String>(service, "whoami", "The instance name of the worker that answered.")
    public static let count = Method<Count, Int>(service, "count", "Answers with n (typed params: n must be an integer).")

    public struct Sleep: Codable, Sendable {
        public var ms: Int
        public init(ms: Int) { self.ms = ms }
    }
    public struct Fail: Codable, Sendable {
        public var code: Int?
        public var message: String?
        public init(code: Int? = nil, message: String? = nil) { (self.code, self.message) = (code, message) }
    }
    public struct Count: Codable, Sendable {
        public var n: Int
        public init(n: Int) { self.n = n }
    }
}

extension EchoAPI.Sleep: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["ms": 0...600_000]
}
