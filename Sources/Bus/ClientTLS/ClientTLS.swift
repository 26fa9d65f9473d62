#if canImport(Glibc)
import Glibc
#endif
public import NIOSSL

/// The TLS of a client of a server a deployment names (etcd, PostgreSQL): the CA its
/// certificate must be signed by, and this process's certificate and key for a server that
/// asks for one. Every file is read here, at once: a path that is wrong is said when the
/// client is made, naming the file, rather than at each connection by an error that names
/// none (NIOSSL reads a CA file given by path only when it connects).
public enum ClientTLS {
    /// A client configuration with the given files (`certificateFile` goes with `keyFile`);
    /// without a CA file, the system's roots.
    public static func configuration(caFile: String?, certificateFile: String? = nil, keyFile: String? = nil) throws(ClientTLSError) -> TLSConfiguration {
        var tls = TLSConfiguration.makeClientConfiguration()
        if let caFile {
            let certificates = try read(caFile, "a CA certificate") { try NIOSSLCertificate.fromPEMFile($0) }
            guard !certificates.isEmpty else { throw ClientTLSError(file: caFile, problem: "is not a CA certificate in PEM (it holds none)") }
            tls.trustRoots = .certificates(certificates)
        }
        if let certificateFile, let keyFile {
            tls.certificateChain = try read(certificateFile, "a certificate") { try NIOSSLCertificate.fromPEMFile($0) }.map { .certificate($0) }
            // Said to be PEM: given a path alone, NIOSSL takes a name ending in .key for DER.
            tls.privateKey = .privateKey(try read(keyFile, "a private key") { try NIOSSLPrivateKey(file: $0, format: .pem) })
        }
        return tls
    }

    /// Whether `error` is a handshake refused because the server's certificate is not signed
    /// by a CA this client trusts. BoringSSL says so only in its error's text.
    public static func isUntrustedServer(_ error: any Error) -> Bool {
        "\(error)".contains("CERTIFICATE_VERIFY_FAILED")
    }

    private static func read<T>(_ path: String, _ what: String, _ load: (String) throws -> T) throws(ClientTLSError) -> T {
        guard access(path, R_OK) == 0 else { throw ClientTLSError(file: path, problem: "cannot be read: \(String(cString: strerror(errno)))") }
        do {
            return try load(path)
        } catch {
            throw ClientTLSError(file: path, problem: "is not \(what) in PEM (\(error))")
        }
    }
}

/// A TLS file that cannot be used, and why.
public struct ClientTLSError: Error, Sendable, CustomStringConvertible {
    public let file: String
    public let problem: String
    public var description: String { "\(file) \(problem)" }
}
