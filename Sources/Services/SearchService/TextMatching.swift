import Foundation

/// Text as search compares it: lower case, without diacritics (`Åland` → `aland`), with
/// runs of white space made one space and the ends trimmed.
func folded(_ text: String) -> String {
    let trimmed = text.split(whereSeparator: \.isWhitespace).joined(separator: " ")
    return trimmed.folding(options: [.caseInsensitive, .diacriticInsensitive], locale: nil)
}

/// Folded text as UTF-8 bytes: prefix and substring tests compare bytes, which is many
/// times faster than `String`'s Unicode-aware `contains` in a loop over every record.
struct FoldedText: Sendable, Equatable {
    let bytes: [UInt8]

    init(_ text: String) { bytes = Array(folded(text).utf8) }

    var isEmpty: Bool { bytes.isEmpty }

    func hasPrefix(_ other: FoldedText) -> Bool {
        other.bytes.count <= bytes.count && bytes.prefix(other.bytes.count).elementsEqual(other.bytes)
    }

    func contains(_ other: FoldedText) -> Bool {
        let needle = other.bytes
        guard !needle.isEmpty else { return true }
        guard needle.count <= bytes.count else { return false }
        return bytes.withUnsafeBufferPointer { hay in
            needle.withUnsafeBufferPointer { needle in
                let first = needle[0]
                var start = 0
                while start <= hay.count - needle.count {
                    if hay[start] == first {
                        var k = 1
                        while k < needle.count, hay[start + k] == needle[k] { k += 1 }
                        if k == needle.count { return true }
                    }
                    start += 1
                }
                return false
            }
        }
    }
}

/// How a name is ordered within a group of the hiring list.
enum NameOrder: String, Sendable, CaseIterable {
    /// Byte by byte, as the apps sort: "Item 1", "Item 100", "Item 2".
    case lexical
    /// Runs of digits by their value, letters without regard to case:
    /// "Item 1", "Item 2", "Item 100".
    case natural
}

/// Whether `a` comes before `b` in natural order (0 when equal, negative when before).
/// Digit runs compare by value (leading zeros ignored, then shorter run first), other
/// bytes by their ASCII lower case; UTF-8 beyond ASCII compares byte by byte.
func naturalCompare(_ a: UnsafeBufferPointer<UInt8>, _ b: UnsafeBufferPointer<UInt8>) -> Int {
    var i = 0
    var j = 0
    while i < a.count, j < b.count {
        let x = a[i]
        let y = b[j]
        if isDigit(x), isDigit(y) {
            // Skip leading zeros, then the longer run is the larger number.
            var si = i, sj = j
            while si < a.count, a[si] == 0x30 { si += 1 }
            while sj < b.count, b[sj] == 0x30 { sj += 1 }
            var ei = si, ej = sj
            while ei < a.count, isDigit(a[ei]) { ei += 1 }
            while ej < b.count, isDigit(b[ej]) { ej += 1 }
            if ei - si != ej - sj { return (ei - si) - (ej - sj) }
            var k = 0
            while k < ei - si {
                if a[si + k] != b[sj + k] { return Int(a[si + k]) - Int(b[sj + k]) }
                k += 1
            }
            i = ei
            j = ej
            continue
        }
        let lx = lowered(x)
        let ly = lowered(y)
        if lx != ly { return Int(lx) - Int(ly) }
        i += 1
        j += 1
    }
    return (a.count - i) - (b.count - j)
}

/// Byte-by-byte order (negative when `a` comes first).
func lexicalCompare(_ a: UnsafeBufferPointer<UInt8>, _ b: UnsafeBufferPointer<UInt8>) -> Int {
    let common = min(a.count, b.count)
    var k = 0
    while k < common {
        if a[k] != b[k] { return Int(a[k]) - Int(b[k]) }
        k += 1
    }
    return a.count - b.count
}

@inline(__always) private func isDigit(_ byte: UInt8) -> Bool { byte >= 0x30 && byte <= 0x39 }
@inline(__always) private func lowered(_ byte: UInt8) -> UInt8 { byte >= 0x41 && byte <= 0x5A ? byte + 0x20 : byte }
