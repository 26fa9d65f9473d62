import HummingbirdCore
import Logging
import Synchronization

/// The HTTP connections the gateway holds, and the most it holds at once
/// (`gateway.max_connections`). At the most it accepts no other until one closes: the next
/// wait in the listening socket's queue, as at any full server. Without a bound the gateway
/// would run out of open files instead, where each accept fails and is tried again at once,
/// at a whole core, for as long as the connections stay.
final class ConnectionCount: Sendable {
    let max: Int
    private let count = Atomic<Int>(0)

    init(max: Int) { self.max = max }

    var open: Int { count.load(ordering: .relaxed) }
    var isFull: Bool { open >= max }

    /// The new count.
    func opened() -> Int { count.add(1, ordering: .relaxed).newValue }
    func closed() -> Int { count.subtract(1, ordering: .relaxed).newValue }

    /// The most when none is configured: what the process may open, less a tenth (at least
    /// 64) kept for its own files (its bus connections, its event loops, the page).
    static func defaultMax(openFiles limit: Int?) -> Int {
        guard let limit else { return 1 << 20 }
        return Swift.max(1, limit - Swift.max(64, limit / 10))
    }
}

/// Counts connections for Hummingbird's server (its `AvailableConnectionsDelegate`, asked
/// on the listening socket's event loop), and says once when the gateway is full and once
/// when it has room again.
struct ConnectionLimit: AvailableConnectionsDelegate {
    let connections: ConnectionCount
    let logger: Logger
    /// Whether it said it is full and has not said it has room since; it has room again
    /// under nine tenths of the most, so a count that hovers at the most says it once.
    private var saidFull = false

    init(_ connections: ConnectionCount, logger: Logger) {
        self.connections = connections
        self.logger = logger
    }

    mutating func connectionOpened() {
        let open = connections.opened()
        if open >= connections.max, !saidFull {
            saidFull = true
            logger.warning("the gateway holds the most HTTP connections it may (\(connections.max), gateway.max_connections): more wait to be accepted until some close")
        }
    }

    mutating func connectionClosed() {
        let open = connections.closed()
        if saidFull, open * 10 < connections.max * 9 {
            saidFull = false
            logger.notice("the gateway has room for HTTP connections again: \(open) of \(connections.max)")
        }
    }

    func isAcceptingNewConnections() -> Bool { !connections.isFull }
}
