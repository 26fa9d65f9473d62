import Foundation

/// A point on the Earth in degrees.
struct Coordinates: Sendable, Equatable {
    var latitude: Double
    var longitude: Double

    /// Mean Earth radius (IUGG), for distances.
    static let earthRadiusKm = 6_371.0088

    /// How a query that looks like coordinates is wrong.
    struct ParseError: Error, Equatable, CustomStringConvertible {
        let description: String
    }

    /// Reads `"12.9716, 77.5946"`: latitude then longitude, separated by a comma (spaces
    /// around it optional), each with an optional sign and up to 8 decimals.
    ///
    /// Returns nil when the text does not look like coordinates at all (a place name);
    /// throws when it does but is malformed or out of range, saying what is wrong.
    static func parse(_ text: String) throws(ParseError) -> Coordinates? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        let allowed = Set("0123456789+-., ")
        guard !trimmed.isEmpty, trimmed.allSatisfy({ allowed.contains($0) }), trimmed.contains(where: \.isNumber) else { return nil }
        let parts = trimmed.split(separator: ",", omittingEmptySubsequences: false)
        guard parts.count == 2 else {
            throw ParseError(description: "coordinates are 'latitude, longitude' (two numbers separated by a comma), got '\(trimmed)'")
        }
        let latitude = try number(parts[0], name: "latitude")
        let longitude = try number(parts[1], name: "longitude")
        guard (-90...90).contains(latitude) else {
            throw ParseError(description: "latitude \(parts[0].trimmingCharacters(in: .whitespaces)) is out of range (-90 to 90)")
        }
        guard (-180...180).contains(longitude) else {
            throw ParseError(description: "longitude \(parts[1].trimmingCharacters(in: .whitespaces)) is out of range (-180 to 180)")
        }
        return Coordinates(latitude: latitude, longitude: longitude)
    }

    private static func number(_ part: Substring, name: String) throws(ParseError) -> Double {
        let text = part.trimmingCharacters(in: .whitespaces)
        var body = Substring(text)
        if body.first == "+" || body.first == "-" { body = body.dropFirst() }
        let pieces = body.split(separator: ".", omittingEmptySubsequences: false)
        guard !body.isEmpty, pieces.count <= 2, pieces.allSatisfy({ !$0.isEmpty && $0.allSatisfy(\.isASCII) && $0.allSatisfy(\.isNumber) }) else {
            throw ParseError(description: "\(name) '\(text)' is not a number such as 52.3547 or -3.7496")
        }
        if pieces.count == 2, pieces[1].count > 8 {
            throw ParseError(description: "\(name) '\(text)' has more than 8 decimals")
        }
        guard pieces[0].count <= 3, let value = Double(text) else {
            throw ParseError(description: "\(name) '\(text)' is out of range")
        }
        return value
    }

    /// Great-circle distance in kilometres (haversine).
    func distanceKm(to other: Coordinates) -> Double {
        let toRadians = Double.pi / 180
        let dLat = (other.latitude - latitude) * toRadians
        let dLon = (other.longitude - longitude) * toRadians
        let h = sin(dLat / 2) * sin(dLat / 2) + cos(latitude * toRadians) * cos(other.latitude * toRadians) * sin(dLon / 2) * sin(dLon / 2)
        return 2 * Self.earthRadiusKm * asin(min(1, sqrt(h)))
    }

    /// The point on the unit sphere: straight-line (chord) distance between these grows with
    /// the great-circle distance, so a 3-d tree over them finds the nearest place.
    var unitVector: SIMD3<Double> {
        let toRadians = Double.pi / 180
        let lat = latitude * toRadians
        let lon = longitude * toRadians
        return SIMD3(cos(lat) * cos(lon), cos(lat) * sin(lon), sin(lat))
    }

    /// Great-circle kilometres for a chord length on the unit sphere.
    static func kilometres(chord: Double) -> Double { 2 * earthRadiusKm * asin(min(1, chord / 2)) }

    /// `52.3547498, 4.8339215`: up to 8 decimals, no trailing zeros.
    var text: String { "\(Self.format(latitude)), \(Self.format(longitude))" }

    static func format(_ degrees: Double) -> String {
        var text = String(format: "%.8f", degrees)
        while text.hasSuffix("0") { text.removeLast() }
        if text.hasSuffix(".") { text.removeLast() }
        return text == "-0" ? "0" : text
    }
}

/// Links into Wikipedia for a place (the format is in docs/PROTOCOL.md).
enum WikipediaLink {
    /// Opens the Wikipedia app's Places tab at the coordinates:
    /// `wikipedia://places?latitude=52.3547498&longitude=4.8339215`.
    static func places(_ point: Coordinates) -> String {
        "wikipedia://places?latitude=\(Coordinates.format(point.latitude))&longitude=\(Coordinates.format(point.longitude))"
    }

    /// The same place on the web, for machines without the app:
    /// `https://en.wikipedia.org/wiki/Special:Nearby#/coord/52.3547498,4.8339215`.
    static func web(_ point: Coordinates) -> String {
        "https://en.wikipedia.org/wiki/Special:Nearby#/coord/\(Coordinates.format(point.latitude)),\(Coordinates.format(point.longitude))"
    }
}
