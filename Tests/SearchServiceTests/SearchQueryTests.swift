import BusProtocol
import Catalog
import Contracts
import Foundation
@testable import SearchService
import SwitchboardTestSupport
import Testing

/// The search service's answers from the bundled data, in process (no bus).
@Suite("search: queries against the bundled data")
struct SearchQueryTests {
    let search = SearchService()

    /// items.grouped in one reply, as a 7/MDP caller gets it: the parts gathered back in.
    func items(_ params: SearchAPI.Items, of service: SearchService? = nil) async throws -> SearchAPI.GroupedItems {
        let service = service ?? search
        return try await MethodTable(of: service).call(SearchAPI.itemsGrouped, params, on: service)
    }

    func countries(_ params: SearchAPI.Countries) throws -> [JSONValue] {
        try search.countries(params)["countries"]?.arrayValue ?? []
    }

    func names(_ query: String?, region: String? = nil, limit: Int? = nil) throws -> [String] {
        try countries(SearchAPI.Countries(query: query, region: region, offset: nil, limit: limit)).compactMap { $0["name"]?.stringValue }
    }

    @Test("countries: name prefix, then capital prefix, then other matches; case and diacritics ignored")
    func countryRanking() throws {
        let found = try countries(SearchAPI.Countries(query: "par", region: nil, offset: nil, limit: nil))
        #expect(found.first?["name"] == "Paraguay" && found.first?["match"] == "name")
        let france = try #require(found.firstIndex { $0["name"] == "France" })
        #expect(found[france]["match"] == "capital")
        // Every name-prefix match comes before every capital-prefix match, and so on.
        let ranks = found.compactMap { $0["match"]?.stringValue }.map { ["name": 0, "capital": 1, "other": 2][$0]! }
        #expect(ranks == ranks.sorted())
        #expect(try names("PAR") == names("par"))
        #expect(try names("aland").first == "Åland Islands")
        #expect(try names("ÅLAND").first == "Åland Islands")
        #expect(try names("curacao").contains("Curaçao"))
        // Within a rank, by name.
        let prefixed = try names("s").prefix { $0.lowercased().hasPrefix("s") }
        #expect(Array(prefixed) == prefixed.sorted { $0.folding(options: [.caseInsensitive, .diacriticInsensitive], locale: nil) < $1.folding(options: [.caseInsensitive, .diacriticInsensitive], locale: nil) })
    }

    @Test("countries: a two-letter query also matches the code exactly; longer ones do not")
    func countryCodes() throws {
        let found = try countries(SearchAPI.Countries(query: "de", region: nil, offset: nil, limit: 1_000))
        #expect(found.contains { $0["name"] == "Germany" && $0["match"] == "other" })
        #expect(try !names("deu").contains("Germany"))
        #expect(try names("nl", limit: 1_000).contains("Netherlands"))
    }

    @Test("countries: an empty query lists all by name; region filters by code or name; paging has a total")
    func countryListing() throws {
        let all = try search.countries(SearchAPI.Countries(query: nil, region: nil, offset: nil, limit: 1_000))
        #expect(all["total"] == 249)
        let names = all["countries"]?.arrayValue?.compactMap { $0["name"]?.stringValue } ?? []
        #expect(names.count == 249 && names.first == "Afghanistan" && names.contains("Åland Islands"))
        #expect(all["countries"]?.arrayValue?.first?["match"] == nil)

        let europe = try search.countries(SearchAPI.Countries(query: "", region: "EU", offset: nil, limit: nil))
        #expect(europe["total"]?.intValue ?? 0 > 40)
        #expect(europe["countries"]?.arrayValue?.allSatisfy { $0["region"] == "EU" } == true)
        #expect(try self.names("", region: "europe") == self.names("", region: "EU"))
        #expect(try search.countries(SearchAPI.Countries(query: nil, region: "Americas", offset: nil, limit: nil))["total"] == 3)

        let page = try search.countries(SearchAPI.Countries(query: nil, region: nil, offset: 10, limit: 5))
        #expect(page["total"] == 249 && page["offset"] == 10)
        #expect(page["countries"]?.arrayValue?.compactMap { $0["name"]?.stringValue } == Array(names[10..<15]))
        let beyond = try search.countries(SearchAPI.Countries(query: nil, region: nil, offset: 5_000, limit: 5))
        #expect(beyond["total"] == 249 && beyond["countries"] == .array([]))
    }

    @Test("countries: limits out of range, an unknown region and an over-long query are -32602 naming the field")
    func countryBadParams() async throws {
        for (params, field) in [(SearchAPI.Countries(query: nil, region: nil, offset: nil, limit: 0), "limit"),
                                (SearchAPI.Countries(query: nil, region: nil, offset: nil, limit: 1_001), "limit"),
                                (SearchAPI.Countries(query: nil, region: nil, offset: -1, limit: nil), "offset"),
                                (SearchAPI.Countries(query: nil, region: "Atlantis", offset: nil, limit: nil), "region"),
                                (SearchAPI.Countries(query: String(repeating: "a", count: 1_001), region: nil, offset: nil, limit: nil), "query")] {
            let error = await rpcError { try search.countries(params) }
            #expect(error?.code == -32602 && error?.data?["field"] == .string(field), "\(field)")
        }
    }

    @Test("countries: unicode and long queries are answered, not crashed on")
    func countryUnicode() throws {
        for query in ["日本", "🇫🇷", "e\u{301}", "\u{0}", "Ω≈ç√", String(repeating: "ä", count: 1_000), String(repeating: "🇫🇷", count: 500)] {
            _ = try search.countries(SearchAPI.Countries(query: query, region: nil, offset: nil, limit: nil))
        }
        // A decomposed é finds what a composed one does.
        #expect(try names("re\u{301}union") == names("réunion"))
        #expect(try names("réunion").contains("Réunion"))
    }

    @Test("places: coordinates with or without a space, with signs, up to 8 decimals; malformed text says what is wrong")
    func coordinateParsing() throws {
        #expect(try Coordinates.parse("12.9716, 77.5946") == Coordinates(latitude: 12.9716, longitude: 77.5946))
        #expect(try Coordinates.parse("12.9716,77.5946") == Coordinates(latitude: 12.9716, longitude: 77.5946))
        #expect(try Coordinates.parse(" +12.9716 , -77.5946 ") == Coordinates(latitude: 12.9716, longitude: -77.5946))
        #expect(try Coordinates.parse("-33.86785012, 151.20732012") == Coordinates(latitude: -33.86785012, longitude: 151.20732012))
        #expect(try Coordinates.parse("90, -180") == Coordinates(latitude: 90, longitude: -180))
        #expect(try Coordinates.parse("Amsterdam") == nil)
        #expect(try Coordinates.parse("Area 51") == nil)
        let cases: [(String, String)] = [
            ("91, 0", "latitude 91 is out of range"), ("-90.5, 0", "latitude -90.5 is out of range"),
            ("0, 180.1", "longitude 180.1 is out of range"), ("12.123456789, 3", "more than 8 decimals"),
            ("12.5", "two numbers separated by a comma"), ("1,2,3", "two numbers separated by a comma"),
            ("1.2.3, 4", "not a number"), ("12, ", "not a number"), ("--1, 2", "not a number"), ("1234, 5", "out of range"),
        ]
        for (text, problem) in cases {
            #expect(throws: Coordinates.ParseError.self, "\(text)") { try Coordinates.parse(text) }
            do {
                _ = try Coordinates.parse(text)
            } catch {
                #expect(error.description.contains(problem), "\(text): \(error.description)")
            }
        }
    }

    @Test("places: resolve by coordinates gives the nearest named place, its distance and the Wikipedia Places link")
    func resolveCoordinates() async throws {
        let answer = try await search.resolve(SearchAPI.Resolve(query: "12.9716, 77.5946"))
        #expect(answer["kind"] == "coordinates" && answer["name"] == nil && answer["label"] == "12.9716, 77.5946")
        #expect(answer["nearest"]?["name"] == "Mumbai")
        let km = try #require(answer["nearest"]?["distanceKm"]?.doubleValue)
        #expect(abs(km - 850.1) < 1)
        #expect(answer["deepLink"] == "wikipedia://places?latitude=12.9716&longitude=77.5946")
        #expect(answer["webLink"] == "https://en.wikipedia.org/wiki/Special:Nearby#/coord/12.9716,77.5946")
        // No bus here: the place still resolves, and the answer says the history did not record it.
        #expect(answer["historyRecorded"] == false)

        // A known place's own coordinates name it, and the nearest is another place.
        let mumbai = try await search.resolve(SearchAPI.Resolve(query: "19.0823998,72.8111468"))
        #expect(mumbai["name"] == "Mumbai" && mumbai["nearest"]?["name"] != "Mumbai")
        let error = await rpcError { try await search.resolve(SearchAPI.Resolve(query: "95, 10")) }
        #expect(error?.code == -32602 && error?.message.contains("latitude 95 is out of range") == true)
    }

    @Test("places: resolve by name; an unknown name is -32003; search lists unnamed places by their coordinates")
    func resolveNames() async throws {
        let amsterdam = try await search.resolve(SearchAPI.Resolve(query: "amsterdam"))
        #expect(amsterdam["kind"] == "name" && amsterdam["name"] == "Amsterdam" && amsterdam["nearest"]?["name"] == "Copenhagen")
        #expect(amsterdam["deepLink"] == "wikipedia://places?latitude=52.3547498&longitude=4.8339215")
        #expect(try await search.resolve(SearchAPI.Resolve(query: "COPEN"))["name"] == "Copenhagen")
        let missing = await rpcError { try await search.resolve(SearchAPI.Resolve(query: "Atlantis")) }
        #expect(missing?.code == -32003)
        let empty = await rpcError { try await search.resolve(SearchAPI.Resolve(query: "  ")) }
        #expect(empty?.code == -32602)

        let all = try search.locations(SearchAPI.Locations(query: nil, offset: nil, limit: nil))
        let labels = all["places"]?.arrayValue?.compactMap { $0["label"]?.stringValue }
        #expect(labels == ["Amsterdam", "Copenhagen", "Mumbai", "40.4380638, -3.7495758"])
        #expect(all["places"]?.arrayValue?.last?["name"] == nil)
        let near = try search.locations(SearchAPI.Locations(query: "40.4, -3.7", offset: nil, limit: 2))
        #expect(near["kind"] == "coordinates" && near["total"] == 4)
        #expect(near["places"]?.arrayValue?.first?["label"] == "40.4380638, -3.7495758")
        #expect(near["places"]?.arrayValue?.count == 2)
        #expect(try search.locations(SearchAPI.Locations(query: "bai", offset: nil, limit: nil))["places"]?.arrayValue?.first?["name"] == "Mumbai")
    }

    @Test("items: blank names dropped, grouped by listId, lexical or natural order, counts")
    func itemsGrouped() async throws {
        let lexical = try await items(SearchAPI.Items(order: nil, listId: nil))
        #expect(lexical["order"] == "lexical" && lexical["total"] == 320 && lexical["dropped"] == 680)
        let groups = try #require(lexical["groups"]?.arrayValue)
        #expect(groups.compactMap { $0["listId"]?.intValue } == [1, 2, 3, 4])
        #expect(groups.compactMap { $0["count"]?.intValue } == [81, 71, 86, 82])
        let firstNames = groups[0]["items"]?.arrayValue?.compactMap { $0["name"]?.stringValue } ?? []
        #expect(firstNames == firstNames.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) })
        #expect(firstNames.first == "Item 0" && firstNames.count == 81)

        let natural = try await items(SearchAPI.Items(order: .natural, listId: 1))
        let naturalGroups = try #require(natural["groups"]?.arrayValue)
        // Of the list asked for: its items shown, and its items left out (160 of the 680).
        #expect(naturalGroups.count == 1 && natural["total"] == 81 && natural["dropped"] == 160)
        let ids = naturalGroups[0]["items"]?.arrayValue?.compactMap { $0["id"]?.intValue } ?? []
        #expect(ids == ids.sorted() && ids.count == 81)  // "Item <id>": natural order is id order

        // Another order is refused by the contract, before the handler.
        let refused = SchemaCheck.mismatch(["order": "random"], JSONSchema.of(SearchAPI.Items.self))
        #expect(refused?.field == "order" && refused?.expected == #"one of "lexical", "natural""#)
    }

    @Test("items: names of white space only are dropped; ties by id; natural order reads numbers")
    func itemOrders() async throws {
        let search = SearchService()
        await search.load(.items([
            HiringItem(id: 5, listId: 2, name: "Item 10"), HiringItem(id: 3, listId: 2, name: "Item 9"),
            HiringItem(id: 4, listId: 2, name: "item 9"), HiringItem(id: 1, listId: 2, name: "Item 9"),
            HiringItem(id: 2, listId: 1, name: " \t "), HiringItem(id: 6, listId: 1, name: ""), HiringItem(id: 7, listId: 1, name: nil),
            HiringItem(id: 8, listId: 3, name: "Item 010"),
        ]), version: "t1")
        func order(_ name: SearchAPI.Items.Order) async throws -> [[Int64]] {
            try await items(SearchAPI.Items(order: name, listId: nil), of: search)["groups"]?.arrayValue?.map { group in
                group["items"]?.arrayValue?.compactMap { $0["id"]?.intValue } ?? []
            } ?? []
        }
        #expect(try await order(.lexical) == [[5, 1, 3, 4], [8]])
        #expect(try await order(.natural) == [[1, 3, 4, 5], [8]])
        #expect(try await items(SearchAPI.Items(order: nil, listId: nil), of: search)["dropped"] == 3)
        // A list whose items all lack a name has no group, only its count; another list's count is its own.
        let nameless = try await items(SearchAPI.Items(order: nil, listId: 1), of: search)
        #expect(nameless["total"] == 0 && nameless["dropped"] == 3 && nameless["groups"] == [])
        #expect(try await items(SearchAPI.Items(order: nil, listId: 2), of: search)["dropped"] == 0)
    }

    @Test("items in parts: a group bigger than a part comes in several, and gathered back it is one group, in order")
    func itemsInParts() async throws {
        let search = SearchService()
        let big = SearchAPI.GroupedItems.itemsPerPart * 2 + 500
        await search.load(.items((0..<big).map { HiringItem(id: $0, listId: $0 < big - 3 ? 1 : 2, name: "Item \($0)") }), version: "t1")
        let whole = try await items(SearchAPI.Items(order: .natural), of: search)
        #expect(whole.groups.map(\.listId) == [1, 2])
        #expect(whole.groups[0].items.map(\.id) == Array(0..<(big - 3)) && whole.groups[0].count == big - 3)
        #expect(whole.total == big)
    }

    @Test("natural and lexical comparison")
    func comparisons() {
        func natural(_ a: String, _ b: String) -> Int {
            Array(a.utf8).withUnsafeBufferPointer { x in Array(b.utf8).withUnsafeBufferPointer { y in naturalCompare(x, y) } }
        }
        #expect(natural("Item 2", "Item 10") < 0)
        #expect(natural("Item 10", "Item 2") > 0)
        #expect(natural("Item 007", "Item 7") == 0)
        #expect(natural("item 2", "Item 3") < 0)
        #expect(natural("Item", "Item 1") < 0)
        #expect(natural("a99999999999999999999999", "a100000000000000000000000") < 0)
    }

    @Test("news sources and headlines without the store: the selection needs it, an explicit list does not")
    func newsWithoutStore() async throws {
        let error = await rpcError { try await search.sources(SearchAPI.Sources(language: nil, category: nil)) }
        #expect(error?.code == -32001 && error?.message.contains("needs the store") == true)
        let headlines = try await search.headlines(SearchAPI.Headlines(sources: ["bbc-news"], page: nil, pageSize: nil))
        #expect(headlines["status"] == "ok")
        for (params, field) in [(SearchAPI.Headlines(sources: [], page: 0, pageSize: nil), "page"),
                                (SearchAPI.Headlines(sources: [], page: nil, pageSize: 101), "pageSize"),
                                (SearchAPI.Headlines(sources: [], page: nil, pageSize: 0), "pageSize")] {
            let error = await rpcError { try await search.headlines(params) }
            #expect(error?.data?["field"] == .string(field))
        }
        let badLanguage = await rpcError { try await search.sources(SearchAPI.Sources(language: "english", category: nil)) }
        #expect(badLanguage?.data?["field"] == "language")
    }

    @Test("flights: both directions joined with their airline, prices as decimal strings; an unknown airline is reported")
    func flights() async throws {
        let all = try search.flights(SearchAPI.Flights(direction: nil))
        let outbound = try #require(all["outbound"]?.arrayValue)
        #expect(outbound.compactMap { $0["id"]?.intValue } == [1, 2, 3, 4, 5, 6])
        #expect(outbound[0]["airline"]?["name"] == "Transavia" && outbound[0]["price"] == ["amount": "15.00", "currency": "EUR"])
        #expect(all["inbound"]?.arrayValue?.count == 5 && all["unknownAirlines"] == .array([]))
        let inbound = try search.flights(SearchAPI.Flights(direction: .inbound))
        #expect(inbound["outbound"] == nil && inbound["inbound"]?.arrayValue?.count == 5)
        #expect(SchemaCheck.mismatch(["direction": "sideways"], JSONSchema.of(SearchAPI.Flights.self))?.field == "direction")

        let other = SearchService()
        await other.load(.flights([Flight(id: 1, direction: .outbound, airline: "KLM", departureAirportCode: "AMS", arrivalAirportCode: "BCN",
                                          price: Decimal(string: "99.5")!)]), version: "t1")
        let unknown = try other.flights(SearchAPI.Flights(direction: nil))
        #expect(unknown.unknownAirlines == ["KLM"] && unknown.outbound?.first?.airline == nil && unknown["outbound"]?.arrayValue?.first?["airline"] == nil)
        #expect(unknown["outbound"]?.arrayValue?.first?["price"]?["amount"] == "99.50")
    }

    @Test("airlines.get: an airline with its flights; an unknown id is -32003")
    func airlines() async throws {
        let vueling = try search.airline(SearchAPI.Airline(id: "Vueling"))
        #expect(vueling["name"] == "Vueling (Vueling Airlines)" && vueling["flights"] == [2, 3, 12, 14])
        let error = await rpcError { try search.airline(SearchAPI.Airline(id: "Concorde")) }
        #expect(error?.code == -32003)
    }

    @Test("indexes.list: every dataset built from the bundled copy, with its version")
    func indexList() throws {
        let list = search.indexList()
        #expect(list.count == 7 && list.allSatisfy { $0.origin == "bundled" && $0.version?.count == 16 })
    }
}
