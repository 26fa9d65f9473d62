import Contracts
import Catalog

/// The hiring list, grouped by list id and sorted within each group in both orders.
///
/// Names live in one byte arena so that sorting a million of them compares bytes in place
/// rather than `String`s.
struct ItemIndex: Sendable {
    struct Group: Sendable {
        let listId: Int
        /// Indices into `kept`, in order.
        let members: [Int32]
    }

    /// The items with a usable name (not null, not empty, not only white space).
    let kept: [HiringItem]
    /// How many items of each list were left out for their name (a list whose items all lack
    /// one has no group, only this count).
    let droppedByList: [Int: Int]
    let lexical: [Group]
    let natural: [Group]

    init(_ items: [HiringItem]) {
        var kept: [HiringItem] = []
        kept.reserveCapacity(items.count)
        var arena: [UInt8] = []
        var spans: [(start: Int, count: Int)] = []
        var droppedByList: [Int: Int] = [:]
        for item in items {
            guard let name = item.name, name.contains(where: { !$0.isWhitespace }) else {
                droppedByList[item.listId, default: 0] += 1
                continue
            }
            kept.append(item)
            let start = arena.count
            arena.append(contentsOf: name.utf8)
            spans.append((start, arena.count - start))
        }
        self.kept = kept
        self.droppedByList = droppedByList

        // Group by list id (ascending), members by id first for the ties.
        var byList: [Int: [Int32]] = [:]
        for (index, item) in kept.enumerated() { byList[item.listId, default: []].append(Int32(index)) }
        let listIds = byList.keys.sorted()
        let sortedKept = kept
        func ordered(_ compare: (UnsafeBufferPointer<UInt8>, UnsafeBufferPointer<UInt8>) -> Int) -> [Group] {
            arena.withUnsafeBufferPointer { bytes in
                listIds.map { listId in
                    let members = byList[listId]!.sorted { a, b in
                        let x = spans[Int(a)], y = spans[Int(b)]
                        let order = compare(UnsafeBufferPointer(rebasing: bytes[x.start..<x.start + x.count]),
                                            UnsafeBufferPointer(rebasing: bytes[y.start..<y.start + y.count]))
                        if order != 0 { return order < 0 }
                        return sortedKept[Int(a)].id < sortedKept[Int(b)].id
                    }
                    return Group(listId: listId, members: members)
                }
            }
        }
        lexical = ordered(lexicalCompare)
        natural = ordered { a, b in
            let order = naturalCompare(a, b)
            return order != 0 ? order : lexicalCompare(a, b)
        }
    }

    func groups(_ order: NameOrder) -> [Group] { order == .lexical ? lexical : natural }

    /// The items left out for their name: of one list, or of all (nil).
    func dropped(inList listId: Int?) -> Int {
        guard let listId else { return droppedByList.values.reduce(0, +) }
        return droppedByList[listId] ?? 0
    }
}
