import Contracts
import BusProtocol
import Catalog
import Foundation
import Testing

func decode(_ dataset: Dataset, _ text: String) throws(CatalogError) -> DecodedDataset {
    try dataset.decode(Array(text.utf8))
}

@Suite("Catalog: the bundled copies decode, irregular records are tolerated")
struct CatalogBundledTests {
    @Test("every bundled dataset decodes with the expected record count", arguments: [
        (Dataset.countries, 249), (.locations, 4), (.items, 1000), (.sources, 12), (.headlines, 50), (.flights, 11), (.airlines, 4),
    ])
    func bundled(dataset: Dataset, count: Int) throws {
        let decoded = try dataset.decode(dataset.bundledData())
        #expect(decoded.content.count == count)
        #expect(decoded.dropped == 0)
        #expect(decoded.content.dataset == dataset)
    }

    @Test("countries: empty capitals, null symbols, regions as words, extra keys")
    func countries() throws {
        guard case .countries(let countries) = try Dataset.countries.decode(Dataset.countries.bundledData()).content else {
            Issue.record("not countries"); return
        }
        #expect(countries.filter { $0.capital == nil }.count == 4)
        #expect(countries.filter { $0.currency?.symbol == nil }.count == 6)
        #expect(countries.filter { $0.language?.code == nil }.count == 1)
        #expect(countries.filter { $0.demonym != nil }.count == 2)
        let haiti = countries.first { $0.code == "HT" }
        #expect(haiti?.region == nil && haiti?.regionName == "Americas")
        let afghanistan = countries.first { $0.code == "AF" }
        #expect(afghanistan?.region == "AS" && afghanistan?.regionName == "Asia" && afghanistan?.capital == "Kabul")
        #expect(countries.first { $0.code == "AX" }?.name == "Åland Islands")
    }

    @Test("locations: a place without a name; keys lat and long")
    func locations() throws {
        let decoded = try decode(.locations, #"{"locations":[{"name":"Amsterdam","lat":52.35,"long":4.83},{"lat":40.43,"long":-3.74},{"name":"nowhere","lat":91,"long":0},{"name":"x"}]}"#)
        #expect(decoded.content == .locations([Location(name: "Amsterdam", latitude: 52.35, longitude: 4.83),
                                               Location(name: nil, latitude: 40.43, longitude: -3.74)]))
        #expect(decoded.dropped == 2)
    }

    @Test("items: null and empty names kept, records without ids dropped")
    func items() throws {
        let decoded = try decode(.items, #"[{"id":1,"listId":2,"name":null},{"id":2,"listId":1,"name":""},{"id":3,"listId":1,"name":"Item 3","extra":true},{"listId":1}]"#)
        #expect(decoded.content == .items([HiringItem(id: 1, listId: 2, name: nil), HiringItem(id: 2, listId: 1, name: ""),
                                           HiringItem(id: 3, listId: 1, name: "Item 3")]))
        #expect(decoded.dropped == 1)
    }

    @Test("headlines: null source ids and [Removed] placeholders are kept, flagged")
    func headlines() throws {
        guard case .headlines(let articles) = try Dataset.headlines.decode(Dataset.headlines.bundledData()).content else {
            Issue.record("not headlines"); return
        }
        #expect(articles.contains { $0.removed })
        #expect(articles.contains { $0.source.id == nil && !$0.removed })
    }

    @Test("flights: outbound and inbound with exact prices; airlines by id")
    func flights() throws {
        guard case .flights(let flights) = try Dataset.flights.decode(Dataset.flights.bundledData()).content else {
            Issue.record("not flights"); return
        }
        #expect(flights.filter { $0.direction == .outbound }.count == 6)
        #expect(flights.first?.price == Decimal(15))
        let decoded = try decode(.flights, #"{"data":{"outboundFlights":[{"id":1,"airline":"A","departureAirportCode":"BCN","arrivalAirportCode":"AMS","price":0.1}],"inboundFlights":[]}}"#)
        guard case .flights(let one) = decoded.content else { Issue.record("not flights"); return }
        #expect(one.first?.price == Decimal(string: "0.1"))
        // Normalised records carry the price as a decimal string.
        #expect(try decoded.content.records(offset: 0, limit: 10).first?["price"] == "0.1")
    }

    @Test("paging normalised records")
    func paging() throws {
        let decoded = try Dataset.items.decode(Dataset.items.bundledData())
        #expect(try decoded.content.records(offset: 0, limit: 3).count == 3)
        #expect(try decoded.content.records(offset: 999, limit: 3).count == 1)
        #expect(try decoded.content.records(offset: 5_000, limit: 3).isEmpty)
        let record = try decoded.content.records(offset: 0, limit: 1)[0]
        #expect(record["id"] != nil && record["listId"] != nil)
    }
}

@Suite("Catalog: unusable data is a clear error naming the dataset, never a half-loaded catalog")
struct CatalogErrorTests {
    @Test("errors", arguments: [
        (Dataset.countries, #"{"countries":[]}"#, "countries: expected a top-level array, got an object"),
        (.items, #"[{"id":1,"listId":1,"name":"a"},"#, "items: not valid JSON or not an array"),
        (.items, "", "items: not valid JSON or not an array"),
        (.locations, #"[{"lat":1,"long":2}]"#, "locations: expected a top-level object, got an array"),
        (.locations, #"{"places":[]}"#, "locations: expected an array at locations, got nothing"),
        (.headlines, #"{"status":"error","code":"apiKeyMissing","message":"Your API key is missing."}"#,
         "headlines: NewsAPI answered an error: apiKeyMissing: Your API key is missing."),
        (.sources, #"{"status":"error","code":"rateLimited","message":"Too many requests"}"#,
         "sources: NewsAPI answered an error: rateLimited: Too many requests"),
        (.flights, #"{"data":{"outboundFlights":[]}}"#, "flights: expected an array at data.inboundFlights, got nothing"),
        (.airlines, #"{"airlines": {"id": "x"}}"#, "airlines: expected an array at airlines, got an object"),
        (.airlines, "<html>502 Bad Gateway</html>", "airlines: not valid JSON"),
    ])
    func unusable(dataset: Dataset, text: String, message: String) {
        let error = #expect(throws: CatalogError.self) { try decode(dataset, text) }
        #expect(error?.dataset == dataset)
        #expect(error?.description.hasPrefix(message) == true, "\(error?.description ?? "-")")
    }

    @Test("a truncated bundled file is refused, whatever the cut", arguments: Dataset.allCases)
    func truncated(dataset: Dataset) throws {
        var data = try dataset.bundledData()
        while let last = data.last, [0x20, 0x0A, 0x0D, 0x09].contains(last) { data.removeLast() }
        for cut in [1, data.count / 3, data.count / 2, data.count - 1] {
            let decoded = try? dataset.decode(data.prefix(cut))
            #expect(decoded == nil, "\(dataset) cut at \(cut) of \(data.count) bytes decoded")
        }
    }
}
