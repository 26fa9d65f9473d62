import BusProtocol
import Foundation

/// A key with its value and revisions, as etcd keeps it.
public struct EtcdKeyValue: Sendable, Equatable {
    public var key: [UInt8]
    public var value: [UInt8]
    /// The revision of the write that created the key (since it was last deleted).
    public var createRevision: Int64
    /// The revision of the last write to it.
    public var modRevision: Int64
    /// Writes to it since it was created (1 for the first).
    public var version: Int64
    /// The lease it is attached to (0: none).
    public var lease: Int64

    public init(key: [UInt8], value: [UInt8], createRevision: Int64 = 0, modRevision: Int64 = 0, version: Int64 = 0, lease: Int64 = 0) {
        (self.key, self.value, self.createRevision, self.modRevision, self.version, self.lease) =
            (key, value, createRevision, modRevision, version, lease)
    }

    public var keyString: String { String(decoding: key, as: UTF8.self) }
    public var valueString: String { String(decoding: value, as: UTF8.self) }
}

/// What a range read found.
public struct EtcdRange: Sendable, Equatable {
    public var keyValues: [EtcdKeyValue]
    /// How many keys are in the range (more than `keyValues` holds when a limit cut it).
    public var count: Int64
    /// Whether a limit left keys out.
    public var more: Bool
    /// The store's revision the read saw.
    public var revision: Int64
}

/// One condition of a transaction, on one key.
public struct EtcdCompare: Sendable, Equatable {
    public enum Target: Sendable, Equatable {
        /// The revision of the key's last write; 0 when it does not exist.
        case modRevision(Int64)
        /// The revision that created it; 0 when it does not exist.
        case createRevision(Int64)
        /// Writes since it was created; 0 when it does not exist.
        case version(Int64)
        case value([UInt8])
    }

    public enum Result: String, Sendable {
        case equal = "EQUAL", notEqual = "NOT_EQUAL", greater = "GREATER", less = "LESS"
    }

    public var key: [UInt8]
    public var result: Result
    public var target: Target

    public init(key: [UInt8], _ result: Result = .equal, _ target: Target) {
        (self.key, self.result, self.target) = (key, result, target)
    }

    /// The key does not exist.
    public static func absent(_ key: [UInt8]) -> EtcdCompare { EtcdCompare(key: key, .equal, .createRevision(0)) }
}

/// One operation of a transaction.
public enum EtcdOperation: Sendable, Equatable {
    case put(key: [UInt8], value: [UInt8], lease: Int64 = 0)
    /// Deletes `key`, or every key from `key` up to `end` (exclusive) when `end` is given.
    case delete(key: [UInt8], end: [UInt8]? = nil)
    case range(key: [UInt8], end: [UInt8]? = nil)
}

/// What a transaction did.
public struct EtcdTransaction: Sendable, Equatable {
    /// Whether every comparison held (the success operations ran) or not (the failure ones).
    public var succeeded: Bool
    /// The store's revision after it: the revision of its writes, if it wrote.
    public var revision: Int64
    /// What each range operation of the branch that ran read, in order (writes give none).
    public var ranges: [EtcdRange]
    /// How many keys each delete operation of the branch that ran deleted, in order.
    public var deleted: [Int64]
}

/// A lease: keys attached to it are deleted when it expires.
public struct EtcdLease: Sendable, Equatable {
    public var id: Int64
    /// Seconds left (as granted, or at the last keep-alive).
    public var ttl: Int64
}

/// A change a watch saw.
public struct EtcdEvent: Sendable, Equatable {
    public enum Kind: Sendable { case put, delete }
    public var kind: Kind
    /// The key after the change; for a delete, its key and the delete's revision (`modRevision`).
    public var keyValue: EtcdKeyValue
}

/// What a watch delivers.
public enum EtcdWatchUpdate: Sendable, Equatable {
    /// Changes, in revision order; `revision` is the store's revision when they were sent.
    case events([EtcdEvent], revision: Int64)
    /// Nothing changed under the watch up to `revision` (a progress notification).
    case progress(revision: Int64)
    /// The revisions the watch was to start from are gone (compacted up to `revision`): the
    /// watch ends; read the range again and watch from its revision.
    case compacted(revision: Int64)
}

extension EtcdClient {
    /// The end of the range of every key that starts with `prefix`: the prefix with its last
    /// byte that can grow grown by one (etcd's `range_end` for a prefix); `[0]` (every key)
    /// for an empty prefix.
    public static func prefixEnd(_ prefix: [UInt8]) -> [UInt8] {
        var end = prefix
        while let last = end.last {
            if last < 0xFF {
                end[end.count - 1] = last + 1
                return end
            }
            end.removeLast()
        }
        return [0]
    }
}

// MARK: The JSON gateway's encoding

/// etcd's JSON gateway speaks proto3 JSON: bytes as base64, 64-bit integers as strings,
/// fields at their default (0, false, empty) left out.
enum GatewayJSON {
    static func bytes(_ value: [UInt8]) -> JSONValue { .string(Data(value).base64EncodedString()) }
    static func int(_ value: Int64) -> JSONValue { .string(String(value)) }

    static func bytes(_ value: JSONValue?) -> [UInt8] {
        guard let text = value?.stringValue, let data = Data(base64Encoded: text) else { return [] }
        return Array(data)
    }

    static func int(_ value: JSONValue?) -> Int64 {
        if let text = value?.stringValue { return Int64(text) ?? 0 }
        return value?.intValue ?? 0
    }

    static func keyValue(_ json: JSONValue) -> EtcdKeyValue {
        EtcdKeyValue(key: bytes(json["key"]), value: bytes(json["value"]), createRevision: int(json["create_revision"]),
                     modRevision: int(json["mod_revision"]), version: int(json["version"]), lease: int(json["lease"]))
    }

    static func range(_ json: JSONValue) -> EtcdRange {
        EtcdRange(keyValues: (json["kvs"]?.arrayValue ?? []).map(keyValue), count: int(json["count"]),
                  more: json["more"]?.boolValue ?? false, revision: revision(json))
    }

    static func revision(_ json: JSONValue) -> Int64 { int(json["header"]?["revision"]) }

    static func rangeRequest(key: [UInt8], end: [UInt8]?, revision: Int64? = nil, limit: Int64? = nil) -> JSONValue {
        var request: [String: JSONValue] = ["key": bytes(key)]
        if let end { request["range_end"] = bytes(end) }
        if let revision { request["revision"] = int(revision) }
        if let limit { request["limit"] = int(limit) }
        return .object(request)
    }

    static func putRequest(key: [UInt8], value: [UInt8], lease: Int64) -> JSONValue {
        var request: [String: JSONValue] = ["key": bytes(key), "value": bytes(value)]
        if lease != 0 { request["lease"] = int(lease) }
        return .object(request)
    }

    static func deleteRequest(key: [UInt8], end: [UInt8]?) -> JSONValue {
        var request: [String: JSONValue] = ["key": bytes(key)]
        if let end { request["range_end"] = bytes(end) }
        return .object(request)
    }

    static func compare(_ compare: EtcdCompare) -> JSONValue {
        var json: [String: JSONValue] = ["key": bytes(compare.key), "result": .string(compare.result.rawValue)]
        switch compare.target {
        case .modRevision(let revision): (json["target"], json["mod_revision"]) = ("MOD", int(revision))
        case .createRevision(let revision): (json["target"], json["create_revision"]) = ("CREATE", int(revision))
        case .version(let version): (json["target"], json["version"]) = ("VERSION", int(version))
        case .value(let value): (json["target"], json["value"]) = ("VALUE", bytes(value))
        }
        return .object(json)
    }

    static func operation(_ operation: EtcdOperation) -> JSONValue {
        switch operation {
        case .put(let key, let value, let lease): ["request_put": putRequest(key: key, value: value, lease: lease)]
        case .delete(let key, let end): ["request_delete_range": deleteRequest(key: key, end: end)]
        case .range(let key, let end): ["request_range": rangeRequest(key: key, end: end)]
        }
    }

    static func event(_ json: JSONValue) -> EtcdEvent {
        // PUT is the enum's default (0), which proto3 JSON leaves out.
        EtcdEvent(kind: json["type"]?.stringValue == "DELETE" ? .delete : .put, keyValue: keyValue(json["kv"] ?? .null))
    }
}
