import Foundation

/// The operating system's one-line reason for a failed file operation ("Permission denied",
/// "Not a directory") rather than Foundation's dump of an error's domain, code and user info.
/// Foundation on Linux puts the system's error under the key as a `POSIXError`, not an
/// `NSError`.
package func systemReason(_ error: any Error) -> String {
    let underlying = (error as NSError).userInfo[NSUnderlyingErrorKey]
    for candidate in [error, underlying] {
        if let posix = candidate as? POSIXError { return String(cString: strerror(posix.code.rawValue)) }
        if let other = candidate as? NSError, other.domain == NSPOSIXErrorDomain { return String(cString: strerror(Int32(other.code))) }
    }
    return error.localizedDescription
}
