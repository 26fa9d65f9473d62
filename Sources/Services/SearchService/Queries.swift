import BusKit
import BusProtocol
import Catalog
import Foundation
import ContractKit
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

    nonisolated func countries(_ params: SearchAPI.Countries) throws -> JSONValue {
        let query = try checkedQuery(params.query)
        let (offset, limit) = try paging(offset: params.offset, limit: params.limit, defaultLimit: 250)
        let index = indexes.snapshot.countries
        if let region = params.region, !index.hasRegion(region) {
            throw JSONRPCError.invalidParams(field: "region", "no country is in region '\(region)'; known: \(index.knownRegions.joined(separator: ", "))")
        }
        let found = index.search(query, region: params.region)
        let page = found.dropFirst(offset).prefix(limit).map { result -> JSONValue in
            var country = result.entry.json
            if let match = result.match { country["match"] = .string(match.name) }
            return .object(country)
        }
        return ["query": .string(query), "region": params.region.map(JSONValue.string) ?? .null, "total": .int(Int64(found.count)),
                "offset": .int(Int64(offset)), "limit": .int(Int64(limit)), "countries": .array(Array(page))]
    }

    // MARK: locations.search, locations.resolve

    nonisolated func locations(_ params: SearchAPI.Locations) throws -> JSONValue {
        let query = try checkedQuery(params.query)
        let (offset, limit) = try paging(offset: params.offset, limit: params.limit, defaultLimit: 100)
        let index = indexes.snapshot.places
        let point = try coordinates(query)
        let found: [(index: Int, km: Double?)] = point.map { point in index.byDistance(from: point).map { ($0.index, $0.km) } }
            ?? index.matching(name: query).map { ($0, nil) }
        let page = found.dropFirst(offset).prefix(limit).map { entry -> JSONValue in
            var place = placeJSON(index, entry.index)
            if let km = entry.km { place["distanceKm"] = .double(roundedKm(km)) }
            return .object(place)
        }
        return ["query": .string(query), "kind": .string(point == nil ? "name" : "coordinates"), "total": .int(Int64(found.count)),
                "offset": .int(Int64(offset)), "places": .array(Array(page))]
    }

    func resolve(_ params: SearchAPI.Resolve) async throws -> JSONValue {
        let query = try checkedQuery(params.query)
        guard !query.isEmpty else { throw JSONRPCError.invalidParams(field: "query", "must not be empty: give a place name or 'latitude, longitude'") }
        let index = indexes.snapshot.places
        var answer: [String: JSONValue] = ["query": .string(query)]
        let point: Coordinates
        let known: Int?
        if let coordinates = try coordinates(query) {
            point = coordinates
            // The known named place at these coordinates, if there is one.
            known = index.nearestNamed(to: coordinates).flatMap { $0.km <= PlaceIndex.samePlaceKm ? $0.index : nil }
            answer["kind"] = "coordinates"
        } else {
            guard let found = index.resolve(name: query) else {
                throw JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: no known place is called '\(query)'",
                                   data: ["field": "query"])
            }
            point = index.points[found]
            known = found
            answer["kind"] = "name"
        }
        answer["name"] = known.flatMap { index.places[$0].name }.map(JSONValue.string) ?? .null
        answer["label"] = .string(known.map(index.label) ?? point.text)
        answer["latitude"] = .double(point.latitude)
        answer["longitude"] = .double(point.longitude)
        if let nearest = index.nearestNamed(to: point, excluding: known) {
            var place = placeJSON(index, nearest.index)
            place["distanceKm"] = .double(roundedKm(nearest.km))
            answer["nearest"] = .object(place)
        } else {
            answer["nearest"] = .null
        }
        answer["deepLink"] = .string(WikipediaLink.places(point))
        answer["webLink"] = .string(WikipediaLink.web(point))
        // The place resolved; recording it is secondary, so a store problem is reported, not fatal.
        do {
            _ = try await store(StoreAPI.historyAdd, StoreAPI.Text(text: query), for: "recording the search history")
            answer["historyRecorded"] = true
        } catch {
            logger.warning("a resolved place was not added to the history", metadata: ["problem": "\(error)"])
            answer["historyRecorded"] = false
            answer["historyProblem"] = .string("\(error)")
        }
        return .object(answer)
    }

    /// The coordinates in `query`, nil for a place name, -32602 when malformed or out of range.
    nonisolated func coordinates(_ query: String) throws -> Coordinates? {
        do {
            return try Coordinates.parse(query)
        } catch {
            throw JSONRPCError.invalidParams(field: "query", error.description)
        }
    }

    nonisolated func placeJSON(_ index: PlaceIndex, _ place: Int) -> [String: JSONValue] {
        ["name": index.places[place].name.map(JSONValue.string) ?? .null, "label": .string(index.label(place)),
         "latitude": .double(index.points[place].latitude), "longitude": .double(index.points[place].longitude)]
    }

    /// Kilometres to the metre.
    nonisolated func roundedKm(_ km: Double) -> Double { (km * 1_000).rounded() / 1_000 }

    // MARK: items.grouped

    nonisolated func items(_ params: SearchAPI.Items) throws -> JSONValue {
        let order: NameOrder = params.order == .natural ? .natural : .lexical
        let index = indexes.snapshot.items
        let groups = index.groups(order).filter { params.listId == nil || $0.listId == params.listId }
        var shown = 0
        let groupsJSON = groups.map { group -> JSONValue in
            shown += group.members.count
            let members = group.members.map { member -> JSONValue in
                let item = index.kept[Int(member)]
                return ["id": .int(Int64(item.id)), "listId": .int(Int64(item.listId)), "name": .string(item.name ?? "")]
            }
            return ["listId": .int(Int64(group.listId)), "count": .int(Int64(group.members.count)), "items": .array(members)]
        }
        return ["order": .string(order.rawValue), "total": .int(Int64(shown)), "dropped": .int(Int64(index.dropped)),
                "groups": .array(groupsJSON)]
    }

    // MARK: sources.list, headlines.list

    func sources(_ params: SearchAPI.Sources) async throws -> JSONValue {
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
        let sources = shown.map { source -> JSONValue in
            var object = (try? JSONValue(encoding: source).objectValue) ?? [:]
            object["selected"] = .bool(selection.contains(source.id))
            return .object(object)
        }
        return ["language": .string(language), "category": params.category.map(JSONValue.string) ?? .null,
                "total": .int(Int64(sources.count)), "selected": .array(selection.map(JSONValue.string)), "sources": .array(sources)]
    }

    func headlines(_ params: SearchAPI.Headlines) async throws -> JSONValue {
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
        let articles = found[start...].prefix(pageSize).map { article -> JSONValue in
            var object = (try? JSONValue(encoding: article).objectValue) ?? [:]
            object["removed"] = nil
            return .object(object)
        }
        // Two different empty states: nothing chosen, and nothing from what was chosen.
        let status = chosen.isEmpty ? "no-sources-selected" : found.isEmpty ? "no-results" : "ok"
        var answer: [String: JSONValue] = [
            "status": .string(status), "sources": .array(chosen.map(JSONValue.string)), "total": .int(Int64(found.count)),
            "page": .int(Int64(page)), "pageSize": .int(Int64(pageSize)), "hasMore": .bool(start + articles.count < found.count),
            "articles": .array(articles), "unknownSources": .array(unknown.map(JSONValue.string)),
        ]
        switch status {
        case "no-sources-selected": answer["message"] = "no news sources are selected: choose some with store sources.select"
        case "no-results": answer["message"] = "no headlines from the chosen sources"
        default: break
        }
        return .object(answer)
    }

    /// The stored selection of news sources.
    private func selectedSources(for purpose: String) async throws -> [String] {
        try await store(StoreAPI.sourcesSelected, NoParams(), for: purpose).ids
    }

    // MARK: flights.list, airlines.get

    nonisolated func flights(_ params: SearchAPI.Flights) throws -> JSONValue {
        let directions: [Flight.Direction] = switch params.direction {
        case nil: [.outbound, .inbound]
        case .outbound?: [.outbound]
        case .inbound?: [.inbound]
        }
        let snapshot = indexes.snapshot
        var unknownAirlines: Set<String> = []
        var answer: [String: JSONValue] = [:]
        for direction in directions {
            answer[direction.rawValue] = .array(snapshot.flights.flights.filter { $0.direction == direction }.map { flight in
                let airline = snapshot.airlines.airlines[flight.airline]
                if airline == nil { unknownAirlines.insert(flight.airline) }
                return flightJSON(flight, airline: airline)
            })
        }
        answer["unknownAirlines"] = .array(unknownAirlines.sorted().map(JSONValue.string))
        return .object(answer)
    }

    nonisolated func flightJSON(_ flight: Flight, airline: Airline?) -> JSONValue {
        ["id": .int(Int64(flight.id)), "direction": .string(flight.direction.rawValue), "airlineId": .string(flight.airline),
         "airline": airline.flatMap { try? JSONValue(encoding: $0) } ?? .null,
         "departureAirportCode": .string(flight.departureAirportCode), "arrivalAirportCode": .string(flight.arrivalAirportCode),
         "price": (try? JSONValue(encoding: flight.fare)) ?? .null]
    }

    nonisolated func airline(_ params: SearchAPI.Airline) throws -> JSONValue {
        let snapshot = indexes.snapshot
        guard let airline = snapshot.airlines.airlines[params.id] else {
            throw JSONRPCError(code: JSONRPCError.notFoundCode, message: "Not found: no airline has the id '\(params.id)'",
                               data: ["field": "id", "known": .array(snapshot.airlines.airlines.keys.sorted().map(JSONValue.string))])
        }
        var object = (try? JSONValue(encoding: airline).objectValue) ?? [:]
        object["flights"] = .array(snapshot.flights.flights.filter { $0.airline == airline.id }.map { .int(Int64($0.id)) })
        return .object(object)
    }

    // MARK: indexes.list

    nonisolated func indexList() -> JSONValue {
        let built = indexes.snapshot.built
        return .array(Dataset.allCases.map { dataset in
            guard let entry = built[dataset] else { return ["name": .string(dataset.rawValue), "version": .null] }
            return ["name": .string(dataset.rawValue), "version": .string(entry.version), "origin": .string(entry.origin),
                    "records": .int(Int64(entry.records)), "builtAt": .string(Timestamp.format(entry.builtAt)),
                    "buildMs": .double((entry.buildDuration.seconds * 1_000 * 10).rounded() / 10)]
        })
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

extension CountryIndex.Match {
    var name: String {
        switch self {
        case .namePrefix: "name"
        case .capitalPrefix: "capital"
        case .other: "other"
        }
    }
}
