import DequeModule
import ZeroMQ

/// A service's waiting requests: one queue per client, the clients served in turn, and the
/// places of the service each client holds.
///
/// One client's flood waits behind its own earlier requests, not in front of everyone
/// else's: each time a worker has room, the next client in turn whose share of the service's
/// places allows another sends its oldest request. A client is its CURVE key (all its
/// connections together), or without CURVE its connection.
///
/// A turn lasts while places free up quickly: up to ``maxRun`` requests, handed out within
/// ``runNanoseconds`` of the first. Turns of one request each sent every client's replies
/// interleaved, one or two to each connection at a time, which cost libzmq's I/O thread
/// more a request with 8 clients than with one; a slow
/// service still takes one request a turn, as a place frees up only after the time is past.
struct FairQueue {
    /// The most requests one turn hands out.
    static let maxRun = 32
    /// How long after its first request a turn may go on.
    static let runNanoseconds: UInt64 = 200_000
    /// One client of the service: its waiting requests, oldest first, and how many of the
    /// service's places its requests hold. A request carries its client, so dispatching and
    /// answering it reach the client with no lookup by key.
    final class Client {
        let id: Frame
        fileprivate var waiting: Deque<Broker.Request> = []
        fileprivate(set) var held = 0
        fileprivate var inTurn = false
        fileprivate var isKnown = false
        /// Requests handed out in its turn so far (0: its turn has not begun), and when the first was.
        fileprivate var run = 0
        fileprivate var runStarted: UInt64 = 0
        init(id: Frame) { self.id = id }
    }

    /// Clients with requests waiting or places held; the others are forgotten, so clients
    /// that come and go cannot grow it.
    private var clients: [Frame: Client] = [:]
    /// Clients with requests waiting, in the order they are served.
    private var turn: Deque<Client> = []
    private(set) var count = 0
    /// Bytes of the bodies waiting.
    private(set) var bytes = 0

    var isEmpty: Bool { count == 0 }

    /// The client `id` (a new one when it has nothing waiting or held); forgotten again
    /// unless a request of it is queued.
    mutating func client(_ id: Frame) -> Client {
        if let lastClient, lastClient.isKnown, lastClient.id == id { return lastClient }
        if let client = clients[id] {
            lastClient = client
            return client
        }
        return Client(id: id)
    }

    /// The client last asked for or queued: a client's requests come in runs, so most
    /// lookups end here instead of hashing its routing id. Valid while it is known.
    private var lastClient: Client?

    /// How many places `id` holds now.
    func held(by id: Frame) -> Int { clients[id]?.held ?? 0 }

    /// Clients known now: those with requests waiting or places held.
    var clientCount: Int { clients.count }

    /// Queues `request` last among its client's.
    mutating func append(_ request: Broker.Request) {
        let client = request.owner
        track(client)
        client.waiting.append(request)
        if !client.inTurn {
            client.inTurn = true
            turn.append(client)
        }
        added(request)
    }

    /// Counts `request`, which waits for nothing (nothing is queued and a place is free), as
    /// holding a place at once, when its client holds fewer than `share`: what ``append(_:)``
    /// and ``next(share:)`` would do, without the queue. False (nothing done) otherwise.
    mutating func holdAtOnce(_ request: Broker.Request, share: Int) -> Bool {
        let client = request.owner
        guard isEmpty, client.held < share else { return false }
        track(client)
        client.held += 1
        return true
    }

    /// Queues `request` first among its client's, and its client first in turn (a request back
    /// from a worker that died keeps its place).
    mutating func prepend(_ request: Broker.Request) {
        let client = request.owner
        track(client)
        client.waiting.prepend(request)
        if client.inTurn, let index = turn.firstIndex(where: { $0 === client }) {
            turn.remove(at: index)
        }
        client.inTurn = true
        turn.prepend(client)
        added(request)
    }

    /// The oldest request of the next client in turn that holds fewer than `share` places,
    /// now counted as holding one more; nil when no waiting client may take one now. The
    /// client whose turn it is keeps it (stays first) until its turn is over at `now`.
    mutating func next(share: Int, now: UInt64) -> Broker.Request? {
        // One more than the clients: the first one's turn may end here, and it may be the only one.
        for _ in 0...turn.count {
            guard let client = turn.popFirst() else { return nil }
            if client.run > 0, client.run >= Self.maxRun || now &- client.runStarted >= Self.runNanoseconds {
                client.run = 0
                turn.append(client)
                continue
            }
            guard client.held < share else {
                client.run = 0
                turn.append(client)
                continue
            }
            let request = client.waiting.removeFirst()
            if client.run == 0 { client.runStarted = now }
            client.run += 1
            if client.waiting.isEmpty {
                client.inTurn = false
                client.run = 0
            } else {
                turn.prepend(client)
            }
            client.held += 1
            count -= 1
            bytes -= request.size
            return request
        }
        return nil
    }

    /// `request`, handed out by ``next(share:)``, no longer holds a place (answered, or its
    /// worker gone).
    mutating func release(_ request: Broker.Request) {
        let client = request.owner
        guard client.held > 0 else { return }
        client.held -= 1
        forgetIfIdle(client)
    }

    /// Takes `request` out of the queue if it waits there; false when it does not (it was
    /// handed out again, answered or expired meanwhile).
    mutating func remove(_ request: Broker.Request) -> Bool {
        let client = request.owner
        guard let index = client.waiting.firstIndex(where: { $0 === request }) else { return false }
        client.waiting.remove(at: index)
        if client.waiting.isEmpty, client.inTurn {
            client.inTurn = false
            client.run = 0
            turn.removeAll { $0 === client }
        }
        count -= 1
        bytes -= request.size
        forgetIfIdle(client)
        return true
    }

    /// Takes out the oldest waiting request of client `id` (of any client when nil) that
    /// `matches`.
    mutating func removeWaiting(of id: Frame?, where matches: (Broker.Request) -> Bool) -> Broker.Request? {
        let candidates = id.map { id in clients[id].map { [$0] } ?? [] } ?? Array(turn)
        for client in candidates {
            guard let request = client.waiting.first(where: matches) else { continue }
            _ = remove(request)
            return request
        }
        return nil
    }

    /// Removes and returns every request whose deadline has passed.
    mutating func removeExpired(now: UInt64) -> [Broker.Request] {
        var expired: [Broker.Request] = []
        for client in turn where client.waiting.contains(where: { $0.deadline <= now }) {
            var kept: Deque<Broker.Request> = []
            for request in client.waiting {
                if request.deadline <= now { expired.append(request) } else { kept.append(request) }
            }
            client.waiting = kept
        }
        guard !expired.isEmpty else { return [] }
        for client in turn where client.waiting.isEmpty {
            client.inTurn = false
            client.run = 0
            forgetIfIdle(client)
        }
        turn.removeAll { !$0.inTurn }
        count -= expired.count
        bytes -= expired.reduce(0) { $0 + $1.size }
        return expired
    }

    /// Lets go of the storage a burst grew it to: the turn's when nothing waits, the
    /// clients' when none holds a place either.
    mutating func releaseIfEmpty() {
        guard isEmpty else { return }
        turn = []
        if clients.isEmpty { clients = [:] }
    }

    /// Drops every waiting request: a waiting request holds its client, which holds it.
    mutating func removeAll() {
        for client in turn { client.waiting.removeAll() }
        turn.removeAll()
        clients.removeAll()
        lastClient = nil
        count = 0
        bytes = 0
    }

    private mutating func track(_ client: Client) {
        guard !client.isKnown else { return }
        client.isKnown = true
        clients[client.id] = client
        lastClient = client
    }

    private mutating func forgetIfIdle(_ client: Client) {
        guard client.isKnown, client.held == 0, client.waiting.isEmpty else { return }
        client.isKnown = false
        clients[client.id] = nil
    }

    private mutating func added(_ request: Broker.Request) {
        count += 1
        bytes += request.size
    }
}
