import Foundation
import SwitchboardTestSupport
import Testing

/// `Scripts/test` runs two test processes at once: a port one of them handed out (and may
/// hold unbound for a moment, restarting a kernel on it) must not be handed out by the other.
@Suite("Free ports")
struct FreePortTests {
    @Test("a port another test process handed out is not handed out here, though nothing is bound to it")
    func apartAcrossProcesses() async throws {
        // Another process holds every port of a stretch but a few, as a test process that
        // handed them out would. Only a stretch: the tests running beside this one (in this
        // process or the other line of tests) need ports meanwhile, and would find none.
        let stretch = freePortsFrom..<(freePortsFrom + 1_000)
        let allowed = Set((0..<40).map { _ in Int.random(in: stretch) })
        let holder = """
            import fcntl, os, sys
            fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
            allowed = set(int(p) for p in sys.argv[2].split(","))
            for port in range(\(stretch.lowerBound), \(stretch.upperBound)):
                if port in allowed: continue
                try: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
                except OSError: pass  # held already: by this test's process, or another's
            print("held", flush=True)
            sys.stdin.read()
            """
        let other = try ChildProcess(URL(fileURLWithPath: "/usr/bin/env"),
                                     ["python3", "-c", holder, PortsHandedOut.lockPath, allowed.map(String.init).joined(separator: ",")])
        defer { other.stop() }
        try await other.waitForOutput(containing: "held", within: 30)
        // Bounded by tries, not by a deadline (a loop that never waits cannot be cut short):
        // about 25 at random find one of 40 ports in 1,000.
        let ports = (0..<5).map { _ in freePort(in: stretch, attempts: 20_000) }
        #expect(ports.allSatisfy { $0.map(allowed.contains) == true }, "\(ports) handed out, not among \(allowed.sorted())")
    }
}
