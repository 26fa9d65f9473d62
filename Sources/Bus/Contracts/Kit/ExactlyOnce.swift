public import BusProtocol
import DequeModule
import Foundation
import Synchronization

/// A request as its client named it: the client's id (the request's `client` member) and
/// the JSON-RPC id. The same key twice is the same request sent again (after a failover, a
/// reconnect or a redispatch), never a new one.
public struct RequestKey: Hashable, Sendable, CustomStringConvertible {
    public var client: String
    public var id: JSONRPCID

    public init(client: String, id: JSONRPCID) {
        self.client = client
        self.id = id
    }

    /// The key of `request`, when its client named it (a `client` member and a non-null id).
    public init?(_ request: JSONRPCRequest) {
        guard let client = request.client, !client.isEmpty, let id = request.id, id != .null else { return nil }
        self.init(client: client, id: id)
    }

    /// One string for storage: the client, a space, the id (a string id after a quote).
    public var description: String {
        switch id {
        case .number(let number): client + " " + String(number)
        case .numberText(let text): client + " " + text
        case .string(let string): client + " \"" + string
        case .null: client
        }
    }

    /// The key of the request being answered, while a handler of a state-changing method runs
    /// (a durable memory records the result under it in the effect's own transaction).
    @TaskLocal public static var current: RequestKey?
}

/// Where a service remembers the results of its state-changing methods, by request, for a
/// while: a request sent again is answered with the result it already had.
public protocol ReplyMemory: Sendable {
    /// The result (JSON text) remembered for `key`, if any.
    func recall(_ key: RequestKey) async throws -> [UInt8]?
    /// Called after a handler succeeded. A durable memory records the result in the same
    /// transaction as the effect (reading ``RequestKey/current``) and has nothing to do here.
    func remember(_ key: RequestKey, result: [UInt8]) async
}

/// Results kept in memory, for `window` and at most `capacity` of them: for services whose
/// effects are not durable themselves (a restart forgets both).
public final class RecentReplies: ReplyMemory {
    private struct Kept {
        var results: [RequestKey: [UInt8]] = [:]
        var order: Deque<(key: RequestKey, at: ContinuousClock.Instant)> = []
    }
    private let kept = Mutex(Kept())
    public let window: Duration
    public let capacity: Int

    public init(window: Duration = .seconds(600), capacity: Int = 100_000) {
        self.window = window
        self.capacity = capacity
    }

    public func recall(_ key: RequestKey) -> [UInt8]? {
        kept.withLock { $0.results[key] }
    }

    public func remember(_ key: RequestKey, result: [UInt8]) {
        let now = ContinuousClock.now
        kept.withLock { kept in
            if kept.results.updateValue(result, forKey: key) == nil { kept.order.append((key, now)) }
            while let oldest = kept.order.first, kept.order.count > capacity || now - oldest.at > window {
                kept.results[oldest.key] = nil
                kept.order.removeFirst()
            }
        }
    }
}

/// Runs each named request of a state-changing method once: a request sent again while the
/// first is still running waits for its outcome; one sent again later gets the remembered
/// result. Errors are not remembered (a request that failed had no effect, and may be tried
/// again).
public final class ExactlyOnce: Sendable {
    public let memory: any ReplyMemory
    /// Requests running now, each with the duplicates waiting for its outcome.
    private let running = Mutex<[RequestKey: [CheckedContinuation<Result<[UInt8], any Error>?, Never>]]>([:])

    public init(memory: any ReplyMemory) {
        self.memory = memory
    }

    public func run(_ key: RequestKey, _ body: () async throws -> [UInt8]) async -> Result<[UInt8], any Error> {
        // nil: this is the first; otherwise the outcome of the first, waited for.
        let duplicateOutcome: Result<[UInt8], any Error>? = await withCheckedContinuation { continuation in
            let first = running.withLock { running -> Bool in
                guard running[key] != nil else {
                    running[key] = []
                    return true
                }
                running[key]!.append(continuation)
                return false
            }
            if first { continuation.resume(returning: nil) }
        }
        if let duplicateOutcome { return duplicateOutcome }
        let outcome: Result<[UInt8], any Error>
        do {
            if let remembered = try await memory.recall(key) {
                outcome = .success(remembered)
            } else {
                let result = try await RequestKey.$current.withValue(key) { try await body() }
                await memory.remember(key, result: result)
                outcome = .success(result)
            }
        } catch {
            outcome = .failure(error)
        }
        let waiters = running.withLock { $0.removeValue(forKey: key) ?? [] }
        for waiter in waiters { waiter.resume(returning: outcome) }
        return outcome
    }
}
