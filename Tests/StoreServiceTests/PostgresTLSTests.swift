import BusProtocol
import Foundation
import Logging
import Storage
import SwitchboardTestSupport
import Testing

@Suite("PostgreSQL over TLS: a server that offers it, with a certificate of its own as Debian's cluster has",
       .enabled(if: TestPostgres.available, "skipped: no PostgreSQL server installed (the test bootstrap installs it)"))
struct PostgresTLSTests {
    /// Whether the server says the connection a durable service's writer reads on is encrypted.
    private func encrypted(_ settings: PostgresSettings) async throws -> Bool {
        let writer = try PostgresWriter(settings: settings, schema: nil, migrations: [], lockKey: 1, replyWindow: .seconds(60), logger: Logger(label: "test"))
        let connections = Task { try await writer.connections.run() }
        return try await stopping(connections, with: { connections in
            connections.cancel()
            _ = await connections.result
        }) { _ in
            try await writer.read { db in try db.row("SELECT ssl::int AS ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", [])?.bool("ssl") ?? false }
        }
    }

    @Test("tls prefer (the default) encrypts whatever certificate the server has; require checks it against ca_file, and without one refuses a certificate it cannot trust, saying so; a ca_file that cannot be used is said at start; disable does not encrypt")
    func modes() async throws {
        let certificates = try await TestCertificates.make()
        defer { certificates.remove() }
        let server = try await TestPostgres.start(tls: certificates)
        defer { server.stop() }
        let url = server.url()
        #expect(try await encrypted(PostgresSettings(url: url, poolSize: 1, operationTimeout: .seconds(10))))
        #expect(try await encrypted(PostgresSettings(url: url, poolSize: 1, tls: .require, caFile: certificates.path("ca.pem"), operationTimeout: .seconds(10))))
        #expect(try await !encrypted(PostgresSettings(url: url, poolSize: 1, tls: .disable, operationTimeout: .seconds(10))))
        let untrusted = await #expect(throws: JSONRPCError.self) {
            try await encrypted(PostgresSettings(url: url, poolSize: 1, tls: .require, operationTimeout: .seconds(2)))
        }
        #expect(untrusted?.code == JSONRPCError.storageFailedCode, "\(String(describing: untrusted))")
        // What the service says of it while it waits for the database at its start.
        let logger = Logger(label: "test")
        let problem = await PostgresSettings(url: url, tls: .require, operationTimeout: .seconds(10)).connectionProblem(logger: logger)
        #expect(problem?.contains("the server's TLS certificate is not signed by a CA this service trusts") == true, "\(String(describing: problem))")
        #expect(await PostgresSettings(url: url, tls: .require, caFile: certificates.path("ca.pem"), operationTimeout: .seconds(10)).connectionProblem(logger: logger) == nil)
        // A CA file that cannot be used is said when the service's connections are made, naming it.
        for (file, problem) in [("nowhere.pem", "cannot be read"), ("client.key", "is not a CA certificate in PEM")] {
            let unusable = #expect(throws: StorageFailure.self) {
                try PostgresWriter(settings: PostgresSettings(url: url, tls: .require, caFile: certificates.path(file)), schema: nil, migrations: [],
                                   lockKey: 1, replyWindow: .seconds(60), logger: logger)
            }
            #expect(unusable?.detail.contains("\(certificates.path(file)) \(problem)") == true, "\(String(describing: unusable))")
        }
    }
}
