import BusProtocol
import Foundation
import Storage

/// The store's writes, validated, as ``StoreDatabase`` runs them.
enum StoreWrite: Sendable {
    /// Adds `text` to the history (an existing one moves to the top), keeps `limit` entries.
    case historyAdd(text: String, limit: Int)
    case historyClear
    /// Saves the article (JSON text) under its URL; `id` is derived from the URL.
    case articleSave(url: String, id: String, article: String)
    case articleDelete(url: String, id: String)
    /// Replaces the selection with `value` (JSON text); given `expected`, only if the
    /// selection is at that revision (0: none yet), else -32004.
    case select(Selection, value: String, expected: Int?)
    /// Keeps a dataset's copy unless a copy fetched later is kept (`fetchedAt`: Unix seconds).
    case snapshotPut(name: String, body: Data, version: String, origin: String, fetchedAt: Double)
}

/// A choice the store keeps, under its name (the `selections` table's key).
enum Selection: String, Sendable {
    case sources
    case route

    /// What a lost compare-and-set says was chosen meanwhile.
    var chosenMeanwhile: String {
        switch self {
        case .sources: "the news sources were"
        case .route: "the route was"
        }
    }
}

/// The store's reads, each answered as ``StoreResults`` shapes it.
enum StoreRead: Sendable {
    case history(limit: Int)
    case articles(offset: Int, limit: Int)
    case article(id: String)
    case selection(Selection)
    case snapshot(name: String)
    case snapshots
}

/// The JSON the store answers with, from the values it read or wrote.
enum StoreResults {
    static func historyAdded(text: String, at: Date, count: Int) -> JSONValue {
        ["text": .string(text), "addedAt": .string(Timestamp.format(at)), "count": .int(Int64(count))]
    }

    static func history(_ entries: [(text: String, addedAt: Double)], count: Int) -> JSONValue {
        ["entries": .array(entries.map { ["text": .string($0.text), "addedAt": .string(Timestamp.format(seconds: $0.addedAt))] }),
         "count": .int(Int64(count))]
    }

    static func cleared(_ count: Int) -> JSONValue { ["cleared": .int(Int64(count))] }

    static func articleSaved(id: String, url: String, at: Date, created: Bool) -> JSONValue {
        ["id": .string(id), "url": .string(url), "savedAt": .string(Timestamp.format(at)), "created": .bool(created)]
    }

    static func savedArticle(id: String, url: String, savedAt: Double, article: String) throws -> JSONValue {
        ["id": .string(id), "url": .string(url), "savedAt": .string(Timestamp.format(seconds: savedAt)),
         "article": try JSONValue(parsing: Array(article.utf8))]
    }

    static func articles(_ articles: [JSONValue], total: Int, offset: Int) -> JSONValue {
        ["articles": .array(articles), "total": .int(Int64(total)), "offset": .int(Int64(offset))]
    }

    static func articleDeleted(url: String, id: String, deleted: Bool) -> JSONValue {
        var result: [String: JSONValue] = ["deleted": .bool(deleted), "url": .string(url), "id": .string(id)]
        if !deleted { result["message"] = "no saved article has this URL" }
        return .object(result)
    }

    /// A selection as answered and published: sources as `{ids, selectedAt}`, the route as
    /// `{outboundId, inboundId, selectedAt}`.
    static func selection(value text: String, selectedAt: Double, revision: Int) throws -> JSONValue {
        let value = try JSONValue(parsing: Array(text.utf8))
        let selectedAt = JSONValue.string(Timestamp.format(seconds: selectedAt)), revision = JSONValue.int(Int64(revision))
        if case .object(var fields) = value {
            fields["selectedAt"] = selectedAt
            fields["revision"] = revision
            return .object(fields)
        }
        return ["ids": value, "selectedAt": selectedAt, "revision": revision]
    }

    /// -32004: the selection `name` moved on from the revision its chooser saw; `current`
    /// (the selection now, null: none) is what won.
    static func selectionConflict(_ selection: Selection, current: JSONValue?, expected: Int) -> JSONRPCError {
        let revision = current?["revision"]?.intValue ?? 0
        return JSONRPCError(code: JSONRPCError.conflictCode,
                            message: "Conflict: \(selection.chosenMeanwhile) chosen meanwhile (revision \(revision), not \(expected)); see data.current and choose again",
                            data: ["revision": .int(revision), "expected": .int(Int64(expected)), "current": current ?? .null])
    }

    static func snapshotStored(name: String, stored: Bool, version: String, size: Int) -> JSONValue {
        ["name": .string(name), "stored": .bool(stored), "version": .string(version), "size": .int(Int64(size))]
    }

    static func snapshot(name: String, body: Data, version: String, origin: String, fetchedAt: Double) -> JSONValue {
        ["name": .string(name), "body": .string(String(decoding: body, as: UTF8.self)), "version": .string(version),
         "origin": .string(origin), "fetchedAt": .string(Timestamp.format(seconds: fetchedAt))]
    }

    static func snapshotEntry(name: String, version: String, origin: String, fetchedAt: Double, size: Int) -> JSONValue {
        ["name": .string(name), "version": .string(version), "origin": .string(origin),
         "fetchedAt": .string(Timestamp.format(seconds: fetchedAt)), "size": .int(Int64(size))]
    }
}
