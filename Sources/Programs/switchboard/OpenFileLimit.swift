#if canImport(Glibc)
import Glibc
#endif
import Logging

/// How many files a process may open bounds the connections it holds: every client, worker,
/// kernel link, HTTP caller and database connection is a file descriptor. Linux (and
/// systemd) start a process with a soft limit of 1,024 under a hard limit that is usually far
/// higher; at the soft limit the kernel can accept no client (libzmq retries the accept in
/// silence) and the gateway no browser. As Go's runtime does, every switchboard process
/// raises its soft limit to the hard one as it starts (nothing in it waits with `select`,
/// which stops at 1,024), and says so when the hard limit itself leaves little room.
enum OpenFileLimit {
    /// Below this hard limit a process is told it may run out of connections.
    static let fewFiles: rlim_t = 4_096

    /// Raises the soft limit on open files to the hard one.
    static func raise(logger: Logger) {
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        var limit = rlimit()
        guard getrlimit(resource, &limit) == 0 else { return }
        if limit.rlim_cur < limit.rlim_max {
            let soft = limit.rlim_cur
            limit.rlim_cur = limit.rlim_max
            if setrlimit(resource, &limit) != 0 {
                logger.warning("could not raise the limit on open files from \(soft) to \(limit.rlim_max): \(String(cString: strerror(errno))); each connection takes one")
                limit.rlim_cur = soft
            }
        }
        if limit.rlim_cur < fewFiles {
            logger.warning("this process may open at most \(limit.rlim_cur) files, and each connection (client, worker, HTTP caller) takes one: raise the hard limit (LimitNOFILE= in a systemd unit, ulimit -Hn) to hold more")
        }
    }
}
