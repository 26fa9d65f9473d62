import Crypto
public import Foundation

extension Dataset {
    /// A copy's version: the first 16 hex digits of the SHA-256 of its bytes. The fetcher
    /// publishes it in `/catalog/<name>`; the search service compares it with what it has.
    public static func version(of bytes: some DataProtocol) -> String {
        SHA256.hash(data: bytes).prefix(8).map { byte in (byte < 16 ? "0" : "") + String(byte, radix: 16) }.joined()
    }
}

/// The copy bundled with the build, decoded, with its version.
public struct BundledCopy: Sendable {
    public let decoded: DecodedDataset
    public let version: String
}

extension Dataset {
    /// The bundled copy decoded, with the version the fetcher gives the same bytes.
    public func bundledCopy() throws -> BundledCopy {
        let data = try bundledData()
        return BundledCopy(decoded: try decode(data), version: Dataset.version(of: data))
    }
}
