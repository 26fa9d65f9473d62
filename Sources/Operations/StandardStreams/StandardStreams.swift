#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// What the bus's programs (`switchboard`, `sb`) do with stdin, stdout and stderr, so that
/// output that did not reach its reader is never taken for output that did: a script that
/// reads `switchboard keygen` or `sb kv ls` into a file on a full disk learns it from the exit
/// status (74, sysexits' EX_IOERR) and a line on stderr, not from a missing key later.
public enum StandardStreams {
    /// The exit status of a program whose output could not be written.
    public static let outputFailedStatus: Int32 = 74

    /// Called first in `main`. A closed stdin, stdout or stderr (`sb ping >&-`) is given
    /// /dev/null, read-only, before anything else opens a file: otherwise the first socket
    /// the program opened would take its number, and what it printed would go into that
    /// socket. Output to it then fails as it would to a closed one. And what went through
    /// stdio's buffer (`print`, the argument parser's `--help`) is checked at exit.
    public static func guardAtStart() {
        for descriptor in [STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO] where fcntl(descriptor, F_GETFD) == -1 {
            let held = open("/dev/null", O_RDONLY)
            if held >= 0, held != descriptor {
                dup2(held, descriptor)
                close(held)
            }
        }
        atexit {
            // Each write to a stream that fails fails again, so the last flush tells.
            if fflush(nil) != 0 { StandardStreams.outputFailed() }
        }
    }

    /// Writes `text` to stdout whole, without stdio's buffer (a line is out when this
    /// returns); when it cannot be written (a full disk, a closed stdout, a pipe whose reader
    /// left while SIGPIPE is ignored, as under systemd) the program ends with
    /// ``outputFailedStatus`` and the reason on stderr.
    public static func write(_ text: String) {
        guard writeAll(text, to: STDOUT_FILENO) else { outputFailed() }
    }

    /// Writes `text` to stdout if it can: for what a program that keeps running says of itself
    /// (`switchboard up`'s banner), which must not end the bus it started when it cannot.
    public static func writeIfPossible(_ text: String) {
        _ = writeAll(text, to: STDOUT_FILENO)
    }

    /// Writes `text` to stderr; if that fails there is nowhere left to say so.
    public static func writeError(_ text: String) {
        _ = writeAll(text, to: STDERR_FILENO)
    }

    /// For a program that follows something (`sb sub`, `sb kv watch`, `sb stream sub`): once
    /// the reader of stdout has gone (`sb sub /pricing/ | head -n 1`), end at once as the next
    /// write would (by SIGPIPE, or where it is ignored with the broken pipe said and
    /// ``outputFailedStatus``), rather than wait for a next line that may never come while the
    /// pipeline, and the script waiting on it, stays open. As `tail -f` does: only a pipe or a
    /// socket can lose its reader, and poll(2) says so (POLLERR or POLLHUP) without writing.
    public static func endWhenOutputReaderLeaves() {
        var status = stat()
        guard fstat(STDOUT_FILENO, &status) == 0, [S_IFIFO, S_IFSOCK].contains(status.st_mode & S_IFMT) else { return }
        Thread.detachNewThread {
            var stdout = pollfd(fd: STDOUT_FILENO, events: 0, revents: 0)
            while true {
                let ready = poll(&stdout, 1, -1)
                if ready > 0, stdout.revents & Int16(POLLERR | POLLHUP) != 0 { break }
                if ready < 0, errno != EINTR { return }
            }
            raise(SIGPIPE)
            errno = EPIPE
            outputFailed()
        }
    }

    private static func outputFailed() -> Never {
        let reason = String(cString: strerror(errno))
        writeError("\(ProcessInfo.processInfo.processName): cannot write to standard output: \(reason)\n")
        _exit(outputFailedStatus)
    }

    /// Writes all of `text` to `descriptor`, again after a signal or a short write; false
    /// (with errno set) when it cannot.
    private static func writeAll(_ text: String, to descriptor: Int32) -> Bool {
        var text = text
        return text.withUTF8 { bytes in
            var offset = 0
            while offset < bytes.count {
                let written = Glibc.write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
                if written < 0, errno == EINTR { continue }
                guard written >= 0 else { return false }
                offset += written
            }
            return true
        }
    }
}
