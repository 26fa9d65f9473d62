public import BusProtocol

/// Publishes a service's state keys through the kernel's `state.set` (acknowledged with a
/// sequence number, unlike the lossy CHP collector), and remembers them so that
/// ``republish()`` can restore them after a kernel restart.
public actor StatePublisher {
    private let client: BusClient
    private var current: [String: (value: JSONValue, ttl: Double?)] = [:]

    public init(client: BusClient) {
        self.client = client
    }

    /// Sets `key` to `value` (deletes it when `value` is nil) and returns its sequence number.
    @discardableResult
    public func set(_ key: String, _ value: JSONValue?, ttl: Double? = nil) async throws(BusError) -> UInt64 {
        var params: [String: JSONValue] = ["key": .string(key), "value": value ?? .null]
        if let ttl { params["ttl"] = .double(ttl) }
        let result = try await client.request(service: "kernel", method: "state.set", params: .object(params))
        remember(key, value, ttl: ttl)
        return UInt64(result["sequence"]?.intValue ?? 0)
    }

    /// Sets several keys in one message to the kernel (a JSON-RPC batch of `state.set`);
    /// returns each one's sequence number or error, in order.
    public func set(many entries: [(key: String, value: JSONValue?)]) async -> [Result<UInt64, BusError>] {
        let calls = entries.map { entry -> (method: String, params: JSONValue?) in
            ("state.set", ["key": .string(entry.key), "value": entry.value ?? .null])
        }
        let outcomes = await client.batch(service: "kernel", calls)
        return zip(entries, outcomes).map { entry, outcome in
            outcome.map { result in
                remember(entry.key, entry.value, ttl: nil)
                return UInt64(result["sequence"]?.intValue ?? 0)
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
}
