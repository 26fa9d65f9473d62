import Catalog
import Foundation
@testable import SearchService
import Testing

@Suite("search: the nearest-place tree")
struct PlaceTreeTests {
    @Test("finds what a scan finds, with duplicates, clusters and an excluded place", arguments: [1, 2, 7, 2_000])
    func agreesWithScan(count: Int) {
        var random = SeededGenerator(seed: UInt64(count))
        var points: [Coordinates] = (0..<count).map { _ in
            Coordinates(latitude: .random(in: -90...90, using: &random), longitude: .random(in: -180...180, using: &random))
        }
        // Many places at one spot and a tight cluster.
        if count > 10 {
            for i in 0..<200 { points[i] = Coordinates(latitude: 52.37, longitude: 4.89) }
            for i in 200..<400 { points[i] = Coordinates(latitude: 40 + Double(i) * 1e-6, longitude: -3.7) }
        }
        let tree = PlaceTree(points: points.map(\.unitVector), places: Array(points.indices))
        for _ in 0..<300 {
            let target = Coordinates(latitude: .random(in: -90...90, using: &random), longitude: .random(in: -180...180, using: &random))
            let excluded = Int.random(in: 0..<count, using: &random)
            let scan = points.indices.filter { $0 != excluded }.min { target.distanceKm(to: points[$0]) < target.distanceKm(to: points[$1]) }
            let found = tree.nearest(to: target.unitVector, where: { $0 != excluded })
            #expect(found?.place != excluded)
            if let scan, let found {
                #expect(abs(target.distanceKm(to: points[found.place]) - target.distanceKm(to: points[scan])) < 1e-6)
                #expect(abs(Coordinates.kilometres(chord: found.chord) - target.distanceKm(to: points[scan])) < 1e-3)
            } else {
                #expect(scan == nil && found == nil)
            }
        }
    }

    @Test("an empty tree finds nothing")
    func empty() {
        #expect(PlaceTree(points: [], places: []).nearest(to: SIMD3(1, 0, 0)) == nil)
    }
}
