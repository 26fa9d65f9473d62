import Contracts
import BusProtocol
import Catalog

/// The countries, prepared for search by name, capital and code.
struct CountryIndex: Sendable {
    /// Why a country matched a query, as answers say it; its cases are in rank order.
    typealias Match = SearchAPI.CountryMatch

    struct Entry: Sendable {
        let country: Country
        let name: FoldedText
        let capital: FoldedText
        let code: FoldedText
        /// What a `region` filter matches: the continent code and the source's region name, folded.
        let regions: [String]
        /// The country as answers carry it (encoded once, at build).
        let json: [String: JSONValue]
    }

    /// Sorted by name.
    let entries: [Entry]
    /// The region filters that match something, for the error about one that does not.
    let knownRegions: [String]

    init(_ countries: [Country]) {
        entries = countries.map { country in
            Entry(country: country, name: FoldedText(country.name), capital: FoldedText(country.capital ?? ""), code: FoldedText(country.code),
                  regions: [country.region, country.regionName].compactMap { $0.map(folded) },
                  json: (try? JSONValue(encoding: country).objectValue) ?? [:])
        }.sorted { a, b in
            a.name != b.name ? a.name.bytes.lexicographicallyPrecedes(b.name.bytes) : a.country.name < b.country.name
        }
        knownRegions = Set(countries.flatMap { [$0.region, $0.regionName].compactMap { $0 } }).sorted()
    }

    /// Whether some country is in `region` (a continent code such as `EU`, or a region name).
    func hasRegion(_ region: String) -> Bool {
        let key = folded(region)
        return entries.contains { $0.regions.contains(key) }
    }

    /// The countries matching `query` (all when empty) in `region` (any when nil), ranked:
    /// name prefix, then capital prefix, then other matches (a name or capital containing
    /// the query, or a two-letter query equal to the code); by name within a rank.
    func search(_ query: String, region: String?) -> [(entry: Entry, match: Match?)] {
        let key = FoldedText(query)
        let twoLetters = folded(query).count == 2
        let regionKey = region.map(folded)
        var ranked: [Match: [(entry: Entry, match: Match?)]] = [:]
        var all: [(entry: Entry, match: Match?)] = []
        for entry in entries {
            if let regionKey, !entry.regions.contains(regionKey) { continue }
            guard !key.isEmpty else {
                all.append((entry, nil))
                continue
            }
            let match: Match
            if entry.name.hasPrefix(key) {
                match = .name
            } else if !entry.capital.isEmpty, entry.capital.hasPrefix(key) {
                match = .capital
            } else if entry.name.contains(key) || entry.capital.contains(key) || (twoLetters && entry.code == key) {
                match = .other
            } else {
                continue
            }
            ranked[match, default: []].append((entry, match))
        }
        return key.isEmpty ? all : Match.allCases.flatMap { ranked[$0] ?? [] }
    }
}
