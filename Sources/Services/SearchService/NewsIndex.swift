import Contracts
import BusProtocol
import Catalog
import Foundation

/// The NewsAPI sources, by id.
struct SourceIndex: Sendable {
    let sources: [NewsSource]
    let ids: Set<String>

    init(_ sources: [NewsSource]) {
        self.sources = sources.sorted { ($0.name.lowercased(), $0.id) < ($1.name.lowercased(), $1.id) }
        ids = Set(sources.map(\.id))
    }

    /// The languages and categories present, for errors about a filter that matches nothing.
    var languages: [String] { Set(sources.compactMap(\.language)).sorted() }
    var categories: [String] { Set(sources.compactMap(\.category)).sorted() }
}

/// The headlines, newest first, without NewsAPI's `[Removed]` placeholders.
struct HeadlineIndex: Sendable {
    let articles: [Article]
    let removed: Int

    init(_ articles: [Article]) {
        let shown = articles.filter { !$0.removed }
        removed = articles.count - shown.count
        // Newest first; an unreadable date sorts last; ties by URL for a stable order.
        let dated = shown.map { (article: $0, date: Timestamp.parse($0.publishedAt)) }
        self.articles = dated.sorted { a, b in
            switch (a.date, b.date) {
            case let (x?, y?) where x != y: return x > y
            case (_?, nil): return true
            case (nil, _?): return false
            default: return a.article.url < b.article.url
            }
        }.map(\.article)
    }

    /// The articles from any of `sources`, newest first.
    func from(_ sources: Set<String>) -> [Article] {
        articles.filter { article in article.source.id.map(sources.contains) ?? false }
    }
}

/// The flights, outbound first, each direction by id.
struct FlightIndex: Sendable {
    let flights: [Flight]

    init(_ flights: [Flight]) {
        self.flights = flights.sorted { ($0.direction == .outbound ? 0 : 1, $0.id) < ($1.direction == .outbound ? 0 : 1, $1.id) }
    }
}

/// The airlines, by id.
struct AirlineIndex: Sendable {
    let airlines: [String: Airline]

    init(_ airlines: [Airline]) {
        self.airlines = Dictionary(airlines.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
    }
}
