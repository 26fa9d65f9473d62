public import Foundation

/// The records of the five apps' datasets, normalised: the shapes `datasets.get` answers
/// with, the search and pricing services decode, and search's results carry. Optional fields are absent or null in
/// some real records.

/// A country (countries dataset).
public struct Country: Codable, Sendable, Equatable {
    public var name: String
    /// Empty in the source for a few territories; nil then.
    public var capital: String?
    /// ISO 3166-1 alpha-2.
    public var code: String
    /// The continent code (AF, AN, AS, EU, NA, OC, SA) when the source gives one or a
    /// continent name that maps to one; nil otherwise (empty, or "Americas").
    public var region: String?
    /// The continent as the source names it ("Asia", "Americas"), when known.
    public var regionName: String?
    public var currency: Currency?
    public var flag: String?
    public var language: Language?
    public var demonym: String?

    public init(name: String, capital: String?, code: String, region: String?, regionName: String?, currency: Currency?,
                flag: String?, language: Language?, demonym: String?) {
        self.name = name
        self.capital = capital
        self.code = code
        self.region = region
        self.regionName = regionName
        self.currency = currency
        self.flag = flag
        self.language = language
        self.demonym = demonym
    }

    public struct Currency: Codable, Sendable, Equatable {
        public var code: String?
        public var name: String?
        public var symbol: String?
        public init(code: String?, name: String?, symbol: String?) { (self.code, self.name, self.symbol) = (code, name, symbol) }
    }

    public struct Language: Codable, Sendable, Equatable {
        public var code: String?
        public var name: String?
        public init(code: String?, name: String?) { (self.code, self.name) = (code, name) }
    }
}

/// A place (locations dataset). The source's keys are `lat` and `long`.
public struct Location: Codable, Sendable, Equatable {
    /// Absent for some places; they are shown by their coordinates.
    public var name: String?
    public var latitude: Double
    public var longitude: Double

    public init(name: String?, latitude: Double, longitude: Double) {
        self.name = name
        self.latitude = latitude
        self.longitude = longitude
    }
}

/// An entry of the hiring list (items dataset). Many names are null or empty in the source;
/// they are kept here and dropped by the search service.
public struct HiringItem: Codable, Sendable, Equatable {
    public var id: Int
    public var listId: Int
    public var name: String?

    public init(id: Int, listId: Int, name: String?) {
        self.id = id
        self.listId = listId
        self.name = name
    }
}

/// A NewsAPI source (sources dataset).
public struct NewsSource: Codable, Sendable, Equatable {
    public var id: String
    public var name: String
    public var description: String?
    public var url: String?
    public var category: String?
    public var language: String?
    public var country: String?

    public init(id: String, name: String, description: String?, url: String?, category: String?, language: String?, country: String?) {
        (self.id, self.name, self.description, self.url) = (id, name, description, url)
        (self.category, self.language, self.country) = (category, language, country)
    }
}

/// A NewsAPI article (headlines dataset).
public struct Article: Codable, Sendable, Equatable {
    public var source: Source
    public var author: String?
    public var title: String
    public var description: String?
    public var url: String
    public var urlToImage: String?
    /// As the source gives it (ISO 8601).
    public var publishedAt: String
    public var content: String?
    /// Whether it is NewsAPI's placeholder for an article that was taken down ("[Removed]").
    public var removed: Bool { title == "[Removed]" || source.name == "[Removed]" }

    public init(source: Source, author: String?, title: String, description: String?, url: String, urlToImage: String?, publishedAt: String,
                content: String?) {
        (self.source, self.author, self.title, self.description, self.url) = (source, author, title, description, url)
        (self.urlToImage, self.publishedAt, self.content) = (urlToImage, publishedAt, content)
    }

    public struct Source: Codable, Sendable, Equatable {
        /// Null for some sources.
        public var id: String?
        public var name: String
        public init(id: String?, name: String) { (self.id, self.name) = (id, name) }
    }
}

/// A flight (flights dataset), outbound or inbound.
public struct Flight: Codable, Sendable, Equatable {
    public enum Direction: String, Codable, Sendable, CaseIterable, SchemaDescribed { case outbound, inbound }

    public var id: Int
    public var direction: Direction
    /// The id of an airline in the airlines dataset (not always its name).
    public var airline: String
    public var departureAirportCode: String
    public var arrivalAirportCode: String
    /// In euros; exact (never a binary float), serialised as a string such as "15".
    public var price: Decimal

    enum CodingKeys: String, CodingKey { case id, direction, airline, departureAirportCode, arrivalAirportCode, price }

    public init(id: Int, direction: Direction, airline: String, departureAirportCode: String, arrivalAirportCode: String, price: Decimal) {
        self.id = id
        self.direction = direction
        self.airline = airline
        self.departureAirportCode = departureAirportCode
        self.arrivalAirportCode = arrivalAirportCode
        self.price = price
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        id = try container.decode(Int.self, forKey: .id)
        direction = try container.decode(Direction.self, forKey: .direction)
        airline = try container.decode(String.self, forKey: .airline)
        departureAirportCode = try container.decode(String.self, forKey: .departureAirportCode)
        arrivalAirportCode = try container.decode(String.self, forKey: .arrivalAirportCode)
        let text = try container.decode(String.self, forKey: .price)
        guard let price = Decimal(string: text, locale: Locale(identifier: "en_US_POSIX")) else {
            throw DecodingError.dataCorruptedError(forKey: .price, in: container, debugDescription: "not a decimal amount: \(text)")
        }
        self.price = price
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try container.encode(direction, forKey: .direction)
        try container.encode(airline, forKey: .airline)
        try container.encode(departureAirportCode, forKey: .departureAirportCode)
        try container.encode(arrivalAirportCode, forKey: .arrivalAirportCode)
        try container.encode(NSDecimalNumber(decimal: price).stringValue, forKey: .price)
    }
}

/// An airline (airlines dataset).
public struct Airline: Codable, Sendable, Equatable {
    public var id: String
    public var name: String
    public var headline: String?
    public var description: String?
    public var logoImg: String?
    public var mainImg: String?

    public init(id: String, name: String, headline: String?, description: String?, logoImg: String?, mainImg: String?) {
        (self.id, self.name, self.headline, self.description, self.logoImg, self.mainImg) = (id, name, headline, description, logoImg, mainImg)
    }
}

extension Flight {
    /// The flights' prices are whole euros.
    public static let currency = "EUR"

    /// The price with its currency.
    public var fare: Money { Money(amount: price, currency: Self.currency) }
}
