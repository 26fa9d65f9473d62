import BusKit
import BusProtocol
import Catalog
import Foundation
import Contracts

// The search service's methods. Each takes one snapshot of the indexes and answers from it
// alone; params are checked first, and a bad one is -32602 naming the field.


/// Limits on params.
enum Limits {
    static let queryLength = 1_000
    static let pageSize = 1...1_000
    static let headlinesPageSize = 1...100
    static let newsCategories = ["business", "entertainment", "general", "health", "science", "sports", "technology"]
}

extension SearchService {
    // MARK: countries.search

    nonisolated func countries(_ params: SearchAPI.Countries) throws -> SearchAPI.CountryResults {
        let query = try checkedQuery(params.query)
        let (offset, limit) = try paging(offset: params.offset, limit: params.limit, defaultLimit: 250)
        let index = indexes.snapshot.countries
        if let region = params.region, !index.hasRegion(region) {
            throw JSONRPCError.invalidParams(field: "region", "no country is in region '\(region)'; known: \(index.knownRegions.joined(separator: ", "))")
        }
        let found = index.search(query, region: params.region)
        let page = found.dropFirst(offset).prefix(limit).map { result in
            SearchAPI.FoundCountry(result.entry.country, match: result.match, fields: result.entry.json)
        }
        return SearchAPI.CountryResults(query: query, region: params.region, total: found.count, offset: offset, limit: limit, countries: Array(page))
    }

    // MARK: locations.search, locations.resolve

    nonisolated func locations(_ params: SearchAPI.Locations) throws -> SearchAPI.PlaceResults {
        let query = try checkedQuery(params.query)
        let (offset, limit) = try paging(offset: params.offset, limit: params.limit, defaultLimit: 100)
        let index = indexes.snapshot.places
        let point = try coordinates(query)
        let found: [(index: Int, km: Double?)] = point.map { point in index.byDistance(from: point).map { ($0.index, $0.km) } }
            ?? index.matching(name: query).map { ($0, nil) }
        let page = found.dropFirst(offset).prefix(limit).map { place(index, $0.index, km: $0.km) }
        return SearchAPI.PlaceResults(query: query, kind: point == nil ? "name" : "coordinates", total: found.count, offset: offset, places: Array(page))
    }

    func resolve(_ params: SearchAPI.Resolve) async throws -> SearchAPI.ResolvedPlace {
        let query = try checkedQuery(params.query)
        guard !query.isEmpty else { throw JSONRPCError.invalidParams(field: "query", "must not be empty: give a place name or 'latitude, longitude'") }
        let index = indexes.snapshot.places
        let kind: String
        let point: Coordinates
        let known: Int?
        if let coordinates = try coordinates(query) {
            point = coordinates
            // The known named place at these coordinates, if there is one.
            known = index.nearestNamed(to: coordinates).flatMap { $0.km <= PlaceIndex.samePlaceKm ? $0.index : nil }
            kind = "coordinates"
        } else {
            guard let found = index.resolve(name: query) else {
                throw JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: no known place is called '\(query)'",
                                   data: ["field": "query"])
            }
            point = index.points[found]
            known = found
            kind = "name"
        }
        let nearest = index.nearestNamed(to: point, excluding: known).map { place(index, $0.index, km: $0.km) }
        // The place resolved; recording it is secondary, so a store problem is reported, not fatal.
        var historyProblem: String?
        do {
            _ = try await store(StoreAPI.historyAdd, StoreAPI.Text(text: query), for: "recording the search history")
        } catch {
            logger.warning("a resolved place was not added to the history", metadata: ["problem": "\(error)"])
            historyProblem = "\(error)"
        }
        return SearchAPI.ResolvedPlace(query: query, kind: kind, name: known.flatMap { index.places[$0].name }, label: known.map(index.label) ?? point.text,
                                       latitude: point.latitude, longitude: point.longitude, nearest: nearest, deepLink: WikipediaLink.places(point),
                                       webLink: WikipediaLink.web(point), historyRecorded: historyProblem == nil, historyProblem: historyProblem)
    }

    /// The coordinates in `query`, nil for a place name, -32602 when malformed or out of range.
    nonisolated func coordinates(_ query: String) throws -> Coordinates? {
        do {
            return try Coordinates.parse(query)
        } catch {
            throw JSONRPCError.invalidParams(field: "query", error.description)
        }
    }

    /// A known place as answers show it, with its distance (to the metre) when measured.
    nonisolated func place(_ index: PlaceIndex, _ place: Int, km: Double? = nil) -> SearchAPI.Place {
        SearchAPI.Place(name: index.places[place].name, label: index.label(place), latitude: index.points[place].latitude,
                        longitude: index.points[place].longitude, distanceKm: km.map(roundedKm))
    }

    /// Kilometres to the metre.
    nonisolated func roundedKm(_ km: Double) -> Double { (km * 1_000).rounded() / 1_000 }

    // MARK: items.grouped

    /// Sends each group in runs of up to `itemsPerPart` items, in order; the answer without its groups.
    nonisolated func items(_ params: SearchAPI.Items, parts: Parts<SearchAPI.GroupedItems.Group>) async throws -> SearchAPI.GroupedItems {
        let order: NameOrder = params.order == .natural ? .natural : .lexical
        let index = indexes.snapshot.items
        let groups = index.groups(order).filter { params.listId == nil || $0.listId == params.listId }
        for group in groups {
            for start in stride(from: 0, to: group.members.count, by: SearchAPI.GroupedItems.itemsPerPart) {
                let run = group.members[start..<min(start + SearchAPI.GroupedItems.itemsPerPart, group.members.count)]
                try await parts.send(SearchAPI.GroupedItems.Group(listId: group.listId, count: group.members.count, items: run.map { member in
                    let item = index.kept[Int(member)]
                    return SearchAPI.GroupedItems.Group.Item(id: item.id, listId: item.listId, name: item.name ?? "")
                }))
            }
        }
        let shown = groups.reduce(0) { $0 + $1.members.count }
        return SearchAPI.GroupedItems(order: order.rawValue, total: shown, dropped: index.dropped(inList: params.listId), groups: [])
    }

    // MARK: sources.list, headlines.list

    func sources(_ params: SearchAPI.Sources) async throws -> SearchAPI.SourceList {
        let language = (params.language ?? "en").lowercased()
        guard language == "all" || (language.count == 2 && language.allSatisfy { $0.isASCII && $0.isLetter }) else {
            throw JSONRPCError.invalidParams(field: "language", "must be a two-letter code such as 'en', or 'all'")
        }
        if let category = params.category, !Limits.newsCategories.contains(category.lowercased()) {
            throw JSONRPCError.invalidParams(field: "category", "must be one of \(Limits.newsCategories.joined(separator: ", "))")
        }
        let selection = try await selectedSources(for: "marking the selected sources")
        let index = indexes.snapshot.sources
        let shown = index.sources.filter { source in
            (language == "all" || source.language?.lowercased() == language)
                && (params.category == nil || source.category?.lowercased() == params.category?.lowercased())
        }
        let sources = shown.map { SearchAPI.ListedSource($0, selected: selection.contains($0.id)) }
        return SearchAPI.SourceList(language: language, category: params.category, total: sources.count, selected: selection, sources: sources)
    }

    func headlines(_ params: SearchAPI.Headlines) async throws -> SearchAPI.HeadlinePage {
        let page = params.page ?? 1
        let pageSize = params.pageSize ?? 20
        guard page >= 1 else { throw JSONRPCError.invalidParams(field: "page", "must be 1 or more") }
        guard Limits.headlinesPageSize.contains(pageSize) else {
            throw JSONRPCError.invalidParams(field: "pageSize", "must be \(Limits.headlinesPageSize.lowerBound) to \(Limits.headlinesPageSize.upperBound)")
        }
        let chosen: [String]
        if let sources = params.sources {
            guard sources.count <= 100 else { throw JSONRPCError.invalidParams(field: "sources", "at most 100 source ids") }
            chosen = sources
        } else {
            chosen = try await selectedSources(for: "headlines of the selected sources")
        }
        let snapshot = indexes.snapshot
        let unknown = chosen.filter { !snapshot.sources.ids.contains($0) }
        let found = chosen.isEmpty ? [] : snapshot.headlines.from(Set(chosen))
        let start = min(found.count, (page - 1).multipliedReportingOverflow(by: pageSize).overflow ? found.count : (page - 1) * pageSize)
        let articles = found[start...].prefix(pageSize)
        // Two different empty states: nothing chosen, and nothing from what was chosen.
        let status = chosen.isEmpty ? "no-sources-selected" : found.isEmpty ? "no-results" : "ok"
        let message: String? = switch status {
        case "no-sources-selected": "no news sources are selected: choose some with store sources.select"
        case "no-results": "no headlines from the chosen sources"
        default: nil
        }
        return SearchAPI.HeadlinePage(status: status, message: message, sources: chosen, unknownSources: unknown, total: found.count, page: page,
                                      pageSize: pageSize, hasMore: start + articles.count < found.count, articles: Array(articles))
    }

    /// The stored selection of news sources.
    private func selectedSources(for purpose: String) async throws -> [String] {
        try await store(StoreAPI.sourcesSelected, NoParams(), for: purpose).ids
    }

    // MARK: flights.list, airlines.get

    nonisolated func flights(_ params: SearchAPI.Flights) throws -> SearchAPI.FlightList {
        let directions: [Flight.Direction] = switch params.direction {
        case nil: [.outbound, .inbound]
        case .outbound?: [.outbound]
        case .inbound?: [.inbound]
        }
        let snapshot = indexes.snapshot
        var unknownAirlines: Set<String> = []
        var listed: [Flight.Direction: [SearchAPI.ListedFlight]] = [:]
        for direction in directions {
            listed[direction] = snapshot.flights.flights.filter { $0.direction == direction }.map { flight in
                let airline = snapshot.airlines.airlines[flight.airline]
                if airline == nil { unknownAirlines.insert(flight.airline) }
                return SearchAPI.ListedFlight(flight, airline: airline)
            }
        }
        return SearchAPI.FlightList(outbound: listed[.outbound], inbound: listed[.inbound], unknownAirlines: unknownAirlines.sorted())
    }

    nonisolated func airline(_ params: SearchAPI.Airline) throws -> SearchAPI.AirlineFlights {
        let snapshot = indexes.snapshot
        guard let airline = snapshot.airlines.airlines[params.id] else {
            throw JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: no airline has the id '\(params.id)'",
                               data: ["field": "id", "known": .array(snapshot.airlines.airlines.keys.sorted().map(JSONValue.string))])
        }
        return SearchAPI.AirlineFlights(airline, flights: snapshot.flights.flights.filter { $0.airline == airline.id }.map(\.id))
    }

    // MARK: indexes.list

    nonisolated func indexList() -> [SearchAPI.IndexEntry] {
        let built = indexes.snapshot.built
        return Dataset.allCases.map { dataset in
            guard let entry = built[dataset] else { return SearchAPI.IndexEntry(name: dataset.rawValue) }
            return SearchAPI.IndexEntry(name: dataset.rawValue, version: entry.version, origin: entry.origin, records: entry.records,
                                        builtAt: Timestamp.format(entry.builtAt), buildMs: (entry.buildDuration.seconds * 1_000 * 10).rounded() / 10)
        }
    }

    // MARK: Params

    /// The query trimmed; -32602 when longer than ``Limits/queryLength``.
    nonisolated func checkedQuery(_ query: String?) throws -> String {
        let query = (query ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
        guard query.count <= Limits.queryLength else {
            throw JSONRPCError.invalidParams(field: "query", "at most \(Limits.queryLength) characters (got \(query.count))")
        }
        return query
    }

    nonisolated func paging(offset: Int?, limit: Int?, defaultLimit: Int) throws -> (offset: Int, limit: Int) {
        let offset = offset ?? 0
        let limit = limit ?? defaultLimit
        guard offset >= 0 else { throw JSONRPCError.invalidParams(field: "offset", "must not be negative") }
        guard Limits.pageSize.contains(limit) else {
            throw JSONRPCError.invalidParams(field: "limit", "must be \(Limits.pageSize.lowerBound) to \(Limits.pageSize.upperBound)")
        }
        return (offset, limit)
    }
}
