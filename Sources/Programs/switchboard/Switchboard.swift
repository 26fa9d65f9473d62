public import ArgumentParser
import BusKit
import BusProtocol
import CommandWords
import Contracts
import Foundation
import Synchronization
import ZeroMQ
public import Logging
import ServiceLifecycle
import StandardStreams
import Supervisor
import Deployment
import SwitchboardConfig
import Telemetry

@main
struct Switchboard: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "switchboard",
        abstract: "Run the Switchboard kernel and services.",
        discussion: """
            switchboard up runs the whole bus: the kernel and every service, each as its own \
            process, supervised (with --single-process, all in one process over inproc://, for \
            development). The other commands run one piece of it (kernel, serve NAME, gateway), \
            make a CURVE key pair (keygen) or check the configuration (check).

            Settings come from --config (default: Config/switchboard.yaml when present), then \
            SWITCHBOARD_* environment variables, then flags.

            Examples:
              switchboard up
              switchboard up --single-process
              switchboard serve search --config Config/two-machines/services-host.yaml
              switchboard check
            """,
        version: SwitchboardVersion.current,
        subcommands: [UpCommand.self, KernelCommand.self, ServeCommand.self, GatewayCommand.self, KeygenCommand.self, CheckCommand.self]
    )

    static func main() async {
        StandardStreams.guardAtStart()
        // A word that names no verb (`switchboard kernal`) is refused naming the verbs there
        // are, as sb does, where the parser would say only that it was not expected. `help`
        // is the parser's own.
        let arguments = Array(CommandLine.arguments.dropFirst())
        if arguments.first != "help", let (group, refusal) = CommandWords.unknownVerb(arguments, root: Switchboard.self, path: "switchboard") {
            StandardStreams.writeError(CommandWords.refusalText(group: group, refusal))
            Foundation.exit(ExitCode.validationFailure.rawValue)
        }
        await main(nil)
    }
}

/// Which kernels a piece that connects to the bus (a service, the gateway) uses, when not the
/// configuration's: a pair's two, or kernels of several cells of one bus, in order of
/// preference (the next is used when one goes; docs/CELLS.md).
struct KernelEndpointOptions: ParsableArguments {
    @Option(help: "A kernel broker endpoint (repeatable: the next is used when one goes; default: kernel.broker in the configuration).")
    var broker: [String] = []

    @Option(help: "A kernel's CHP state (repeatable: the next is used when one goes): the snapshot endpoint (publisher on the next port), or snapshot,publisher,collector (default: the configuration's).")
    var state: [String] = []

    func validate() throws {
        for endpoint in broker where !ConfigSection.isEndpoint(endpoint, schemes: ["tcp://", "ipc://"]) {
            throw ValidationError("--broker \(endpoint): give tcp://HOST:PORT or ipc:///PATH")
        }
        for endpoints in state where StateEndpoints(endpoints) == nil {
            throw ValidationError("--state \(endpoints): give tcp://HOST:PORT (the snapshot; the publisher is on the next port) or snapshot,publisher,collector")
        }
    }

    func brokers(_ file: ConfigFile) -> [String] { broker.isEmpty ? file.brokerEndpoints : broker }
    func stateEndpoints(_ file: ConfigFile) -> [StateEndpoints] { state.isEmpty ? file.stateEndpoints : state.compactMap { StateEndpoints($0) } }
}

/// `--config`: which configuration file, read and checked.
struct ConfigFileOption: ParsableArguments {
    @Option(help: "The configuration file (YAML; default: Config/switchboard.yaml when present).")
    var config: String?

    /// The configuration file: `--config`, else Config/switchboard.yaml when present, else
    /// the defaults; `SWITCHBOARD_*` variables apply on top. A bad file or variable ends the
    /// process with its problem on stderr and exit status 78 (EX_CONFIG).
    func load() throws -> ConfigFile {
        try checked { try ConfigFile.load(path.map { URL(fileURLWithPath: $0) }) }
    }

    /// A setting read from the file or derived after loading it (the CURVE keys, the
    /// reloader): a problem ends the process as a bad file does, named on stderr with the
    /// file, exit status 78.
    func checked<T>(_ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch {
            StandardStreams.writeError("switchboard: \(path ?? "configuration"): \(error)\n")
            throw ExitCode(78)
        }
    }

    var path: String? {
        let defaultPath = "Config/switchboard.yaml"
        return config ?? (FileManager.default.fileExists(atPath: defaultPath) ? defaultPath : nil)
    }
}

/// `--cell`: the cell this machine's kernel is of, for `up` and for `check` to read the
/// configuration as `up` would.
struct CellOption: ParsableArguments {
    @Option(help: "The cell this machine's kernel is of, on a bus of several cells (kernel.cell.name; the configuration's kernel.cell names their etcd; docs/CELLS.md).")
    var cell: String?

    func validate() throws {
        if let cell, !MDP.isValidCellName(cell) { throw ValidationError("--cell: expected \(MDP.cellNameRule), got '\(cell)'") }
    }

    /// Sets it through the environment, as every process `up` starts reads the configuration:
    /// call it before the configuration is loaded.
    func apply() {
        if let cell { setenv(ConfigFile.variable(for: "kernel.cell.name"), cell, 1) }
    }
}

/// Options every piece shares.
struct CommonOptions: ParsableArguments {
    @OptionGroup var configFile: ConfigFileOption

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical (default: log_level in the configuration).")
    var logLevel: Logger.Level?

    @Option(help: "Log lines as text, or as one JSON object per line (default: log_format in the configuration, else text).")
    var logFormat: LogFormat?

    /// Set by `switchboard up`: the fd whose end-of-file means the supervisor is gone.
    @Option(help: .hidden)
    var lifelineFd: Int32?

    /// swift-log to stderr, as text or JSON lines (--log-format, else `log_format`), each
    /// label ("switchboard.store") at its piece's configured level unless --log-level says
    /// otherwise; tracing, exported as OpenTelemetry spans when `telemetry:` (or `OTEL_*`)
    /// says so, for a process that runs `exporting` pieces; the lifeline to the supervisor,
    /// if any; and room for connections (``roomForConnections(logger:)``). Returns the exporters, to run
    /// first in the process's group.
    func bootstrap(_ file: ConfigFile, exporting piece: String?) throws -> [any Service] {
        // A SIGHUP before the reloading part listens must not end the process (its default).
        signal(SIGHUP, SIG_IGN)
        let json = (logFormat ?? LogFormat(rawValue: file.logFormat) ?? .text) == .json
        // Each piece's level is live: a reload (SIGHUP) changes it in loggers made already.
        let levels = LiveLogLevels(override: logLevel, file: file)
        Self.levels.withLock { $0 = levels }
        // Every log line written while answering a traced request carries its trace id.
        LoggingSystem.bootstrap({ label, metadataProvider in
            let piece = label.hasPrefix("switchboard.") ? String(label.dropFirst("switchboard.".count)) : label
            var handler: any LogHandler = json ? JSONLogHandler(label: label, metadataProvider: metadataProvider)
                : StreamLogHandler.standardError(label: label, metadataProvider: metadataProvider)
            handler.logLevel = .trace  // the live level decides
            return LiveLevelHandler(handler, cell: levels.cell(for: piece))
        }, metadataProvider: BusTracing.loggingMetadata)
        if let lifelineFd { Lifeline.watch(fd: lifelineFd) }
        roomForConnections(logger: Logger(label: "switchboard.\(piece ?? "up")"))
        guard let piece else {
            BusTracing.bootstrap()
            return []
        }
        do {
            // The kernel's figures (`kernel stats`) go out as metrics from the process that runs it.
            return try Telemetry.bootstrap(file.telemetry, serviceName: "switchboard-\(piece)", metrics: piece == "kernel" || piece == "up",
                                           diagnostics: Logger(label: "switchboard.telemetry"))
        } catch {
            StandardStreams.writeError("switchboard: telemetry: \(error)\n")
            throw ExitCode(78)
        }
    }

    /// Every connection (client, worker, HTTP caller) is an open file: the soft limit goes up
    /// to the hard one (``OpenFiles/raiseSoftLimit()``), and a hard limit that leaves little
    /// room is said.
    private func roomForConnections(logger: Logger) {
        if let problem = OpenFiles.raiseSoftLimit() {
            logger.warning("could not raise the limit on open files \(problem); each connection takes one")
        }
        if let limit = OpenFiles.limit, limit < OpenFiles.fewFiles {
            logger.warning("this process may open at most \(limit) files, and each connection (client, worker, HTTP caller) takes one: raise the hard limit (LimitNOFILE= in a systemd unit, ulimit -Hn) to hold more")
        }
    }

    /// The live log levels ``bootstrap(_:exporting:)`` made, for ``reloading(apply:)``.
    private static let levels = Mutex<LiveLogLevels?>(nil)

    /// The part of a process's group that reloads the configuration on SIGHUP (after
    /// ``bootstrap(_:exporting:)``): log levels, then what `apply` takes of the new file;
    /// `admitsKeys` where the kernel runs (the key folder's further keys read again).
    func reloading(_ label: String, admitsKeys: Bool = false, apply: @escaping @Sendable (ConfigFile) async -> Void = { _ in }) throws -> any Service {
        Reloading(reloader: try reloader(supervised: false, admitsKeys: admitsKeys), levels: Self.levels.withLock { $0 }!, apply: apply,
                  logger: Logger(label: label))
    }

    /// What `switchboard up` reloads with (SIGHUP, `sb reload`): made after its security
    /// settings, whose variable it sees.
    func supervisedReload() throws -> SupervisedReload {
        SupervisedReload(reloader: try reloader(supervised: true, admitsKeys: true), levels: Self.levels.withLock { $0 }!)
    }

    private func reloader(supervised: Bool, admitsKeys: Bool) throws -> ConfigReloader {
        try configFile.checked { try ConfigReloader(path: configFile.path, supervised: supervised, admitsKeys: admitsKeys) }
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}

/// How log lines are written.
enum LogFormat: String, CaseIterable, ExpressibleByArgument {
    case text, json
}
