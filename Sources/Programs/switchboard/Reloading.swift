import BusProtocol
import Deployment
import Dispatch
import Foundation
import Logging
import ServiceLifecycle
import Supervisor
import Synchronization
import SwitchboardConfig
#if canImport(Glibc)
import Glibc
#endif

/// Each piece's log level, read by its loggers at every line, so a reload changes it in
/// loggers that already exist: one atomic cell per piece ("kernel", "store", "gateway").
final class LiveLogLevels: Sendable {
    final class Cell: Sendable {
        let level: Atomic<UInt8>
        init(_ level: Logger.Level) { self.level = Atomic(Self.code(level)) }
        var current: Logger.Level { Self.levels[Int(level.load(ordering: .relaxed))] }
        static let levels = Logger.Level.allCases
        static func code(_ level: Logger.Level) -> UInt8 { UInt8(levels.firstIndex(of: level) ?? 2) }
    }

    private let cells = Mutex<[String: Cell]>([:])
    /// `--log-level` wins over every configuration, the first and the reloaded.
    private let override: Logger.Level?
    private let configured: Mutex<ConfigFile>

    init(override: Logger.Level?, file: ConfigFile) {
        self.override = override
        configured = Mutex(file)
    }

    func cell(for piece: String) -> Cell {
        cells.withLock { cells in
            if let cell = cells[piece] { return cell }
            let cell = Cell(level(for: piece))
            cells[piece] = cell
            return cell
        }
    }

    /// A reloaded configuration's levels, for every piece that logs.
    func apply(_ file: ConfigFile) {
        configured.withLock { $0 = file }
        cells.withLock { cells in
            for (piece, cell) in cells { cell.level.store(Cell.code(level(for: piece)), ordering: .relaxed) }
        }
    }

    private func level(for piece: String) -> Logger.Level {
        override ?? configured.withLock { Logger.Level(rawValue: $0.logLevel(for: piece)) } ?? .info
    }
}

/// A log handler whose level is its piece's live one (``LiveLogLevels``), unless code set
/// one on its logger.
struct LiveLevelHandler: LogHandler {
    var inner: any LogHandler
    let cell: LiveLogLevels.Cell
    private var chosen: Logger.Level?

    init(_ inner: any LogHandler, cell: LiveLogLevels.Cell) {
        self.inner = inner
        self.cell = cell
    }

    var logLevel: Logger.Level {
        get { chosen ?? cell.current }
        set { chosen = newValue }
    }
    var metadata: Logger.Metadata {
        get { inner.metadata }
        set { inner.metadata = newValue }
    }
    var metadataProvider: Logger.MetadataProvider? {
        get { inner.metadataProvider }
        set { inner.metadataProvider = newValue }
    }
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { inner[metadataKey: key] }
        set { inner[metadataKey: key] = newValue }
    }
    func log(event: LogEvent) { inner.log(event: event) }
}

/// `switchboard up`'s reload (``Supervisor/reload()``): the file read again, and the
/// supervisor's own log levels with it (its processes apply theirs on SIGHUP).
struct SupervisedReload: ConfigurationReloading {
    let reloader: ConfigReloader
    let levels: LiveLogLevels

    func reload() throws(JSONRPCError) -> ConfigurationChange {
        let change = try reloader.reload()
        levels.apply(reloader.file)
        return change
    }
}

/// A part of a process's group that reloads the configuration on SIGHUP: the file is read
/// again and checked as at start; a file that does not read is refused (logged with the
/// key) and the running configuration stays. Otherwise the log levels change, `apply` takes
/// the piece's own live settings, and the log says what changed and what needs a restart.
struct Reloading: Service {
    let reloader: ConfigReloader
    let levels: LiveLogLevels
    let apply: @Sendable (ConfigFile) async -> Void
    let logger: Logger

    func run() async throws {
        let (hangups, hangup) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let sources = Signals.handle([SIGHUP]) { _ in hangup.yield() }
        defer { sources.forEach { $0.cancel() } }
        for await _ in hangups.cancelOnGracefulShutdown() {
            do {
                let (file, report) = try reloader.reread()
                levels.apply(file)
                await apply(file)
                let changed = !report.applied.isEmpty || !report.needsRestart.isEmpty
                logger.log(level: changed ? .notice : .info, "configuration reloaded", metadata: [
                    "file": "\(report.file ?? "-")", "applied": "\(report.applied.joined(separator: ", "))",
                    "needsRestart": "\(report.needsRestart.joined(separator: ", "))"])
            } catch {
                logger.error("reload refused, the running configuration stays: \(reloader.url?.path ?? "configuration"): \(error)", metadata: ["key": "\(error.path)"])
            }
        }
    }
}
