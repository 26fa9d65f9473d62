import Foundation

/// Reading the small files a person names (a configuration, a key, a token, a script): at most
/// a bound's worth of bytes, since a name can point at something that never ends (/dev/zero,
/// a pipe) and reading on would only fill memory; a failure is the system's reason.
package enum FileContents {
    /// The most a key or token file is read to: one holds a few hundred bytes.
    package static let largestKeyFile = 64 * 1024

    /// Why a file could not be read, in a few words ("No such file or directory", "it is a
    /// folder", "it holds more than the limit of 65536 bytes"), for a message that names the file.
    package struct Failure: Error, Sendable, CustomStringConvertible {
        package let reason: String
        package var description: String { reason }
    }

    /// The bytes of the file at `path`, when it holds at most `limit`.
    package static func bytes(_ path: String, atMost limit: Int) throws(Failure) -> [UInt8] {
        let descriptor = try openForReading(path)
        defer { close(descriptor) }
        guard let bytes = try readToEnd(descriptor, atMost: limit) else {
            throw Failure(reason: "it holds more than the limit of \(limit) bytes")
        }
        return bytes
    }

    /// The UTF-8 text of the file at `path`, when it holds at most `limit` bytes.
    package static func text(_ path: String, atMost limit: Int) throws(Failure) -> String {
        guard let text = String(validating: try bytes(path, atMost: limit), as: UTF8.self) else {
            throw Failure(reason: "it is not UTF-8 text")
        }
        return text
    }

    /// A descriptor open to read the file at `path`; a folder is refused.
    package static func openForReading(_ path: String) throws(Failure) -> Int32 {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw Failure(reason: String(cString: strerror(errno))) }
        var info = stat()
        if fstat(descriptor, &info) == 0, info.st_mode & S_IFMT != S_IFDIR { return descriptor }
        close(descriptor)
        throw Failure(reason: "it is a folder")
    }

    /// What `descriptor` holds, to its end; nil once that is more than `limit` bytes, read no
    /// further.
    package static func readToEnd(_ descriptor: Int32, atMost limit: Int) throws(Failure) -> [UInt8]? {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            if count == 0 { return bytes }
            if count < 0 {
                if errno == EINTR { continue }
                throw Failure(reason: String(cString: strerror(errno)))
            }
            bytes += chunk[..<count]
            if bytes.count > limit { return nil }
        }
    }
}
