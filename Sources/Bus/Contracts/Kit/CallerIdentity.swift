/// Who sent the request being answered, as the kernel authenticated it (its CURVE key) and
/// ranks it: what a service decides rights and quotas by. The request's `client` member
/// cannot serve: its sender chooses it.
///
/// A ``ServiceHost`` on a CURVE connection asks the kernel for it (the worker extension's
/// `callers=1`, docs/PROTOCOL.md) and runs each handler with it as ``current``; without CURVE
/// nobody can be told apart, and ``current`` is nil.
public struct CallerIdentity: Hashable, Sendable, CustomStringConvertible {
    /// What the kernel admitted the key as.
    public enum Rank: String, Sendable {
        /// A client key: requests, subscriptions, its own state.
        case client
        /// A client key the kernel lists as an operator's.
        case `operator`
        /// A service's key, or a whole services host's.
        case worker
    }

    public var rank: Rank
    /// The CURVE public key, Z85 (40 characters).
    public var key: String

    public init(rank: Rank, key: String) {
        self.rank = rank
        self.key = key
    }

    /// Reads the kernel's `RANK:KEY`; nil for anything else (the empty text of a kernel
    /// without CURVE among them).
    public init?(_ text: some StringProtocol) {
        guard let colon = text.firstIndex(of: ":"), let rank = Rank(rawValue: String(text[..<colon])) else { return nil }
        let key = text[text.index(after: colon)...]
        guard !key.isEmpty else { return nil }
        self.init(rank: rank, key: String(key))
    }

    /// `RANK:KEY`, as the kernel writes it for a worker and ``init(_:)`` reads it.
    public var description: String { rank.rawValue + ":" + key }

    /// The sender of the request being answered, while its handler runs.
    @TaskLocal public static var current: CallerIdentity?
}
