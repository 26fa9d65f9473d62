public import ArgumentParser
import BusKit
import EchoService
import Foundation
import Kernel
public import Logging
import ServiceLifecycle
import ZeroMQ

@main
struct Switchboard: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "switchboard",
        abstract: "Run the Switchboard kernel and services.",
        discussion: """
            switchboard kernel            the kernel: Majordomo broker and state server
            switchboard serve echo        a service, connected to a kernel
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
        abstract: "Run the kernel: the Majordomo broker (7/MDP, 8/MMI) and the CHP state server (12/CHP)."
    )

    @OptionGroup var common: CommonOptions
    @Option(help: "The broker's endpoint (clients and workers connect here).")
    var broker = KernelConfiguration().brokerEndpoint
    @Option(help: "The CHP snapshot endpoint.")
    var snapshot = KernelConfiguration().snapshotEndpoint
    @Option(help: "The CHP publisher endpoint.")
    var publisher = KernelConfiguration().publisherEndpoint
    @Option(help: "The CHP collector endpoint.")
    var collector = KernelConfiguration().collectorEndpoint
    @Option(help: "Heartbeat interval in milliseconds.")
    var heartbeatMs = 2_500
    @Option(help: "Missed heartbeats before a worker is dead.")
    var liveness = 3
    @Option(help: "Milliseconds a request waits for a worker before -32001.")
    var queueTimeoutMs = 5_000
    @Option(help: "The largest message accepted, in bytes.")
    var maxMessageSize = KernelConfiguration().maxMessageSize
    @Option(name: .customLong("no-retry"), help: "A service whose requests are not re-sent when their worker dies (repeatable).")
    var nonRetriable: [String] = []
    @Option(name: .customLong("writable-prefix"), help: "A key prefix the collector accepts (repeatable; default /client/).")
    var writablePrefixes: [String] = []

    func validate() throws {
        guard heartbeatMs > 0, liveness > 0, queueTimeoutMs > 0, maxMessageSize > 0 else {
            throw ValidationError("--heartbeat-ms, --liveness, --queue-timeout-ms and --max-message-size must be positive")
        }
    }

    func run() async throws {
        common.bootstrapLogging()
        var configuration = KernelConfiguration()
        configuration.brokerEndpoint = broker
        configuration.snapshotEndpoint = snapshot
        configuration.publisherEndpoint = publisher
        configuration.collectorEndpoint = collector
        configuration.heartbeatInterval = .milliseconds(heartbeatMs)
        configuration.heartbeatLiveness = liveness
        configuration.queueTimeout = .milliseconds(queueTimeoutMs)
        configuration.maxMessageSize = maxMessageSize
        configuration.nonRetriableServices = Set(nonRetriable)
        if !writablePrefixes.isEmpty { configuration.collectorWritablePrefixes = writablePrefixes }
        let logger = Logger(label: "switchboard.kernel")
        let kernel = try Kernel(configuration: configuration, context: ZMQContext(), logger: logger)
        let group = ServiceGroup(services: [kernel], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        try await group.run()
    }
}

struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run one service and register it with a kernel."
    )

    @OptionGroup var common: CommonOptions
    @Argument(help: "The service to run: echo.")
    var name: String
    @Option(help: "A kernel broker endpoint (repeatable).")
    var broker: [String] = [KernelConfiguration().brokerEndpoint]
    @Option(help: "Worker connections (requests handled at once).")
    var connections = 2
    @Option(help: "Heartbeat interval in milliseconds (match the kernel's).")
    var heartbeatMs = 2_500
    @Option(help: "Missed heartbeats before the kernel is considered gone.")
    var liveness = 3
    @Option(help: "A name for this instance, reported by echo's whoami.")
    var instance: String?

    func validate() throws {
        guard ["echo"].contains(name) else { throw ValidationError("unknown service '\(name)'; known: echo") }
        guard connections > 0, heartbeatMs > 0, liveness > 0 else { throw ValidationError("--connections, --heartbeat-ms and --liveness must be positive") }
    }

    func run() async throws {
        common.bootstrapLogging()
        let logger = Logger(label: "switchboard.\(name)")
        let options = ServiceHost<EchoService>.Options(brokers: broker, connections: connections,
                                                       heartbeatInterval: .milliseconds(heartbeatMs), heartbeatLiveness: liveness)
        let host = try ServiceHost(service: EchoService(instance: instance ?? "echo-\(getpid())"), options: options, logger: logger)
        let group = ServiceGroup(services: [host], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        try await group.run()
    }
}
