public import Foundation
import Synchronization
public import Kernel
public import ZeroMQ
public import BusKit
import Contracts
public import BusProtocol
import Supervisor

/// Thrown when a bounded wait in a test runs out.
public struct TimedOut: Error, CustomStringConvertible {
    public let what: String
    public init(what: String) { self.what = what }
    public var description: String { "timed out: \(what)" }
}

/// Runs `body`, failing with ``TimedOut`` if it takes longer than `seconds`, even when
/// `body` ignores cancellation (``withDeadline``): the test goes on, the stuck task is left.
public func within<T: Sendable>(_ seconds: Double, _ what: String = "operation",
                                _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withDeadline(.seconds(seconds), expired: { TimedOut(what: what) }, body)
}

/// Runs `body` on `started`, then `stop(started)` however `body` ends, and gives what `body`
/// gave: a test that fails leaves nothing it started running (Swift has no `defer` that awaits).
public func stopping<Started, Result>(_ started: Started, with stop: (Started) async -> Void,
                                      _ body: (Started) async throws -> Result) async throws -> Result {
    let result: Result
    do {
        result = try await body(started)
    } catch {
        await stop(started)
        throw error
    }
    await stop(started)
    return result
}

/// Polls `condition` every 20 ms until it holds, failing after `seconds`.
public func eventually(_ seconds: Double = 10, _ what: String, _ condition: @escaping @Sendable () async throws -> Bool) async throws {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if (try? await condition()) == true { return }
        try await Task.sleep(for: .milliseconds(20))
    }
    throw TimedOut(what: what)
}

/// The repository's folder, from the path of the test file that asks (`Tests/TARGET/FILE.swift`).
public func repositoryRoot(_ testFile: String = #filePath) -> URL {
    URL(fileURLWithPath: testFile).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
}

/// A loopback TCP port that was free a moment ago.
///
/// Chosen below the range the OS takes local ports of outgoing connections from (read from
/// /proc): a client reconnecting to a stopped kernel's port from that range can end up
/// connected to itself on that very port (TCP simultaneous open), and the restarted kernel
/// could not bind it. A port is handed out once: two calls never give the same port, though
/// it was free at each (a configuration asking for five ports got one twice), nor do two test
/// processes running at once (``PortsHandedOut``).
public func freePort() -> Int {
    let range = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8))?
        .split(whereSeparator: \.isWhitespace).compactMap { Int($0) }
    let ephemeralStart = range?.first ?? 32_768
    let candidates = freePortsFrom..<max(freePortsFrom + 1, min(ephemeralStart, 32_768))
    while true {
        if let port = freePort(in: candidates, attempts: 1_000) { return port }
    }
}

/// The lowest port ``freePort()`` hands out.
public let freePortsFrom = 10_000

/// A port of `candidates` as ``freePort()`` hands one out, or nil when `attempts` tries at
/// random found none (every one bound, or handed out already).
public func freePort(in candidates: Range<Int>, attempts: Int) -> Int? {
    for _ in 0..<attempts {
        let port = Int.random(in: candidates)
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        let bound = bindLoopback(fd, port: port)
        close(fd)
        if bound, PortsHandedOut.reserve(port) { return port }
    }
    return nil
}

/// Binds the socket `fd` to 127.0.0.1:`port`; whether it could.
public func bindLoopback(_ fd: Int32, port: Int) -> Bool {
    withLoopbackAddress(port: port) { bind(fd, $0, $1) } == 0
}

/// Calls `body` with 127.0.0.1:`port` as the socket calls take an address.
func withLoopbackAddress<T>(port: Int, _ body: (UnsafePointer<sockaddr>, socklen_t) -> T) -> T {
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = UInt16(port).bigEndian
    return withUnsafePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
}

/// The ports ``freePort()`` handed out: in this process, and in every test process running
/// at once (`Scripts/test` runs two side by side). A port a test holds unbound for a moment,
/// as when it restarts a kernel on it, must not go to another process meanwhile: each
/// process locks the byte at its port's offset in a file they share, and the machine lets go
/// of a process's locks when it ends, however it ends.
public enum PortsHandedOut {
    /// The file whose byte at a port's offset a process locks while the port is its own.
    public static let lockPath = FileManager.default.temporaryDirectory.appendingPathComponent("switchboard-test-ports.lock").path
    private static let ports = Mutex<Set<Int>>([])
    /// The shared file; -1 where it cannot be opened (then ports are kept apart in this
    /// process only, as where it cannot be locked).
    private static let lockFile = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o666)

    /// Whether `port` is this caller's now: handed out by no one before.
    static func reserve(_ port: Int) -> Bool {
        ports.withLock { handedOut in
            guard !handedOut.contains(port) else { return false }
            // The file's offset is shared by this process's threads: moved and used under the mutex.
            if lockFile >= 0, lseek(lockFile, off_t(port), SEEK_SET) == off_t(port), lockf(lockFile, F_TLOCK, 1) != 0 {
                // Held by another process; any other failure (a file system without locks)
                // would refuse every port, so there only this process's own are kept apart.
                if errno == EACCES || errno == EAGAIN { return false }
            }
            handedOut.insert(port)
            return true
        }
    }
}

/// A ROUTER bound at `endpoint` standing in for a kernel, to see exactly what a client sends.
/// libzmq closes a listening socket in its I/O thread after `zmq_close` returns, so a stand-in
/// that replaces a closed one binds the port once it is free again (no event says when).
public func kernelStandIn(at endpoint: String, in context: ZMQContext, receiveHighWaterMark: Int32 = 1_000) async throws -> ZMQSocket {
    let router = try ZMQSocket(context, .router)
    try router.set(.receiveTimeout, Int32(10_000))
    try router.set(.receiveHighWaterMark, receiveHighWaterMark)
    for _ in 0..<200 {
        if (try? router.bind(endpoint)) != nil { return router }
        try await Task.sleep(for: .milliseconds(10))
    }
    _ = try router.bind(endpoint)
    return router
}

extension ZMQSocket {
    /// The next message, waited for on a thread of its own (up to the socket's receive
    /// timeout): a test reading a stand-in's socket must not hold one of the cooperative
    /// pool's threads (two on a 2-core machine) while the tests beside it need them.
    public func receiveOffPool() async throws -> Message {
        nonisolated(unsafe) let socket = self
        return try await withCheckedThrowingContinuation { continuation in
            // The continuation hands the socket back to the task (libzmq allows moving a
            // socket between threads with a full memory barrier between uses).
            Thread { continuation.resume(with: Result { try socket.receive() }) }.start()
        }
    }
}

/// A fresh temporary directory, removed with everything in it when this process exits
/// normally: a test run leaves nothing behind (a crashed one leaves its folders, for a
/// reader to see why). ``keepTemporaryDirectory(_:)`` lets one outlive the process.
public func temporaryDirectory(_ label: String = "sb-test") throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("\(label)-\(UUID().uuidString.prefix(8))")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    _ = removeTemporaryDirectoriesAtExit
    temporaryDirectories.withLock { _ = $0.insert(url.path) }
    return url
}

/// Leaves `folder` (from ``temporaryDirectory(_:)``) in place when this process exits: its
/// owner removes it, or keeps it for a reader (a failed soak's logs).
public func keepTemporaryDirectory(_ folder: URL) {
    temporaryDirectories.withLock { _ = $0.remove(folder.path) }
}

/// The folders ``temporaryDirectory(_:)`` made that go when the process exits.
private let temporaryDirectories = Mutex<Set<String>>([])
private let removeTemporaryDirectoriesAtExit: Void = {
    atexit {
        for path in temporaryDirectories.withLock({ $0 }) { try? FileManager.default.removeItem(atPath: path) }
    }
}()

/// A kernel for one test, on loopback ports of its own.
public struct TestKernel: Sendable {
    public let kernel: Kernel
    public let endpoints: Kernel.Endpoints
    public let configuration: KernelConfiguration

    /// Starts a kernel. With `fixedPorts`, the endpoints are concrete ports, so a second
    /// kernel can be started on the same ones (a restart).
    ///
    /// A port found free can be taken before the kernel binds it (by another test, or as the
    /// local end of some outgoing connection): then it tries again with other ports.
    public static func start(fixedPorts: Bool = false, _ configure: (inout KernelConfiguration) -> Void = { _ in }) async throws -> TestKernel {
        var attempt = 0
        while true {
            do {
                return try await start(configuration(fixedPorts: fixedPorts, configure))
            } catch let error as ZMQError where fixedPorts && error.code == EADDRINUSE && attempt < 5 {
                attempt += 1
            }
        }
    }

    /// A kernel's configuration on loopback: on ports the system picks at bind, or with
    /// `fixedPorts` on concrete ones, known before the kernel starts.
    public static func configuration(fixedPorts: Bool = false, _ configure: (inout KernelConfiguration) -> Void = { _ in }) -> KernelConfiguration {
        var configuration = KernelConfiguration()
        let endpoint = { fixedPorts ? "tcp://127.0.0.1:\(freePort())" : "tcp://127.0.0.1:*" }
        configuration.brokerEndpoint = endpoint()
        configuration.snapshotEndpoint = endpoint()
        configuration.publisherEndpoint = endpoint()
        configuration.collectorEndpoint = endpoint()
        configure(&configuration)
        return configuration
    }

    /// Starts a kernel with exactly this configuration.
    public static func start(_ configuration: KernelConfiguration) async throws -> TestKernel {
        let kernel = try Kernel(configuration: configuration, context: ZMQContext())
        do {
            let endpoints = try await kernel.start()
            return TestKernel(kernel: kernel, endpoints: endpoints, configuration: configuration)
        } catch {
            await kernel.stop()
            throw error
        }
    }

    /// A new kernel on the same endpoints (after ``stop()``): a kernel restart.
    public func restarted() async throws -> TestKernel {
        var configuration = self.configuration
        configuration.brokerEndpoint = endpoints.broker
        configuration.snapshotEndpoint = endpoints.snapshot
        configuration.publisherEndpoint = endpoints.publisher
        configuration.collectorEndpoint = endpoints.collector
        // libzmq closes the old kernel's listening sockets on its I/O thread, a moment
        // after the old kernel has stopped: until then a bind finds the port in use.
        var attempt = 0
        while true {
            do {
                return try await TestKernel.start(configuration)
            } catch let error as ZMQError where error.code == EADDRINUSE && attempt < 50 {
                attempt += 1
                try await Task.sleep(for: .milliseconds(50))
            }
        }
    }

    public func stop() async { await kernel.stop() }

    /// Its CHP endpoints, as a ``BusClient`` takes them (`state:`).
    public var stateEndpoints: StateEndpoints {
        StateEndpoints(snapshot: endpoints.snapshot, publisher: endpoints.publisher, collector: endpoints.collector)
    }

    /// Returns once `service` has at least `count` workers registered; fails with
    /// ``TimedOut`` after `seconds`.
    public func workers(_ service: String, atLeast count: Int = 1, within seconds: Double = 10, curve: CurveClientKeys? = nil) async throws {
        try await workers(service, within: seconds, curve: curve, "\(service): \(count) worker\(count == 1 ? "" : "s") registered") { $0 >= count }
    }

    /// Returns once the number of `service`'s workers satisfies `condition`, awaiting the
    /// kernel's own state key for it (`/kernel/services/NAME`, published as workers come and
    /// go) rather than polling; fails with ``TimedOut`` after `seconds`.
    public func workers(_ service: String, within seconds: Double = 10, curve: CurveClientKeys? = nil, _ what: String,
                        where condition: @escaping @Sendable (Int) -> Bool) async throws {
        try await SwitchboardTestSupport.workers(service, snapshot: endpoints.snapshot, publisher: endpoints.publisher, cell: configuration.cell?.name,
                                                 within: seconds, curve: curve, what, where: condition)
    }

    /// Returns once the other cells offering `service` to this kernel are `cells` (sorted),
    /// awaiting the service's state key (its `cells`, published as offers come and go);
    /// fails with ``TimedOut`` after `seconds`.
    public func offers(_ service: String, from cells: [String], within seconds: Double = 10, curve: CurveClientKeys? = nil) async throws {
        let key = KernelAPI.StateKeys.service(service, cell: configuration.cell?.name)
        try await state(key, within: seconds, curve: curve, "\(service) offered to cell \(configuration.cell?.name ?? "-") by \(cells)") { state in
            (state[key]?["cells"]?.arrayValue ?? []).compactMap(\.stringValue) == cells
        }
    }

    /// The kernel's state under `prefix` once `condition` holds of it (``awaitState``).
    @discardableResult
    public func state(_ prefix: String, within seconds: Double = 10, curve: CurveClientKeys? = nil, _ what: String,
                      until condition: @escaping @Sendable ([String: JSONValue]) -> Bool) async throws -> [String: JSONValue] {
        try await awaitState(snapshot: endpoints.snapshot, publisher: endpoints.publisher, prefix: prefix, within: seconds, curve: curve,
                             what, until: condition)
    }
}

/// Returns once the number of `service`'s workers on the kernel at these state endpoints
/// satisfies `condition` (its `/kernel/services/NAME` key, of a kernel of a cell its cell's;
/// none: 0).
public func workers(_ service: String, snapshot: String, publisher: String, cell: String? = nil, within seconds: Double = 10,
                    curve: CurveClientKeys? = nil, _ what: String, where condition: @escaping @Sendable (Int) -> Bool) async throws {
    let key = KernelAPI.StateKeys.service(service, cell: cell)
    try await awaitState(snapshot: snapshot, publisher: publisher, prefix: key, within: seconds, curve: curve, what) { state in
        condition(Int(state[key]?["workers"]?.intValue ?? 0))
    }
}

/// The kernel's state under `prefix` (each key's JSON value; a deleted key is absent) once
/// `condition` holds of it, followed through a subscription: the snapshot, then every change,
/// so the wait ends at the change it waits for instead of polling `state.get`. `condition` is
/// first asked once the snapshot is in (an empty state there is an answer, not "not read
/// yet"). Fails with ``TimedOut`` after `seconds`.
@discardableResult
public func awaitState(snapshot: String, publisher: String, prefix: String, within seconds: Double = 10, curve: CurveClientKeys? = nil,
                       _ what: String, until condition: @escaping @Sendable ([String: JSONValue]) -> Bool) async throws -> [String: JSONValue] {
    let subscription = try await Subscription.open(snapshot: snapshot, publisher: publisher, prefixes: [prefix], curve: curve)
    // What the wait saw, for the error when it times out: the state, and the events as they came.
    let seen = Observed<(state: [String: JSONValue], events: [String])>(([:], []))
    return try await stopping(subscription, with: { await $0.cancel() }) { subscription in
        do {
            return try await SwitchboardTestSupport.within(seconds, what) {
                var state: [String: JSONValue] = [:]
                var synced = false
                for try await event in subscription {
                    defer { seen.update { $0 = (state, $0.events.suffix(19) + ["\(event)"]) } }
                    switch event {
                    case .update(let update):
                        guard update.key.hasPrefix(prefix) else { continue }
                        if update.isDelete { state.removeValue(forKey: update.key) } else { state[update.key] = update.json ?? .null }
                    case .synced, .resynced:
                        synced = true
                    case .reset:
                        state = [:]
                        continue
                    case .missed:
                        continue
                    }
                    if synced, condition(state) { return state }
                }
                throw TimedOut(what: "\(what): the subscription ended")
            }
        } catch let error as TimedOut {
            let (state, events) = seen.value
            throw TimedOut(what: "\(error.what); the state under '\(prefix)' was \(state), after the events \(events.isEmpty ? "(none)" : events.joined(separator: "; "))")
        }
    }
}

/// Two kernels in a primary/backup pair on fixed loopback ports, in this process.
public struct TestPair: Sendable {
    /// [primary, backup]; nil where stopped.
    public private(set) var kernels: [TestKernel?]
    public let configurations: [KernelConfiguration]

    public var brokers: [String] { configurations.map(\.brokerEndpoint) }
    public var states: [StateEndpoints] {
        configurations.map { StateEndpoints(snapshot: $0.snapshotEndpoint, publisher: $0.publisherEndpoint, collector: $0.collectorEndpoint) }
    }

    /// Starts both (primary first), with 100 ms pair heartbeats and `configure` applied to each.
    public static func start(heartbeat: Duration = .milliseconds(100), _ configure: (inout KernelConfiguration) -> Void = { _ in }) async throws -> TestPair {
        let pairPorts = [freePort(), freePort()], brokerPorts = [freePort(), freePort()]
        let configurations = PairConfiguration.Role.allCases.enumerated().map { index, role in
            var configuration = KernelConfiguration()
            configuration.brokerEndpoint = "tcp://127.0.0.1:\(brokerPorts[index])"
            configuration.snapshotEndpoint = "tcp://127.0.0.1:\(freePort())"
            configuration.publisherEndpoint = "tcp://127.0.0.1:\(freePort())"
            configuration.collectorEndpoint = "tcp://127.0.0.1:\(freePort())"
            configuration.pair = PairConfiguration(role: role, listen: "tcp://127.0.0.1:\(pairPorts[index])",
                                                   peer: "tcp://127.0.0.1:\(pairPorts[1 - index])", heartbeatInterval: heartbeat,
                                                   peerBroker: "tcp://127.0.0.1:\(brokerPorts[1 - index])")
            configure(&configuration)
            return configuration
        }
        var pair = TestPair(kernels: [nil, nil], configurations: configurations)
        for index in 0..<2 { try await pair.start(index) }
        return pair
    }

    /// Starts kernel `index` (0: primary, 1: backup) again, on its endpoints.
    public mutating func start(_ index: Int) async throws {
        var attempt = 0
        while true {
            do {
                kernels[index] = try await TestKernel.start(configurations[index])
                return
            } catch let error as ZMQError where error.code == EADDRINUSE && attempt < 50 {
                attempt += 1
                try await Task.sleep(for: .milliseconds(50))
            }
        }
    }

    public mutating func stop(_ index: Int) async {
        await kernels[index]?.stop()
        kernels[index] = nil
    }

    public mutating func stopAll() async {
        for index in 0..<2 { await stop(index) }
    }
}

/// Heartbeats fast enough for tests (100 ms) with a liveness that tolerates a loaded
/// machine (10 missed): a dead worker is noticed within about a second.
public func fastHeartbeats(_ configuration: inout KernelConfiguration) {
    configuration.heartbeatInterval = .milliseconds(100)
    configuration.heartbeatLiveness = 10
}

/// A child process a test started; ``stop()`` ends it (SIGTERM, then SIGKILL).
///
/// It goes even when the test process dies without stopping it (killed, or a CI time-out):
/// its stdin is a "lifeline", a pipe only this process writes to, and end-of-file there
/// ends it. `switchboard up`, `kernel`, `serve` and `gateway` are told to watch it
/// (`--lifeline-fd 0`, added here, also through `ip netns exec`); the Python fixtures in
/// Tests/Interop watch their stdin themselves; other programs are started
/// ``init(watched:_:)``, with a watcher of their own.
public final class ChildProcess: Sendable {
    public let pid: Int32
    /// The write end of the child's stdin, which only this process holds.
    private let lifeline: Int32
    /// How the process ended, once it has (reaped by a thread of its own).
    private let ended = Observed<ExitReason?>(nil)
    /// What the process wrote so far (stdout and stderr together), and whether it closed them.
    private let captured = Observed(CapturedOutput())

    /// Starts `executable` with `arguments` (and ``testProcessEnvironment(_:)`` of
    /// `environment`); its stdout and stderr are read as they come, or, with `log`, go to the
    /// end of that file (``outputSoFar`` stays empty).
    public init(_ executable: URL, _ arguments: [String], environment: [String: String] = [:], log: URL? = nil) throws {
        let stdin = try Pipes.make()
        let output = try log.map { file -> (read: Int32?, write: Int32) in
            let descriptor = open(file.path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
            guard descriptor >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
            return (nil, descriptor)
        } ?? { let pipe = try Pipes.make(); return (pipe.read, pipe.write) }()
        defer { for end in [stdin.read, output.write] { close(end) } }
        do {
            pid = try Spawn.start(executable.path, arguments + (Self.watchesLifeline(executable, arguments) ? ["--lifeline-fd", "0"] : []),
                                  descriptors: [0: stdin.read, 1: output.write, 2: output.write],
                                  environment: testProcessEnvironment(environment))
        } catch {
            for end in [stdin.write] + (output.read.map { [$0] } ?? []) { close(end) }
            throw error
        }
        lifeline = stdin.write
        if let read = output.read { Pipes.read(read, into: captured) } else { captured.update { $0.closed = true } }
        let ended = ended
        Spawn.watch(pid) { reason in ended.update { $0 = reason } }
    }

    /// Starts `executable`, which watches no lifeline itself (etcd, HAProxy), through a shell
    /// that leaves a watcher of the lifeline behind and then becomes `executable` (the same
    /// pid). When the lifeline ends, that is when this process ended without stopping it, the
    /// watcher kills its parent if that is still `executable`: never a process that took the
    /// pid of one that already ended (the watcher has another parent then).
    public convenience init(watched executable: URL, _ arguments: [String]) throws {
        // The watcher holds the lifeline (as 3) and nothing of the program's output.
        let script = #"exec 3<&0; { "#
            + #"while read -r _; do :; done <&3; read -r _ _ _ parent _ < /proc/self/stat; [ "$parent" = "$$" ] && kill -KILL $$; } "#
            + #"</dev/null >/dev/null 2>&1 & exec 3<&-; exec "$@""#
        try self.init(URL(fileURLWithPath: "/bin/bash"), ["-c", script, "bash", executable.path] + arguments)
    }

    /// Whether the command is a `switchboard` command that watches a lifeline when told
    /// (`up`, `kernel`, `serve`, `gateway`), run directly or through `ip netns exec`.
    private static func watchesLifeline(_ executable: URL, _ arguments: [String]) -> Bool {
        let command = [executable.path] + arguments
        guard let program = command.firstIndex(where: { URL(fileURLWithPath: $0).lastPathComponent == "switchboard" }),
              program + 1 < command.count else { return false }
        return ["up", "kernel", "serve", "gateway"].contains(command[program + 1])
    }

    public var isRunning: Bool { ended.value == nil }

    /// How it ended, as Foundation's `Process` says: the exit status, or the signal that ended
    /// it (nil while it runs).
    public var terminationStatus: Int32? { ended.value?.status }

    /// Sends `signal` to the process (while it runs: its pid is not another's then).
    public func signal(_ signal: Int32) {
        if isRunning { kill(pid, signal) }
    }

    /// Writes `text` to the process's standard input (its lifeline), for a child that reads
    /// commands there, such as `psql`.
    public func send(_ text: String) {
        Pipes.write(Array(text.utf8), to: lifeline)
    }

    /// Ends the process: SIGTERM, then SIGKILL after `grace` seconds; waits for it, boundedly.
    public func stop(grace: Double = 5) {
        guard isRunning else { return }
        kill(pid, SIGTERM)
        if !waitForEnd(within: grace) {
            kill(pid, SIGKILL)
            waitForEnd(within: 10)
        }
    }

    /// Blocks until the process has ended, or `seconds` have passed; whether it ended.
    @discardableResult
    private func waitForEnd(within seconds: Double) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while isRunning && Date() < deadline { usleep(10_000) }
        return !isRunning
    }

    /// Waits for the process to exit without blocking a thread of the cooperative pool;
    /// returns false if it is still running after `seconds`.
    @discardableResult
    public func exit(within seconds: Double) async -> Bool {
        (try? await ended.wait(within: seconds, "the process's end") { $0 != nil }) != nil
    }

    /// Everything the process wrote so far.
    public var outputSoFar: String { captured.value.text }

    /// Waits until the output holds `text` (failing after `seconds`, or when the process
    /// ends without writing it); returns the output so far.
    @discardableResult
    public func waitForOutput(containing text: String, within seconds: Double = 30) async throws -> String {
        try await waitForOutput("output containing \"\(text)\"", within: seconds) { $0.contains(text) }
    }

    /// Waits until `condition` holds of the output so far, asked again each time the process
    /// writes (failing after `seconds`, or when the process ends first); returns the output.
    @discardableResult
    public func waitForOutput(_ what: String, within seconds: Double = 30, where condition: @escaping @Sendable (String) -> Bool) async throws -> String {
        do {
            return try await captured.wait(within: seconds, what) { output in
                if condition(output.text) { return true }
                if output.closed { throw ChildProcessEnded(output: output.text) }
                return false
            }.text
        } catch let timedOut as TimedOut {
            throw TimedOut(what: "\(timedOut.what); so far:\n\(outputSoFar)")
        }
    }

    /// Everything the process wrote (call after it ended: waits up to 10 s for the pipe to close).
    public func readOutput() -> String {
        let deadline = Date().addingTimeInterval(10)
        while !captured.value.closed && Date() < deadline { usleep(5_000) }
        return outputSoFar
    }

    deinit {
        stop(grace: 1)
        close(lifeline)
    }
}

/// Pipes to and from the processes tests start.
enum Pipes {
    /// A pipe (``Spawn/pipe()``), once writes to a child that closed its end are errors.
    static func make() throws -> (read: Int32, write: Int32) {
        _ = ignoringBrokenPipes
        return try Spawn.pipe()
    }

    /// A write to a child that closed its end fails with EPIPE, rather than ending the test
    /// process with SIGPIPE (``Spawn`` puts SIGPIPE back to its default in the child).
    private static let ignoringBrokenPipes: Void = { signal(SIGPIPE, SIG_IGN) }()

    /// Reads `descriptor` to its end on a thread of its own, adding what comes to `output`,
    /// then closes it.
    static func read(_ descriptor: Int32, into output: Observed<CapturedOutput>) {
        let thread = Thread {
            read(descriptor) { bytes in output.update { $0.data.append(contentsOf: bytes) } }
            close(descriptor)
            output.update { $0.closed = true }
        }
        thread.name = "output-\(descriptor)"
        thread.start()
    }

    /// Reads `descriptor` to its end on this thread, handing each piece to `piece`.
    static func read(_ descriptor: Int32, _ piece: (ArraySlice<UInt8>) -> Void) {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = buffer.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { return }
            piece(buffer[..<count])
        }
    }

    /// Writes all of `bytes` to `descriptor`, or what its reader takes before it closes its end.
    static func write(_ bytes: [UInt8], to descriptor: Int32) {
        var rest = bytes[...]
        while !rest.isEmpty {
            let written = rest.withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress, $0.count) }
            if written < 0 && errno == EINTR { continue }
            guard written > 0 else { return }
            rest = rest.dropFirst(written)
        }
    }
}

extension ExitReason {
    /// As Foundation's `Process` reports it: the exit status, or the signal that ended it.
    var status: Int32 {
        switch self {
        case .exited(let status): status
        case .signalled(let signal): signal
        }
    }
}

/// What a child process wrote so far, and whether it closed its output.
struct CapturedOutput: Sendable {
    var data = Data()
    var closed = false
    var text: String { String(decoding: data, as: UTF8.self) }
}

/// The process ended before writing what a test waited for; `output` is what it wrote.
public struct ChildProcessEnded: Error, CustomStringConvertible {
    public let output: String
    public var description: String { "the process ended; its output:\n\(output)" }
}

/// The directory holding the built products (the test bundle's own directory).
public func productsDirectory() -> URL {
    URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
}

/// The built `switchboard` executable.
public func switchboardExecutable() -> URL {
    var directory = productsDirectory()
    // On Linux the test runner is `…/debug/SwitchboardPackageTests.xctest`.
    if directory.lastPathComponent.hasSuffix(".xctest") { directory.deleteLastPathComponent() }
    return directory.appendingPathComponent("switchboard")
}

/// The built `sb` executable.
public func sbExecutable() -> URL {
    switchboardExecutable().deletingLastPathComponent().appendingPathComponent("sb")
}

/// What a finished command printed and how it ended.
public struct CommandResult: Sendable, CustomStringConvertible {
    public let status: Int32
    public let stdout: String
    public let stderr: String
    public var description: String { "exit \(status)\nstdout: \(stdout)\nstderr: \(stderr)" }
}

/// The environment of a process a test starts: this process's with `environment` added. An
/// `sb` finds no CURVE keys unless `environment` says where (SB_KEY_DIR), so the `data/keys`
/// that `Scripts/run` leaves in the working directory never leaks into a test (an `sb` using
/// them cannot talk to a test's kernel without CURVE).
public func testProcessEnvironment(_ environment: [String: String]) -> [String: String] {
    ProcessInfo.processInfo.environment.merging(["SB_KEY_DIR": "/nonexistent/sb-test-keys"]) { $1 }.merging(environment) { $1 }
}

/// Runs `executable` to the end (killed after `seconds`), with `input` on its stdin and
/// ``testProcessEnvironment(_:)`` of `environment`; stdout and stderr are read as they come,
/// so a large output never blocks it.
public func runCommand(_ executable: URL, _ arguments: [String], environment: [String: String] = [:], input: Data? = nil,
                       in directory: URL? = nil, seconds: Double = 30) async throws -> CommandResult {
    let stdin = try Pipes.make(), stdout = try Pipes.make(), stderr = try Pipes.make()
    let pid: pid_t
    do {
        defer { for end in [stdin.read, stdout.write, stderr.write] { close(end) } }
        pid = try Spawn.start(executable.path, arguments, descriptors: [0: stdin.read, 1: stdout.write, 2: stderr.write],
                              environment: testProcessEnvironment(environment), directory: directory?.path)
    } catch {
        for end in [stdin.write, stdout.read, stderr.read] { close(end) }
        throw error
    }
    let outputs = [Observed(CapturedOutput()), Observed(CapturedOutput())]
    Pipes.read(stdout.read, into: outputs[0])
    Pipes.read(stderr.read, into: outputs[1])
    let ended = Observed<ExitReason?>(nil)
    Spawn.watch(pid) { reason in ended.update { $0 = reason } }
    // Written from a thread of its own: a large input must not wait on a pool thread for the
    // command to read it.
    let writer = Thread {
        if let input { Pipes.write([UInt8](input), to: stdin.write) }
        close(stdin.write)
    }
    writer.start()
    let reason: ExitReason
    do {
        reason = try await ended.wait(within: seconds, "\(executable.lastPathComponent) \(arguments.joined(separator: " "))") { $0 != nil }!
    } catch {
        kill(pid, SIGKILL)
        throw error
    }
    // What it wrote is all read once its output closes (a child it left running may hold it).
    for output in outputs { _ = try? await output.wait(within: 10, "the command's output to close") { $0.closed } }
    return CommandResult(status: reason.status, stdout: outputs[0].value.text, stderr: outputs[1].value.text)
}

/// Runs `executable arguments | head -n 1` in a shell, as a script takes the first line of a
/// command that follows something (`sb sub`), with `executable` ended by coreutils' `timeout`
/// after `seconds` should it outlive its reader. Its stdout is the line, then the pipeline's
/// two exit statuses: `141 0` when `executable` ended by SIGPIPE as its reader left, `124 0`
/// when `timeout` had to end it.
public func runFirstLine(_ executable: URL, _ arguments: [String], environment: [String: String] = [:], seconds: Int = 20) async throws -> CommandResult {
    try await runCommand(URL(fileURLWithPath: "/bin/bash"), ["-c", #"timeout "$0" "$@" | head -n 1; echo "${PIPESTATUS[@]}""#, "\(seconds)", executable.path] + arguments,
                         environment: environment, seconds: Double(seconds + 10))
}

/// Runs `executable` to its end on this thread, for quick tools (`ip`, `chattr`): its exit
/// status (or the signal that ended it) and what it wrote to stderr; its stdout is dropped.
public func runBriefly(_ executable: String, _ arguments: [String]) throws -> (status: Int32, errors: String) {
    let nothing = open("/dev/null", O_RDWR | O_CLOEXEC)
    guard nothing >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    defer { close(nothing) }
    let errors = try Pipes.make()
    let pid: pid_t
    do {
        defer { close(errors.write) }
        pid = try Spawn.start(executable, arguments, descriptors: [0: nothing, 1: nothing, 2: errors.write])
    } catch {
        close(errors.read)
        throw error
    }
    var written: [UInt8] = []
    Pipes.read(errors.read) { written += $0 }
    close(errors.read)
    var status: Int32 = 0
    while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
    return (ExitReason(waitStatus: status).status, String(decoding: written, as: UTF8.self))
}

/// `Tests/Interop/http_fixture_server.py` serving a folder on a free loopback port (the
/// fetcher's tests and benchmark use it as the datasets' remote source).
public final class FixtureHTTPServer: Sendable {
    public let process: ChildProcess
    public let port: Int
    public let folder: URL

    /// Starts the server at `script` over `folder` and waits for the port it prints.
    public static func start(script: URL, serving folder: URL) async throws -> FixtureHTTPServer {
        let process = try ChildProcess(URL(fileURLWithPath: "/usr/bin/python3"), ["-u", script.path, folder.path])
        let output = try await process.waitForOutput(containing: "\n", within: 10)
        let line = String(output.prefix { $0 != "\n" })
        guard line.hasPrefix("PORT "), let port = Int(line.dropFirst(5).trimmingCharacters(in: .whitespaces)) else {
            process.signal(SIGKILL)
            throw TimedOut(what: "a port from the HTTP server (it said: \(line))")
        }
        return FixtureHTTPServer(process: process, port: port, folder: folder)
    }

    private init(process: ChildProcess, port: Int, folder: URL) {
        self.process = process
        self.port = port
        self.folder = folder
    }

    public func url(_ path: String) -> URL { URL(string: "http://127.0.0.1:\(port)\(path)")! }

    /// Ends the server (SIGKILL: it holds nothing to clean up) and waits for it.
    public func stop() async {
        process.signal(SIGKILL)
        _ = await process.exit(within: 5)
    }
}

/// The resident memory of process `pid` in bytes (VmRSS in /proc), nil when it is gone.
public func residentBytes(of pid: Int32) -> Int? {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
    for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        let words = line.split(separator: " ")
        if words.count >= 2, let kilobytes = Int(words[1]) { return kilobytes * 1024 }
    }
    return nil
}

/// The JSON lines of an output (`sb --json`).
public func jsonLines(_ text: String) throws -> [JSONValue] {
    try text.split(separator: "\n").map { try JSONValue(parsing: Array($0.utf8)) }
}

/// Sends a `kernel` request body holding `batch` (each a request's JSON), then a `ping` (id 1),
/// on one connection to `broker`, speaking 7/MDP as any client; returns the responses of the
/// two replies in the order they came (the kernel reads a connection's messages in order, so
/// the ping is taken up only after the batch).
public func repliesToBatchThenPing(_ batch: [[UInt8]], broker: String) throws -> [[JSONRPCResponse]] {
    let dealer = try ZMQSocket(ZMQContext(), .dealer)
    defer { dealer.close() }
    try dealer.set(.linger, 0)
    try dealer.set(.receiveTimeout, 30_000)
    try dealer.connect(broker)
    try dealer.send([Frame(), Frame(MDP.clientHeader), Frame("kernel"), Frame(JSONRPC.batchReply(batch)!)])
    try dealer.send([Frame(), Frame(MDP.clientHeader), Frame("kernel"), Frame(JSONRPCRequest(id: .number(1), method: "ping").jsonBytes)])
    return try (0..<2).map { _ in try JSONRPC.parseResponses(try MDP.decodeAtClient(try dealer.receive()).body[0].bytes) }
}
