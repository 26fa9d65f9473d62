public import BusProtocol

/// `store`: the apps' durable state (history, saved articles, selections, the chosen route)
/// and the fetcher's last good dataset copies.
public enum StoreAPI {
    public static let service = "store"

    /// The CHP keys the store publishes.
    public enum StateKeys {
        public static let history = "/store/history"
        public static let articlePrefix = "/store/articles/"
        public static let sourcesSelected = "/store/sources/selected"
        public static let routeSelected = "/store/route/selected"
        public static func article(_ id: String) -> String { articlePrefix + id }
    }

    public static let historyAdd = Method<Text, HistoryAdded>(service, "history.add", "Adds a search to the history (re-adding moves it to the top).", changesState: true)
    public static let historyList = Method<Limit, History>(service, "history.list", "The history, most recent first.")
    public static let historyClear = Method<NoParams, Cleared>(service, "history.clear", "Empties the history.", changesState: true)
    public static let articlesSave = Method<Article, ArticleSaved>(service, "articles.save", "Saves an article (an object with a url), keyed by its URL.", changesState: true)
    public static let articlesList = Method<Page, SavedArticles>(service, "articles.list", "The saved articles, most recently saved first.")
    public static let articlesDelete = Method<URL, ArticleDeleted>(service, "articles.delete", "Deletes a saved article by its URL.", changesState: true)
    public static let sourcesSelect = Method<Sources, SourceSelection>(service, "sources.select", "Replaces the selected news sources; with revision, only if the selection is still at it (else -32004 with data.current).", changesState: true)
    public static let sourcesSelected = Method<NoParams, SourceSelection>(service, "sources.selected", "The selected news sources.")
    public static let routeSelect = Method<Route, RouteSelection>(service, "route.select", "Keeps the chosen route (an outbound and optionally an inbound flight); with revision, only if the choice is still at it (else -32004 with data.current).", changesState: true)
    public static let routeSelected = Method<NoParams, RouteSelection?>(service, "route.selected", "The chosen route, or null.")
    public static let snapshotsPut = Method<Snapshot, SnapshotStored>(service, "snapshots.put", "Keeps the last good copy of a dataset.", changesState: true)
    public static let snapshotsGet = Method<Name, Snapshot?>(service, "snapshots.get", "The last good copy of a dataset, or null when none is kept.")
    public static let snapshotsList = Method<NoParams, [SnapshotEntry]>(service, "snapshots.list", "The datasets with a kept copy: version, origin, size.")

    public struct Text: Codable, Sendable {
        public var text: String
        public init(text: String) { self.text = text }
    }
    public struct Limit: Codable, Sendable {
        public var limit: Int?
        public init(limit: Int? = nil) { self.limit = limit }
    }
    public struct Page: Codable, Sendable {
        public var offset: Int?
        public var limit: Int?
        public init(offset: Int? = nil, limit: Int? = nil) { (self.offset, self.limit) = (offset, limit) }
    }
    public struct Article: Codable, Sendable {
        public var article: JSONValue
        public init(article: JSONValue) { self.article = article }
    }
    public struct URL: Codable, Sendable {
        public var url: String
        public init(url: String) { self.url = url }
    }
    public struct Sources: Codable, Sendable {
        public var ids: [String]
        /// Compare-and-set: the selection's revision the chooser saw (0: none made yet).
        public var revision: Int?
        public init(ids: [String], revision: Int? = nil) { (self.ids, self.revision) = (ids, revision) }
    }
    public struct Route: Codable, Sendable {
        public var outboundId: Int
        public var inboundId: Int?
        /// Compare-and-set: the choice's revision the chooser saw (0: none made yet).
        public var revision: Int?
        public init(outboundId: Int, inboundId: Int?, revision: Int? = nil) {
            (self.outboundId, self.inboundId, self.revision) = (outboundId, inboundId, revision)
        }
    }
    public struct Snapshot: Codable, Sendable {
        public var name: String
        public var body: String
        public var version: String
        public var origin: String
        public var fetchedAt: String
        public init(name: String, body: String, version: String, origin: String, fetchedAt: String) {
            (self.name, self.body, self.version, self.origin, self.fetchedAt) = (name, body, version, origin, fetchedAt)
        }
    }
    public struct Name: Codable, Sendable {
        public var name: String
        public init(name: String) { self.name = name }
    }

    // MARK: Results

    public struct HistoryAdded: Codable, Sendable {
        public var text: String
        public var addedAt: String
        /// Entries in the history now.
        public var count: Int
    }
    public struct History: Codable, Sendable {
        public struct Entry: Codable, Sendable {
            public var text: String
            public var addedAt: String
        }
        public var entries: [Entry]
        public var count: Int
        public init(entries: [Entry], count: Int) { (self.entries, self.count) = (entries, count) }
    }
    public struct Cleared: Codable, Sendable {
        public var cleared: Int
    }
    public struct ArticleSaved: Codable, Sendable {
        /// Derived from the URL.
        public var id: String
        public var url: String
        public var savedAt: String
        /// False when an article with this URL was saved before (it is replaced).
        public var created: Bool
    }
    public struct SavedArticles: Codable, Sendable {
        public struct Entry: Codable, Sendable {
            public var id: String
            public var url: String
            public var savedAt: String
            public var article: JSONValue
        }
        public var articles: [Entry]
        public var total: Int
        public var offset: Int
        public init(articles: [Entry], total: Int, offset: Int) { (self.articles, self.total, self.offset) = (articles, total, offset) }
    }
    public struct ArticleDeleted: Codable, Sendable {
        public var deleted: Bool
        public var url: String
        public var id: String
        public var message: String?
    }
    public struct SourceSelection: Codable, Sendable {
        public var ids: [String]
        /// Absent before any selection was made.
        public var selectedAt: String?
        /// Counts the selections made: 0 before the first. What a compare-and-set gives back.
        public var revision: Int
        public init(ids: [String], selectedAt: String?, revision: Int = 0) { (self.ids, self.selectedAt, self.revision) = (ids, selectedAt, revision) }
    }
    public struct RouteSelection: Codable, Sendable {
        public var outboundId: Int
        public var inboundId: Int?
        public var selectedAt: String
        /// Counts the choices made (1 for the first). What a compare-and-set gives back.
        public var revision: Int
    }
    public struct SnapshotStored: Codable, Sendable {
        public var name: String
        /// False when the store holds a copy fetched later.
        public var stored: Bool
        public var version: String
        public var size: Int
    }
    public struct SnapshotEntry: Codable, Sendable {
        public var name: String
        public var version: String
        public var origin: String
        public var fetchedAt: String
        public var size: Int
    }
}

extension StoreAPI.Limit: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["limit": 1...1_000_000]
}

extension StoreAPI.Page: NumberRanges {
    public static let numberRanges: [String: ClosedRange<Double>] = ["offset": Ranges.offset, "limit": 1...1_000]
}
