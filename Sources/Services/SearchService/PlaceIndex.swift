import Contracts
import Catalog

/// The known places: by name, and by position for the nearest named place.
struct PlaceIndex: Sendable {
    let places: [Location]
    /// Folded names (nil for a place without one).
    let names: [FoldedText?]
    let points: [Coordinates]
    /// Named places first by name, then the unnamed by latitude and longitude.
    let byName: [Int]
    /// The named places only, by position.
    let tree: PlaceTree

    /// Within this distance a point is the known place itself.
    static let samePlaceKm = 0.1

    init(_ locations: [Location]) {
        places = locations
        names = locations.map { $0.name.map(FoldedText.init).flatMap { $0.isEmpty ? nil : $0 } }
        points = locations.map { Coordinates(latitude: $0.latitude, longitude: $0.longitude) }
        let names = self.names
        let points = self.points
        byName = locations.indices.sorted { a, b in
            switch (names[a], names[b]) {
            case let (x?, y?): return x != y ? x.bytes.lexicographicallyPrecedes(y.bytes) : a < b
            case (_?, nil): return true
            case (nil, _?): return false
            case (nil, nil): return (points[a].latitude, points[a].longitude, a) < (points[b].latitude, points[b].longitude, b)
            }
        }
        let named = locations.indices.filter { names[$0] != nil }
        tree = PlaceTree(points: points.map(\.unitVector), places: named)
    }

    /// How a place is shown: its name, else its coordinates.
    func label(_ index: Int) -> String { places[index].name.flatMap { $0.isEmpty ? nil : $0 } ?? points[index].text }

    /// The places whose name matches `query`: names starting with it first, then names
    /// containing it, by name within each.
    func matching(name query: String) -> [Int] {
        let key = FoldedText(query)
        guard !key.isEmpty else { return byName }
        var prefix: [Int] = []
        var other: [Int] = []
        for index in byName {
            guard let name = names[index] else { continue }
            if name.hasPrefix(key) { prefix.append(index) } else if name.contains(key) { other.append(index) }
        }
        return prefix + other
    }

    /// The place a name query means: an exact name first, else the best match; nil when none.
    func resolve(name query: String) -> Int? {
        let key = FoldedText(query)
        return byName.first { names[$0] == key } ?? matching(name: query).first
    }

    /// Every place by distance from `point` (for a coordinates search; a scan, as it
    /// returns them all in order).
    func byDistance(from point: Coordinates) -> [(index: Int, km: Double)] {
        points.indices.map { ($0, point.distanceKm(to: points[$0])) }.sorted { ($0.km, $0.index) < ($1.km, $1.index) }
    }

    /// The named place nearest to `point`, other than `excluded`, with its distance.
    func nearestNamed(to point: Coordinates, excluding excluded: Int? = nil) -> (index: Int, km: Double)? {
        guard let found = tree.nearest(to: point.unitVector, where: { $0 != excluded }) else { return nil }
        // The exact great-circle distance rather than the one from the chord.
        return (found.place, point.distanceKm(to: points[found.place]))
    }
}
