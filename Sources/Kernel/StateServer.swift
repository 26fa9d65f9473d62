import BusProtocol
import Foundation
import Logging
import ZeroMQ

/// The Clustered Hashmap server (12/CHP): a sequenced key-value map with snapshots,
/// published updates, TTL expiry and a collector for clients' writes.
///
/// Loop-confined like the broker. The publisher is an XPUB: when a subscription arrives it
/// publishes a HUGZ at once, so a subscriber can wait for its first HUGZ to know its
/// subscription is live before it asks for the snapshot (no update can fall between the
/// two). Sequence numbers start from the wall clock in microseconds, so they keep growing
/// across kernel restarts as long as fewer than a million updates a second are published.
final class StateServer {
    struct Entry {
        var sequence: UInt64
        var value: Frame
        var expiresAt: UInt64?
    }

    let configuration: KernelConfiguration
    let logger: Logger
    /// Sends on the snapshot ROUTER and on the publisher XPUB.
    var sendSnapshot: (Message) -> Void = { _ in }
    var publish: (Message) -> Void = { _ in }

    private(set) var entries: [String: Entry] = [:]
    private(set) var sequence: UInt64
    private(set) var rejectedWrites = 0
    private var lastPublished: UInt64 = 0
    private var expiring = 0

    init(configuration: KernelConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        sequence = UInt64(Date().timeIntervalSince1970 * 1_000_000)
    }

    // MARK: Writes

    /// Sets (or, with an empty value, deletes) `key`, publishes the change and returns its
    /// sequence number. A `ttl` in seconds deletes the key when it runs out.
    @discardableResult
    func set(_ key: String, value: Frame, ttl: Double? = nil, now: UInt64) -> UInt64 {
        let properties = ttl.map { ttl in "ttl=\(ttl == ttl.rounded() ? String(Int(ttl)) : String(ttl))\n" } ?? ""
        return set(key, keyFrame: Frame(key), value: value, ttl: ttl, uuid: Frame(), properties: Frame(properties), now: now)
    }

    /// The same with the frames to publish already at hand: a KVSET's own key, UUID,
    /// properties and value frames are published as they came, without copying.
    private func set(_ key: String, keyFrame: Frame, value: Frame, ttl: Double?, uuid: Frame, properties: Frame, now: UInt64) -> UInt64 {
        sequence += 1
        let old: Entry?
        if value.isEmpty {
            old = entries.removeValue(forKey: key)
        } else {
            let expiresAt = ttl.map { now + UInt64($0 * 1e9) }
            if expiresAt != nil { expiring += 1 }
            old = entries.updateValue(Entry(sequence: sequence, value: value, expiresAt: expiresAt), forKey: key)
        }
        if old?.expiresAt != nil { expiring -= 1 }
        publish([keyFrame, CHP.sequenceFrame(sequence), uuid, properties, value])
        lastPublished = now
        return sequence
    }

    /// A KVSET from the collector: applied when its key is under a writable prefix.
    func collect(_ message: Message, now: UInt64) {
        let entry: KVEntry
        do {
            entry = try CHP.decodeKVSet(message)
        } catch {
            rejectedWrites += 1
            logger.debug("dropped malformed KVSET", metadata: ["problem": "\(error)"])
            return
        }
        guard configuration.collectorWritablePrefixes.contains(where: { entry.key.hasPrefix($0) }) else {
            rejectedWrites += 1
            logger.info("refused KVSET outside the writable prefixes", metadata: ["key": "\(entry.key)"])
            return
        }
        _ = set(entry.key, keyFrame: message[0], value: message[4], ttl: entry.ttl, uuid: message[2], properties: message[3], now: now)
    }

    // MARK: Reads

    /// Answers ICANHAZ? with every entry of the subtree, then KTHXBAI with the current
    /// sequence: updates after it are exactly those still to come on the publisher.
    func snapshot(_ message: Message) {
        let request: (client: Frame, subtree: String)
        do {
            request = try CHP.decodeSnapshotRequest(message)
        } catch {
            logger.debug("dropped malformed snapshot request", metadata: ["problem": "\(error)"])
            return
        }
        for (key, entry) in entries where key.hasPrefix(request.subtree) {
            sendSnapshot(CHP.kvsync(KVEntry(key: key, sequence: entry.sequence, value: entry.value), to: request.client))
        }
        sendSnapshot(CHP.kthxbai(sequence: sequence, subtree: request.subtree, to: request.client))
    }

    /// Entries under `prefix`, sorted by key.
    func entries(under prefix: String) -> [(key: String, entry: Entry)] {
        entries.filter { $0.key.hasPrefix(prefix) }.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
    }

    // MARK: Publisher events and time

    /// A subscription or unsubscription reached the XPUB: greet subscribers with a HUGZ.
    func subscriptionChanged(_ message: Message, now: UInt64) {
        guard let first = message.first, first.count >= 1, first.withUnsafeBytes({ $0[0] }) == 1 else { return }
        publish(CHP.hugz())
        lastPublished = now
    }

    /// Expires TTL entries and sends HUGZ when nothing was published for an interval.
    func tick(now: UInt64) {
        if expiring > 0 {
            let expired = entries.compactMap { key, entry in (entry.expiresAt ?? .max) <= now ? key : nil }
            for key in expired.sorted() { set(key, value: Frame(), now: now) }
        }
        if now &- lastPublished >= configuration.hugzInterval.nanoseconds {
            publish(CHP.hugz())
            lastPublished = now
        }
    }
}
