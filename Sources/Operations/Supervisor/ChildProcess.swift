import CSpawn
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// How a child process ended.
public enum ExitReason: Sendable, Equatable, CustomStringConvertible {
    case exited(Int32)
    case signalled(Int32)

    public init(waitStatus status: Int32) {
        // WIFEXITED / WEXITSTATUS / WTERMSIG, which Swift does not import as macros.
        let signal = status & 0x7f
        self = signal == 0 ? .exited((status >> 8) & 0xff) : .signalled(signal)
    }

    public var description: String {
        switch self {
        case .exited(let status): "exited with status \(status)"
        case .signalled(let signal): "was killed by signal \(signal)\(signal == SIGKILL ? " (SIGKILL)" : signal == SIGSEGV ? " (SIGSEGV)" : "")"
        }
    }
}

/// Starts child processes for the supervisor.
///
/// Each child gets its own process group, so a Ctrl-C in the terminal reaches the
/// supervisor alone, which then stops the children in order. Each child also inherits the
/// read end of a "lifeline" pipe as fd 3 whose write end only the supervisor holds: if the
/// supervisor dies, even by SIGKILL, the children read end-of-file there and shut down.
final class ProcessLauncher: @unchecked Sendable {
    /// The fd number the lifeline has in every child.
    static let lifelineFD: Int32 = 3
    private let lifelineRead: Int32
    private let lifelineWrite: Int32

    init() throws {
        // Children get the read end as fd 3.
        (lifelineRead, lifelineWrite) = try Spawn.pipe()
    }

    /// Starts `executable` with `arguments`; stdout and stderr are the supervisor's.
    func spawn(_ executable: String, _ arguments: [String]) throws -> pid_t {
        try Spawn.start(executable, arguments, descriptors: [0: 0, 1: 1, 2: 2, Self.lifelineFD: lifelineRead], ownProcessGroup: true)
    }
}

/// Starting programs, for the supervisor and for tests: `posix_spawn`, so nothing of this
/// process runs in the child between fork and exec, and only the descriptors named reach it.
public enum Spawn {
    /// A pipe whose ends are closed on exec: a child gets an end only as a descriptor named
    /// to ``start(_:_:descriptors:environment:directory:ownProcessGroup:)``.
    public static func pipe() throws -> (read: Int32, write: Int32) {
        var ends: [Int32] = [0, 0]
        guard Glibc.pipe(&ends) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        return (ends[0], ends[1])
    }

    /// Starts `executable` with `arguments` and returns its pid. `descriptors` gives each of the
    /// child's descriptors the one of this process it is (child's: this process's); every other
    /// descriptor is closed in the child, whether or not it was marked close-on-exec, so no
    /// pipe's end or socket leaks into it. (This process's descriptors named are 3 or above, or
    /// each the child's of the same number: they are set in the order of the child's.)
    /// The child has no signal blocked and SIGINT, SIGTERM, SIGPIPE and SIGHUP at their
    /// defaults, whatever the starting thread had (the threads Swift concurrency runs on block
    /// nearly every signal); `ownProcessGroup`: a process group of its own, so a Ctrl-C in the
    /// terminal does not reach it. `environment` nil: this process's; `directory` nil: this
    /// process's.
    public static func start(_ executable: String, _ arguments: [String], descriptors: [Int32: Int32], environment: [String: String]? = nil,
                             directory: String? = nil, ownProcessGroup: Bool = false) throws -> Int32 {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for (child, parent) in descriptors.sorted(by: { $0.key < $1.key }) {
            posix_spawn_file_actions_adddup2(&actions, parent, child)
        }
        sb_spawn_file_actions_addclosefrom(&actions, (descriptors.keys.max() ?? -1) + 1)
        if let directory { sb_spawn_file_actions_addchdir(&actions, directory) }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGINT, SIGTERM, SIGPIPE, SIGHUP] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF
        if ownProcessGroup {
            posix_spawnattr_setpgroup(&attributes, 0)
            flags |= POSIX_SPAWN_SETPGROUP
        }
        posix_spawnattr_setflags(&attributes, Int16(flags))

        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        let environmentStrings = environment.map { $0.map { strdup("\($0.key)=\($0.value)") } + [nil] }
        defer { for pointer in environmentStrings ?? [] { free(pointer) } }
        var pid: pid_t = 0
        let status = environmentStrings.map { strings in posix_spawn(&pid, executable, &actions, &attributes, argv, strings) }
            ?? posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
        guard status == 0 else { throw POSIXError(POSIXErrorCode(rawValue: status) ?? .EIO) }
        return pid
    }

    /// Calls `onExit` (on a thread of its own) when `pid` ends, having reaped it.
    public static func watch(_ pid: Int32, onExit: @escaping @Sendable (ExitReason) -> Void) {
        let thread = Thread {
            var status: Int32 = 0
            while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
            onExit(ExitReason(waitStatus: status))
        }
        thread.name = "wait-\(pid)"
        thread.start()
    }
}

/// The child's side of the lifeline: when the supervisor is gone (end-of-file on fd 3),
/// the process sends itself SIGTERM and shuts down as if told to.
public enum Lifeline {
    public static func watch(fd: Int32) {
        let thread = Thread {
            var byte: UInt8 = 0
            while true {
                let count = read(fd, &byte, 1)
                if count == 0 || (count < 0 && errno != EINTR) { break }
            }
            kill(getpid(), SIGTERM)
        }
        thread.name = "lifeline"
        thread.start()
    }
}
