#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// The files (descriptors) a process holds, and how many it may: every client, worker,
/// kernel link, HTTP caller and database connection takes one. At the limit a listener
/// accepts no connection, and its event loop may retry the accept at once, again and again
/// (libzmq does, in silence, at a whole core). So every switchboard process raises its limit
/// as it starts (``raiseSoftLimit()``), the kernel says when it comes near it (``Watch``)
/// and how near it is (`kernel stats`, `/metrics`) and ends the connections it accepts into
/// its last files (``isInReserve``), and the gateway holds fewer HTTP connections than it
/// may open files.
public enum OpenFiles {
    /// Below this limit a process is told it may run out of connections.
    public static let fewFiles = 4_096

    /// Linux (and systemd) start a process with a soft limit of 1,024 under a hard limit
    /// that is usually far higher. As Go's runtime does, this raises the soft limit to the
    /// hard one (nothing in a switchboard process waits with `select`, which stops at
    /// 1,024). Returns why it could not, if it could not.
    public static func raiseSoftLimit() -> String? {
        var limit = rlimit()
        guard getrlimit(resource, &limit) == 0 else { return "getrlimit: \(String(cString: strerror(errno)))" }
        guard limit.rlim_cur < limit.rlim_max else { return nil }
        let soft = limit.rlim_cur
        limit.rlim_cur = limit.rlim_max
        guard setrlimit(resource, &limit) == 0 else { return "from \(soft) to \(limit.rlim_max): \(String(cString: strerror(errno)))" }
        return nil
    }

    /// How many files this process may hold open (the soft limit); nil if unlimited.
    public static var limit: Int? {
        var limit = rlimit()
        guard getrlimit(resource, &limit) == 0, limit.rlim_cur != rlim_t.max else { return nil }
        return Int(clamping: limit.rlim_cur)
    }

    /// How many files this process holds open. Linux 6.2 and later give it as the size of
    /// `/proc/self/fd`, at no cost; older ones only by listing that directory, which takes
    /// milliseconds at ten thousand files on the caller's thread (the kernel's loop): a count
    /// listed is kept for ten seconds, so that figures sampled each second cost no more than
    /// that. nil where there is no such directory, or when no file is left to list it.
    public static var count: Int? {
        if let stated = statedCount { return stated }
        let now = monotonicNanoseconds()
        return listed.withLock { listed in
            if let last = listed, now - last.at < 10_000_000_000 { return last.count }
            guard let count = listedCount() else { return nil }
            listed = (count, now)
            return count
        }
    }

    /// The last count listed, and when.
    private static let listed = Mutex<(count: Int, at: UInt64)?>(nil)

    /// The entries of `/proc/self/fd`, less the one listing them.
    static func listedCount() -> Int? {
        guard let directory = opendir("/proc/self/fd") else { return nil }
        defer { closedir(directory) }
        var entries = 0
        while let entry = readdir(directory) {
            if entry.pointee.d_name.0 != UInt8(ascii: ".") { entries += 1 }
        }
        return entries - 1
    }

    /// The files a listener leaves free for what the process opens itself (a link it makes, a
    /// socket, a log): the last twentieth of the limit, at least 16.
    public static func reserve(of limit: Int) -> Int { max(16, limit / 20) }

    /// Whether the process now holds files into its reserve (``reserve(of:)``): a connection
    /// just accepted then is ended (``AcceptedConnection/end()``), so the listener never
    /// reaches the limit, where its accept would fail and be tried again at once, forever.
    /// Asked once per connection accepted, so it counts only where that costs a `stat`;
    /// elsewhere it looks at the lowest free descriptor, which may be one a connection just
    /// closed, below others still open, and then lets a few more in.
    public static var isInReserve: Bool {
        guard let limit else { return false }
        let reserveStarts = limit - reserve(of: limit)
        if let open = statedCount { return open >= reserveStarts }
        guard let lowest = lowestFree else { return true }
        return lowest >= reserveStarts
    }

    /// How many files this process holds open, where the system says it at no cost (the size
    /// of `/proc/self/fd`, Linux 6.2 and later).
    private static var statedCount: Int? {
        var info = stat()
        guard stat("/proc/self/fd", &info) == 0, info.st_size > 0 else { return nil }
        return Int(info.st_size)
    }

    /// The lowest descriptor free now, which is the one Linux hands out next: every lower one
    /// is open. Costs an open and a close whatever the count. nil at the limit (none free).
    static var lowestFree: Int? {
        let probe = open("/dev/null", O_RDONLY | O_CLOEXEC)
        guard probe >= 0 else { return nil }
        close(probe)
        return Int(probe)
    }

    private static let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)

    /// Notices when the process comes near its limit, and when it has room again, once each.
    /// Asked often (each second, on the kernel's loop), so for nearing it looks only at the
    /// lowest free descriptor: it nears the limit only when the files below it are all open,
    /// which is what running out is. For room it counts: files closed leave free descriptors
    /// below open ones, so a low free one alone is no sign of room.
    public struct Watch {
        /// The share of the limit at which the process is near it, and the lower share it must
        /// fall under before it is told that again (so a count that hovers says it once).
        static let near = 0.9, clear = 0.75
        public enum Change: Equatable {
            /// At least `open` files are open (nil: all) of the `limit`.
            case near(open: Int?, limit: Int)
            /// `open` files are open, of the `limit`.
            case room(open: Int, limit: Int)
        }
        private(set) var isNear = false

        public init() {}

        /// A connection was ended for want of files (``OpenFiles/isInReserve``): near the
        /// limit, if that was not said yet. (Ending connections keeps the count under the
        /// share at which ``check()`` would say it, on a small limit.)
        public mutating func endedConnection() -> Change? {
            guard !isNear, let limit = OpenFiles.limit else { return nil }
            isNear = true
            return .near(open: OpenFiles.count, limit: limit)
        }

        /// What changed since the last check, if anything.
        public mutating func check() -> Change? {
            guard let limit = OpenFiles.limit else { return nil }
            let lowest = OpenFiles.lowestFree
            if !isNear, lowest.map({ Double($0) >= Double(limit) * Self.near }) ?? true {
                isNear = true
                return .near(open: lowest, limit: limit)
            } else if isNear, let open = OpenFiles.count ?? lowest, Double(open) < Double(limit) * Self.clear {
                isNear = false
                return .room(open: open, limit: limit)
            }
            return nil
        }
    }
}
