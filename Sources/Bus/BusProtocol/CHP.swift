@_exported public import Frames

/// 12/CHP, the Clustered Hashmap Protocol: frames exactly as in the RFC.
///
/// Snapshot port (ROUTER/DEALER): `ICANHAZ?` then `KVSYNC`… `KTHXBAI`. Publisher port
/// (PUB/SUB): `KVPUB` and `HUGZ`. Collector port (SUB/PUB): `KVSET`. Every KV command has
/// five frames: key, sequence (8 bytes, network order), UUID, properties, value.
public enum CHP {
    public static let icanhazCommand = "ICANHAZ?"
    public static let kthxbaiCommand = "KTHXBAI"
    public static let hugzCommand = "HUGZ"
}

/// One key-value update. An empty value deletes the key.
public struct KVEntry: Sendable, Equatable {
    public var key: String
    public var sequence: UInt64
    /// A 16-byte UUID, or empty.
    public var uuid: [UInt8]
    /// `name=value` properties, in order (`ttl` is the one CHP defines).
    public var properties: [(name: String, value: String)]
    public var value: Frame

    public init(key: String, sequence: UInt64 = 0, uuid: [UInt8] = [], properties: [(name: String, value: String)] = [], value: Frame) {
        self.key = key
        self.sequence = sequence
        self.uuid = uuid
        self.properties = properties
        self.value = value
    }

    /// Whether this update deletes its key.
    public var isDelete: Bool { value.isEmpty }

    /// The value of the named property, if present.
    public func property(_ name: String) -> String? {
        properties.first { $0.name == name }?.value
    }

    /// The `ttl` property in seconds, if present and within ``TimeToLive/range``.
    public var ttl: Double? {
        property("ttl").flatMap(Double.init).flatMap { TimeToLive(seconds: $0)?.seconds }
    }

    public static func == (lhs: KVEntry, rhs: KVEntry) -> Bool {
        lhs.key == rhs.key && lhs.sequence == rhs.sequence && lhs.uuid == rhs.uuid
            && lhs.properties.elementsEqual(rhs.properties, by: { $0.name == $1.name && $0.value == $1.value })
            && lhs.value == rhs.value
    }
}

/// What a client's snapshot connection receives.
public enum SnapshotReply: Sendable, Equatable {
    case entry(KVEntry)
    /// The end of the snapshot: the highest sequence it covers, and the subtree asked for.
    /// `since`: the entries before it were the changes after that sequence, in order and
    /// deletions included (the kernel held them), not the whole subtree.
    case done(sequence: UInt64, subtree: String, since: UInt64?)
}

/// What a client's subscriber connection receives.
public enum PublishedUpdate: Sendable, Equatable {
    case entry(KVEntry)
    /// A keep-alive; from a Switchboard kernel it also says how many updates it has
    /// published under each topic subscribed, so a subscriber can count what it missed.
    case hugz(published: [String: UInt64])
}

extension CHP {
    // MARK: Encoders

    /// `ICANHAZ?` for the client's DEALER snapshot socket. `since` (a Switchboard extension,
    /// a third frame a plain CHP client never sends): the sequence the client's view is at;
    /// a kernel that still holds every change after it sends those instead of the snapshot
    /// and says so in its `KTHXBAI` (``SnapshotReply/done(sequence:subtree:since:)``).
    /// `changesOnly` (a fourth frame): when it does not hold them, a bare `KTHXBAI` rather than
    /// the whole subtree, for a client that wants the changes or nothing.
    public static func icanhaz(subtree: String, since: UInt64? = nil, changesOnly: Bool = false) -> Message {
        guard let since else { return [Frame(icanhazCommand), Frame(subtree)] }
        guard changesOnly else { return [Frame(icanhazCommand), Frame(subtree), sequenceFrame(since)] }
        return [Frame(icanhazCommand), Frame(subtree), sequenceFrame(since), Frame(changesOnlyFlag)]
    }

    static let changesOnlyFlag = "changes-only"

    /// `KVSYNC` to `client`, for the server's ROUTER snapshot socket.
    public static func kvsync(_ entry: KVEntry, to client: Frame) -> Message {
        [client, Frame(entry.key), sequenceFrame(entry.sequence), Frame(), Frame(), entry.value]
    }

    /// `KTHXBAI` to `client`, for the server's ROUTER snapshot socket. `since`: what came
    /// before it were the changes after that sequence (a `since=N` property, which plain
    /// CHP clients ignore).
    public static func kthxbai(sequence: UInt64, subtree: String, since: UInt64? = nil, to client: Frame) -> Message {
        [client, Frame(kthxbaiCommand), sequenceFrame(sequence), Frame(), Frame(since.map { "\(sinceProperty)=\($0)\n" } ?? ""), Frame(subtree)]
    }

    static let sinceProperty = "since"

    /// `KVPUB` (server to subscribers) or `KVSET` (client to collector): the same five frames.
    public static func kv(_ entry: KVEntry) -> Message {
        [Frame(entry.key), sequenceFrame(entry.sequence), Frame(entry.uuid), Frame(encodeProperties(entry.properties)), entry.value]
    }

    /// A `KVPUB` of frames at hand (a KVSET's own key, UUID, properties and value, sent on
    /// uncopied) with the server's `sequence`.
    public struct KVPub: MessageEncoding {
        public var key: Frame
        public var sequence: UInt64
        public var uuid: Frame
        public var properties: Frame
        public var value: Frame

        public init(key: Frame, sequence: UInt64, uuid: Frame, properties: Frame, value: Frame) {
            (self.key, self.sequence, self.uuid, self.properties, self.value) = (key, sequence, uuid, properties, value)
        }

        public func appendFrames(to frames: inout [Frame]) {
            frames.append(key)
            frames.append(sequenceFrame(sequence))
            frames.append(uuid)
            frames.append(properties)
            frames.append(value)
        }
    }

    /// `HUGZ`, the publisher's keep-alive. `published` (a Switchboard extension, in the
    /// value frame, which plain CHP subscribers ignore): for each topic subscribed, how many
    /// updates under it were published since the topic was first subscribed.
    public static func hugz(published: [String: UInt64] = [:]) -> Message {
        var value = Frame()
        if !published.isEmpty {
            value = Frame(JSONValue.object([publishedField: .object(published.mapValues { .int(Int64(clamping: $0)) })]).jsonBytes)
        }
        return [Frame(hugzCommand), sequenceFrame(0), Frame(), Frame(), value]
    }

    static let publishedField = "published"

    public static func sequenceFrame(_ sequence: UInt64) -> Frame {
        withUnsafeBytes(of: sequence.bigEndian) { Frame(copying: $0) }
    }

    static func encodeProperties(_ properties: [(name: String, value: String)]) -> String {
        properties.map { "\($0.name)=\($0.value)\n" }.joined()
    }

    // MARK: Decoders

    /// An `ICANHAZ?` as the server reads it: the client's routing id, the subtree, the sequence
    /// the client resumes from (nil: none) and whether only the changes are wanted.
    public typealias SnapshotRequest = (client: Frame, subtree: String, since: UInt64?, changesOnly: Bool)

    /// Decodes `ICANHAZ?` as the server's ROUTER receives it: `[client, "ICANHAZ?", subtree]`,
    /// or with the sequence the client is at as a third frame and `changes-only` as a fourth
    /// (``icanhaz(subtree:since:changesOnly:)``). Returns the client's routing id, the subtree,
    /// that sequence and whether only the changes are wanted.
    public static func decodeSnapshotRequest(_ message: Message) throws(ProtocolError) -> SnapshotRequest {
        let frames = message.frames
        guard (3...5).contains(frames.count) else {
            throw ProtocolError("CHP", "ICANHAZ? has \(frames.count - 1) frames, expected 2 (or 3 with a sequence, 4 with changes-only)")
        }
        guard frames[1].equals(icanhazCommand) else { throw ProtocolError("CHP", "expected ICANHAZ?, got \(frames[1])") }
        guard let subtree = frames[2].string, isValidSubtree(subtree) else {
            throw ProtocolError("CHP", "subtree must be empty or a path ending in '/' (got \(frames[2]))")
        }
        guard frames.count >= 4 else { return (frames[0], subtree, nil, false) }
        guard frames[3].count == 8 else { throw ProtocolError("CHP", "ICANHAZ? sequence has \(frames[3].count) bytes, expected 8") }
        guard frames.count == 5 else { return (frames[0], subtree, sequenceValue(frames[3]), false) }
        guard frames[4].equals(changesOnlyFlag) else { throw ProtocolError("CHP", "ICANHAZ? fourth frame must be \(changesOnlyFlag), got \(frames[4])") }
        return (frames[0], subtree, sequenceValue(frames[3]), true)
    }

    /// Decodes what the client's DEALER snapshot socket receives.
    public static func decodeSnapshotReply(_ message: Message) throws(ProtocolError) -> SnapshotReply {
        let (key, sequence, _, properties, value) = try fiveFrames(message, "KVSYNC")
        if key == kthxbaiCommand {
            guard let subtree = value.string else { throw ProtocolError("CHP", "KTHXBAI subtree is not UTF-8") }
            let since = try decodeProperties(properties).first { $0.name == sinceProperty }.map { property throws(ProtocolError) in
                guard let since = UInt64(property.value) else { throw ProtocolError("CHP", "KTHXBAI since is not a sequence: \(property.value.prefix(40))") }
                return since
            }
            return .done(sequence: sequence, subtree: subtree, since: since)
        }
        return .entry(KVEntry(key: key, sequence: sequence, value: value))
    }

    /// Decodes what the client's SUB socket receives: `KVPUB` or `HUGZ`.
    public static func decodeUpdate(_ message: Message) throws(ProtocolError) -> PublishedUpdate {
        let (key, sequence, uuid, properties, value) = try fiveFrames(message, "KVPUB")
        if key == hugzCommand { return .hugz(published: try decodePublished(value)) }
        return .entry(KVEntry(key: key, sequence: sequence, uuid: uuid, properties: try decodeProperties(properties), value: value))
    }

    /// The counts a `HUGZ` carries: none when its value is empty (a plain CHP server).
    private static func decodePublished(_ value: Frame) throws(ProtocolError) -> [String: UInt64] {
        guard !value.isEmpty else { return [:] }
        guard case .object(let fields)? = try? JSONValue(parsing: value.bytes), case .object(let topics)? = fields[publishedField] else {
            throw ProtocolError("CHP", "HUGZ value is not {\"\(publishedField)\": {topic: count}}")
        }
        var counts: [String: UInt64] = [:]
        for (topic, count) in topics {
            guard case .int(let count) = count, count >= 0 else { throw ProtocolError("CHP", "HUGZ count for \(topic) is not a count") }
            counts[topic] = UInt64(count)
        }
        return counts
    }

    /// Decodes a `KVSET` the server's collector (SUB) socket receives.
    public static func decodeKVSet(_ message: Message) throws(ProtocolError) -> KVEntry {
        let frames = message.frames
        let properties = try checkedKVSetProperties(frames)
        return KVEntry(key: String(decoding: frames[0].bytes, as: UTF8.self), sequence: sequenceValue(frames[1]), uuid: frames[2].bytes,
                       properties: properties, value: frames[4])
    }

    /// Checks a `KVSET` as ``decodeKVSet(_:)`` does, without building its key or entry (the
    /// kernel keys its state by the key's bytes); returns its `ttl` property. A `ttl` that is
    /// no number of seconds within ``TimeToLive/range`` makes the KVSET malformed (it is
    /// refused, never converted).
    public static func checkKVSet(_ message: Message) throws(ProtocolError) -> TimeToLive? {
        try checkKVSet(parts: message.frames)
    }

    /// The same, read where the socket received it (the kernel's collector).
    public static func checkKVSet(_ parts: ReceivedParts) throws(ProtocolError) -> TimeToLive? {
        try checkKVSet(parts: parts)
    }

    private static func checkKVSet(parts: some MessageParts) throws(ProtocolError) -> TimeToLive? {
        let properties = try checkedKVSetProperties(parts)
        guard let text = properties.first(where: { $0.name == "ttl" })?.value else { return nil }
        guard let seconds = Double(text), let ttl = TimeToLive(seconds: seconds) else {
            throw ProtocolError("CHP", "KVSET ttl must be \(TimeToLive.rangeDescription), got '\(text.prefix(40))'")
        }
        return ttl
    }

    /// The one check of a `KVSET`'s frames; returns its properties, decoded once.
    private static func checkedKVSetProperties(_ frames: some MessageParts) throws(ProtocolError) -> [(name: String, value: String)] {
        guard frames.count == 5 else { throw ProtocolError("CHP", "KVSET has \(frames.count) frames, expected 5") }
        guard !frames.isEmpty(0), frames.withPart(0, Frame.isUTF8) else { throw ProtocolError("CHP", "KVSET key must be non-empty UTF-8") }
        guard !frames.part(0, equals: hugzFrame), !frames.part(0, equals: kthxbaiFrame) else {
            throw ProtocolError("CHP", "KVSET may not use the reserved key \(frames.frame(0))")
        }
        try checkSequenceAndUUID(frames, "KVSET")
        return frames.isEmpty(3) ? [] : try decodeProperties(frames.frame(3))
    }
    private static let hugzFrame = Frame(hugzCommand)
    private static let kthxbaiFrame = Frame(kthxbaiCommand)

    /// Whether `prefix` can match a key: keys are paths, so a prefix is empty (every key) or
    /// starts with '/'. Any other would be followed in silence, matching nothing.
    public static func isKeyPrefix(_ prefix: String) -> Bool {
        prefix.isEmpty || prefix.hasPrefix("/")
    }

    /// Whether `subtree` is a valid subtree specification: empty, or `/segment/…/`.
    public static func isValidSubtree(_ subtree: String) -> Bool {
        subtree.isEmpty || (subtree.hasPrefix("/") && subtree.hasSuffix("/"))
    }

    private static func fiveFrames(_ message: Message, _ name: String) throws(ProtocolError)
        -> (key: String, sequence: UInt64, uuid: [UInt8], properties: Frame, value: Frame)
    {
        let frames = message.frames
        guard frames.count == 5 else { throw ProtocolError("CHP", "\(name) has \(frames.count) frames, expected 5") }
        guard let key = frames[0].string, !key.isEmpty else { throw ProtocolError("CHP", "\(name) key must be non-empty UTF-8") }
        try checkSequenceAndUUID(frames, name)
        return (key, sequenceValue(frames[1]), frames[2].bytes, frames[3], frames[4])
    }

    private static func checkSequenceAndUUID(_ frames: some MessageParts, _ name: String) throws(ProtocolError) {
        guard frames.partCount(1) == 8 else { throw ProtocolError("CHP", "\(name) sequence has \(frames.partCount(1)) bytes, expected 8") }
        guard frames.partCount(2) == 0 || frames.partCount(2) == 16 else {
            throw ProtocolError("CHP", "\(name) UUID has \(frames.partCount(2)) bytes, expected 0 or 16")
        }
    }

    private static func sequenceValue(_ frame: Frame) -> UInt64 {
        frame.withUnsafeBytes { raw in raw.reduce(UInt64(0)) { $0 << 8 | UInt64($1) } }
    }

    private static func decodeProperties(_ frame: Frame) throws(ProtocolError) -> [(name: String, value: String)] {
        guard !frame.isEmpty else { return [] }
        guard let text = frame.string else { throw ProtocolError("CHP", "properties are not UTF-8") }
        var properties: [(name: String, value: String)] = []
        for line in text.split(separator: "\n", omittingEmptySubsequences: true) {
            guard let equals = line.firstIndex(of: "="), equals != line.startIndex else {
                throw ProtocolError("CHP", "property '\(line.prefix(40))' is not name=value")
            }
            properties.append((String(line[..<equals]), String(line[line.index(after: equals)...])))
        }
        return properties
    }
}
