public import BusKit
public import BusProtocol
import Foundation
public import Logging
public import Contracts
#if canImport(Glibc)
import Glibc
#endif

/// `switchboard up`: runs the kernel and each service as a process of its own.
///
/// Start: the kernel first, until it answers `ping`; then each service in order, until the
/// kernel lists its workers. A process that ends during start fails the start. Once up, a
/// process that exits unexpectedly is restarted after a back-off that doubles per recent
/// restart, up to `supervisor.restart_backoff_max_ms`: never given up on, and never a reason
/// to stop the others, which keep serving what does not need it. Past
/// `supervisor.restart_limit` restarts within the window it counts as failing (logged once,
/// at critical). How each process is doing goes into the kernel's state
/// (``SupervisorStatus``), which `sb services` and the gateway's `/readyz` show.
/// Shutdown (SIGINT/SIGTERM through ``requestShutdown()``): every service gets SIGTERM and
/// drains, then the kernel; anything still running after the stop timeout gets SIGKILL.
///
/// Rolling restart (``rollingRestart(_:)``: `sb restart`, SIGUSR2): one service at a time, a
/// new process starts and registers its workers beside the old one, which is then told to
/// drain (SIGTERM) and leaves once it has answered what it holds; no request fails or is
/// re-sent. The gateway, which cannot share its port, is stopped and then started. A service
/// that exits 0 on its own was drained (`sb drain`): it stays down until `sb restart` names it.
/// Reload (``reload()``: `sb reload`, SIGHUP): the configuration is read again; if it reads,
/// every process is sent SIGHUP to apply what it can, and a service whose worker count
/// changed is restarted the rolling way. The supervisor answers both on the bus as the
/// `supervisor` service (``SupervisorAPI``).
public actor Supervisor: BusService {
    public static let name = SupervisorAPI.service
    /// One process to run: `switchboard ARGUMENTS`.
    public struct Piece: Sendable {
        public let name: String
        public let arguments: [String]
        /// Workers the kernel must list before the service counts as up (0: the kernel
        /// itself, or a piece that listens); a reload may change it.
        public var workers: Int
        /// A piece that is no worker (the gateway) is up once it accepts TCP connections here.
        public let listensAt: (host: String, port: Int)?

        public init(name: String, arguments: [String], workers: Int, listensAt: (host: String, port: Int)? = nil) {
            self.name = name
            self.arguments = arguments
            self.workers = workers
            self.listensAt = listensAt
        }
    }

    final class Child {
        var piece: Piece
        var pid: pid_t?
        /// The process a rolling restart is replacing: it drains while `pid` serves.
        var retiring: pid_t?
        var restarts: [ContinuousClock.Instant] = []
        /// What the kernel's state says of it (``SupervisorStatus``).
        var status: SupervisorStatus
        init(piece: Piece) {
            self.piece = piece
            status = SupervisorStatus(name: piece.name, state: .running)
        }
    }

    enum Phase { case starting, running, stopping }

    private let executable: String
    private let settings: SupervisorSettings
    private let probe: BusClient
    /// Writes each process's ``SupervisorStatus`` into the kernel's state (nil: nowhere).
    private let reporter: BusClient?
    private let logger: Logger
    private let launcher: ProcessLauncher
    /// nil: the kernel runs elsewhere (`up --no-kernel`); it must answer before services start.
    private let kernel: Child?
    private let services: [Child]
    private var phase = Phase.starting
    private var shutdownWaiter: CheckedContinuation<Void, Never>?
    private var exitStatus: Int32 = 0

    /// What happens while ``run(onKernelServing:onUp:)`` runs, handled by its task group in order: a
    /// process exited (told by its watcher thread), a restart or a status report to make
    /// later or beside the rest, a shutdown asked for (told by a signal handler).
    enum Event: Sendable {
        case exited(name: String, pid: pid_t, reason: ExitReason)
        case restart(name: String, after: Duration)
        case report(key: String, value: JSONValue)
        case shutdown
        /// SIGUSR2 and SIGHUP: a rolling restart of everything, a reload.
        case rollingRestart
        case reload
    }
    private let (events, eventQueue) = AsyncStream.makeStream(of: Event.self)

    /// Reads the configuration again for ``reload()`` (nil: reloads are refused).
    private let configuration: (any ConfigurationReloading)?
    /// A rolling restart (or reload) runs: another waits its turn's end, refused.
    private var replacing = false
    /// Whether a kernel that does not answer yet stands by for another that serves its state
    /// (it waits for the state's election in etcd): nil when the kernel never waits.
    private let kernelStandsBy: (@Sendable () async -> Bool)?

    /// - Parameters:
    ///   - executable: the `switchboard` binary.
    ///   - probe: a client of the kernel, for `ping` and `services.list` while starting.
    ///   - reporter: a client with the supervisor's key, to say in the kernel's state how each
    ///     process is doing (nil: only the log says).
    ///   - kernelStandsBy: for a kernel that may wait for another (its state in etcd), whether
    ///     another holds the state's election now.
    public init(executable: String, kernel: Piece?, services: [Piece], settings: SupervisorSettings, probe: BusClient,
                reporter: BusClient? = nil, configuration: (any ConfigurationReloading)? = nil,
                kernelStandsBy: (@Sendable () async -> Bool)? = nil, logger: Logger) throws {
        self.executable = executable
        self.kernelStandsBy = kernelStandsBy
        self.configuration = configuration
        self.settings = settings
        self.probe = probe
        self.reporter = reporter
        self.logger = logger
        launcher = try ProcessLauncher()
        self.kernel = kernel.map(Child.init)
        self.services = services.map(Child.init)
    }

    /// The process ids, by piece name (for the banner).
    public var pids: [(name: String, pid: Int32)] {
        children.compactMap { child in child.pid.map { (child.piece.name, $0) } }
    }

    /// Starts everything, calls `onKernelServing` once this machine's kernel answers (its own
    /// process, not another already at its endpoints; or stands by) and `onUp` once all
    /// registered, and supervises until shutdown. Returns the exit status: 0 after a clean
    /// shutdown.
    public func run(onKernelServing: @Sendable () -> Void = {}, onUp: @Sendable ([(name: String, pid: Int32)]) -> Void) async -> Int32 {
        await withDiscardingTaskGroup(returning: Int32.self) { group in
            group.addTask { await self.handleEvents() }
            let status = await supervise(onKernelServing: onKernelServing, onUp: onUp)
            // Pending restarts and reports end with the events.
            eventQueue.finish()
            return status
        }
    }

    /// Handles ``Event``s until the queue ends; delayed restarts and reports run as child
    /// tasks, cancelled when it ends.
    private func handleEvents() async {
        await withDiscardingTaskGroup { group in
            for await event in events {
                switch event {
                case .exited(let name, let pid, let reason):
                    exited(name, pid: pid, reason: reason)
                case .restart(let name, let delay):
                    group.addTask {
                        try? await Task.sleep(for: delay)
                        guard !Task.isCancelled else { return }
                        await self.restart(name)
                    }
                case .report(let key, let value):
                    guard let reporter else { continue }
                    group.addTask { _ = try? await reporter.publish(key: key, value: value, asService: true) }
                case .shutdown:
                    shutdown()
                case .rollingRestart:
                    group.addTask {
                        do { _ = try await self.rollingRestart(nil) } catch { self.logger.error("rolling restart (SIGUSR2): \(error)") }
                    }
                case .reload:
                    group.addTask {
                        do { _ = try await self.reload() } catch { self.logger.error("reload (SIGHUP) refused; the running configuration stays: \(error)") }
                    }
                }
            }
            group.cancelAll()
        }
    }

    private func supervise(onKernelServing: @Sendable () -> Void, onUp: @Sendable ([(name: String, pid: Int32)]) -> Void) async -> Int32 {
        do {
            var standingBy = false
            if let kernel {
                try start(kernel)
                standingBy = try await waitUntilServing(kernel)
                if phase == .starting { onKernelServing() }
            } else {
                try await waitForRemoteKernel()
            }
            if standingBy {
                logger.notice("the kernel stands by: another kernel serves the state (it holds the state's election in etcd); the services start now and register once this kernel serves")
            }
            for service in services {
                guard phase == .starting else { break }
                try checkAddressFree(service)
                try start(service)
                // A kernel standing by registers nobody: the services wait for it themselves.
                if !standingBy { try await waitUntilUp(service) }
            }
        } catch {
            if phase == .starting {
                logger.error("start failed: \(error)")
                exitStatus = 1
            }
            await stopAll()
            return exitStatus
        }
        guard phase == .starting else {
            await stopAll()
            return exitStatus
        }
        phase = .running
        for child in children { report(child) }
        onUp(pids)
        await withCheckedContinuation { shutdownWaiter = $0 }
        await stopAll()
        return exitStatus
    }

    /// Begins the ordered shutdown (SIGINT/SIGTERM; callable from a signal handler). A
    /// second request kills what is left.
    public nonisolated func requestShutdown() {
        eventQueue.yield(.shutdown)
    }

    /// A rolling restart of every service (SIGUSR2; callable from a signal handler).
    public nonisolated func requestRollingRestart() {
        eventQueue.yield(.rollingRestart)
    }

    /// A reload of the configuration (SIGHUP; callable from a signal handler).
    public nonisolated func requestReload() {
        eventQueue.yield(.reload)
    }

    private func shutdown() {
        if phase == .stopping {
            logger.warning("second signal: killing every process now")
            for child in children { if let pid = child.pid { kill(pid, SIGKILL) } }
            return
        }
        phase = .stopping
        shutdownWaiter?.resume()
        shutdownWaiter = nil
    }

    private var children: [Child] { (kernel.map { [$0] } ?? []) + services }

    // MARK: Starting

    struct StartFailure: Error, CustomStringConvertible {
        let description: String
    }

    private func start(_ child: Child) throws {
        let pid = try launcher.spawn(executable, child.piece.arguments + ["--lifeline-fd", String(ProcessLauncher.lifelineFD)])
        child.pid = pid
        child.status = SupervisorStatus(name: child.piece.name, state: .running, pid: Int(pid), restarts: child.restarts.count,
                                        lastExit: child.status.lastExit)
        logger.info("started \(child.piece.name)", metadata: ["pid": "\(pid)"])
        let name = child.piece.name, queue = eventQueue
        Spawn.watch(pid) { reason in queue.yield(.exited(name: name, pid: pid, reason: reason)) }
    }

    /// A piece that listens is up once its address accepts connections: another program
    /// already accepting there would pass for it (while it fails to bind), so it is refused.
    private func checkAddressFree(_ child: Child) throws {
        guard let (host, port) = child.piece.listensAt, Self.acceptsConnections(host: host, port: port) else { return }
        let name = child.piece.name
        throw StartFailure(description: "something already accepts connections at \(host):\(port), where the \(name) is to listen (another bus's \(name)?); "
                           + "stop it, or give the \(name) another address (\(name).listen)")
    }

    /// Waits until the kernel answers `ping`, or lists `workers` workers of a service, or
    /// `otherwise` holds.
    private func waitUntilUp(_ child: Child, otherwise: () async -> Bool = { false }) async throws {
        try await waitUntil("\(child.piece.name) did not \(child.piece.listensAt != nil ? "listen" : child.piece.workers == 0 ? "answer" : "register")") {
            guard child.pid != nil else {
                throw StartFailure(description: "\(child.piece.name) exited while starting (its log is above)")
            }
            if try await self.isUp(child) { return true }
            return await otherwise()
        }
    }

    /// Waits until the kernel answers `ping` (false), or finds it standing by for another
    /// kernel that serves its state (true; asked once a second).
    private func waitUntilServing(_ kernel: Child) async throws -> Bool {
        guard let kernelStandsBy else {
            try await waitUntilUp(kernel)
            return false
        }
        var standingBy = false, asked = ContinuousClock.now
        try await waitUntilUp(kernel) {
            guard ContinuousClock.now - asked >= .seconds(1) else { return false }
            asked = .now
            standingBy = await kernelStandsBy()
            return standingBy
        }
        return standingBy
    }

    /// `up --no-kernel`: the kernel elsewhere must answer before the services start.
    private func waitForRemoteKernel() async throws {
        try await waitUntil("no kernel answers at \(probe.brokers.joined(separator: ", "))") {
            (try? await self.probe.call(KernelAPI.ping, timeout: .milliseconds(500))) != nil
        }
    }

    /// Checks `condition` every 50 ms until it holds, the start timeout passes (failing with
    /// `failure`) or a shutdown begins.
    private func waitUntil(_ failure: String, _ condition: () async throws -> Bool) async throws {
        let deadline = ContinuousClock.now + settings.startTimeout
        while ContinuousClock.now < deadline {
            guard phase != .stopping else { return }
            if try await condition() { return }
            try? await Task.sleep(for: .milliseconds(50))
        }
        throw StartFailure(description: "\(failure) within \(settings.startTimeout)")
    }

    private func isUp(_ child: Child) async throws -> Bool {
        if let (host, port) = child.piece.listensAt { return Self.acceptsConnections(host: host, port: port) }
        if child.piece.workers == 0 {
            // Our kernel, not another one already listening there (whose answer would
            // otherwise look like ours while ours fails to bind and exits).
            guard let pong = try? await probe.call(KernelAPI.ping, timeout: .milliseconds(500)) else { return false }
            if let ours = child.pid, pong.pid != Int(ours) {
                let pid = pong.pid
                throw StartFailure(description: "another kernel (pid \(pid)) already answers at \(probe.brokers.joined(separator: ", ")); stop it or choose other endpoints")
            }
            return true
        }
        guard let workers = try? await registeredWorkers(child.piece.name) else { return false }
        return workers >= child.piece.workers
    }

    /// Whether a TCP connection to `host`:`port` is accepted now.
    public static func acceptsConnections(host: String, port: Int) -> Bool {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var found: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host == "0.0.0.0" ? "127.0.0.1" : host == "::" ? "::1" : host, String(port), &hints, &found) == 0, let first = found else { return false }
        defer { freeaddrinfo(found) }
        var address: UnsafeMutablePointer<addrinfo>? = first
        while let current = address {
            let fd = socket(current.pointee.ai_family, current.pointee.ai_socktype, current.pointee.ai_protocol)
            if fd >= 0 {
                defer { close(fd) }
                if connect(fd, current.pointee.ai_addr, current.pointee.ai_addrlen) == 0 { return true }
            }
            address = current.pointee.ai_next
        }
        return false
    }

    // MARK: Exits and restarts

    private func exited(_ name: String, pid: pid_t, reason: ExitReason) {
        guard let child = children.first(where: { $0.piece.name == name }) else { return }
        if child.retiring == pid {
            child.retiring = nil
            logger.info("\(child.piece.name) (pid \(pid)) \(reason) after draining")
            return
        }
        guard child.pid == pid else { return }
        if let old = child.retiring {
            // The replacement ended while starting: the old process keeps serving.
            logger.error("the new \(child.piece.name) (pid \(pid)) \(reason) while starting; pid \(old) keeps serving")
            child.pid = old
            child.retiring = nil
            return
        }
        child.pid = nil
        switch phase {
        case .starting:
            logger.error("\(child.piece.name) (pid \(pid)) \(reason) while starting")
        case .stopping:
            logger.info("\(child.piece.name) (pid \(pid)) \(reason)")
            if reason != .exited(0) && reason != .signalled(SIGTERM) { exitStatus = 1 }
        case .running where reason == .exited(0) && child.piece.workers > 0:
            // A service leaves with status 0 only when a kernel drained it (`sb drain`).
            logger.notice("\(child.piece.name) (pid \(pid)) drained and left; it stays down until `sb restart \(child.piece.name)`")
            child.status = SupervisorStatus(name: child.piece.name, state: .drained, restarts: child.restarts.count, lastExit: reason.description)
            report(child)
        case .running:
            scheduleRestart(child, pid: pid, reason: reason)
        }
    }

    private func scheduleRestart(_ child: Child, pid: pid_t, reason: ExitReason) {
        let now = ContinuousClock.now
        child.restarts.removeAll { now - $0 > settings.restartWindow }
        let delay = min(settings.restartBackoff * (1 << min(child.restarts.count, 20)), settings.restartBackoffMax)
        child.restarts.append(now)
        let recent = child.restarts.count, failing = recent >= settings.restartLimit
        if recent == settings.restartLimit {
            logger.critical("\(child.piece.name) keeps failing: it ended \(recent) times within \(settings.restartWindow) (last: pid \(pid) \(reason)); the other processes keep running, and it is restarted every \(settings.restartBackoffMax) at most until it stays up")
        } else {
            logger.warning("\(child.piece.name) (pid \(pid)) \(reason); restarting in \(delay) (\(recent) restarts within \(settings.restartWindow))")
        }
        child.status = SupervisorStatus(name: child.piece.name, state: failing ? .failing : .restarting, restarts: recent,
                                        lastExit: reason.description, restartInSeconds: delay.seconds)
        report(child)
        eventQueue.yield(.restart(name: child.piece.name, after: delay))
    }

    /// Writes `child`'s status into the kernel's state; a kernel that is down (or is the one
    /// restarting) misses it, and the next change says it again.
    private func report(_ child: Child) {
        guard reporter != nil, let value = try? JSONValue(encoding: child.status) else { return }
        eventQueue.yield(.report(key: SupervisorStatus.key(child.piece.name), value: value))
    }

    /// A restart that came due; nothing once stopping, or when the process is back already.
    private func restart(_ name: String) {
        guard phase == .running, let child = children.first(where: { $0.piece.name == name }), child.pid == nil else { return }
        do {
            try start(child)
            // A kernel that restarted lost the state where the others' statuses were.
            for reported in child === kernel ? children : [child] { report(reported) }
        } catch {
            logger.error("cannot restart \(child.piece.name): \(error)")
            scheduleRestart(child, pid: 0, reason: .exited(127))
        }
    }

    // MARK: Stopping

    // MARK: Rolling restarts

    /// Replaces each named piece's process (default: every service, then the gateway), one
    /// at a time; the kernel is not among them (it would take the bus down: a kernel pair
    /// fails over instead, docs/PAIR.md).
    public func rollingRestart(_ names: [String]?) async throws(JSONRPCError) -> [SupervisorAPI.Restarted.Entry] {
        let chosen = try pieces(names)
        guard phase == .running else { throw JSONRPCError(code: JSONRPCError.conflictCode, message: "Conflict: the bus is \(phase == .starting ? "still starting" : "stopping")") }
        guard !replacing else { throw JSONRPCError(code: JSONRPCError.conflictCode, message: "Conflict: a rolling restart or reload is already running") }
        replacing = true
        defer { replacing = false }
        logger.notice("rolling restart", metadata: ["pieces": "\(chosen.map(\.piece.name).joined(separator: ", "))"])
        var done: [SupervisorAPI.Restarted.Entry] = []
        for child in chosen {
            guard phase == .running else { break }
            do {
                done.append(try await replace(child))
            } catch {
                logger.error("rolling restart stopped at \(child.piece.name): \(error)")
                throw JSONRPCError(code: JSONRPCError.internalErrorCode, message: "Restart of \(child.piece.name) failed: \(error)",
                                   data: ["restarted": .array(done.map { .string($0.name) })])
            }
        }
        logger.notice("rolling restart done", metadata: ["pieces": "\(done.map(\.name).joined(separator: ", "))"])
        return done
    }

    private func pieces(_ names: [String]?) throws(JSONRPCError) -> [Child] {
        guard let names, !names.isEmpty else { return services }
        return try names.map { name throws(JSONRPCError) in
            if name == kernel?.piece.name {
                throw .invalidParams(field: "services", "the kernel is not restarted in place (every client would lose it): restart switchboard up, or fail a kernel pair over (docs/PAIR.md)")
            }
            guard let child = services.first(where: { $0.piece.name == name }) else {
                throw .invalidParams(field: "services", "'\(name)' is not run here; known: \(services.map(\.piece.name).joined(separator: ", "))")
            }
            return child
        }
    }

    /// One piece: a service gets its new process first (registered beside the old one),
    /// then the old one drains; the gateway is stopped, then started (one port).
    private func replace(_ child: Child) async throws -> SupervisorAPI.Restarted.Entry {
        let name = child.piece.name
        guard let old = child.pid else {
            // Down (drained, or waiting for a restart): started, nothing to drain.
            try start(child)
            try await waitUntilUp(child)
            report(child)
            return .init(name: name, oldPid: nil, newPid: Int(child.pid ?? 0))
        }
        if child.piece.listensAt != nil {
            child.retiring = old
            child.pid = nil
            try await retire(child, old)
            try checkAddressFree(child)
            try start(child)
            try await waitUntilUp(child)
        } else {
            let before = try await registeredWorkers(name)
            child.retiring = old
            do {
                try start(child)
                let new = child.pid
                try await waitUntil("the new \(name) did not register") {
                    guard child.pid == new else { throw StartFailure(description: "the new \(name) exited while starting (its log is above)") }
                    return try await self.registeredWorkers(name) >= before + child.piece.workers
                }
            } catch {
                if let new = child.pid, new != old { kill(new, SIGKILL) }
                child.pid = old
                child.retiring = nil
                throw error
            }
            try await retire(child, old)
        }
        logger.notice("restarted \(name)", metadata: ["old": "\(old)", "new": "\(child.pid ?? 0)"])
        report(child)
        return .init(name: name, oldPid: Int(old), newPid: Int(child.pid ?? 0))
    }

    /// SIGTERM to the retiring process (it drains), and its end within the stop timeout
    /// (SIGKILL after it).
    private func retire(_ child: Child, _ pid: pid_t) async throws {
        kill(pid, SIGTERM)
        let deadline = ContinuousClock.now + settings.stopTimeout
        while child.retiring == pid, ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
        if child.retiring == pid {
            logger.error("\(child.piece.name) (pid \(pid)) did not drain within \(settings.stopTimeout); killing it")
            kill(pid, SIGKILL)
            while child.retiring == pid { try? await Task.sleep(for: .milliseconds(20)) }
        }
    }

    /// The workers the kernel lists for `name` (those taking requests: not draining).
    private func registeredWorkers(_ name: String) async throws -> Int {
        let list = try await probe.call(KernelAPI.servicesList, timeout: .milliseconds(500))
        return list.services.first { $0.name == name }?.workers ?? 0
    }

    // MARK: Reloading

    /// Reads the configuration again; refused (the running one kept) when it does not read.
    /// Otherwise every process applies what it can (SIGHUP), and services whose worker
    /// count changed are restarted the rolling way.
    public func reload() async throws(JSONRPCError) -> SupervisorAPI.Reloaded {
        guard let configuration else { throw JSONRPCError(code: JSONRPCError.conflictCode, message: "Conflict: this supervisor has no configuration to reload") }
        guard phase == .running else { throw JSONRPCError(code: JSONRPCError.conflictCode, message: "Conflict: the bus is not running yet") }
        // A process starting for a rolling restart may not handle SIGHUP yet.
        guard !replacing else { throw JSONRPCError(code: JSONRPCError.conflictCode, message: "Conflict: a rolling restart is running; reload once it is done") }
        let change = try configuration.reload()
        for child in children {
            for pid in [child.pid, child.retiring].compactMap({ $0 }) { kill(pid, SIGHUP) }
        }
        var report = change.report
        var resized: [String] = []
        for child in services {
            guard let workers = change.workers[child.piece.name], workers != child.piece.workers else { continue }
            child.piece.workers = workers
            resized.append(child.piece.name)
        }
        if !resized.isEmpty {
            report.restarted = try await rollingRestart(resized).map(\.name)
        }
        logger.notice("configuration reloaded", metadata: [
            "applied": "\(report.applied.joined(separator: ", "))", "needsRestart": "\(report.needsRestart.joined(separator: ", "))",
            "restarted": "\(report.restarted.joined(separator: ", "))"])
        return report
    }

    public nonisolated func methods(_ table: inout MethodTable<Supervisor>) {
        table.on(SupervisorAPI.restart) { supervisor, params in .init(restarted: try await supervisor.rollingRestart(params.services)) }
        table.on(SupervisorAPI.reload) { supervisor, _ in try await supervisor.reload() }
    }

    // MARK: Stopping

    /// Services first, all at once (each drains its requests in flight), then the kernel.
    private func stopAll() async {
        phase = .stopping
        await stop(services)
        if let kernel { await stop([kernel]) }
    }

    private func stop(_ children: [Child]) async {
        func running(_ child: Child) -> [pid_t] { [child.pid, child.retiring].compactMap { $0 } }
        for child in children { for pid in running(child) { kill(pid, SIGTERM) } }
        let deadline = ContinuousClock.now + settings.stopTimeout
        while children.contains(where: { !running($0).isEmpty }) && ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(20))
        }
        for child in children {
            for pid in running(child) {
                logger.error("\(child.piece.name) (pid \(pid)) did not stop within \(settings.stopTimeout); killing it")
                exitStatus = 1
                kill(pid, SIGKILL)
            }
        }
        while children.contains(where: { !running($0).isEmpty }) {
            try? await Task.sleep(for: .milliseconds(20))
        }
    }
}

/// Reads the configuration again for ``Supervisor/reload()``.
public protocol ConfigurationReloading: Sendable {
    /// What changed, and each service's worker count now; throws (naming the key) when the
    /// file does not read, keeping the running configuration.
    func reload() throws(JSONRPCError) -> ConfigurationChange
}

public struct ConfigurationChange: Sendable {
    public var report: SupervisorAPI.Reloaded
    public var workers: [String: Int]
    public init(report: SupervisorAPI.Reloaded, workers: [String: Int]) { (self.report, self.workers) = (report, workers) }
}
