import ArgumentParser
import BusKit
import BusProtocol
import Dispatch
import Foundation
import StandardStreams
import Gateway
import Kernel
import Logging
import ServiceLifecycle
import Supervisor
import Deployment
import SwitchboardConfig
import ZeroMQ
#if canImport(Glibc)
import Glibc
#endif

struct UpCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "up",
        abstract: "Run the whole bus: the kernel and every enabled service, each as its own process.",
        discussion: """
            Starts the kernel, then each service in the configuration's services section, waits \
            until each has registered, and prints where to connect. A process that exits \
            unexpectedly is restarted (supervisor section: back-off and limit). Ctrl-C or SIGTERM \
            stops the services (they finish their requests in flight), then the kernel; the exit \
            status is 0 after a clean shutdown. A second Ctrl-C kills what is left.

            Examples:
              switchboard up
              SWITCHBOARD_KERNEL_BROKER=tcp://0.0.0.0:5555 switchboard up
              switchboard up --single-process
              switchboard up --no-kernel --config Config/two-machines/services-host.yaml
            """
    )

    @OptionGroup var common: CommonOptions
    @Flag(help: "Run the kernel and the services in this one process, connected over inproc:// (for development); the kernel still listens on its configured endpoints.")
    var singleProcess = false
    @Flag(help: "Start no kernel: the services connect to the one in the configuration (on another machine).")
    var noKernel = false
    @OptionGroup var cell: CellOption

    func validate() throws {
        if singleProcess && noKernel { throw ValidationError("--single-process runs its own kernel; it cannot be combined with --no-kernel") }
    }

    func run() async throws {
        cell.apply()
        var file = try common.configFile.load()
        // One process runs every piece with --single-process, so it exports their spans;
        // otherwise each piece's own process does.
        let telemetry = try common.bootstrap(file, exporting: singleProcess ? "up" : nil)
        if singleProcess, file.pair != nil {
            StandardStreams.writeError("switchboard: --single-process: a kernel pair runs its pieces as processes that reach both kernels; drop --single-process or the pair section\n")
            throw ExitCode(64)
        }
        let enabled = ConfigFile.serviceNames.filter { file.services[$0]?.enabled == true }
        try common.configFile.checked { try file.prepareDatabaseFolders(for: enabled) }
        try secure(&file, services: enabled)
        // The gateway binds last, once the state is in: an address another program holds is
        // refused before anything starts, not after the bus has said it is up.
        if Self.runsGateway(file, noKernel: noKernel, quiet: true), Supervisor.acceptsConnections(host: file.gateway.host, port: file.gateway.port) {
            StandardStreams.writeError("switchboard: gateway: \(Gateway.ListenFailure(host: file.gateway.host, port: file.gateway.port, errno: EADDRINUSE))\n")
            throw ExitCode(1)
        }
        let status = singleProcess ? try await runInOneProcess(file, services: enabled, telemetry: telemetry)
            : try await runSupervised(file, services: enabled, reloader: try common.supervisedReload())
        if status != 0 { throw ExitCode(status) }
    }

    // MARK: Security

    /// Secure by default: unless the configuration says `security.curve: false`, CURVE is
    /// on, and the kernel's, every service's (enabled here or not: another machine may run
    /// it) and the local client's keys are made in the key folder when missing. A
    /// services-only machine makes none: it needs the keys its kernel allows, copied from
    /// the kernel's machine. The processes started later read the same configuration and
    /// are told that CURVE is on through SWITCHBOARD_SECURITY_CURVE.
    private func secure(_ file: inout ConfigFile, services: [String]) throws {
        let logger = Logger(label: "switchboard.up")
        guard file.security.isOn(default: true) else {
            logger.warning("CURVE is off (security.curve: false): any process that reaches the kernel can register as a service, read other clients' requests and write state")
            return
        }
        file.security.curve = true
        setenv(ConfigFile.variable(for: "security.curve"), "true", 1)
        let folder = file.security.keyFolder
        if noKernel {
            guard file.security.serverKey == nil, file.security.secretKey == nil else { return }
            let needed = [folder.publicKeyFile(KeyFolder.kernel)] + services.map { folder.secretKeyFile($0) }
            let missing = needed.filter { !FileManager.default.fileExists(atPath: $0.path) }.map(\.lastPathComponent)
            try common.configFile.checked {
                guard missing.isEmpty else {
                    throw ConfigError(path: "security.keys_dir", problem: """
                        a services-only machine needs the keys its kernel allows: copy \(missing.joined(separator: ", ")) \
                        (and the .pub beside each .key) from the kernel machine's \(KeyFolder.defaultPath) into \(folder.path), \
                        or give security.server_key and security.secret_key_file (see Config/two-machines/)
                        """)
                }
            }
            return
        }
        guard file.security.kernelSecretKey == nil else { return }
        do {
            let made = try folder.create([KeyFolder.kernel] + ConfigFile.serviceNames + [KeyFolder.client, KeyFolder.operator, KeyFolder.gateway, KeyFolder.supervisor])
            if !made.isEmpty {
                logger.notice("made CURVE keys", metadata: ["folder": "\(folder.path)", "keys": "\(made.joined(separator: ", "))"])
            }
            if file.gateway.enabled, file.gateway.tokens.isEmpty, try folder.createGatewayToken() {
                logger.notice("made the gateway's bearer token", metadata: ["file": "\(folder.gatewayTokenFile.path)"])
            }
        } catch {
            StandardStreams.writeError("switchboard: security.keys_dir: cannot make the CURVE keys: \(error)\n")
            throw ExitCode(73)
        }
    }

    /// Whether `up` runs the gateway: when enabled, beside the kernel (not on a
    /// services-only machine), and, with CURVE keys given by hand rather than the key
    /// folder, only once `gateway.tokens` says who may call (up makes no token then).
    static func runsGateway(_ file: ConfigFile, noKernel: Bool, quiet: Bool = false) -> Bool {
        guard file.gateway.enabled, !noKernel else { return false }
        if file.security.isOn(), file.security.kernelSecretKey != nil, file.gateway.tokens.isEmpty {
            if !quiet {
                Logger(label: "switchboard.up").notice("the gateway is not started: with CURVE keys given by hand it needs gateway.tokens (and uses security.secret_key to reach the kernel); see docs/GATEWAY.md")
            }
            return false
        }
        return true
    }

    // MARK: Processes

    private func runSupervised(_ file: ConfigFile, services: [String], reloader: SupervisedReload) async throws -> Int32 {
        let logger = Logger(label: "switchboard.up")
        if !noKernel { _ = try common.configFile.checked { try file.security.kernelSecurity() } }
        // The probe asks the kernel whether each piece is up: on a services-only machine, which
        // has no client key, it goes with the first service's key.
        let prober = noKernel ? services.first ?? KeyFolder.client : KeyFolder.client
        let probeKeys = try common.configFile.checked { try file.security.connectingKeys(as: prober) }
        var shared: [String] = []
        if let path = common.configFile.path { shared += ["--config", path] }
        if let level = common.logLevel { shared += ["--log-level", level.rawValue] }
        if let format = common.logFormat { shared += ["--log-format", format.rawValue] }
        // The probe asks this machine's kernel (of a pair, the passive one answers -32008,
        // which counts as up: it answers).
        let probe = try await BusClient(brokers: [Self.connectable(file.kernel.brokerEndpoint)], timeout: .seconds(1), curve: probeKeys)
        // Where the supervisor says how each process is doing: this machine's kernel, with the
        // supervisor's key (none on a services-only machine, whose kernel is elsewhere).
        let reporter = noKernel ? nil : try await BusClient(brokers: [Self.connectable(file.kernel.brokerEndpoint)], timeout: .seconds(2),
                                                            curve: try common.configFile.checked { try file.security.connectingKeys(as: KeyFolder.supervisor) })
        // A kernel keeping its state in etcd may wait for another kernel's election.
        var kernelStandsBy: (@Sendable () async -> Bool)?
        if let state = file.kernel.stateEtcd {
            let broker = file.kernel.brokerEndpoint, cell = file.kernel.cell?.name
            kernelStandsBy = { await Kernel.stateElectionHeld(state, cell: cell, byOtherThan: broker) }
        }
        let supervisor = try Supervisor(
            executable: URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path,
            kernel: noKernel ? nil : .init(name: "kernel", arguments: ["kernel"] + shared, workers: 0),
            services: services.map { .init(name: $0, arguments: ["serve", $0] + shared, workers: file.services[$0]!.workers) }
                // The gateway runs beside the kernel, not on a services-only machine.
                + (Self.runsGateway(file, noKernel: noKernel) ? [.init(name: "gateway", arguments: ["gateway"] + shared, workers: 0,
                                                 listensAt: (file.gateway.host, file.gateway.port))] : []),
            settings: file.supervisor, probe: probe, reporter: reporter, configuration: reloader, kernelStandsBy: kernelStandsBy, logger: logger)
        // `sb restart` and `sb reload` reach the supervisor as the `supervisor` service of its
        // kernel (with the supervisor's key); SIGUSR2 and SIGHUP do the same. Hosted once the
        // kernel at its endpoint is this supervisor's own: another one already there (a second
        // `up` in the same folder) would otherwise take it as a second supervisor of its bus,
        // answering `sb restart` and `sb reload` for a bus it does not run.
        let hostOptions = noKernel ? nil : ServiceHostOptions(
            brokers: [Self.connectable(file.kernel.brokerEndpoint)], connections: 1, window: 4,
            heartbeatInterval: file.kernel.heartbeatInterval, heartbeatLiveness: file.kernel.heartbeatLiveness,
            curve: try common.configFile.checked { try file.security.connectingKeys(as: KeyFolder.supervisor) },
            maxMessageSize: file.kernel.maxMessageSize, maxBatchItems: file.kernel.maxBatchItems)
        let (stopping, stop) = AsyncStream.makeStream(of: Void.self)
        let (kernelServing, kernelServes) = AsyncStream.makeStream(of: Void.self)
        let signals = Signals.forward { _ in
            stop.finish()
            supervisor.requestShutdown()
        } + Signals.handle([SIGHUP]) { _ in supervisor.requestReload() } + Signals.handle([SIGUSR2]) { _ in supervisor.requestRollingRestart() }
        let status = await withTaskGroup(of: Int32?.self) { group in
            if let hostOptions {
                group.addTask {
                    var serving = kernelServing.makeAsyncIterator()
                    guard await serving.next() != nil else { return nil }
                    do {
                        try await ServiceHost(service: supervisor, options: hostOptions, logger: logger).serve { for await _ in stopping {} }
                    } catch {
                        logger.error("the supervisor service (sb restart, sb reload) could not be hosted: \(error)")
                    }
                    return nil
                }
            }
            let status = await supervisor.run(onKernelServing: { kernelServes.yield() }) { pids in
                Self.printBanner(file, pids: pids, services: services, singleProcess: false, remoteKernel: noKernel)
            }
            kernelServes.finish()
            stop.finish()
            return status
        }
        signals.forEach { $0.cancel() }
        await probe.close()
        await reporter?.close()
        return status
    }

    // MARK: One process

    private func runInOneProcess(_ file: ConfigFile, services: [String], telemetry: [any Service]) async throws -> Int32 {
        let context = try ZMQContext()
        var configuration = file.kernel
        configuration.inprocName = "switchboard"
        configuration.security = try common.configFile.checked { try file.security.kernelSecurity() }
        var keys: [String: CurveClientKeys?] = [:]
        for name in services + [KeyFolder.client] {
            keys[name] = try common.configFile.checked { try file.security.connectingKeys(as: name) }
        }
        let kernel = try Kernel(configuration: configuration, context: context, logger: Logger(label: "switchboard.kernel"))
        // Bound now, before the group, because the pieces below open their clients and
        // subscriptions as they are made; serving and stopping are the group's (its first part).
        do {
            try await kernel.start()
        } catch let error as ZMQError where error.code == EADDRINUSE {
            StandardStreams.writeError("switchboard: \(KernelCommand.addressInUse(error, configuration))\n")
            return 1
        } catch {
            StandardStreams.writeError("switchboard: kernel: \(error)\n")
            return 1
        }
        // Over inproc:// the pieces share the kernel's context (and with CURVE on, still use keys).
        let inproc = { (role: String) in "inproc://switchboard-\(role)" }
        var pieces: [ServiceGroupConfiguration.ServiceConfiguration] = (telemetry + [kernel]).map { .init(service: $0) }
        for name in services {
            let connection = Connection(brokers: [inproc("broker")],
                                        state: [StateEndpoints(snapshot: inproc("snapshot"), publisher: inproc("publisher"), collector: inproc("collector"))],
                                        workers: file.services[name]!.workers, window: file.services[name]!.window,
                                        heartbeatInterval: configuration.heartbeatInterval,
                                        liveness: configuration.heartbeatLiveness, curve: keys[name]!, context: context, instance: nil,
                                        maxMessageSize: configuration.maxMessageSize, maxBatchItems: configuration.maxBatchItems)
            pieces.append(contentsOf: Pieces.grouped(try await Pieces.service(name, file: file, connection: connection), drained: .ignore))
        }
        var gateway: Gateway.Options?
        if Self.runsGateway(file, noKernel: false) {
            let options = try GatewayCommand.options(file, common: common, logger: Logger(label: "switchboard.gateway"), brokers: [inproc("broker")],
                                                     state: [StateEndpoints(snapshot: inproc("snapshot"), publisher: inproc("publisher"), collector: inproc("collector"))],
                                                     context: context)
            pieces.append(contentsOf: try await Gateway.parts(options: options, logger: Logger(label: "switchboard.gateway")).map { .init(service: $0) })
            gateway = options
        }
        // SIGHUP: log levels, the kernel's limits and allowed keys, the gateway's tokens.
        let kernelSecurity = configuration.security
        pieces.append(.init(service: try common.reloading("switchboard.up", admitsKeys: true) { [gateway] reloaded in
            var next = reloaded.kernel
            next.security = (try? reloaded.security.kernelSecurity()) ?? kernelSecurity
            await kernel.reconfigure(next)
            if let gateway, let tokens = try? GatewayCommand.tokens(reloaded, logger: Logger(label: "switchboard.gateway")) { gateway.tokens.replace(with: tokens) }
        }))
        let logger = Logger(label: "switchboard.up")
        // A ServiceGroup stops its services in reverse order: the services first, the kernel last.
        let probe = try await BusClient(brokers: [inproc("broker")], context: context, timeout: .seconds(1), curve: keys[KeyFolder.client]!)
        pieces.append(.init(service: Banner(probe: probe, services: services) {
            Self.printBanner(file, pids: [("switchboard", getpid())], services: services, singleProcess: true, remoteKernel: false)
        }))
        let group = ServiceGroup(configuration: .init(services: pieces, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        do {
            try await group.run()
        } catch let failure as Gateway.ListenFailure {
            StandardStreams.writeError("switchboard: gateway: \(failure)\n")
            return 1
        }
        return 0
    }

    // MARK: Where to connect

    static func printBanner(_ file: ConfigFile, pids: [(name: String, pid: Int32)], services: [String], singleProcess: Bool, remoteKernel: Bool) {
        let kernel = file.kernel
        var lines = ["Switchboard is up\(singleProcess ? " in one process (pid \(getpid()))" : ""):",
                     "  kernel   \(remoteKernel ? "(elsewhere) " : "")broker \(kernel.brokerEndpoint), state \(kernel.snapshotEndpoint) (publisher \(kernel.publisherEndpoint), collector \(kernel.collectorEndpoint))"]
        let pid = Dictionary(pids.map { ($0.name, $0.pid) }, uniquingKeysWith: { a, _ in a })
        if let kernelPid = pid["kernel"] { lines[1] += ", pid \(kernelPid)" }
        if let pair = file.pair {
            lines.append("  pair     \(pair.configuration.role.rawValue) of a kernel pair: peer \(pair.peerBroker), kernels talk on \(pair.configuration.listen) <-> \(pair.configuration.peer)")
        }
        for name in services {
            let workers = file.services[name]!.workers
            let padded = name.padding(toLength: 8, withPad: " ", startingAt: 0)
            lines.append("  \(padded) \(workers) worker\(workers == 1 ? "" : "s")\(pid[name].map { ", pid \($0)" } ?? "")")
        }
        if runsGateway(file, noKernel: remoteKernel, quiet: true) {
            let gateway = file.gateway
            let host = gateway.host == "0.0.0.0" ? "127.0.0.1" : gateway.host.contains(":") ? "[\(gateway.host)]" : gateway.host
            // Where the token is, never the token itself: the banner ends up in logs.
            let address = "http://\(host):\(gateway.port)/"
            var line = "  gateway  \(address)"
            if !gateway.tokens.isEmpty {
                line += " (callers need one of gateway.tokens: open \(address)#token=YOUR-TOKEN)"
            } else if file.security.isOn() {
                let tokenFile = file.security.keyFolder.gatewayTokenFile.path
                line += " (token in \(tokenFile): open \"\(address)#token=$(cat \(tokenFile))\")"
            }
            lines.append(line + (pid["gateway"].map { ", pid \($0)" } ?? ""))
        }
        lines.append("Connect with: \(sbLine(file))sb services   (then: sb countries par, sb flights route; sb --help)")
        lines.append("Stop with Ctrl-C (or SIGTERM to pid \(getpid())).")
        StandardStreams.writeIfPossible(lines.joined(separator: "\n") + "\n")
    }

    /// What a shell needs before `sb` finds this bus: nothing for the defaults, else an
    /// `export` of sb's variables (they apply to every verb, wherever its flags would go).
    static func sbLine(_ file: ConfigFile) -> String {
        let security = file.security
        let brokers = file.brokerEndpoints, states = file.stateEndpoints
        var variables: [String] = []
        if brokers != ["tcp://127.0.0.1:5555"] { variables.append("SB_ENDPOINT=\(brokers.joined(separator: ","))") }
        if zip(brokers, states).contains(where: { StateEndpoints(followingBroker: $0)?.snapshot != $1.snapshot }) {
            variables.append("SB_STATE_ENDPOINT='\(states.map { "\($0.snapshot),\($0.publisher),\($0.collector)" }.joined(separator: ";"))'")
        }
        if security.isOn(), security.serverKey != nil || security.kernelSecretKey != nil {
            // Keys given explicitly: the client brings its own pair.
            let kernelPublicKey = security.serverKey ?? security.kernelSecretKey.flatMap { try? CurveKeyPair.publicKey(forSecretKey: $0) }
            if let kernelPublicKey { variables.append("SB_SERVER_KEY='\(kernelPublicKey)'") }
            variables.append("SB_KEY_FILE=YOUR.key")
        } else if security.isOn(), security.keyFolder.url.standardizedFileURL != KeyFolder(KeyFolder.defaultPath).url.standardizedFileURL {
            variables.append("SB_KEY_DIR=\(security.keyFolder.url.standardizedFileURL.path)")
        }
        return variables.isEmpty ? "" : "export \(variables.joined(separator: " ")); "
    }

    /// An endpoint a client can connect to: a wildcard or any-address host becomes loopback.
    static func connectable(_ endpoint: String) -> String { ConfigFile.connectable(endpoint) }
}

/// Prints the banner of `up` in one process once every service has its workers; a part of
/// the process's `ServiceGroup` (the last), so it ends with it.
private struct Banner: Service {
    let probe: BusClient
    let services: [String]
    let show: @Sendable () -> Void

    func run() async throws {
        do {  // until cancelled (shutdown before every service came up: no banner)
            for name in services {
                while (try? await probe.hasWorkers(name)) != true { try await Task.sleep(for: .milliseconds(50)) }
            }
            show()
        } catch {}
        try? await gracefulShutdown()
        await probe.close()
    }
}
