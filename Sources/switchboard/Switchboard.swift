public import ArgumentParser
import BusKit
import EchoService
import FetcherService
import Foundation
import Kernel
import PricingService
import SearchService
public import Logging
import ServiceLifecycle
import StoreService
import SwitchboardConfig
import ZeroMQ

@main
struct Switchboard: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "switchboard",
        abstract: "Run the Switchboard kernel and services.",
        discussion: """
            switchboard kernel            the kernel: Majordomo broker and state server
            switchboard serve NAME        a service (echo, store, fetcher, search, pricing), connected to a kernel
            """,
        subcommands: [KernelCommand.self, ServeCommand.self]
    )
}

/// Options every piece shares.
struct CommonOptions: ParsableArguments {
    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: Logger.Level = .info

    func bootstrapLogging() {
        let level = logLevel
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}

struct KernelCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kernel",
        abstract: "Run the kernel: the Majordomo broker (7/MDP, 8/MMI) and the CHP state server (12/CHP).",
        discussion: "Settings come from --config (default: Config/switchboard.yaml when present); flags override them."
    )

    @OptionGroup var common: CommonOptions
    @Option(help: "The configuration file (YAML).")
    var config: String?
    @Option(help: "The broker's endpoint (clients and workers connect here).")
    var broker: String?
    @Option(help: "The CHP snapshot endpoint.")
    var snapshot: String?
    @Option(help: "The CHP publisher endpoint.")
    var publisher: String?
    @Option(help: "The CHP collector endpoint.")
    var collector: String?
    @Option(help: "Heartbeat interval in milliseconds.")
    var heartbeatMs: Int?
    @Option(help: "Missed heartbeats before a worker is dead.")
    var liveness: Int?
    @Option(help: "Milliseconds a request waits for a worker before -32001.")
    var queueTimeoutMs: Int?
    @Option(help: "The largest message accepted, in bytes.")
    var maxMessageSize: Int?
    @Option(name: .customLong("no-retry"), help: "A service whose requests are not re-sent when their worker dies (repeatable).")
    var nonRetriable: [String] = []
    @Option(name: .customLong("writable-prefix"), help: "A key prefix the collector accepts (repeatable; default /client/).")
    var writablePrefixes: [String] = []

    func validate() throws {
        for (name, value) in [("--heartbeat-ms", heartbeatMs), ("--liveness", liveness), ("--queue-timeout-ms", queueTimeoutMs),
                              ("--max-message-size", maxMessageSize)] {
            if let value, value <= 0 { throw ValidationError("\(name) must be positive") }
        }
    }

    /// The file's settings with the flags applied on top.
    func kernelConfiguration() throws -> KernelConfiguration {
        var configuration = try loadConfigFile(config).kernel
        if let broker { configuration.brokerEndpoint = broker }
        if let snapshot { configuration.snapshotEndpoint = snapshot }
        if let publisher { configuration.publisherEndpoint = publisher }
        if let collector { configuration.collectorEndpoint = collector }
        if let heartbeatMs { configuration.heartbeatInterval = .milliseconds(heartbeatMs) }
        if let liveness { configuration.heartbeatLiveness = liveness }
        if let queueTimeoutMs { configuration.queueTimeout = .milliseconds(queueTimeoutMs) }
        if let maxMessageSize { configuration.maxMessageSize = maxMessageSize }
        if !nonRetriable.isEmpty { configuration.nonRetriableServices = Set(nonRetriable) }
        if !writablePrefixes.isEmpty { configuration.collectorWritablePrefixes = writablePrefixes }
        return configuration
    }

    func run() async throws {
        common.bootstrapLogging()
        let configuration = try kernelConfiguration()
        let logger = Logger(label: "switchboard.kernel")
        let kernel = try Kernel(configuration: configuration, context: ZMQContext(), logger: logger)
        let group = ServiceGroup(services: [kernel], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        try await group.run()
    }
}

struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run one service and register it with a kernel.",
        discussion: """
            switchboard serve echo                          answers with what it is sent
            switchboard serve store --db /tmp/store.sqlite  history, articles, selections, snapshots
            switchboard serve fetcher                       the seven datasets, from their sources or bundled copies
            switchboard serve search                        countries, places, the hiring list, news and flights
            switchboard serve pricing                       route quotes, the current route, deals
            """
    )
    static let services = ["echo", "store", "fetcher", "search", "pricing"]

    @OptionGroup var common: CommonOptions
    @Argument(help: "The service to run: \(ServeCommand.services.joined(separator: ", ")).")
    var name: String
    @Option(help: "The configuration file (YAML; default: Config/switchboard.yaml when present).")
    var config: String?
    @Option(help: "A kernel broker endpoint (repeatable).")
    var broker: [String] = [KernelConfiguration().brokerEndpoint]
    @Option(help: "The kernel's CHP snapshot endpoint (default: kernel.snapshot in the configuration).")
    var snapshot: String?
    @Option(help: "The kernel's CHP publisher endpoint (default: kernel.publisher in the configuration).")
    var publisher: String?
    @Option(help: "Worker connections (requests handled at once; default 2, store 8, fetcher 4, search 4, pricing 2).")
    var connections: Int?
    @Option(help: "Heartbeat interval in milliseconds (match the kernel's).")
    var heartbeatMs = 2_500
    @Option(help: "Missed heartbeats before the kernel is considered gone.")
    var liveness = 3
    @Option(help: "A name for this instance, reported by echo's whoami.")
    var instance: String?
    @Option(help: "store: the SQLite database file (overrides store.path).")
    var db: String?

    func validate() throws {
        guard Self.services.contains(name) else {
            throw ValidationError("unknown service '\(name)'; known: \(Self.services.joined(separator: ", "))")
        }
        guard (connections ?? 1) > 0, heartbeatMs > 0, liveness > 0 else {
            throw ValidationError("--connections, --heartbeat-ms and --liveness must be positive")
        }
    }

    func run() async throws {
        common.bootstrapLogging()
        let logger = Logger(label: "switchboard.\(name)")
        let file = try loadConfigFile(config)
        let piece: any Service
        switch name {
        case "store":
            var configuration = file.store
            if let db { configuration.path = db }
            let service = StoreService(configuration: configuration, logger: logger)
            let client = try await BusClient(brokers: broker)
            let publisher = StatePublisher(client: client)
            let host = try ServiceHost(service: service, options: hostOptions(defaultConnections: 8), logger: logger,
                                       onReregistered: { await service.publish(through: publisher) })
            piece = HostedService(host: host, afterStart: { await service.publish(through: publisher) },
                                  beforeStop: { await service.stopPublishing() }, afterStop: { await client.close() })
        case "fetcher":
            let service = FetcherService(configuration: file.fetcher, logger: logger)
            let client = try await BusClient(brokers: broker)
            let publisher = StatePublisher(client: client)
            let host = try ServiceHost(service: service, options: hostOptions(defaultConnections: 4), logger: logger,
                                       onReregistered: { await service.republish() })
            piece = HostedService(host: host, afterStart: { await service.start(client: client, publisher: publisher) },
                                  beforeStop: { await service.stop() }, afterStop: { await client.close() })
        case "search":
            let service = SearchService(logger: logger)
            let client = try await BusClient(brokers: broker)
            let catalog = try await catalogSubscription(file)
            let host = try ServiceHost(service: service, options: hostOptions(defaultConnections: 4), logger: logger)
            piece = HostedService(host: host, afterStart: { await service.start(client: client, catalog: catalog) },
                                  beforeStop: { await service.stop() }, afterStop: {
                                      await catalog.cancel()
                                      await client.close()
                                  })
        case "pricing":
            let service = PricingService(logger: logger)
            let client = try await BusClient(brokers: broker)
            let publisher = StatePublisher(client: client)
            let catalog = try await catalogSubscription(file)
            let host = try ServiceHost(service: service, options: hostOptions(defaultConnections: 2), logger: logger,
                                       onReregistered: { _ = await publisher.republish() })
            piece = HostedService(host: host, afterStart: { await service.start(client: client, publisher: publisher, catalog: catalog) },
                                  beforeStop: { await service.stop() }, afterStop: {
                                      await catalog.cancel()
                                      await client.close()
                                  })
        default:
            let host = try ServiceHost(service: EchoService(instance: instance ?? "echo-\(getpid())"),
                                       options: hostOptions(defaultConnections: 2), logger: logger)
            piece = host
        }
        let group = ServiceGroup(services: [piece], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        try await group.run()
    }

    /// `/catalog/*` from the kernel's state server (flags, else the configuration file).
    func catalogSubscription(_ file: ConfigFile) async throws -> Subscription {
        try await Subscription.open(snapshot: snapshot ?? file.kernel.snapshotEndpoint,
                                    publisher: publisher ?? file.kernel.publisherEndpoint, prefixes: ["/catalog/"])
    }

    func hostOptions<S>(defaultConnections: Int) -> ServiceHost<S>.Options {
        ServiceHost<S>.Options(brokers: broker, connections: connections ?? defaultConnections,
                               heartbeatInterval: .milliseconds(heartbeatMs), heartbeatLiveness: liveness)
    }
}

/// A hosted service with work to do once it is registered (publish its state) and
/// around its shutdown.
struct HostedService<S: BusService>: Service {
    let host: ServiceHost<S>
    let afterStart: @Sendable () async -> Void
    let beforeStop: @Sendable () async -> Void
    let afterStop: @Sendable () async -> Void

    func run() async throws {
        try await host.start()
        await afterStart()
        try? await gracefulShutdown()
        await beforeStop()
        await host.stop()
        await afterStop()
    }
}

/// The configuration file: `path`, else Config/switchboard.yaml when present, else the
/// defaults. A bad file ends the process with its problem on stderr and exit status 78.
func loadConfigFile(_ path: String?) throws -> ConfigFile {
    let defaultPath = "Config/switchboard.yaml"
    guard let path = path ?? (FileManager.default.fileExists(atPath: defaultPath) ? defaultPath : nil) else { return ConfigFile() }
    do {
        return try ConfigFile.load(URL(fileURLWithPath: path))
    } catch {
        FileHandle.standardError.write(Data("switchboard: \(path): \(error)\n".utf8))
        throw ExitCode(78)  // EX_CONFIG
    }
}
