import ArgumentParser
import Foundation
import StandardStreams
import Kernel
import Logging
import ServiceLifecycle
import Deployment
import SwitchboardConfig
import ZeroMQ

struct KernelCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kernel",
        abstract: "Run the kernel: the Majordomo broker (7/MDP, 8/MMI) and the CHP state server (12/CHP).",
        discussion: """
            Settings come from the configuration's kernel and security sections; flags override \
            them.

            Example (the kernel of a two-machine deployment, see Config/two-machines/):
              switchboard kernel --config Config/two-machines/kernel-host.yaml
            """
    )

    @OptionGroup var common: CommonOptions
    @Option(help: "The broker's endpoint (clients and workers connect here).")
    var broker: String?
    @Option(help: "The CHP snapshot endpoint.")
    var snapshot: String?
    @Option(help: "The CHP publisher endpoint.")
    var publisher: String?
    @Option(help: "The CHP collector endpoint.")
    var collector: String?
    @Option(parsing: .unconditional, help: "Heartbeat interval in milliseconds.")
    var heartbeatMs: Int?
    @Option(parsing: .unconditional, help: "Missed heartbeats before a worker is dead.")
    var liveness: Int?
    @Option(parsing: .unconditional, help: "Milliseconds a request waits for a worker before -32001.")
    var queueTimeoutMs: Int?
    @Option(parsing: .unconditional, help: "The largest message accepted, in bytes.")
    var maxMessageSize: Int?
    @Option(name: .customLong("no-retry"), help: "A service whose requests are not re-sent when their worker dies (repeatable).")
    var nonRetriable: [String] = []
    @Option(name: .customLong("writable-prefix"), help: "A key prefix, starting with '/', the collector accepts (repeatable; default /client/).")
    var writablePrefixes: [String] = []

    func validate() throws {
        for (name, value) in [("--heartbeat-ms", heartbeatMs), ("--liveness", liveness), ("--queue-timeout-ms", queueTimeoutMs),
                              ("--max-message-size", maxMessageSize)] {
            if let value, value <= 0 { throw ValidationError("\(name) must be positive") }
        }
        for (name, value) in [("--broker", broker), ("--snapshot", snapshot), ("--publisher", publisher), ("--collector", collector)] {
            if let value, !ConfigSection.isEndpoint(value) {
                throw ValidationError("\(name) '\(value)' is not an endpoint such as tcp://127.0.0.1:5555, ipc:///PATH or inproc://NAME")
            }
        }
        if let prefix = writablePrefixes.first(where: { !$0.hasPrefix("/") }) {
            throw ValidationError("--writable-prefix '\(prefix)' is not a key prefix: keys are paths, so it starts with '/' (such as /\(prefix))")
        }
    }

    /// The file's settings with the flags applied on top.
    func kernelConfiguration(_ file: ConfigFile) throws -> KernelConfiguration {
        var configuration = file.kernel
        configuration.security = try common.configFile.checked { try file.security.kernelSecurity() }
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
        let file = try common.configFile.load()
        let telemetry = try common.bootstrap(file, exporting: "kernel")
        let configuration = try kernelConfiguration(file)
        let logger = Logger(label: "switchboard.kernel")
        if configuration.security == nil {
            logger.warning("CURVE is off: any process that reaches the kernel can register as a service, read other clients' requests and write state (`switchboard up` turns CURVE on; security.curve: true with keys in security.keys_dir)")
        }
        let kernel = try Kernel(configuration: configuration, context: ZMQContext(), logger: logger)
        // SIGHUP: the limits and allowed keys of the file read again (flags still win).
        let reloading = try common.reloading("switchboard.kernel", admitsKeys: true) { file in
            if let reloaded = try? kernelConfiguration(file) { await kernel.reconfigure(reloaded) }
        }
        let group = ServiceGroup(services: telemetry + [kernel, reloading], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        do {
            try await group.run()
        } catch let error as ZMQError where error.code == EADDRINUSE {
            StandardStreams.writeError("switchboard: \(Self.addressInUse(error, configuration))\n")
            throw ExitCode(1)
        } catch {
            // What ended the kernel (etcd not reached, its election lost) says itself.
            StandardStreams.writeError("switchboard: kernel: \(error)\n")
            throw ExitCode(1)
        }
    }

    /// A bind refused for an address another socket holds, said with the setting that named
    /// the address and what to do about it.
    static func addressInUse(_ error: ZMQError, _ configuration: KernelConfiguration) -> String {
        let settings = [("kernel.broker", configuration.brokerEndpoint), ("kernel.snapshot", configuration.snapshotEndpoint),
                        ("kernel.publisher", configuration.publisherEndpoint), ("kernel.collector", configuration.collectorEndpoint),
                        ("pair.listen", configuration.pair?.listen)]
        let setting = settings.first { error.call == "zmq_bind(\($0.1 ?? ""))" }?.0
        return "\(error): another program listens there (another switchboard kernel?); stop it, or give this kernel another endpoint"
            + (setting.map { " (\($0))" } ?? "")
    }
}
