public import BusKit
import BusProtocol

/// A service for tests, benchmarks and trying the bus: it answers with what it is sent.
///
/// Methods: `echo` (returns its params), `sleep {ms}` (answers after `ms` milliseconds),
/// `fail {code?, message?}` (answers with that JSON-RPC error), `whoami` (the instance name,
/// to see which worker answered), `count {n}` (typed params: `n` must be an integer).
public actor EchoService: BusService {
    public static let name = "echo"
    public let instance: String
    private(set) public var handled = 0

    public init(instance: String = "echo") {
        self.instance = instance
    }

    struct SleepParams: Decodable, Sendable { let ms: Int }
    struct FailParams: Decodable, Sendable { let code: Int?; let message: String? }
    struct CountParams: Decodable, Sendable { let n: Int }

    public nonisolated func methods(_ table: inout MethodTable<EchoService>) {
        table.on("echo") { (echo, params: JSONValue) in
            await echo.count()
            return params
        }
        table.on("sleep") { (echo, params: SleepParams) -> JSONValue in
            await echo.count()
            guard (0...600_000).contains(params.ms) else { throw JSONRPCError.invalidParams(field: "ms", "must be 0 to 600000") }
            try await Task.sleep(for: .milliseconds(params.ms))
            return ["slept": .int(Int64(params.ms)), "instance": .string(echo.instance)]
        }
        table.on("fail") { (echo, params: FailParams) -> JSONValue in
            await echo.count()
            throw JSONRPCError(code: params.code ?? -32000, message: params.message ?? "failed on purpose")
        }
        table.on("whoami") { (echo, _: NoParams) -> JSONValue in
            await echo.count()
            return .string(echo.instance)
        }
        table.on("count") { (echo, params: CountParams) -> JSONValue in
            await echo.count()
            return .int(Int64(params.n))
        }
    }

    private func count() { handled += 1 }
}
