public import BusProtocol
import Contracts

/// Publishes a service's state keys through the kernel's `state.set` (acknowledged with a
/// sequence number, unlike the lossy CHP collector), and remembers what was asked of each so
/// that ``republish()`` can restore it after a kernel restart, a write that failed included.
///
/// The writes of one key reach the kernel one at a time, in the order the calls reach this
/// actor: a write waits for the one before it to be acknowledged (or to fail). Two writes in
/// flight at once could land in either order (one of them resent on a new connection, say),
/// and the kernel would keep the older value; the other keys' writes do not wait. Calls from
/// different tasks may reach the actor in another order than they were made (a waiting task
/// of higher priority runs first): a caller whose value changes while a write is on the way
/// sets it with ``set(_:toLatest:)``.
public actor StatePublisher {
    private let client: BusClient
    /// Each key's value as last asked; nil: a deletion not yet acknowledged.
    private var wanted: [String: (value: JSONValue?, ttl: Double?)] = [:]
    /// The keys with a write at the kernel, each with the writes waiting for it, in turn.
    private var writing: [String: [CheckedContinuation<Void, Never>]] = [:]
    /// Set at graceful shutdown: nothing is published after it (``BusError/closed``).
    private var closed = false

    public init(client: BusClient) {
        self.client = client
    }

    /// Sets `key` to `value` (deletes it when `value` is nil) and returns its sequence number.
    @discardableResult
    public func set(_ key: String, _ value: JSONValue?, ttl: Double? = nil) async throws(BusError) -> UInt64 {
        guard !closed else { throw .closed }
        want(key, value, ttl: ttl)
        await takeTurn(of: key)
        defer { passTurn(of: key) }
        return try await write(key, value, ttl: ttl)
    }

    /// Sets `key` to what `latest` gives, and again while that has changed by the time the
    /// kernel acknowledged the write: what the kernel keeps last is the caller's latest value
    /// even when another task's call with an older one reaches this actor after its own.
    /// Returns the last write's sequence number.
    @discardableResult
    public func set(_ key: String, toLatest latest: @Sendable () async -> JSONValue?) async throws(BusError) -> UInt64 {
        var sent: JSONValue?
        var sequence: UInt64
        repeat {
            sent = await latest()
            sequence = try await set(key, sent)
        } while await latest() != sent
        return sequence
    }

    /// Sets several keys in one message to the kernel (a JSON-RPC batch of `state.set`; more
    /// than the kernel's `max_batch_items` go as several); returns each one's sequence
    /// number or error, in order.
    public func set(many entries: [(key: String, value: JSONValue?)]) async -> [Result<UInt64, BusError>] {
        guard !closed else { return entries.map { _ in .failure(.closed) } }
        for entry in entries { want(entry.key, entry.value, ttl: nil) }
        // Turns taken in one order (the keys sorted) by every batch: no two wait for each other.
        let keys = Set(entries.map(\.key)).sorted()
        for key in keys { await takeTurn(of: key) }
        defer { for key in keys { passTurn(of: key) } }
        guard !closed else { return entries.map { _ in .failure(.closed) } }
        let outcomes = await client.batch(KernelAPI.stateSet, entries.map { KernelAPI.StateSetParams(key: $0.key, value: $0.value ?? .null) })
        return zip(entries, outcomes).map { entry, outcome in
            outcome.map { written in
                acknowledged(entry.key, entry.value)
                return written.sequence
            }
        }
    }

    /// Publishes every key again as it was last asked (deletions not yet acknowledged too),
    /// each as it is when its turn comes. Returns how many were published.
    @discardableResult
    public func republish() async -> Int {
        var published = 0
        for key in wanted.keys.sorted() {
            await takeTurn(of: key)
            defer { passTurn(of: key) }
            guard let entry = wanted[key] else { continue }
            if (try? await write(key, entry.value, ttl: entry.ttl)) != nil { published += 1 }
        }
        return published
    }

    /// The keys this publisher has set (and not deleted).
    public var keys: [String] { wanted.filter { $0.value.value != nil }.keys.sorted() }

    /// Publishes nothing more (graceful shutdown, once the service's work has stopped).
    public func close() { closed = true }

    /// One write of `key`, its turn taken.
    private func write(_ key: String, _ value: JSONValue?, ttl: Double?) async throws(BusError) -> UInt64 {
        guard !closed else { throw .closed }
        let sequence = try await client.publish(key: key, value: value, ttl: ttl, asService: true)
        acknowledged(key, value)
        return sequence
    }

    /// Keeps `value` as what `key` should hold, for ``republish()``.
    private func want(_ key: String, _ value: JSONValue?, ttl: Double?) {
        wanted[key] = (value?.isNull == false ? value : nil, ttl)
    }

    /// Forgets a deletion of `key` the kernel acknowledged, unless another value was asked since.
    private func acknowledged(_ key: String, _ value: JSONValue?) {
        if value?.isNull != false, let entry = wanted[key], entry.value == nil { wanted[key] = nil }
    }

    /// Returns once no other write of `key` is at the kernel or ahead in the queue.
    private func takeTurn(of key: String) async {
        guard writing[key] != nil else {
            writing[key] = []
            return
        }
        await withCheckedContinuation { writing[key]!.append($0) }
    }

    /// Hands `key` to the next write waiting for it, if any.
    private func passTurn(of key: String) {
        guard var waiting = writing[key], !waiting.isEmpty else {
            writing[key] = nil
            return
        }
        let next = waiting.removeFirst()
        writing[key] = waiting
        next.resume()
    }
}
