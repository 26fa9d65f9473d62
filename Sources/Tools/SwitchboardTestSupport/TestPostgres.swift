public import Foundation

/// A PostgreSQL server of its own for a test: a new cluster in a temporary folder
/// (`initdb`, password authentication), its server a ``ChildProcess`` on a free loopback
/// port (so it ends with the test process, however that ends), as the unprivileged
/// `postgres` user when the test runs as root; stopped (and its folder removed) by ``stop()``.
public final class TestPostgres: @unchecked Sendable {
    public let port: Int
    public let folder: URL
    public static let user = "switchboard"
    public static let password = "sw1tch-b0ard"
    /// The server (its postmaster) while it runs.
    private var server: ChildProcess?
    /// Whether it offers TLS (with the certificate and key in its folder).
    private let offersTLS: Bool

    /// The server's binaries (Debian's postgresql package), if installed.
    public static let binaries: URL? = {
        let root = URL(fileURLWithPath: "/usr/lib/postgresql")
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root.path)) ?? []).sorted { $0.compare($1, options: .numeric) == .orderedDescending }
        return versions.map { root.appendingPathComponent("\($0)/bin") }.first { FileManager.default.isExecutableFile(atPath: $0.appendingPathComponent("postgres").path) }
    }()

    public static var available: Bool { binaries != nil }

    /// `postgres://switchboard:PASSWORD@127.0.0.1:PORT/DATABASE`.
    public func url(database: String = "postgres") -> String {
        "postgres://\(Self.user):\(Self.password)@127.0.0.1:\(port)/\(database)"
    }

    private init(port: Int, folder: URL, offersTLS: Bool) {
        self.port = port
        self.folder = folder
        self.offersTLS = offersTLS
    }

    /// A new cluster, started on `port` (default: a free one); offering TLS with `tls`'s
    /// server certificate and key (``TestCertificates``), as Debian's own cluster offers TLS
    /// with a certificate of its own.
    public static func start(port: Int? = nil, tls: TestCertificates? = nil) async throws -> TestPostgres {
        guard let binaries else { throw TestPostgresError(description: "no PostgreSQL server installed (Debian's postgresql package)") }
        let folder = try temporaryDirectory("postgres")
        let data = folder.appendingPathComponent("data")
        let passwordFile = folder.appendingPathComponent("password")
        try password.write(to: passwordFile, atomically: true, encoding: .utf8)
        if let tls {
            // The server reads its key only when no one else may (mode 0600, its own file).
            for name in ["server.pem", "server.key"] {
                try FileManager.default.copyItem(atPath: tls.path(name), toPath: folder.appendingPathComponent(name).path)
            }
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: folder.appendingPathComponent("server.key").path)
        }
        if getuid() == 0 { try await run(URL(fileURLWithPath: "/bin/chown"), ["-R", "postgres:postgres", folder.path]) }
        try await run(binaries.appendingPathComponent("initdb"), ["-D", data.path, "-U", user, "--pwfile", passwordFile.path,
                                                            "--auth", "scram-sha-256", "--encoding", "UTF8", "--no-sync"])
        let server = TestPostgres(port: port ?? freePort(), folder: folder, offersTLS: tls != nil)
        try await server.startServer()
        return server
    }

    /// Starts the server and returns once it accepts connections.
    private func startServer() async throws {
        guard let binaries = Self.binaries else { return }
        let postgres = binaries.appendingPathComponent("postgres")
        let arguments = ["-D", folder.appendingPathComponent("data").path, "-p", "\(port)", "-c", "listen_addresses=127.0.0.1",
                         "-k", folder.path, "-c", "fsync=on"]
            + (offersTLS ? ["-c", "ssl=on", "-c", "ssl_cert_file=\(folder.appendingPathComponent("server.pem").path)",
                            "-c", "ssl_key_file=\(folder.appendingPathComponent("server.key").path)"] : [])
        // The server refuses root: setpriv becomes the postgres user in place (the same pid,
        // which the watcher of the lifeline ends), where runuser would stay as its parent.
        let process = getuid() == 0
            ? try ChildProcess(watched: URL(fileURLWithPath: "/usr/bin/setpriv"), ["--reuid=postgres", "--regid=postgres", "--init-groups", postgres.path] + arguments)
            : try ChildProcess(watched: postgres, arguments)
        server = process
        do {
            try await process.waitForOutput(containing: "database system is ready to accept connections", within: 60)
        } catch {
            process.stop(grace: 1)
            server = nil
            throw TestPostgresError(description: "the PostgreSQL server did not start: \(error)")
        }
    }

    /// Stops the server at once, as a crash would (SIGQUIT, PostgreSQL's immediate shutdown:
    /// what it acknowledged is in its write-ahead log, nothing else is flushed).
    public func kill() async {
        guard let server else { return }
        server.signal(SIGQUIT)
        _ = await server.exit(within: 30)
        server.stop(grace: 0)
        self.server = nil
    }

    /// Starts it again on the same port and data.
    public func restart() async throws {
        await kill()
        try await startServer()
    }

    /// Stops the server (SIGINT, PostgreSQL's fast shutdown) and removes its folder.
    public func stop() {
        if let server {
            server.signal(SIGINT)
            server.stop(grace: 10)
            self.server = nil
        }
        try? FileManager.default.removeItem(at: folder)
    }

    /// The server's process (its postmaster), while it runs.
    public var pid: Int32? { server?.pid }

    /// The server's log so far.
    public var log: String { server?.outputSoFar ?? "" }

    /// A `psql` session on the server, reading SQL from its standard input: what a test sends
    /// runs at once, and a transaction it begins stays open until the test ends it.
    public func session() throws -> ChildProcess {
        try ChildProcess(Self.binaries!.appendingPathComponent("psql"),
                         ["-h", "127.0.0.1", "-p", String(port), "-U", Self.user, "-d", "postgres", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"],
                         environment: ["PGPASSWORD": Self.password])
    }

    /// What `write` answers when it runs while another session is midway through a
    /// transaction (`statements`, not committed yet), as another process's would be: the
    /// transaction commits once `write` waits for a lock (`waiting`, SQL on `pg_locks`).
    public func whileAnotherTransaction<T: Sendable>(_ statements: String, commitsOnceWaiting waiting: String = "true",
                                                     _ write: @escaping @Sendable () async -> T) async throws -> T {
        let other = try session()
        defer { other.stop() }
        other.send("BEGIN; \(statements); SELECT 'midway';\n")
        try await other.waitForOutput(containing: "midway", within: 10)
        async let outcome = write()
        let watcher = try session()
        defer { watcher.stop() }
        try await waitForLockWaiters(1, where: waiting, on: watcher)
        other.send("COMMIT;\n")
        return await outcome
    }

    /// Returns once `count` sessions wait for a lock `condition` (SQL on `pg_locks`) says
    /// which, asking on `watcher` (a ``session()``) again and again.
    public func waitForLockWaiters(_ count: Int, where condition: String, on watcher: ChildProcess, within seconds: Double = 10) async throws {
        try await eventually(seconds, "\(count) sessions wait for a lock (\(condition))") {
            // Asked again each time; any answer so far may say so.
            watcher.send("SELECT 'waiting ' || count(*) FROM pg_locks WHERE NOT granted AND \(condition);\n")
            return watcher.outputSoFar.split(separator: "\n").contains("waiting \(count)")
        }
    }

    /// Runs a tool to its end (`initdb` as the `postgres` user when this process is root: it
    /// refuses root); its output goes into the error if it fails.
    private static func run(_ tool: URL, _ arguments: [String]) async throws {
        let asPostgres = getuid() == 0 && tool.lastPathComponent != "chown"
        let result = asPostgres
            ? try await runCommand(URL(fileURLWithPath: "/usr/sbin/runuser"), ["-u", "postgres", "--", tool.path] + arguments, seconds: 120)
            : try await runCommand(tool, arguments, seconds: 120)
        guard result.status == 0 else {
            throw TestPostgresError(description: "\(tool.lastPathComponent) \(arguments.joined(separator: " ")): \(result.stdout)\(result.stderr)")
        }
    }

    deinit { stop() }
}

public struct TestPostgresError: Error, CustomStringConvertible {
    public let description: String
}
