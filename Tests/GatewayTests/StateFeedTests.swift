import BusKit
import BusProtocol
@testable import Gateway
import Logging
import NIOCore
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// The feed's bookkeeping, driven with the events a subscription delivers.
@Suite("Gateway: the state feed behind /events")
struct StateFeedTests {
    func update(_ key: String, _ sequence: UInt64, _ value: String?, snapshot: Bool = false) -> SubscriptionEvent {
        .update(StateUpdate(key: key, sequence: sequence, value: value.map { Frame($0) } ?? Frame(), fromSnapshot: snapshot))
    }

    func drain(_ stream: AsyncStream<StreamEvent>, upTo name: String) async -> [StreamEvent] {
        var events: [StreamEvent] = []
        for await event in stream {
            events.append(event)
            if event.name == name { break }
        }
        return events
    }

    @Test("an event carries the value as the kernel holds it: JSON as it is, JSON over several lines on one line, other bytes as a string, a deletion as null")
    func eventValues() {
        let id = StreamEvent.entry("update", key: "/k", sequence: 7, value: Frame(#"{"a":[1,2]}"#))
        #expect(id.data == #"{"key":"/k","sequence":7,"value":{"a":[1,2]}}"#)
        let lines = StreamEvent.entry("update", key: "/k", sequence: 8, value: Frame("{\"a\":\n 1}"))
        #expect(lines.data == #"{"key":"/k","sequence":8,"value":{"a":1}}"# && !String(buffer: lines.encoded).dropLast(2).contains("\n\n"))
        #expect(StreamEvent.entry("update", key: "/k", sequence: 9, value: Frame("not json")).data == #"{"key":"/k","sequence":9,"value":"not json"}"#)
        #expect(StreamEvent.entry("update", key: "/k", sequence: 10, value: Frame()).data == #"{"key":"/k","sequence":10,"value":null}"#)
    }

    @Test("a gap in the gateway's own subscription: streams get missed, the repairs, resynced; a resume meanwhile or from before gets a reset")
    func gapAndRepair() async throws {
        let feed = StateFeed(prefixes: [""], history: 100, logger: Logger(label: "test"))
        await feed.receive(update("/a", 5, "1", snapshot: true))
        await feed.receive(.synced(sequence: 10))
        await feed.receive(update("/a", 11, "2"))
        let (_, live, _) = await feed.attach(prefixes: ["/"], since: nil)
        #expect(await drain(live, upTo: "synced").map(\.name) == ["snapshot", "synced"])

        await feed.receive(.missed(count: 3, afterSequence: 11, reason: "test"))
        // Resuming while the feed is repairing: what changed is not known yet.
        let (_, during, _) = await feed.attach(prefixes: ["/"], since: 11)
        #expect(await drain(during, upTo: "synced").first?.name == "reset")
        await feed.receive(update("/a", 14, "5", snapshot: true))
        await feed.receive(update("/b", 20, nil, snapshot: true))
        await feed.receive(.resynced(sequence: 20, changed: 2))
        let told = await drain(live, upTo: "resynced")
        #expect(told.map(\.name) == ["missed", "update", "update", "resynced"])
        #expect(told[1].id == nil, "a repair carries no id: its sequence may be older than one sent")
        #expect(told.last?.id == 20)

        // From before the gap: a reset and the repaired snapshot. From the resync on: exact.
        let (_, old, _) = await feed.attach(prefixes: ["/"], since: 11)
        let replay = await drain(old, upTo: "synced")
        #expect(replay.map(\.name) == ["reset", "snapshot", "synced"] && replay[1].data.contains("\"value\":5"))
        await feed.receive(update("/c", 21, "1"))
        let (_, fresh, _) = await feed.attach(prefixes: ["/"], since: 20)
        #expect(await drain(fresh, upTo: "synced").map(\.id) == [21, 21])
        let counters = await feed.counters
        #expect(counters.missed == 1 && counters.resets == 2 && counters.resumes == 1)
    }

    @Test("the history is bounded: a resume from before it gets a reset; a stream that falls too far behind is cut")
    func boundedHistoryAndSlowStreams() async throws {
        let feed = StateFeed(prefixes: [""], history: 3, logger: Logger(label: "test"))
        await feed.receive(.synced(sequence: 1))
        for sequence in UInt64(2)...6 { await feed.receive(update("/k", sequence, "\(sequence)")) }
        let (_, kept, _) = await feed.attach(prefixes: ["/"], since: 3)
        #expect(await drain(kept, upTo: "synced").map(\.id) == [4, 5, 6, 6])
        let (_, lost, _) = await feed.attach(prefixes: ["/"], since: 2)
        #expect(await drain(lost, upTo: "synced").first?.name == "reset")

        // Bounded in bytes too, each change counting its record as well as its key and value:
        // a bound of three small changes keeps three, however small they are.
        let record = MemoryLayout<StateFeed.Change>.stride
        let small = StateFeed(prefixes: [""], history: 100, historyBytes: 3 * record + record / 2, logger: Logger(label: "test"))
        await small.receive(.synced(sequence: 1))
        for sequence in UInt64(2)...9 { await small.receive(update("/k", sequence, "1")) }
        let (_, three, _) = await small.attach(prefixes: ["/"], since: 6)
        #expect(await drain(three, upTo: "synced").map(\.id) == [7, 8, 9, 9])
        let (_, four, _) = await small.attach(prefixes: ["/"], since: 5)
        #expect(await drain(four, upTo: "synced").first?.name == "reset")

        // A stream nobody reads: cut once it holds its opening plus the backlog.
        let (_, unread, _) = await feed.attach(prefixes: ["/"], since: nil)
        for sequence in UInt64(7)...UInt64(8 + StateFeed.streamBacklog) { await feed.receive(update("/k", sequence, "1")) }
        #expect(await feed.counters.overflows >= 1)
        var count = 0
        for await _ in unread { count += 1 }
        #expect(count <= 2 + StateFeed.streamBacklog, "the stream ended instead of growing")
    }

    /// The kernel's history as a test states it.
    struct KernelHistory: ChangeLog {
        let answer: StateChanges?
        func changes(under prefixes: [String], since: UInt64, timeout: Duration) async throws -> StateChanges? { answer }
    }

    func change(_ key: String, _ sequence: UInt64, _ value: String?) -> StateUpdate {
        StateUpdate(key: key, sequence: sequence, value: value.map { Frame($0) } ?? Frame(), fromSnapshot: false)
    }

    @Test("a resume this gateway cannot serve (it restarted, or the browser comes from another) comes from the kernel's history, joined to its own log; one from further ahead gets nothing twice")
    func resumeFromTheKernel() async throws {
        // A restarted gateway: its memory starts at 100. The kernel holds from before.
        let history = StateChanges(changes: [change("/a", 95, "1"), change("/b", 98, nil), change("/c", 101, "3")], sequence: 101)
        let feed = StateFeed(prefixes: [""], history: 100, changeLog: KernelHistory(answer: history), logger: Logger(label: "test"))
        await feed.receive(.synced(sequence: 100))
        await feed.receive(update("/c", 101, "3"))
        await feed.receive(update("/d", 102, "4"))
        let (_, resumed, _) = await feed.attach(prefixes: ["/"], since: 90)
        let opening = await drain(resumed, upTo: "synced")
        #expect(opening.map(\.id) == [95, 98, 101, 102, 102])
        #expect(opening[1].data == #"{"key":"/b","sequence":98,"value":null}"#)
        #expect(await feed.counters.kernelResumes == 1)

        // A browser that saw up to 105 on a gateway further along: nothing up to 105 again.
        let ahead = StateFeed(prefixes: [""], history: 100, changeLog: KernelHistory(answer: StateChanges(changes: [change("/e", 106, "6")], sequence: 106)),
                              logger: Logger(label: "test"))
        await ahead.receive(.synced(sequence: 102))
        let (_, moved, _) = await ahead.attach(prefixes: ["/"], since: 105)
        #expect(await drain(moved, upTo: "synced").map(\.id) == [105])
        for sequence in UInt64(103)...106 { await ahead.receive(update("/e", sequence, "\(sequence)")) }
        var live: [UInt64?] = []
        for await event in moved {
            live.append(event.id)
            if event.id == 106 { break }
        }
        #expect(live == [106])

        // The kernel no longer holds them either: a reset and the snapshot.
        let forgotten = StateFeed(prefixes: [""], history: 100, changeLog: KernelHistory(answer: nil), logger: Logger(label: "test"))
        await forgotten.receive(update("/a", 5, "1", snapshot: true))
        await forgotten.receive(.synced(sequence: 100))
        let (_, reset, _) = await forgotten.attach(prefixes: ["/"], since: 50)
        #expect(await drain(reset, upTo: "synced").map(\.name) == ["reset", "snapshot", "synced"])
    }

    /// A kernel history that answers only once let go.
    actor HeldHistory: ChangeLog {
        private var waiting: [CheckedContinuation<Void, Never>] = []
        private var held = true
        let answer: StateChanges
        init(answer: StateChanges) { self.answer = answer }

        func changes(under prefixes: [String], since: UInt64, timeout: Duration) async throws -> StateChanges? {
            if held { await withCheckedContinuation { waiting.append($0) } }
            return answer
        }

        var waiters: Int { waiting.count }

        func letGo() {
            held = false
            for waiter in waiting { waiter.resume() }
            waiting.removeAll()
        }
    }

    @Test("at most 4 resumes read the kernel's history at once (each answer may be megabytes): a fifth gets a reset and the snapshot at once")
    func kernelResumesBounded() async throws {
        let history = HeldHistory(answer: StateChanges(changes: [], sequence: 200))
        let feed = StateFeed(prefixes: [""], history: 100, changeLog: history, logger: Logger(label: "test"))
        await feed.receive(update("/a", 150, "1", snapshot: true))
        await feed.receive(.synced(sequence: 200))
        await withDiscardingTaskGroup { group in
            for _ in 0..<StateFeed.kernelResumesAtOnce {
                group.addTask { _ = await feed.attach(prefixes: ["/"], since: 50) }
            }
            // Each of them waits in the kernel's history (the feed is free meanwhile).
            var turns = 0
            while await history.waiters < StateFeed.kernelResumesAtOnce, turns < 100_000 {
                turns += 1
                await Task.yield()
            }
            #expect(await history.waiters == StateFeed.kernelResumesAtOnce)
            // Bounded: were it to wait for the history too, it would wait for the letGo below.
            let fifth = try? await within(5, "a fifth resume, answered at once") {
                let (_, events, _) = await feed.attach(prefixes: ["/"], since: 50)
                return await drain(events, upTo: "synced").map(\.name)
            }
            await history.letGo()
            #expect(fifth == ["reset", "snapshot", "synced"])
            #expect(await feed.counters.kernelResumesDeclined == 1)
        }
        #expect(await feed.counters.kernelResumes == StateFeed.kernelResumesAtOnce)
        // Once they are done, the kernel's history serves resumes again.
        let (_, later, _) = await feed.attach(prefixes: ["/"], since: 50)
        #expect(await drain(later, upTo: "synced").map(\.name) == ["synced"])
        #expect(await feed.counters.kernelResumes == StateFeed.kernelResumesAtOnce + 1)
    }

    @Test("the gateway stopping (its follow task cancelled) ends the feed without a warning")
    func stoppingIsNoProblem() async throws {
        let kernel = try await TestKernel.start()
        let client = try await BusClient(brokers: [kernel.endpoints.broker], state: [kernel.stateEndpoints])
        let subscription = try await client.subscribe(prefixes: ["/client/"])
        let log = LogLines()
        let feed = StateFeed(prefixes: ["/client/"], history: 10, logger: log.logger("test"))
        let following = Task { await feed.follow(subscription) }
        try await within(20, "the feed synced") { await feed.waitUntilSynced() }
        following.cancel()
        try await within(20, "the feed ended") { await following.value }
        #expect(log.lines.value.isEmpty, "\(log.text)")
        await subscription.cancel()
        await client.close()
        await kernel.stop()
    }
}
