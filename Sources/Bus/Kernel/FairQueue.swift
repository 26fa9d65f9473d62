import DequeModule
import ZeroMQ

/// A service's waiting requests: one queue per client, the clients served in turn.
///
/// One client's flood waits behind its own earlier requests, not in front of everyone
/// else's: each time a worker has room, the next client in turn whose share of the service's
/// places allows another sends its oldest request. A client is its CURVE key (all its
/// connections together), or without CURVE its connection.
struct FairQueue {
    private var queues: [Frame: Deque<Broker.Request>] = [:]
    /// Clients with requests waiting, in the order they are served.
    private var turn: Deque<Frame> = []
    private(set) var count = 0
    /// Bytes of the bodies waiting.
    private(set) var bytes = 0

    var isEmpty: Bool { count == 0 }

    /// Queues `request` last among its client's.
    mutating func append(_ request: Broker.Request) {
        add(request) { $0.append($1) }
    }

    /// Queues `request` first among its client's, and its client first in turn (a request back
    /// from a worker that died keeps its place).
    mutating func prepend(_ request: Broker.Request) {
        add(request) { $0.prepend($1) }
        if let index = turn.firstIndex(of: request.owner), index != 0 {
            turn.remove(at: index)
            turn.prepend(request.owner)
        }
    }

    private mutating func add(_ request: Broker.Request, _ insert: (inout Deque<Broker.Request>, Broker.Request) -> Void) {
        if queues[request.owner] == nil { turn.append(request.owner) }
        insert(&queues[request.owner, default: []], request)
        count += 1
        bytes += request.size
    }

    /// The oldest request of the next client in turn that `mayTake` allows another place;
    /// nil when no waiting client may take one now.
    mutating func next(where mayTake: (Frame) -> Bool) -> Broker.Request? {
        for _ in 0..<turn.count {
            let owner = turn.removeFirst()
            guard mayTake(owner) else {
                turn.append(owner)
                continue
            }
            let request = queues[owner]!.removeFirst()
            if queues[owner]!.isEmpty { queues[owner] = nil } else { turn.append(owner) }
            count -= 1
            bytes -= request.size
            return request
        }
        return nil
    }

    /// Removes and returns every request whose deadline has passed.
    mutating func removeExpired(now: UInt64) -> [Broker.Request] {
        var expired: [Broker.Request] = []
        for owner in Array(turn) {
            guard queues[owner]!.contains(where: { $0.deadline <= now }) else { continue }
            var kept: Deque<Broker.Request> = []
            for request in queues[owner]! {
                if request.deadline <= now { expired.append(request) } else { kept.append(request) }
            }
            if kept.isEmpty {
                queues[owner] = nil
                turn.removeAll { $0 == owner }
            } else {
                queues[owner] = kept
            }
        }
        count -= expired.count
        bytes -= expired.reduce(0) { $0 + $1.size }
        return expired
    }

    /// Lets go of the storage a burst grew it to, when nothing waits.
    mutating func releaseIfEmpty() {
        if isEmpty {
            queues = [:]
            turn = []
        }
    }
}
