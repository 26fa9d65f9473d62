import Contracts
public import BusProtocol
import Foundation

extension Dataset {
    /// Decodes this dataset from its source format (see `../shared/fixtures/README.md`).
    ///
    /// Tolerant where real data is irregular: missing optional fields, nulls, extra keys,
    /// a region given as a word, null source ids, `[Removed]` articles (flagged). A record
    /// without what makes it usable (a flight without an id) is dropped and counted.
    /// Strict where the data is unusable: not JSON, the wrong top-level shape, a NewsAPI
    /// error body. Those throw a ``CatalogError`` and nothing is loaded.
    public func decode(_ body: some Collection<UInt8>) throws(CatalogError) -> DecodedDataset {
        do {
            switch self {
            case .items, .countries: return try decodeTopLevelArray(body)
            default: break
            }
            let root: JSONValue
            do {
                root = try JSONValue(parsing: body)
            } catch {
                throw CatalogError(dataset: self, problem: "not valid JSON (\(error))")
            }
            return try decodeObject(root)
        } catch let error as CatalogError {
            throw error
        } catch {
            throw CatalogError(dataset: self, problem: "\(error)")
        }
    }

    /// countries and items: a top-level array, decoded one record at a time so that a large
    /// file never exists as one tree of values.
    private func decodeTopLevelArray(_ body: some Collection<UInt8>) throws -> DecodedDataset {
        var dropped = 0
        var countries: [Country] = []
        var items: [HiringItem] = []
        do {
            try JSONValue.forEachElement(ofArray: body) { value in
                switch self {
                case .countries:
                    if let country = Self.country(value) { countries.append(country) } else { dropped += 1 }
                default:
                    if let item = Self.item(value) { items.append(item) } else { dropped += 1 }
                }
            }
        } catch {
            let trimmed = body.first { ![0x20, 0x09, 0x0A, 0x0D].contains($0) }
            if trimmed == UInt8(ascii: "{"), let root = try? JSONValue(parsing: body) {
                // An object where an array belongs: perhaps an error document.
                throw CatalogError(dataset: self, problem: "expected a top-level array, got an object\(Self.errorDetail(root))")
            }
            throw CatalogError(dataset: self, problem: "not valid JSON or not an array (\(error))")
        }
        let content: DatasetContent = self == .countries ? .countries(countries) : .items(items)
        return DecodedDataset(content: content, dropped: dropped)
    }

    private func decodeObject(_ root: JSONValue) throws -> DecodedDataset {
        guard case .object(let object) = root else {
            throw CatalogError(dataset: self, problem: "expected a top-level object, got \(Self.kind(root))")
        }
        if isNewsAPI, let status = object["status"]?.stringValue, status != "ok" {
            let code = object["code"]?.stringValue ?? "unknown"
            let message = object["message"]?.stringValue ?? "no message"
            throw CatalogError(dataset: self, problem: "NewsAPI answered an error: \(code): \(message)")
        }
        func array(_ value: JSONValue?, _ path: String) throws -> [JSONValue] {
            guard case .array(let elements)? = value else {
                throw CatalogError(dataset: self, problem: "expected an array at \(path), got \(value.map(Self.kind) ?? "nothing")")
            }
            return elements
        }
        var dropped = 0
        func keep<T>(_ elements: [JSONValue], _ convert: (JSONValue) -> T?) -> [T] {
            elements.compactMap { element in
                let record = convert(element)
                if record == nil { dropped += 1 }
                return record
            }
        }
        let content: DatasetContent
        switch self {
        case .locations:
            content = .locations(keep(try array(object["locations"], "locations"), Self.location))
        case .sources:
            content = .sources(keep(try array(object["sources"], "sources"), Self.source))
        case .headlines:
            content = .headlines(keep(try array(object["articles"], "articles"), Self.article))
        case .flights:
            guard case .object(let data)? = object["data"] else {
                throw CatalogError(dataset: self, problem: "expected an object at data\(Self.errorDetail(root))")
            }
            let outbound = keep(try array(data["outboundFlights"], "data.outboundFlights")) { Self.flight($0, .outbound) }
            let inbound = keep(try array(data["inboundFlights"], "data.inboundFlights")) { Self.flight($0, .inbound) }
            content = .flights(outbound + inbound)
        case .airlines:
            content = .airlines(keep(try array(object["airlines"], "airlines"), Self.airline))
        case .countries, .items:
            throw CatalogError(dataset: self, problem: "expected a top-level array, got an object\(Self.errorDetail(root))")
        }
        return DecodedDataset(content: content, dropped: dropped)
    }

    // MARK: Records

    private static let continentCodes: Set<String> = ["AF", "AN", "AS", "EU", "NA", "OC", "SA"]
    private static let continentNames: [String: String] = [
        "africa": "AF", "antarctica": "AN", "asia": "AS", "europe": "EU", "north america": "NA",
        "oceania": "OC", "south america": "SA",
    ]
    private static let continentDisplay: [String: String] = [
        "AF": "Africa", "AN": "Antarctica", "AS": "Asia", "EU": "Europe", "NA": "North America",
        "OC": "Oceania", "SA": "South America",
    ]

    static func country(_ value: JSONValue) -> Country? {
        guard let name = text(value["name"]), let code = text(value["code"]) else { return nil }
        let rawRegion = text(value["region"])
        var region: String?
        var regionName: String?
        if let rawRegion {
            if continentCodes.contains(rawRegion.uppercased()) {
                region = rawRegion.uppercased()
                regionName = continentDisplay[region!]
            } else {
                region = continentNames[rawRegion.lowercased()]
                regionName = rawRegion
            }
        }
        let currency = value["currency"].flatMap { currency -> Country.Currency? in
            guard case .object = currency else { return nil }
            return Country.Currency(code: text(currency["code"]), name: text(currency["name"]), symbol: text(currency["symbol"]))
        }
        let language = value["language"].flatMap { language -> Country.Language? in
            guard case .object = language else { return nil }
            return Country.Language(code: text(language["code"]), name: text(language["name"]))
        }
        return Country(name: name, capital: text(value["capital"]), code: code.uppercased(), region: region, regionName: regionName,
                       currency: currency, flag: text(value["flag"]), language: language, demonym: text(value["demonym"]))
    }

    static func location(_ value: JSONValue) -> Location? {
        guard let latitude = number(value["lat"]), let longitude = number(value["long"] ?? value["lng"]),
              (-90...90).contains(latitude), (-180...180).contains(longitude) else { return nil }
        return Location(name: text(value["name"]), latitude: latitude, longitude: longitude)
    }

    static func item(_ value: JSONValue) -> HiringItem? {
        guard let id = value["id"]?.intValue, let listId = value["listId"]?.intValue else { return nil }
        // Null and empty names are kept as they are: dropping them is the list's business.
        return HiringItem(id: Int(id), listId: Int(listId), name: value["name"]?.stringValue)
    }

    static func source(_ value: JSONValue) -> NewsSource? {
        guard let id = text(value["id"]), let name = text(value["name"]) else { return nil }
        return NewsSource(id: id, name: name, description: text(value["description"]), url: text(value["url"]),
                          category: text(value["category"]), language: text(value["language"]), country: text(value["country"]))
    }

    static func article(_ value: JSONValue) -> Article? {
        guard let url = text(value["url"]) else { return nil }
        let title = text(value["title"]) ?? ""
        return Article(source: .init(id: text(value["source"]?["id"]), name: text(value["source"]?["name"]) ?? ""), author: text(value["author"]),
                       title: title, description: text(value["description"]), url: url, urlToImage: text(value["urlToImage"]),
                       publishedAt: text(value["publishedAt"]) ?? "", content: text(value["content"]))
    }

    static func flight(_ value: JSONValue, _ direction: Flight.Direction) -> Flight? {
        guard let id = value["id"]?.intValue, let airline = text(value["airline"]),
              let departure = text(value["departureAirportCode"]), let arrival = text(value["arrivalAirportCode"]),
              let price = money(value["price"]), price >= 0 else { return nil }
        return Flight(id: Int(id), direction: direction, airline: airline, departureAirportCode: departure,
                      arrivalAirportCode: arrival, price: price)
    }

    static func airline(_ value: JSONValue) -> Airline? {
        guard let id = text(value["id"]) else { return nil }
        return Airline(id: id, name: text(value["name"]) ?? id, headline: text(value["headline"]),
                       description: text(value["description"]), logoImg: text(value["logoImg"]), mainImg: text(value["mainImg"]))
    }

    // MARK: Helpers

    /// A non-empty string (after trimming), else nil.
    static func text(_ value: JSONValue?) -> String? {
        guard case .string(let string)? = value else { return nil }
        let trimmed = string.trimmingCharacters(in: .whitespacesAndNewlines)
        return trimmed.isEmpty ? nil : trimmed
    }

    static func number(_ value: JSONValue?) -> Double? {
        switch value {
        case .int(let number)?: Double(number)
        case .double(let number)? where number.isFinite: number
        default: nil
        }
    }

    /// An amount exactly as written: integers as they are, decimals through their
    /// shortest text (so 0.1 stays 0.1), strings such as "45.00".
    static func money(_ value: JSONValue?) -> Decimal? {
        let posix = Locale(identifier: "en_US_POSIX")
        switch value {
        case .int(let number)?: return Decimal(number)
        case .double(let number)? where number.isFinite: return Decimal(string: "\(number)", locale: posix)
        case .string(let text)?: return Decimal(string: text, locale: posix)
        default: return nil
        }
    }

    static func kind(_ value: JSONValue) -> String {
        switch value {
        case .null: "null"
        case .bool: "a boolean"
        case .int, .double: "a number"
        case .string: "a string"
        case .array: "an array"
        case .object: "an object"
        }
    }

    /// ", saying: …" when an object looks like an error document.
    static func errorDetail(_ root: JSONValue) -> String {
        if let message = root["message"]?.stringValue { return " saying: \(message)" }
        if let error = root["error"]?.stringValue { return " saying: \(error)" }
        return ""
    }
}

extension Dataset {
    /// ``decode(_:)`` off the caller's actor (`@concurrent`: on the shared pool), so an actor
    /// decoding a large file goes on serving meanwhile.
    @concurrent
    public func decodeConcurrently(_ body: [UInt8]) async throws(CatalogError) -> DecodedDataset { try decode(body) }

    /// ``content(fromRecords:)`` off the caller's actor, likewise.
    @concurrent
    public func contentConcurrently(fromRecords records: [JSONValue]) async throws(CatalogError) -> DatasetContent {
        try content(fromRecords: records)
    }
}
