public import BusProtocol
import Contracts

/// Publishes a service's state keys through the kernel's `state.set` (acknowledged with a
/// sequence number, unlike the lossy CHP collector), and remembers them so that
/// ``republish()`` can restore them after a kernel restart.
public actor StatePublisher {
    private let client: BusClient
    private var current: [String: (value: JSONValue, ttl: Double?)] = [:]
    /// Set at graceful shutdown: nothing is published after it (``BusError/closed``).
    private var closed = false

    public init(client: BusClient) {
        self.client = client
    }

    /// Sets `key` to `value` (deletes it when `value` is nil) and returns its sequence number.
    @discardableResult
    public func set(_ key: String, _ value: JSONValue?, ttl: Double? = nil) async throws(BusError) -> UInt64 {
        guard !closed else { throw .closed }
        let sequence = try await client.publish(key: key, value: value, ttl: ttl, asService: true)
        remember(key, value, ttl: ttl)
        return sequence
    }

    /// Sets several keys in one message to the kernel (a JSON-RPC batch of `state.set`; more
    /// than the kernel's `max_batch_items` go as several); returns each one's sequence
    /// number or error, in order.
    public func set(many entries: [(key: String, value: JSONValue?)]) async -> [Result<UInt64, BusError>] {
        guard !closed else { return entries.map { _ in .failure(.closed) } }
        let outcomes = await client.batch(KernelAPI.stateSet, entries.map { KernelAPI.StateSetParams(key: $0.key, value: $0.value ?? .null) })
        return zip(entries, outcomes).map { entry, outcome in
            outcome.map { written in
                remember(entry.key, entry.value, ttl: nil)
                return written.sequence
            }
        }
    }

    /// Keeps what the kernel now holds for `key`, for ``republish()``.
    private func remember(_ key: String, _ value: JSONValue?, ttl: Double?) {
        if let value, !value.isNull { current[key] = (value, ttl) } else { current[key] = nil }
    }

    /// Publishes every remembered key again. Returns how many were published.
    @discardableResult
    public func republish() async -> Int {
        var published = 0
        for (key, entry) in current.sorted(by: { $0.key < $1.key }) {
            if (try? await set(key, entry.value, ttl: entry.ttl)) != nil { published += 1 }
        }
        return published
    }

    /// The keys this publisher has set.
    public var keys: [String] { current.keys.sorted() }

    /// Publishes nothing more (graceful shutdown, once the service's work has stopped).
    public func close() { closed = true }
}
