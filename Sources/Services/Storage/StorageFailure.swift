package import BusProtocol
import SwitchboardConfig
import Foundation
import GRDB
#if canImport(Glibc)
import Glibc
#endif

/// A storage failure as a durable service's callers see it: -32007 with the reason and the
/// path, e.g. "Storage failed: the database is read-only (/var/lib/switchboard/store.sqlite)".
package struct StorageFailure: Error, Sendable {
    /// One of read-only, full, corrupt, io, cannot-open, busy, other.
    package let reason: String
    package let detail: String
    package let path: String

    package init(reason: String, detail: String, path: String) {
        (self.reason, self.detail, self.path) = (reason, detail, path)
    }

    package init(_ error: any Error, path: String) {
        if let failure = error as? StorageFailure {
            self = failure
            return
        }
        self.path = path
        guard let error = error as? DatabaseError else {
            reason = "other"
            detail = systemReason(error)
            return
        }
        switch error.resultCode {
        case .SQLITE_READONLY, .SQLITE_PERM: (reason, detail) = ("read-only", "the database is read-only")
        case .SQLITE_FULL: (reason, detail) = ("full", "the disk or the database's size limit is full")
        case .SQLITE_CORRUPT, .SQLITE_NOTADB: (reason, detail) = ("corrupt", "the database file is corrupt or not a database")
        case .SQLITE_IOERR: (reason, detail) = ("io", "a disk I/O error occurred")
        case .SQLITE_CANTOPEN: (reason, detail) = ("cannot-open", "the database file cannot be opened" + Self.whyNotOpened(path))
        case .SQLITE_BUSY, .SQLITE_LOCKED: (reason, detail) = ("busy", "the database stayed locked by another process")
        default: (reason, detail) = ("other", error.message ?? "\(error)")
        }
    }

    /// What the system says of a database file SQLite could not open (SQLite says only that
    /// it could not): ": it is a folder", ": Permission denied"; empty when nothing is found.
    package static func whyNotOpened(_ path: String) -> String {
        var info = stat()
        if stat(path, &info) == 0 {
            if info.st_mode & S_IFMT == S_IFDIR { return ": it is a folder" }
            return access(path, R_OK | W_OK) == 0 ? "" : ": \(String(cString: strerror(errno)))"
        }
        let folder = URL(fileURLWithPath: path).deletingLastPathComponent().path
        return access(folder, W_OK | X_OK) == 0 ? "" : ": its folder \(folder): \(String(cString: strerror(errno)))"
    }

    package var rpcError: JSONRPCError {
        JSONRPCError(code: JSONRPCError.storageFailedCode, message: "Storage failed: \(detail) (\(path))",
                     data: ["reason": .string(reason), "path": .string(path)])
    }
}
