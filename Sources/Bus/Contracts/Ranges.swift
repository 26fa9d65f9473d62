/// Ranges several contracts share (each contract's own are beside its params, as
/// `NumberRanges`).
enum Ranges {
    /// Where a page starts: far past any dataset, and small enough that no offset arithmetic
    /// overflows.
    static let offset: ClosedRange<Double> = 0...1_000_000_000
}
