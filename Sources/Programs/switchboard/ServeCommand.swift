import ArgumentParser
import BusKit
import BusProtocol
import Foundation
import Logging
import ServiceLifecycle
import StandardStreams
import Deployment
import SwitchboardConfig
import ZeroMQ

struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run one service and register it with a kernel (here or on another machine).",
        discussion: """
            NAME is one of:
              echo      answers with what it is sent
              store     history, articles, selections, snapshots (--db: its SQLite file)
              streams   durable streams and their consumers (--db: its SQLite file)
              fetcher   the seven datasets, from their sources or bundled copies
              search    countries, places, the hiring list, news and flights
              pricing   route quotes, the current route, deals

            Examples:
              switchboard serve echo
              switchboard serve store --db /tmp/store.sqlite
              switchboard serve search --broker tcp://10.0.0.1:5555 \\
                                       --state tcp://10.0.0.1:5556   (the kernel elsewhere)
            """
    )

    @OptionGroup var common: CommonOptions
    @Argument(help: "The service to run: \(Pieces.names.joined(separator: ", ")).")
    var name: String
    @OptionGroup var kernels: KernelEndpointOptions
    @Option(parsing: .unconditional, help: "Worker connections (default: services.NAME.workers).")
    var connections: Int?
    @Option(parsing: .unconditional, help: "Requests each connection holds at once, 1 to 4096; 1 is plain 7/MDP (default: services.NAME.window, 16).")
    var window: Int?
    @Option(parsing: .unconditional, help: "Heartbeat interval in milliseconds (default: kernel.heartbeat_ms; match the kernel's).")
    var heartbeatMs: Int?
    @Option(parsing: .unconditional, help: "Missed heartbeats before the kernel is considered gone (default: kernel.liveness).")
    var liveness: Int?
    @Option(help: "A name for this instance, reported by echo's whoami.")
    var instance: String?
    @Option(help: "store and streams: the SQLite database file (overrides store.path or streams.path).")
    var db: String?

    func validate() throws {
        guard Pieces.names.contains(name) else {
            throw ValidationError("unknown service '\(name)'; known: \(Pieces.names.joined(separator: ", "))")
        }
        guard (connections ?? 1) > 0, (heartbeatMs ?? 1) > 0, (liveness ?? 1) > 0 else {
            throw ValidationError("--connections, --heartbeat-ms and --liveness must be positive")
        }
        if let window, !(1...MDP.maxWindow).contains(window) {
            throw ValidationError("--window must be 1 to \(MDP.maxWindow), got \(window)")
        }
        if db != nil, !["store", "streams"].contains(name) {
            throw ValidationError("--db names the SQLite file of store or streams; \(name) keeps no database")
        }
    }

    func run() async throws {
        var file = try common.configFile.load()
        let telemetry = try common.bootstrap(file, exporting: name)
        if let db {
            if name == "store" { file.store.path = db } else { file.streams.path = db }
            // The file named on the command line: its problem is a usage error naming --db.
            do throws(ConfigError) {
                try file.prepareDatabaseFolders(for: [name])
            } catch {
                StandardStreams.writeError("switchboard: --db: \(error.problem)\n")
                throw ExitCode(64)
            }
        } else {
            try common.configFile.checked { try file.prepareDatabaseFolders(for: [name]) }
        }
        let kernel = file.kernel
        let curve = try common.configFile.checked { try file.security.connectingKeys(as: name) }
        let connection = Connection(
            brokers: kernels.brokers(file),
            state: kernels.stateEndpoints(file),
            workers: connections ?? file.services[name]?.workers ?? 2,
            window: window ?? file.services[name]?.window ?? 16,
            heartbeatInterval: heartbeatMs.map { .milliseconds($0) } ?? kernel.heartbeatInterval,
            liveness: liveness ?? kernel.heartbeatLiveness,
            curve: curve, context: nil, instance: instance, maxMessageSize: kernel.maxMessageSize,
            maxBatchItems: kernel.maxBatchItems)
        let parts = try await Pieces.service(name, file: file, connection: connection)
        // SIGTERM drains (the host tells the kernel, answers what it holds, then leaves); so
        // does a kernel's `workers.drain`, after which the process exits 0.
        // SIGHUP: the log level (a new worker count takes a restart: `up` does it rolling).
        let reloading = try common.reloading("switchboard.\(name)")
        let group = ServiceGroup(configuration: .init(services: (telemetry + [reloading]).map { .init(service: $0) } + Pieces.grouped(parts, drained: .gracefullyShutdownGroup),
                                                      gracefulShutdownSignals: [.sigterm, .sigint], logger: Logger(label: "switchboard.\(name)")))
        try await group.run()
    }
}
