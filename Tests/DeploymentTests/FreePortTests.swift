import Foundation
import SwitchboardTestSupport
import Testing

/// `Scripts/test` runs two test processes at once: a port one of them handed out (and may
/// hold unbound for a moment, restarting a kernel on it) must not be handed out by the other.
@Suite("Free ports")
struct FreePortTests {
    @Test("a port another test process handed out is not handed out here, though nothing is bound to it")
    func apartAcrossProcesses() async throws {
        // Another process holds every port but a few, as a test process that handed them out would.
        let allowed = Set((0..<40).map { _ in Int.random(in: 10_000..<20_000) })
        let holder = """
            import fcntl, os, sys
            fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
            allowed = set(int(p) for p in sys.argv[2].split(","))
            for port in range(10000, 65536):
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
        // Bounded: were the other's ports never free here, its end (the defer) frees them.
        let ports = try await within(30, "ports the other process does not hold") { (0..<5).map { _ in freePort() } }
        #expect(ports.allSatisfy(allowed.contains), "\(ports) handed out, not among \(allowed.sorted())")
    }
}
