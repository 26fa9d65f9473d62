public import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A PostgreSQL server of its own for a test: a new cluster in a temporary folder
/// (`initdb`, password authentication), started with `pg_ctl` on a free loopback port as
/// the unprivileged `postgres` user when the test runs as root, stopped (and its folder
/// removed) by ``stop()``.
public final class TestPostgres: @unchecked Sendable {
    public let port: Int
    public let folder: URL
    public static let user = "switchboard"
    public static let password = "sw1tch-b0ard"
    private var running = true

    /// The server's binaries (Debian's postgresql package), if installed.
    public static let binaries: URL? = {
        let root = URL(fileURLWithPath: "/usr/lib/postgresql")
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root.path)) ?? []).sorted { $0.compare($1, options: .numeric) == .orderedDescending }
        return versions.map { root.appendingPathComponent("\($0)/bin") }.first { FileManager.default.isExecutableFile(atPath: $0.appendingPathComponent("pg_ctl").path) }
    }()

    public static var available: Bool { binaries != nil }

    /// `postgres://switchboard:PASSWORD@127.0.0.1:PORT/DATABASE`.
    public func url(database: String = "postgres") -> String {
        "postgres://\(Self.user):\(Self.password)@127.0.0.1:\(port)/\(database)"
    }

    private init(port: Int, folder: URL) {
        self.port = port
        self.folder = folder
    }

    /// A new cluster, started on `port` (default: a free one).
    public static func start(port: Int? = nil) async throws -> TestPostgres {
        guard let binaries else { throw TestPostgresError(description: "no PostgreSQL server installed (Debian's postgresql package)") }
        let folder = try temporaryDirectory("postgres")
        let data = folder.appendingPathComponent("data")
        let passwordFile = folder.appendingPathComponent("password")
        try password.write(to: passwordFile, atomically: true, encoding: .utf8)
        if getuid() == 0 { try run(URL(fileURLWithPath: "/bin/chown"), ["-R", "postgres:postgres", folder.path]) }
        try run(binaries.appendingPathComponent("initdb"), ["-D", data.path, "-U", user, "--pwfile", passwordFile.path,
                                                            "--auth", "scram-sha-256", "--encoding", "UTF8", "--no-sync"])
        let server = TestPostgres(port: port ?? freePort(), folder: folder)
        try server.startServer()
        return server
    }

    private func startServer() throws {
        guard let binaries = Self.binaries else { return }
        try Self.run(binaries.appendingPathComponent("pg_ctl"), [
            "-D", folder.appendingPathComponent("data").path, "-l", folder.appendingPathComponent("server.log").path, "-w", "-t", "30",
            "-o", "-p \(port) -c listen_addresses=127.0.0.1 -k \(folder.path) -c fsync=on", "start",
        ])
        running = true
    }

    /// Stops the server at once, as a crash would (`pg_ctl stop -m immediate`).
    public func kill() throws {
        guard let binaries = Self.binaries, running else { return }
        try Self.run(binaries.appendingPathComponent("pg_ctl"), ["-D", folder.appendingPathComponent("data").path, "-m", "immediate", "stop"])
        running = false
    }

    /// Starts it again on the same port and data.
    public func restart() throws {
        try kill()
        try startServer()
    }

    /// Stops the server and removes its folder.
    public func stop() {
        if running, let binaries = Self.binaries {
            try? Self.run(binaries.appendingPathComponent("pg_ctl"), ["-D", folder.appendingPathComponent("data").path, "-m", "fast", "stop"])
            running = false
        }
        try? FileManager.default.removeItem(at: folder)
    }

    /// The server's process (its postmaster), while it runs.
    public var pid: Int32? {
        guard running, let text = try? String(contentsOf: folder.appendingPathComponent("data/postmaster.pid"), encoding: .utf8) else { return nil }
        return text.split(separator: "\n").first.flatMap { Int32($0) }
    }

    /// The server's log so far.
    public var log: String { (try? String(contentsOf: folder.appendingPathComponent("server.log"), encoding: .utf8)) ?? "" }

    /// Runs a PostgreSQL tool, as the `postgres` user when this process is root (initdb and
    /// the server refuse root), and waits for it (not for the server `pg_ctl start` leaves
    /// running: Foundation's `Process` would, as the server inherits what it watches).
    private static func run(_ tool: URL, _ arguments: [String]) throws {
        let asPostgres = getuid() == 0 && tool.lastPathComponent != "chown"
        // Through a shell that closes every descriptor but the first three: nothing else of
        // this process's (the lifelines of the test's other child processes among them) goes
        // to the server, which outlives the tool that started it.
        let closeOthers = #"for fd in /proc/$$/fd/*; do n=${fd##*/}; [ "$n" -gt 2 ] && eval "exec $n>&-" 2>/dev/null; done; exec "$@""#
        let command = ["/bin/bash", "-c", closeOthers, "bash"]
            + (asPostgres ? ["/usr/sbin/runuser", "-u", "postgres", "--", tool.path] + arguments : [tool.path] + arguments)
        let outputFile = FileManager.default.temporaryDirectory.appendingPathComponent("pg-tool-\(UUID().uuidString).log")
        defer { try? FileManager.default.removeItem(at: outputFile) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outputFile.path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        var pid: pid_t = 0
        let argv = command.map { strdup($0) } + [nil]
        defer { for argument in argv { free(argument) } }
        let spawned = posix_spawn(&pid, command[0], &actions, nil, argv, environ)
        guard spawned == 0 else { throw TestPostgresError(description: "cannot run \(command[0]): \(String(cString: strerror(spawned)))") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        let exited = status & 0x7f == 0 && (status >> 8) & 0xff == 0
        guard exited else {
            let text = (try? String(contentsOf: outputFile, encoding: .utf8)) ?? ""
            throw TestPostgresError(description: "\(tool.lastPathComponent) \(arguments.joined(separator: " ")): \(text)")
        }
    }

    deinit { stop() }
}

public struct TestPostgresError: Error, CustomStringConvertible {
    public let description: String
}
