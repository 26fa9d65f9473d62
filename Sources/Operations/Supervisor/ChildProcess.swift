import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// How a child process ended.
public enum ExitReason: Sendable, Equatable, CustomStringConvertible {
    case exited(Int32)
    case signalled(Int32)

    init(waitStatus status: Int32) {
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
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        // Neither end leaks into children as is: they get the read end as a dup2'd fd 3.
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        lifelineRead = fds[0]
        lifelineWrite = fds[1]
    }

    /// Starts `executable` with `arguments`; stdout and stderr are the supervisor's.
    func spawn(_ executable: String, _ arguments: [String]) throws -> pid_t {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, lifelineRead, Self.lifelineFD)

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        posix_spawnattr_setpgroup(&attributes, 0)
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGINT, SIGTERM, SIGPIPE, SIGHUP] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var pid: pid_t = 0
        let status = posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
        guard status == 0 else { throw POSIXError(POSIXErrorCode(rawValue: status) ?? .EIO) }
        return pid
    }

    /// Calls `onExit` (on a thread of its own) when `pid` ends, having reaped it.
    func watch(_ pid: pid_t, onExit: @escaping @Sendable (ExitReason) -> Void) {
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
