import BusKit
import BusProtocol
import Contracts
import Foundation
import Synchronization

/// Publishers and a consumer group on one stream beside the load, through every kill: each
/// message is published with an id until a publish of it is acknowledged (so a publish whose
/// answer was lost is kept once), and readers share the group's messages, fetching them or
/// having them pushed, acknowledging each as they get it. At the end every acknowledged
/// publish must have been done (acknowledged by a reader) exactly once: none lost, none done
/// twice.
final class StreamsCheck: Sendable {
    struct Counts {
        /// Publishes acknowledged, and of them answered as duplicates (a re-send kept once).
        var published = 0
        var duplicates = 0
        /// Publish attempts that failed and were tried again.
        var publishRetries = 0
        var handedOut = 0
        var redelivered = 0
        /// Sequences acknowledged, and acknowledged a second time (never allowed).
        var done = 0
        var doneTwice = 0
        /// Acknowledgements of messages that had already gone to another reader.
        var notPending = 0
        var failures: [String: Int] = [:]
        var unexpected = UnexpectedErrors()
        /// Acknowledged publishes not done by the end.
        var lost = 0
    }

    static let stream = "soak"
    static let consumer = "group"
    let counts = Mutex(Counts())
    /// Set once the readers are to stop.
    private let over = Atomic(false)
    /// Each acknowledged publish's sequence, and how many times each sequence was done.
    private let sequences = Mutex<(published: Set<Int>, done: [Int: Int])>(([], [:]))

    /// The stream and its consumer: a short ack wait, so messages whose reader's answer was
    /// lost come back within the soak, and deliveries enough that none is dead-lettered.
    func prepare(_ client: BusClient) async -> Bool {
        await waitUntil(60) {
            do {
                _ = try await client.call(StreamsAPI.streamAdd, .init(name: Self.stream, subjects: ["soak."]))
                _ = try await client.call(StreamsAPI.consumerAdd, .init(stream: Self.stream, name: Self.consumer, ackWait: 3, maxDeliver: 1_000))
                return true
            } catch {
                return false
            }
        }
    }

    /// Publishes messages one after another until `end`; each is tried again, with its id,
    /// until it is acknowledged (for at most 30 s past `end`).
    func publish(_ client: BusClient, publisher: Int, until end: Date) async {
        var number = 0
        while Date() < end {
            number += 1
            let data: JSONValue = ["publisher": .int(Int64(publisher)), "n": .int(Int64(number))]
            while Date() < end.addingTimeInterval(30) {
                do {
                    let published = try await client.publish(to: "soak.\(publisher)", data, id: "p\(publisher)-\(number)")
                    counts.withLock { counts in
                        counts.published += 1
                        if published.duplicate { counts.duplicates += 1 }
                    }
                    sequences.withLock { _ = $0.published.insert(published.sequence) }
                    break
                } catch {
                    note(error, asking: StreamsAPI.publish)
                    counts.withLock { $0.publishRetries += 1 }
                    try? await Task.sleep(for: .milliseconds(50))
                }
            }
            try? await Task.sleep(for: .milliseconds(10))
        }
    }

    /// Fetches and acknowledges until ``stopReading()``.
    func read(_ client: BusClient) async {
        while !over.load(ordering: .relaxed) {
            do {
                let fetched = try await client.call(StreamsAPI.fetch, .init(stream: Self.stream, consumer: Self.consumer, batch: 20, wait: 0.5))
                counts.withLock { counts in
                    counts.handedOut += fetched.messages.count
                    counts.redelivered += fetched.messages.filter { $0.deliveries > 1 }.count
                }
                if !fetched.messages.isEmpty { await acknowledge(fetched.messages.map(\.sequence), client) }
            } catch {
                note(error, asking: StreamsAPI.fetch)
                try? await Task.sleep(for: .milliseconds(50))
            }
        }
    }

    /// Takes the messages pushed to it (`consumer.next` in parts, as `sb stream sub` does) and
    /// acknowledges each as it comes, until ``stopReading()``. A push that ends (at its expiry,
    /// or early: its worker drained) or fails (its worker died) is asked for again.
    func readPushed(_ client: BusClient) async {
        let expires = 2.0
        while !over.load(ordering: .relaxed) {
            let parts = client.stream(StreamsAPI.next, .init(stream: Self.stream, consumer: Self.consumer, max: 100, expires: expires),
                                      timeout: .seconds(expires + 30))
            do {
                for try await message in parts {
                    counts.withLock { counts in
                        counts.handedOut += 1
                        if message.deliveries > 1 { counts.redelivered += 1 }
                    }
                    await acknowledge([message.sequence], client)
                }
                _ = try await parts.end()
            } catch {
                note(error, asking: StreamsAPI.nextMethod)
                try? await Task.sleep(for: .milliseconds(50))
            }
        }
    }

    /// Acknowledges `handed` until an acknowledgement is answered (for at most 30 s). After
    /// one whose answer was lost, what the next finds not pending and nobody had done was done
    /// by the lost one (another reader gets it only after its ack wait, and says so).
    private func acknowledge(_ handed: [Int], _ client: BusClient) async {
        var lostOne = false
        let end = Date().addingTimeInterval(30)
        while Date() < end {
            do {
                let answer = try await client.call(StreamsAPI.ack, .init(stream: Self.stream, consumer: Self.consumer, sequences: handed))
                let (twice, foundDone) = sequences.withLock { sequences in
                    var twice = 0, foundDone = 0
                    for sequence in answer.done {
                        sequences.done[sequence, default: 0] += 1
                        if sequences.done[sequence]! > 1 { twice += 1 }
                    }
                    for sequence in answer.notPending where lostOne && sequences.done[sequence] == nil {
                        sequences.done[sequence] = 1
                        foundDone += 1
                    }
                    return (twice, foundDone)
                }
                counts.withLock { counts in
                    counts.done += answer.done.count + foundDone
                    counts.doneTwice += twice
                    counts.notPending += answer.notPending.count - foundDone
                }
                return
            } catch {
                note(error, asking: StreamsAPI.ack)
                lostOne = true
                try? await Task.sleep(for: .milliseconds(50))
            }
        }
    }

    /// Whether every acknowledged publish has been done.
    var allDone: Bool {
        sequences.withLock { sequences in sequences.published.allSatisfy { sequences.done[$0] != nil } }
    }

    func stopReading() { over.store(true, ordering: .relaxed) }

    /// Counts what was published and never done (after the readers stopped).
    func finish() {
        let lost = sequences.withLock { sequences in sequences.published.filter { sequences.done[$0] == nil }.count }
        counts.withLock { $0.lost = lost }
    }

    /// Counts a failed call; none asks for an error, so one that is not an outage's is unexpected.
    private func note<P, R>(_ error: any Error, asking method: Method<P, R>) {
        let kind = (error as? BusError).flatMap { $0.code.map { "\($0)" } } ?? "\(error)".prefix(60).description
        counts.withLock { counts in
            counts.failures[kind, default: 0] += 1
            if (error as? BusError)?.isOutage != true { counts.unexpected.note(error, asking: "\(method.service) \(method.name)") }
        }
    }
}
