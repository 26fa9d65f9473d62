import BusKit
import BusProtocol
import Contracts
import Foundation
import Logging

/// Streams that capture the kernel's state (`captureState`): the service follows the state
/// under each one's subjects (12/CHP) and keeps every change as a message, so a key's changes
/// outlive the kernel's bounded history.
///
/// Each capturing stream is followed by one subscription that resumes after the state's
/// sequence the stream holds (a new stream starts from the current values); what arrives
/// together is written in one transaction that keeps only the changes newer than that
/// sequence, and moves it. So a change is kept once, in the state's order, however many
/// `streams` processes follow the stream, and after a restart of the service, its database or
/// the kernel, capturing goes on where the stream stopped. When the kernel no longer holds
/// every change since then (its history is bounded), the keys' latest values are kept and the
/// stream counts a gap.
extension StreamsService {
    /// How often the capturing streams are read again, for those another process added or
    /// deleted (this process's own are seen at once).
    static let capturesLookAgain: Duration = .seconds(2)
    /// A subscription or write that failed is tried again after this.
    static let captureRetry: Duration = .seconds(1)
    /// Changes written in one transaction at most.
    static let captureBatch = 500

    /// Runs the captures until cancelled: first makes the streams the configuration names
    /// (`streams.capture`), then follows every capturing stream, each in a child task that
    /// ends when its stream is deleted or made again (then followed anew).
    func captureState(_ client: BusClient) async {
        await addConfiguredCaptures()
        await withDiscardingTaskGroup { group in
            while !Task.isCancelled {
                if let captures = try? await read({ db in try StreamsDatabase.captures(db) }) {
                    let current = Dictionary(uniqueKeysWithValues: captures.map { ($0.stream, $0) })
                    // Deleted, or made again (over other subjects, or the same: its changes start anew).
                    let gone = following.filter { name, followed in current[name]?.isTheStream(followed) != true }.keys
                    if !gone.isEmpty {
                        stale.formUnion(gone)
                        wakeAll(.streams)
                    }
                    for capture in captures where following[capture.stream] == nil {
                        following[capture.stream] = capture
                        group.addTask { await self.follow(capture, client) }
                    }
                }
                await waitForWake(.streams, upTo: Self.capturesLookAgain)
            }
        }
    }

    /// Follows one capturing stream until the coordinator finds it deleted or changed, its
    /// writes find that, or the task is cancelled; then it may be followed anew.
    private func follow(_ capture: StreamsDatabase.Capture, _ client: BusClient) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.keepFollowing(capture, client) }
            group.addTask {
                while !Task.isCancelled, await !self.stale.contains(capture.stream) {
                    await self.waitForWake(.streams, upTo: Self.capturesLookAgain)
                }
            }
            await group.next()
            group.cancelAll()
        }
        following[capture.stream] = nil
        stale.remove(capture.stream)
    }

    /// The streams `streams.capture` names, added as capturing streams with the service's
    /// defaults (the same again changes nothing); tried again until the database answers. One
    /// there already, capturing the same prefixes with limits an operator changed since
    /// (`stream.update`), is the configured stream, its limits kept.
    private func addConfiguredCaptures() async {
        for (name, subjects) in configuration.capture.sorted(by: { $0.key < $1.key }) {
            while !Task.isCancelled {
                do {
                    _ = try await addStream(API.StreamConfig(name: name, subjects: subjects, captureState: true))
                    break
                } catch let error as JSONRPCError where error.code == JSONRPCError.conflictCode
                            && error.data?["current"]?["captureState"] == true
                            && Set(error.data?["current"]?["subjects"]?.arrayValue?.compactMap(\.stringValue) ?? []) == Set(subjects) {
                    break
                } catch let error as JSONRPCError where error.code != JSONRPCError.storageFailedCode {
                    logger.error("cannot add the capturing stream streams.capture names", metadata: ["stream": "\(name)", "problem": "\(error.message)"])
                    break
                } catch {
                    try? await Task.sleep(for: Self.captureRetry)
                }
            }
        }
    }

    /// Keeps one stream's changes until its writes find it deleted or made again, or the task
    /// is cancelled; a subscription or write that fails starts again from what the stream holds.
    private nonisolated func keepFollowing(_ capture: StreamsDatabase.Capture, _ client: BusClient) async {
        var position = capture.capturedSequence
        while !Task.isCancelled {
            var subscription: Subscription?
            do {
                subscription = try await client.subscribe(prefixes: capture.subjects, since: position > 0 ? UInt64(position) : nil)
                if let subscription { try await keep(subscription, for: capture, position: &position) }
            } catch let error as JSONRPCError where [JSONRPCError.notFoundCode, JSONRPCError.invalidParamsCode, JSONRPCError.conflictCode].contains(error.code) {
                // The stream was deleted, or made again.
                await subscription?.cancel()
                return
            } catch {
                if !Task.isCancelled {
                    logger.warning("capturing the state stopped; starting again", metadata: ["stream": "\(capture.stream)", "problem": "\(error)"])
                }
            }
            await subscription?.cancel()
            try? await Task.sleep(for: Self.captureRetry)
        }
    }

    /// Writes the subscription's changes into the stream as they come: what arrived together
    /// in one write, and a sync's changes (which come by key, not in order) all at once when it
    /// is done. `position` follows the stream's captured sequence.
    private nonisolated func keep(_ subscription: Subscription, for capture: StreamsDatabase.Capture, position: inout Int) async throws {
        var changes: [StreamsDatabase.StateChange] = []
        var syncing = true, gap = false
        var event = try await subscription.next()
        while let current = event {
            switch current {
            case .update(let update):
                changes.append(StreamsDatabase.StateChange(key: update.key, sequence: Int(clamping: update.sequence),
                                                            value: update.isDelete ? nil : update.value.bytes))
            case .synced, .resynced:
                syncing = false
            case .missed, .reset:
                (syncing, gap) = (true, true)
            }
            if changes.count < Self.captureBatch, let more = subscription.nextIfReady() {
                event = more
                continue
            }
            if !syncing, !changes.isEmpty || gap {
                let batch = changes, missed = gap
                let (maxMessageBytes, most) = (configuration.maxMessageBytes, configuration.removedPerTransaction)
                position = try await write(request: nil) { db, now in
                    try StreamsDatabase.capture(db, capture, changes: batch, gap: missed, maxMessageBytes: maxMessageBytes, removingAtMost: most, now: now)
                }
                (changes, gap) = ([], false)
                await wakeAll(.message)
            }
            event = try await subscription.next()
        }
    }
}
