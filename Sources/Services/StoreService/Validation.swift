import BusProtocol
import Crypto
import Foundation

/// Checks of request params, each failing with -32602 naming the field.
enum Validate {
    static func limit(_ value: Int?, default fallback: Int, max: Int) throws -> Int {
        guard let value else { return fallback }
        guard value >= 1 else { throw JSONRPCError.invalidParams(field: "limit", "must be at least 1") }
        return min(value, max)
    }

    static func offset(_ value: Int?) throws -> Int {
        guard let value else { return 0 }
        guard value >= 0 else { throw JSONRPCError.invalidParams(field: "offset", "must not be negative") }
        return value
    }

    static func webURL(_ text: String, field: String) throws {
        guard text.count <= 2_048, let url = URL(string: text), let scheme = url.scheme?.lowercased(),
              scheme == "http" || scheme == "https", url.host?.isEmpty == false else {
            throw JSONRPCError.invalidParams(field: field, "must be an absolute http or https URL")
        }
    }

    /// Dataset names are short lowercase words (`countries`, `news-sources`).
    static func datasetName(_ name: String) throws -> String {
        let allowed = Set("abcdefghijklmnopqrstuvwxyz0123456789-_")
        guard !name.isEmpty, name.count <= 64, name.allSatisfy(allowed.contains) else {
            throw JSONRPCError.invalidParams(field: "name", "must be a dataset name (lowercase letters, digits, - and _)")
        }
        return name
    }
}

/// A saved article's id: the first 16 hex digits of the SHA-256 of its URL, so the id (and
/// its key `/store/articles/<id>`) is the same in every process and after every restart.
public enum ArticleID {
    public static func of(_ url: String) -> String {
        SHA256.hash(data: Data(url.utf8)).prefix(8).map { byte in
            let hex = String(byte, radix: 16)
            return byte < 16 ? "0" + hex : hex
        }.joined()
    }
}
