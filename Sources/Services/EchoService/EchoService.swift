import BusKit
import BusProtocol
public import Contracts

/// A service for tests, benchmarks and trying the bus: it answers with what it is sent.
///
/// Its methods are ``EchoAPI``'s.
public actor EchoService: BusService {
    public static let name = EchoAPI.service
    public let instance: String
    private(set) public var handled = 0

    public init(instance: String = "echo") {
        self.instance = instance
    }

    public nonisolated func methods(_ table: inout MethodTable<EchoService>) {
        table.on(EchoAPI.echo) { echo, params in
            await echo.count()
            return params
        }
        table.on(EchoAPI.sleep) { echo, params in
            await echo.count()
            guard (0...600_000).contains(params.ms) else { throw JSONRPCError.invalidParams(field: "ms", "must be 0 to 600000") }
            try await Task.sleep(for: .milliseconds(params.ms))
            return ["slept": .int(Int64(params.ms)), "instance": .string(echo.instance)]
        }
        table.on(EchoAPI.fail) { echo, params in
            await echo.count()
            throw JSONRPCError(code: params.code ?? -32000, message: params.message ?? "failed on purpose")
        }
        table.on(EchoAPI.whoami) { echo, _ in
            await echo.count()
            return echo.instance
        }
        table.on(EchoAPI.count) { echo, params in
            await echo.count()
            return params.n
        }
        table.onStream(EchoAPI.numbers) { echo, params, parts in
            await echo.count()
            for number in 0..<params.n {
                if number > 0, let ms = params.everyMs, ms > 0 { try await parts.pause(for: .milliseconds(ms)) }
                try await parts.send(number + 1)
            }
            return EchoAPI.NumberList(count: params.n, numbers: [])
        }
    }

    private func count() { handled += 1 }
}
