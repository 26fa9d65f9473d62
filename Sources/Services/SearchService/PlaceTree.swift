/// A 3-d tree over points on the unit sphere, for the nearest place among many
/// (O(log n) per query on spread-out data, instead of a scan).
///
/// Built once, never changed: the points are reordered so that each subtree is a
/// contiguous range whose middle element splits it on the axis `depth % 3`.
struct PlaceTree: Sendable {
    /// The points, in tree order, and for each the index of its place in the caller's list.
    private var points: [SIMD3<Double>] = []
    private var places: [Int32] = []

    var isEmpty: Bool { points.isEmpty }

    /// Builds the tree over `points[i]` for the places `i` given.
    init(points source: [SIMD3<Double>], places indices: [Int]) {
        points = indices.map { source[$0] }
        places = indices.map { Int32($0) }
        build(0, points.count, axis: 0)
    }

    init() {}

    private mutating func build(_ lower: Int, _ upper: Int, axis: Int) {
        guard upper - lower > 1 else { return }
        let middle = (lower + upper) / 2
        select(middle, in: lower, upper, axis: axis)
        let next = (axis + 1) % 3
        build(lower, middle, axis: next)
        build(middle + 1, upper, axis: next)
    }

    /// Puts the element of rank `k` at `k`, smaller ones before it and larger after
    /// (quickselect with a median-of-three pivot and a three-way partition, so many equal
    /// coordinates cost no more than distinct ones).
    private mutating func select(_ k: Int, in lower: Int, _ upper: Int, axis: Int) {
        var lo = lower
        var hi = upper - 1
        while lo < hi {
            let a = points[lo][axis], b = points[(lo + hi) / 2][axis], c = points[hi][axis]
            let pivot = max(min(a, b), min(max(a, b), c))
            // [lo, less) < pivot, [less, i) == pivot, (greater, hi] > pivot.
            var less = lo
            var i = lo
            var greater = hi
            while i <= greater {
                let value = points[i][axis]
                if value < pivot {
                    swapAt(i, less)
                    less += 1
                    i += 1
                } else if value > pivot {
                    swapAt(i, greater)
                    greater -= 1
                } else {
                    i += 1
                }
            }
            if k < less {
                hi = less - 1
            } else if k > greater {
                lo = greater + 1
            } else {
                return
            }
        }
    }

    private mutating func swapAt(_ i: Int, _ j: Int) {
        points.swapAt(i, j)
        places.swapAt(i, j)
    }

    /// The place nearest to `target` among those `accept` lets through, with the chord
    /// distance to it; nil when there is none.
    func nearest(to target: SIMD3<Double>, where accept: (Int) -> Bool = { _ in true }) -> (place: Int, chord: Double)? {
        var best: (place: Int, squared: Double)?
        search(0, points.count, axis: 0, target: target, accept: accept, best: &best)
        return best.map { ($0.place, $0.squared.squareRoot()) }
    }

    private func search(_ lower: Int, _ upper: Int, axis: Int, target: SIMD3<Double>, accept: (Int) -> Bool,
                        best: inout (place: Int, squared: Double)?) {
        guard lower < upper else { return }
        let middle = (lower + upper) / 2
        let point = points[middle]
        let offset = point - target
        let squared = (offset * offset).sum()
        if squared < (best?.squared ?? .infinity), accept(Int(places[middle])) {
            best = (Int(places[middle]), squared)
        }
        let difference = target[axis] - point[axis]
        let next = (axis + 1) % 3
        let (near, far) = difference < 0 ? ((lower, middle), (middle + 1, upper)) : ((middle + 1, upper), (lower, middle))
        search(near.0, near.1, axis: next, target: target, accept: accept, best: &best)
        // The far side can only hold something nearer when the splitting plane is nearer.
        if difference * difference < (best?.squared ?? .infinity) {
            search(far.0, far.1, axis: next, target: target, accept: accept, best: &best)
        }
    }
}
