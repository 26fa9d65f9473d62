import BusKit
import BusProtocol
import Catalog
import Contracts
import Foundation
import Synchronization

/// One request of the mix: what to send, and the article URL when it is a store write.
struct Call {
    let service: String
    let label: String
    let send: @Sendable (BusClient) async throws(BusError) -> JSONValue
    var savedURL: String? = nil
    /// A save of an article never tried before: its reply must say `created`, or the
    /// store applied some earlier copy of this very request (a duplicated effect).
    var firstSave = false
    /// The error codes this request asks for on purpose (an unknown id, say); with an
    /// outage's (``BusError/isOutage``), the only ones it may be answered with.
    var asksFor: Set<Int> = []

    init<P, R>(_ method: Method<P, R>, _ params: P, savedURL: String? = nil, firstSave: Bool = false, asksFor: Set<Int> = []) {
        service = method.service
        label = "\(method.service) \(method.name)"
        send = { client throws(BusError) in try await client.call(method.json, params) }
        self.savedURL = savedURL
        self.firstSave = firstSave
        self.asksFor = asksFor
    }

    /// Whether `error` is one this request may meet: one it asks for, or an outage's.
    func expects(_ error: BusError) -> Bool {
        error.isOutage || error.code.map(asksFor.contains) == true
    }

    init<R>(_ method: Method<NoParams, R>) { self.init(method, NoParams()) }
}

extension BusError {
    /// Whether any request may be answered this while a piece of the bus is down, restarting
    /// or crowded: no worker in time (-32001), its deadline passed (-32002), a write whose
    /// outcome went with its database (-32006), the database down (-32007), a kernel that is
    /// not the active one (-32008), a request whose worker died each time it had it (-32012),
    /// a reply in parts cut short (-32014). Any other error a request did not ask for is one
    /// no outage explains: a bug, which fails the run.
    var isOutage: Bool { code.map(Self.outageCodes.contains) ?? false }

    private static let outageCodes: Set<Int> = [
        JSONRPCError.serviceUnavailableCode, JSONRPCError.timedOutCode, JSONRPCError.outcomeUnknownCode,
        JSONRPCError.storageFailedCode, JSONRPCError.notActiveCode, JSONRPCError.handlerDiedCode,
        JSONRPCError.streamEndedCode,
    ]
}

/// Errors neither asked for nor an outage's (``BusError/isOutage``), by what was asked and
/// the code, each with the first one's message.
struct UnexpectedErrors {
    private var byKind: [String: (count: Int, first: String)] = [:]

    var isEmpty: Bool { byKind.isEmpty }

    mutating func note(_ error: any Error, asking what: String) {
        let kind = "\(what) \((error as? BusError)?.code.map(String.init) ?? "(no code)")"
        byKind[kind, default: (0, "\(error)")].count += 1
    }

    mutating func merge(_ other: UnexpectedErrors) {
        byKind.merge(other.byKind) { ($0.count + $1.count, $0.first) }
    }

    /// Each kind with how often, and its first message.
    var summary: String {
        byKind.sorted { $0.key < $1.key }.map { "\($0.key) x\($0.value.count) (\($0.value.first))" }.joined(separator: ", ")
    }
}

/// A mix over every app's requests, drawn from a seeded generator so a run can be replayed.
struct RequestMix {
    var random: SeededGenerator
    let client: Int
    let seed: UInt64
    private var count = 0
    /// The article URLs this client tried to save.
    private var tried: Set<Int> = []

    init(seed: UInt64, client: Int) {
        self.seed = seed
        self.client = client
        random = SeededGenerator(seed: seed &+ UInt64(client) &* 0x9E37_79B9)
    }

    static let articlesPerClient = 250
    private static let countryQueries = ["fr", "ger", "united", "a", "ü", "Paris", "", "zz"]
    private static let places = ["Amsterdam", "Rome", "52.37, 4.89", "-33.86, 151.2", "Nowhere-at-all", "91, 0"]
    private static let sources = [["bbc-news"], ["cnn", "reuters"], ["not-a-source"], []]

    mutating func next() -> Call {
        count += 1
        switch Int.random(in: 0..<17, using: &random) {
        case 0: return Call(SearchAPI.countriesSearch, .init(query: Self.countryQueries.randomElement(using: &random)!, limit: 20))
        case 1: return Call(PricingAPI.dealsRollback, .init(seed: Int64.random(in: 0...1_000, using: &random)))
        case 2: return Call(PricingAPI.dealsToday, .init())
        case 3: return Call(SearchAPI.locationsSearch, .init(query: "Am", limit: 10))
        case 4:
            // A place no dataset knows is not found (-32003); a latitude past 90 is refused (-32602).
            return Call(SearchAPI.locationsResolve, .init(query: Self.places.randomElement(using: &random)!),
                        asksFor: [JSONRPCError.notFoundCode, JSONRPCError.invalidParamsCode])
        case 5: return Call(SearchAPI.itemsGrouped, .init(order: Bool.random(using: &random) ? .natural : .lexical))
        case 6: return Call(SearchAPI.sourcesList, .init())
        case 7: return Call(SearchAPI.headlinesList, .init(sources: Self.sources.randomElement(using: &random)!, pageSize: 5))
        case 8: return Call(SearchAPI.flightsList, .init())
        case 9:
            // The bundled flights are outbound 1-6 and inbound 11-15: a pair that flies there and
            // back is quoted, one that does not is refused (-32004), and the id past each end is
            // unknown (-32003).
            return Call(PricingAPI.routeQuote, .init(outboundId: Int.random(in: 1...7, using: &random), inboundId: Int.random(in: 11...16, using: &random)),
                        asksFor: [JSONRPCError.notFoundCode, JSONRPCError.conflictCode])
        case 10: return Call(PricingAPI.routeCheapest)
        case 11: return Call(PricingAPI.routeCurrent)
        case 12, 13:
            // A bounded set of URLs per client (saving one again replaces it): the stored
            // state stops growing, so the memory figures show leaks rather than data.
            let index = count % Self.articlesPerClient
            let url = "https://soak.example/\(seed)/\(client)/\(index)"
            return Call(StoreAPI.articlesSave, .init(article: ["url": .string(url), "title": .string("Soak article \(count)"), "source": ["id": nil, "name": "soak"]]),
                        savedURL: url, firstSave: tried.insert(index).inserted)
        case 14: return Call(StoreAPI.historyList, .init(limit: 10))
        case 15: return Call(FetcherAPI.datasetsList)
        default: return Call(EchoAPI.echo, ["client": .int(Int64(client)), "n": .int(Int64(count))])
        }
    }
}

/// What happened to the requests, counted by every client together.
final class Tally: Sendable {
    struct Counts {
        var sent = 0
        var answered = 0
        /// Never answered within the client's timeout.
        var lost = 0
        /// Failed with a JSON-RPC error, by code.
        var failed: [Int: Int] = [:]
        /// Failed otherwise (closed, protocol violation), by description.
        var otherFailures: [String: Int] = [:]
        var acknowledgedWrites: [String] = []
        /// First saves answered "not new": the store applied the request twice.
        var duplicatedEffects = 0
        var failedByMethod: [String: Int] = [:]
        var sentByMethod: [String: Int] = [:]
        var answeredByMethod: [String: Int] = [:]
        var unexpected = UnexpectedErrors()

        /// The request kinds of the mix sent often and never answered: a kind the mix asks
        /// only in ways that fail tests nothing but its errors (a few failing calls can be
        /// chance, a kill; fifty are not).
        var neverAnswered: [String] {
            sentByMethod.filter { $0.value >= 50 && answeredByMethod[$0.key] == nil }.keys.sorted()
        }
    }
    let counts = Mutex(Counts())

    func record(_ call: Call, _ outcome: Result<JSONValue, BusError>) {
        counts.withLock { counts in
            counts.sent += 1
            counts.sentByMethod[call.label, default: 0] += 1
            switch outcome {
            case .success(let result):
                counts.answered += 1
                counts.answeredByMethod[call.label, default: 0] += 1
                if let url = call.savedURL { counts.acknowledgedWrites.append(url) }
                if call.firstSave, result["created"] == false { counts.duplicatedEffects += 1 }
            case .failure(.timedOut):
                counts.lost += 1
                counts.failedByMethod[call.label, default: 0] += 1
            case .failure(let error):
                if let code = error.code { counts.failed[code, default: 0] += 1 } else { counts.otherFailures["\(error)", default: 0] += 1 }
                counts.failedByMethod[call.label, default: 0] += 1
                if !call.expects(error) { counts.unexpected.note(error, asking: call.label) }
            }
        }
    }
}

/// The soak's writer of ticks under `/client/soak/tick`: each written with compare-and-set at
/// the revision its last write made, so a write whose answer was lost (a kill, a failover) is
/// found applied or not by reading the key, and none is applied twice.
struct TickWriter: Sendable {
    static let key = "/client/soak/tick"
    var epoch: Int64 = 1
    var n: Int64 = 0
    var acknowledged: (epoch: Int64, n: Int64) = (0, 0)
    /// The key's revision after the last write known applied (0: absent; nil: not known, so
    /// the next write is unconditional and starts a new epoch).
    var revision: UInt64? = 0
    var writes = 0
    /// Refused because the key had moved on (a write of this writer's whose answer was lost).
    var conflicts = 0
    /// Writes whose outcome was unknown, then found applied or not by reading the key.
    var foundApplied = 0
    var foundNotApplied = 0
    /// Outcomes it could not learn (the key could not be read): a new epoch began.
    var epochs = 1

    mutating func write(_ client: BusClient) async {
        let value: JSONValue = ["epoch": .int(epoch), "n": .int(n + 1)]
        do throws(BusError) {
            advance(to: try await client.call(KernelAPI.stateSet, .init(key: Self.key, value: value, revision: revision)).sequence)
        } catch {
            if case .remote(_, let refusal) = error, refusal.code == JSONRPCError.conflictCode { conflicts += 1 }
            await settle(client, tried: value)
        }
    }

    private mutating func advance(to revision: UInt64) {
        n += 1
        writes += 1
        acknowledged = (epoch, n)
        self.revision = revision
    }

    /// Reads the key to learn whether the write of `tried` happened.
    private mutating func settle(_ client: BusClient, tried: JSONValue) async {
        guard let page = try? await client.call(KernelAPI.stateGet, .init(prefix: Self.key, limit: 1)) else {
            epoch += 1
            epochs += 1
            n = 0
            revision = nil
            return
        }
        guard let entry = page.entries.first(where: { $0.key == Self.key }) else {
            // The key is gone: a kernel alone restarted and lost its state. Its subscribers
            // may get the new kernel's first ticks before they notice the restart (their resync
            // follows), so the count starts again in a new epoch, from an absent key.
            foundNotApplied += 1
            epoch += 1
            epochs += 1
            n = 0
            revision = 0
            return
        }
        if entry.value == tried {
            foundApplied += 1
            advance(to: entry.sequence)
        } else {
            // Not applied (yet): the same tick is tried again at the key's revision now.
            foundNotApplied += 1
            revision = entry.sequence
        }
    }
}

/// The subscriptions the subscribers hold now (each is replaced as it leaves and resumes),
/// and whether the load is over (then they stay, to be read to the last tick).
final class Following: Sendable {
    let loadOver = Mutex(false)
    let subscriptions = Mutex<[Int: Subscription]>([:])
}

/// The subscribers' view of the writer's ticks, and what they found wrong.
final class SubscriberCheck: Sendable {
    struct Counts {
        var updates = 0
        /// A live update that skipped a tick of the same epoch: a gap the subscription did
        /// not repair by resynchronising.
        var gaps = 0
        /// A live update older than one already seen (out of order). The same tick again is
        /// not counted: a write re-sent after a kernel restart may be applied twice.
        var backwards = 0
        var lastSeen: [Int: (epoch: Int64, n: Int64)] = [:]
        var resyncs: [Int: Int] = [:]
        /// Subscriptions reopened with the sequence they had reached, and of those the ones
        /// the kernel could not resume (it no longer held the changes): a snapshot instead.
        var resumes = 0
        var resets = 0
        /// The first gaps, said: which subscriber, what it had, what came.
        var gapNotes: [String] = []
        /// Each subscriber's last few events, said, so a subscriber stale at the end shows
        /// what it went through last.
        var recent: [Int: [String]] = [:]
    }
    let counts = Mutex(Counts())
    private let started = ContinuousClock.now

    /// Keeps what happened to a subscriber (an event, a resume) among its last few.
    func note(_ what: String, subscriber: Int) {
        let at = (ContinuousClock.now - started).formatted(.units(allowed: [.seconds], fractionalPart: .show(length: 1)))
        counts.withLock { counts in
            counts.recent[subscriber, default: []].append("\(at) \(what)")
            if counts.recent[subscriber]!.count > 8 { counts.recent[subscriber]!.removeFirst() }
        }
    }

    func saw(_ update: StateUpdate, subscriber: Int) {
        guard let epoch = update.json?["epoch"]?.intValue, let n = update.json?["n"]?.intValue else { return }
        counts.withLock { counts in
            counts.updates += 1
            if !update.fromSnapshot, let last = counts.lastSeen[subscriber], last.epoch == epoch {
                if n > last.n + 1 {
                    counts.gaps += 1
                    if counts.gapNotes.count < 5 {
                        // What the subscriber went through up to the gap says where the tick went.
                        let before = (counts.recent[subscriber] ?? []).map { "\n        \($0)" }.joined()
                        counts.gapNotes.append("subscriber \(subscriber) had tick \(last.n), then \(n) (sequence \(update.sequence)) of epoch \(epoch); its last events:\(before)")
                    }
                }
                if n < last.n { counts.backwards += 1 }
            }
            counts.lastSeen[subscriber] = (epoch, n)
        }
    }
}

/// Replies in parts and requests to every worker under the same chaos: each stream must bring
/// its numbers in order with none missing or repeated, and one that ends early must say how
/// many came; each gather must account for every worker it asked, once.
final class PartsCheck: Sendable {
    struct Counts {
        var streams = 0
        /// Streams that ended early, told why (by code).
        var endedEarly: [Int: Int] = [:]
        var parts = 0
        /// A part that was not the next number: lost, repeated or out of order.
        var partsOutOfSequence = 0
        /// A stream whose end disagreed with the parts that came (a whole stream short, or an
        /// early end whose count was not what arrived).
        var miscounted = 0
        var gathers = 0
        var gatherAnswers = 0
        var gatherMissing = 0
        /// A gather whose end did not account for each worker asked exactly once.
        var gathersMiscounted = 0
        var failed: [String: Int] = [:]
        var unexpected = UnexpectedErrors()
    }
    let counts = Mutex(Counts())

    static let partsPerStream = 200

    /// One stream of the numbers 1...partsPerStream from an echo worker.
    func stream(_ client: BusClient) async {
        let stream = client.stream(EchoAPI.numbers, .init(n: Self.partsPerStream))
        var next = 1, received = 0, outOfSequence = 0
        var ending: BusError?
        do {
            for try await number in stream {
                if number != next { outOfSequence += 1 }
                next = number + 1
                received += 1
            }
            let end = try await stream.end()
            if end.count != Self.partsPerStream || received != Self.partsPerStream { ending = .protocolViolation("a whole stream of \(received) parts") }
        } catch let error as BusError {
            ending = error
        } catch {
            ending = .cancelled(service: EchoAPI.service, method: EchoAPI.numbersMethod.name)
        }
        counts.withLock { counts in
            counts.streams += 1
            counts.parts += received
            counts.partsOutOfSequence += outOfSequence
            guard let ending else { return }
            if case .protocolViolation = ending {
                counts.miscounted += 1
            } else if case .remote(_, let error) = ending, error.code == JSONRPCError.streamEndedCode {
                counts.endedEarly[error.code, default: 0] += 1
                if error.data?["parts"]?.intValue != Int64(received) { counts.miscounted += 1 }
            } else {
                counts.failed["\(ending.code ?? 0)", default: 0] += 1
                if !ending.isOutage { counts.unexpected.note(ending, asking: "\(EchoAPI.service) \(EchoAPI.numbersMethod.name)") }
            }
        }
    }

    /// One `whoami` to every echo worker.
    func gather(_ client: BusClient) async {
        let gather = client.gather(EchoAPI.whoami)
        var asked: [String] = [], answered: [String] = []
        do {
            for try await event in gather {
                switch event {
                case .asked(let workers): asked = workers
                case .answer(let worker, _): answered.append(worker)
                }
            }
            let end = try await gather.end()
            let accounted = answered + end.missing.map(\.worker)
            let consistent = end.expected == asked.count && end.answered == answered.count && accounted.sorted() == asked.sorted()
            counts.withLock { counts in
                counts.gathers += 1
                counts.gatherAnswers += answered.count
                counts.gatherMissing += end.missing.count
                if !consistent { counts.gathersMiscounted += 1 }
            }
        } catch {
            counts.withLock { counts in
                counts.failed["\((error as? BusError)?.code ?? 0)", default: 0] += 1
                if (error as? BusError)?.isOutage != true { counts.unexpected.note(error, asking: "\(EchoAPI.service) \(EchoAPI.whoami.name) (to every worker)") }
            }
        }
    }
}
