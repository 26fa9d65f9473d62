public import BusProtocol

/// `echo`, the service for tests, benchmarks and trying the bus.
public enum EchoAPI {
    public static let service = "echo"

    public static let echo = Method<JSONValue, JSONValue>(service, "echo", "Answers with its params.")
    public static let sleep = Method<Sleep, JSONValue>(service, "sleep", "Answers after ms milliseconds (0 to 600000).")
    public static let fail = Method<Fail, JSONValue>(service, "fail", "Answers with this JSON-RPC error (default -32000).")
    public static let whoami = Method<NoParams, String>(service, "whoami", "The instance name of the worker that answered.")
    public static let count = Method<Count, Int>(service, "count", "Answers with n (typed params: n must be an integer).")
    public static let numbersMethod = Method<Numbers, NumberList>(service, "numbers", "The numbers 1 to n, one a part when asked in parts, everyMs milliseconds apart.")
    /// `numbers` in parts: each part is the next number; the end is the count.
    public static let numbers = StreamMethod(numbersMethod, part: Int.self) { end, parts in
        var whole = end
        whole.numbers = parts
        return whole
    }

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
    public struct Numbers: Codable, Sendable {
        public var n: Int
        public var everyMs: Int?
        public init(n: Int, everyMs: Int? = nil) { (self.n, self.everyMs) = (n, everyMs) }
    }
    public struct NumberList: Codable, Sendable {
        public var count: Int
        public var numbers: [Int]
        public init(count: Int, numbers: [Int]) { (self.count, self.numbers) = (count, numbers) }
    }
}

extension EchoAPI.Sleep: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["ms": 0...600_000]
}

extension EchoAPI.Numbers: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["n": 0...1_000_000, "everyMs": 0...10_000]
}
