public import Foundation

/// A certificate authority and, signed by it, a certificate for a server at 127.0.0.1 and
/// one for a client: PEM files made by openssl (`ca.pem`, `server.pem`/`server.key`,
/// `client.pem`/`client.key`) in a folder of their own. The server's may also authenticate
/// as a client, as etcd's JSON gateway does when it reaches its own member.
public struct TestCertificates: Sendable {
    public let folder: URL
    public func path(_ name: String) -> String { folder.appendingPathComponent(name).path }

    public static func make() async throws -> TestCertificates {
        let certificates = TestCertificates(folder: try temporaryDirectory("certificates"))
        let openssl = URL(fileURLWithPath: "/usr/bin/openssl")
        func run(_ arguments: [String]) async throws {
            let result = try await runCommand(openssl, arguments, in: certificates.folder)
            guard result.status == 0 else { throw Failure(description: "openssl \(arguments.joined(separator: " ")): \(result)") }
        }
        let newKey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        try await run(["req", "-x509"] + newKey + ["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=switchboard-test-ca"])
        for (name, extensions) in [("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"),
                                   ("client", "extendedKeyUsage=clientAuth\n")] {
            try extensions.write(toFile: certificates.path("\(name).ext"), atomically: true, encoding: .utf8)
            try await run(["req", "-new"] + newKey + ["-keyout", "\(name).key", "-out", "\(name).csr", "-subj", "/CN=\(name)"])
            try await run(["x509", "-req", "-in", "\(name).csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                           "-out", "\(name).pem", "-days", "2", "-extfile", "\(name).ext"])
        }
        return certificates
    }

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Removes the folder.
    public func remove() { try? FileManager.default.removeItem(at: folder) }
}
