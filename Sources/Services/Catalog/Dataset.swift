public import Contracts
public import BusProtocol
public import Foundation

/// The seven datasets of the five apps.
public enum Dataset: String, CaseIterable, Sendable, Codable, CustomStringConvertible {
    case countries, locations, items, sources, headlines, flights, airlines

    public var description: String { rawValue }

    /// The file of the bundled copy, in the Catalog's resources.
    public var bundledFileName: String {
        switch self {
        case .countries: "countries.json"
        case .locations: "locations.json"
        case .items: "hiring.json"
        case .sources: "news-sources.json"
        case .headlines: "news-headlines.json"
        case .flights: "flights.json"
        case .airlines: "airlines.json"
        }
    }

    /// Where the real data lives (see the fixtures' README). The flights app's mock
    /// endpoints have no public address: their default is the bundled copy itself.
    public var defaultURL: URL? {
        switch self {
        case .countries:
            URL(string: "https://gist.githubusercontent.com/peymano-wmt/32dcb892b06648910ddd40406e37fdab/raw/db25946fd77c5873b0303b858e861ce724e0dcd0/countries.json")
        case .locations: URL(string: "https://raw.githubusercontent.com/abnamrocoesd/assignment-ios/main/locations.json")
        case .items: URL(string: "https://fetch-hiring.s3.amazonaws.com/hiring.json")
        case .sources: URL(string: "https://newsapi.org/v2/top-headlines/sources?language=en")
        case .headlines: URL(string: "https://newsapi.org/v2/top-headlines?language=en&pageSize=100")
        case .flights, .airlines: nil
        }
    }

    /// Whether the source is NewsAPI (key in `X-Api-Key`, errors as `{"status":"error"}`).
    public var isNewsAPI: Bool { self == .sources || self == .headlines }

    /// The bundled copy's bytes.
    public func bundledData() throws -> Data {
        guard let url = Bundle.module.url(forResource: bundledFileName, withExtension: nil) else {
            throw CatalogError(dataset: self, problem: "the bundled copy \(bundledFileName) is missing from the build")
        }
        return try Data(contentsOf: url)
    }

    /// The bundled copy's location on disk.
    public var bundledURL: URL? { Bundle.module.url(forResource: bundledFileName, withExtension: nil) }
}

/// Why a dataset's data cannot be used: names the dataset and the problem. A dataset that
/// fails to decode is not loaded at all (never half).
public struct CatalogError: Error, Sendable, Equatable, CustomStringConvertible {
    public let dataset: Dataset
    public let problem: String

    public init(dataset: Dataset, problem: String) {
        self.dataset = dataset
        self.problem = problem
    }

    public var description: String { "\(dataset): \(problem)" }
}

/// A decoded dataset: its records, typed, and how many source records were unusable and
/// left out (say, a location without coordinates).
public enum DatasetContent: Sendable, Equatable {
    case countries([Country])
    case locations([Location])
    case items([HiringItem])
    case sources([NewsSource])
    case headlines([Article])
    case flights([Flight])
    case airlines([Airline])

    public var dataset: Dataset {
        switch self {
        case .countries: .countries
        case .locations: .locations
        case .items: .items
        case .sources: .sources
        case .headlines: .headlines
        case .flights: .flights
        case .airlines: .airlines
        }
    }

    public var count: Int {
        switch self {
        case .countries(let records): records.count
        case .locations(let records): records.count
        case .items(let records): records.count
        case .sources(let records): records.count
        case .headlines(let records): records.count
        case .flights(let records): records.count
        case .airlines(let records): records.count
        }
    }

    /// Records `offset..<offset+limit` in their normalised JSON form.
    public func records(offset: Int, limit: Int) throws -> [JSONValue] {
        func page<T: Encodable>(_ records: [T]) throws -> [JSONValue] {
            guard offset < records.count else { return [] }
            return try records[offset..<min(records.count, offset + limit)].map { try JSONValue(encoding: $0) }
        }
        switch self {
        case .countries(let records): return try page(records)
        case .locations(let records): return try page(records)
        case .items(let records): return try page(records)
        case .sources(let records): return try page(records)
        case .headlines(let records): return try page(records)
        case .flights(let records): return try page(records)
        case .airlines(let records): return try page(records)
        }
    }
}

/// The result of decoding: the content, and how many records were dropped as unusable.
public struct DecodedDataset: Sendable, Equatable {
    public let content: DatasetContent
    public let dropped: Int
}

extension Dataset {
    /// Decodes records in their normalised form (what `datasets.get` answers with) back
    /// into typed content; throws naming the dataset when a record does not fit.
    public func content(fromRecords records: [JSONValue]) throws(CatalogError) -> DatasetContent {
        let array = JSONValue.array(records)
        do {
            switch self {
            case .countries: return .countries(try array.decode())
            case .locations: return .locations(try array.decode())
            case .items: return .items(try array.decode())
            case .sources: return .sources(try array.decode())
            case .headlines: return .headlines(try array.decode())
            case .flights: return .flights(try array.decode())
            case .airlines: return .airlines(try array.decode())
            }
        } catch {
            throw CatalogError(dataset: self, problem: "a record does not fit the \(self) model (\(error))")
        }
    }
}
