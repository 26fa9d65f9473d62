import ArgumentParser
import BusKit
import Foundation
import StandardStreams
import Gateway
import Logging
import ServiceLifecycle
import Deployment
import SwitchboardConfig
import ZeroMQ

struct GatewayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "gateway",
        abstract: "Serve the bus over HTTP: JSON-RPC, state as Server-Sent Events, metrics, health and the apps' page.",
        discussion: """
            POST /rpc/SERVICE      a JSON-RPC 2.0 request or batch (HTTP status per error)
            GET  /events?prefix=P  the state under P: snapshot, synced, changes (resumable)
            GET  /metrics, /healthz, /readyz
            GET  /                 the five apps' page

            With CURVE on, callers send Authorization: Bearer TOKEN (gateway.tokens, or the \
            token switchboard up writes to data/keys/gateway.token).

            Examples:
              switchboard gateway
              switchboard gateway --listen 127.0.0.1:9090
              switchboard gateway --broker tcp://10.0.0.1:5555 \\
                                  --state tcp://10.0.0.1:5556 \\
                                  --broker tcp://10.0.0.2:5555 \\
                                  --state tcp://10.0.0.2:5556
            """
    )

    @OptionGroup var common: CommonOptions
    @Option(help: "Where to listen, HOST:PORT (default: gateway.listen, 127.0.0.1:8080).")
    var listen: String?
    @OptionGroup var kernels: KernelEndpointOptions

    func run() async throws {
        var file = try common.configFile.load()
        let telemetry = try common.bootstrap(file, exporting: "gateway")
        let logger = Logger(label: "switchboard.gateway")
        if let listen {
            let override: ConfigFile
            do {
                override = try ConfigFile.parse("", environment: [ConfigFile.variable(for: "gateway.listen"): listen])
            } catch {
                // Read as the setting is, through its variable; said of the flag that gave it.
                StandardStreams.writeError("switchboard: --listen: \((error as? ConfigError)?.problem ?? "\(error)")\n")
                throw ExitCode(64)
            }
            file.gateway.host = override.gateway.host
            file.gateway.port = override.gateway.port
        }
        let options = try Self.options(file, common: common, logger: logger, brokers: kernels.brokers(file), state: kernels.stateEndpoints(file))
        let parts = try await Gateway.parts(options: options, logger: logger)
        // SIGHUP: the log level and the tokens.
        let reloading = try common.reloading("switchboard.gateway") { file in
            if let tokens = try? Self.tokens(file, logger: logger) { options.tokens.replace(with: tokens) }
        }
        let group = ServiceGroup(services: telemetry + [reloading] + parts, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        do {
            try await group.run()
        } catch let failure as Gateway.ListenFailure {
            StandardStreams.writeError("switchboard: gateway: \(failure)\n")
            throw ExitCode(1)
        }
    }

    /// The gateway's options from the configuration. Tokens: `gateway.tokens`; when none
    /// are configured and CURVE is on, the one in the key folder (which `switchboard up`
    /// writes), allowed every service and the kernel's writable prefixes: CURVE keeps
    /// strangers off the bus, so the gateway must not let them in over HTTP.
    static func tokens(_ file: ConfigFile, logger: Logger) throws(ConfigError) -> [GatewayToken] {
        guard file.gateway.tokens.isEmpty else { return file.gateway.tokens }
        guard file.security.isOn() else {
            logger.warning("no gateway.tokens: anyone who reaches \(file.gateway.host):\(file.gateway.port) may call every service")
            return []
        }
        guard let token = file.security.keyFolder.gatewayToken(), !token.isEmpty else {
            throw ConfigError(path: "gateway.tokens", problem: "with CURVE on, HTTP callers need a token: configure gateway.tokens, or let `switchboard up` write \(file.security.keyFolder.gatewayTokenFile.path)")
        }
        return [GatewayToken(token: token, services: ["*"], writablePrefixes: file.kernel.collectorWritablePrefixes)]
    }

    static func options(_ file: ConfigFile, common: CommonOptions, logger: Logger, brokers: [String], state: [StateEndpoints],
                        context: ZMQContext? = nil) throws -> Gateway.Options {
        var settings = file.gateway
        do {
            settings.tokens = try tokens(file, logger: logger)
        } catch {
            StandardStreams.writeError("switchboard: gateway: \(error)\n")
            throw ExitCode(78)
        }
        let curve = try common.configFile.checked { try file.security.connectingKeys(as: KeyFolder.gateway) }
        return Gateway.Options(settings: settings, brokers: brokers, state: state, curve: curve,
                               services: ConfigFile.serviceNames.filter { file.services[$0]?.enabled == true },
                               maxMessageSize: file.kernel.maxMessageSize, maxBatchItems: file.kernel.maxBatchItems, context: context)
    }
}
