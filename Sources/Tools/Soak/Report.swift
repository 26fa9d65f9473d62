import Foundation

/// The figures of one soak run, and whether it passed.
struct SoakReport {
    let seed: UInt64
    let duration: Double
    let clients: Int
    let subscribers: Int
    var elapsed: Double = 0
    var chaos = ChaosLog()
    var requests = Tally.Counts()
    var resent = 0
    var duplicated = 0
    var lateReplies = 0
    var ticksWritten = 0
    var ticks = TickWriter()
    var subscribers_ = SubscriberCheck.Counts()
    var parts = PartsCheck.Counts()
    var staleSubscribers = 0
    /// Each stale subscriber: what it had and what it went through last.
    var staleNotes: [String] = []
    var missingWrites = 0
    /// The stream's publishers and consumer group.
    var streams = StreamsCheck.Counts()
    var memoryAtStart: [String: Double] = [:]
    var memoryAtEnd: [String: Double] = [:]
    var upExit: Int32 = -1
    var problems: [String] = []
    /// What the hostile client's run measured (`--hostile`).
    var hostile: HostileFigures?

    init(seed: UInt64, duration: Double, clients: Int, subscribers: Int) {
        self.seed = seed
        self.duration = duration
        self.clients = clients
        self.subscribers = subscribers
    }

    var subscriberCounts: SubscriberCheck.Counts {
        get { subscribers_ }
        set { subscribers_ = newValue }
    }

    var unrecovered: Int { chaos.kills.filter { $0.recoveredAfter == nil }.count }
    /// Kills of a pair's active kernel that no answered request followed.
    var failedOver: Int { chaos.kills.filter { $0.failoverAsked && $0.failoverAfter == nil }.count }

    var passed: Bool { failures.isEmpty }

    /// What made the run fail, each named, so the last line of the report says it (a CI log
    /// that keeps only the tail still shows why).
    var failures: [String] {
        var checks: [(failed: Bool, says: String)] = [
            (requests.sent == 0, "no request was sent"),
            (requests.lost > 0, "\(requests.lost) lost"),
            (!requests.neverAnswered.isEmpty, "never answered, though sent again and again: \(requests.neverAnswered.joined(separator: ", "))"),
            (!unexpectedErrors.isEmpty, "errors no outage explains: " + unexpectedErrors.summary),
            (duplicated > 0, "\(duplicated) duplicated"),
            (requests.duplicatedEffects > 0, "\(requests.duplicatedEffects) store writes applied twice"),
            (subscribers_.gaps > 0, "\(subscribers_.gaps) subscription gaps"),
            (subscribers_.backwards > 0, "\(subscribers_.backwards) subscription updates out of order"),
            (staleSubscribers > 0, "\(staleSubscribers) subscribers stale at the end"),
            (subscribers_.resumes == 0 && duration >= 30, "no subscription was resumed from a sequence"),
            (missingWrites > 0, "\(missingWrites) acknowledged store writes missing"),
            (streams.published == 0, "no stream message was published"),
            (streams.lost > 0, "\(streams.lost) acknowledged stream messages never done"),
            (streams.doneTwice > 0, "\(streams.doneTwice) stream messages acknowledged twice"),
            (parts.streams == 0, "no reply in parts was asked for"),
            (parts.partsOutOfSequence > 0, "\(parts.partsOutOfSequence) parts lost, repeated or out of order"),
            (parts.miscounted > 0, "\(parts.miscounted) streams whose end did not count the parts that came"),
            (parts.gathersMiscounted > 0, "\(parts.gathersMiscounted) requests to every worker that did not account for each worker once"),
            (unrecovered > 0, "\(unrecovered) kills never recovered from: " + chaos.kills.filter { $0.recoveredAfter == nil }.map {
                String(format: "%@ killed at %.1f s", $0.piece, $0.at) + ($0.stillMissing.map { " (\($0))" } ?? "")
            }.joined(separator: "; ")),
            (failedOver > 0, "\(failedOver) kills of the active kernel after which no request was answered within 30 s"),
        ]
        checks += problems.map { (true, $0) }
        return checks.filter(\.failed).map(\.says)
    }

    /// The errors no request (of the mix, the replies in parts, the streams' publishers and
    /// readers) asked for and no outage explains.
    var unexpectedErrors: UnexpectedErrors {
        var all = requests.unexpected
        all.merge(parts.unexpected)
        all.merge(streams.unexpected)
        return all
    }

    func print() {
        func line(_ label: String, _ value: String) { Swift.print("  " + label.padding(toLength: 44, withPad: " ", startingAt: 0) + value) }
        Swift.print("")
        Swift.print("Soak report: seed \(seed), \(String(format: "%.0f", elapsed)) s of load, \(clients) clients, \(subscribers) subscribers")
        func byPiece(_ kills: [ChaosLog.Kill]) -> String {
            let counts = Dictionary(grouping: kills, by: \.piece).map { "\($0.key) \($0.value.count)" }.sorted().joined(separator: ", ")
            return "\(kills.count)" + (counts.isEmpty ? "" : " (\(counts))")
        }
        let recoveries = chaos.kills.compactMap(\.recoveredAfter)
        line("processes killed (SIGKILL)", byPiece(chaos.kills.filter { !$0.rolling }))
        let rolling = chaos.kills.filter(\.rolling)
        if !rolling.isEmpty { line("services restarted the rolling way", byPiece(rolling)) }
        if !recoveries.isEmpty {
            line("serving again after a kill or restart", String(format: "mean %.1f s, longest %.1f s, never %d", recoveries.reduce(0, +) / Double(recoveries.count),
                                                       recoveries.max()!, unrecovered))
        }
        let failovers = chaos.kills.compactMap(\.failoverAfter)
        if !failovers.isEmpty {
            line("failover (kill to first answered request)", String(format: "mean %.3f s, longest %.3f s, over 1 s: %d of %d", failovers.reduce(0, +) / Double(failovers.count),
                                                                    failovers.max()!, failovers.filter { $0 > 1 }.count, failovers.count))
        }
        line("requests sent", "\(requests.sent)")
        line("answered", "\(requests.answered)")
        let failed = requests.failed.values.reduce(0, +) + requests.otherFailures.values.reduce(0, +)
        let codes = requests.failed.sorted { $0.key > $1.key }.map { "\($0.key): \($0.value)" } + requests.otherFailures.map { "\($0.key): \($0.value)" }
        line("failed with an error", "\(failed)" + (codes.isEmpty ? "" : " (\(codes.joined(separator: ", ")))"))
        line("  neither asked for nor an outage's", unexpectedErrors.isEmpty ? "0" : unexpectedErrors.summary)
        line("lost (never answered)", "\(requests.lost)")
        line("duplicated (answered twice)", "\(duplicated)")
        line("re-sent after a kernel restart", "\(resent) (late replies dropped: \(lateReplies))")
        line("subscription updates seen", "\(subscribers_.updates) of \(ticksWritten) acknowledged writes x \(subscribers)")
        line("subscription resyncs", "\(subscribers_.resyncs.values.reduce(0, +))")
        line("ticks written with compare-and-set", "\(ticks.writes); refused as moved on: \(ticks.conflicts); unknown outcomes found applied: \(ticks.foundApplied), not applied: \(ticks.foundNotApplied); epochs: \(ticks.epochs)")
        line("subscriptions resumed from a sequence", "\(subscribers_.resumes) (the kernel no longer held the changes, snapshot instead: \(subscribers_.resets))")
        line("subscription gaps after resync", "\(subscribers_.gaps) (out of order: \(subscribers_.backwards), stale at the end: \(staleSubscribers))")
        for note in subscribers_.gapNotes { line("  a gap", note) }
        for note in staleNotes { line("  stale", note) }
        line("replies in parts (echo numbers, 200 each)", "\(parts.streams) streams, \(parts.parts) parts; ended early, told: \(parts.endedEarly.values.reduce(0, +)); failed otherwise: \(parts.failed.values.reduce(0, +))\(parts.failed.isEmpty ? "" : " (" + parts.failed.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", ") + ")")")
        line("parts lost, repeated or out of order", "\(parts.partsOutOfSequence) (streams miscounted: \(parts.miscounted))")
        line("requests to every echo worker", "\(parts.gathers), \(parts.gatherAnswers) answers, \(parts.gatherMissing) workers missing (told); miscounted: \(parts.gathersMiscounted)")
        line("acknowledged store writes", "\(requests.acknowledgedWrites.count) (\(Set(requests.acknowledgedWrites).count) distinct articles)")
        line("acknowledged store writes missing after", "\(missingWrites)")
        line("store writes applied twice", "\(requests.duplicatedEffects) (a first save of an article answered as not new)")
        line("stream messages published", "\(streams.published) acknowledged (kept once when sent again: \(streams.duplicates)); tried again: \(streams.publishRetries)")
        line("stream messages done by the group", "\(streams.done) of \(streams.handedOut) handed out (again: \(streams.redelivered)); late acknowledgements: \(streams.notPending)")
        line("stream messages never done, done twice", "\(streams.lost), \(streams.doneTwice)"
             + (streams.failures.isEmpty ? "" : " (calls failed: " + streams.failures.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", ") + ")"))
        Swift.print("  memory (resident MiB)                       start      end")
        for name in Set(memoryAtStart.keys).union(memoryAtEnd.keys).sorted() {
            let start = memoryAtStart[name].map { String(format: "%8.1f", $0) } ?? "       -"
            let end = memoryAtEnd[name].map { String(format: "%8.1f", $0) } ?? "       -"
            line("  " + name, "\(start) \(end)")
        }
        line("switchboard up exit status", "\(upExit)")
        for problem in problems { Swift.print("  problem: \(problem)") }
        if !requests.failedByMethod.isEmpty {
            Swift.print("  failures by request: " + requests.failedByMethod.sorted { $0.value > $1.value }.prefix(8).map { "\($0.key) \($0.value)" }.joined(separator: ", "))
        }
        hostile?.print()
        Swift.print(passed ? "PASS: nothing lost, duplicated or missing" : "FAIL: " + failures.joined(separator: "; "))
    }
}

/// The bystander's latency in each hostile case, and the memory of the processes it watches.
struct HostileFigures: Sendable {
    let bystander: [HostileClient.Case: Bystander.Figures]
    let accepted: Int
    let memoryAtStart: [String: Double]
    let peak: [String: Double]
    let memoryAfter: [String: Double]
    /// From the hostile client leaving to `memoryAfter`: when all were back, or the limit.
    let secondsToGiveBack: Double

    func print() {
        Swift.print("")
        Swift.print("Hostile client: a bystander's kernel ping and echo echo (ms, a client key of its own) while each case ran")
        Swift.print("  " + "case".padding(toLength: 62, withPad: " ", startingAt: 0) + "   ping p50    p99    max   echo p50    p99    max  failed")
        for hostileCase in HostileClient.Case.allCases {
            guard let figures = bystander[hostileCase] else { continue }
            let columns = [quantile(figures.ping, 0.5), quantile(figures.ping, 0.99), figures.ping.max() ?? .nan,
                           quantile(figures.echo, 0.5), quantile(figures.echo, 0.99), figures.echo.max() ?? .nan]
            Swift.print("  " + hostileCase.rawValue.padding(toLength: 62, withPad: " ", startingAt: 0)
                        + columns.map { String(format: "%9.1f", $0) }.joined(separator: "") + String(format: "%8d", figures.failures))
        }
        for name in HostileClient.measured {
            Swift.print(String(format: "  %@ memory: %.0f MB at start (after the quiet case), %.0f MB at most during, %.0f MB %.1f s after the hostile client left",
                               name, memoryAtStart[name] ?? .nan, peak[name] ?? .nan, memoryAfter[name] ?? .nan, secondsToGiveBack))
        }
        Swift.print("  hostile ttl writes taken: \(accepted) (must be 0)")
    }
}
