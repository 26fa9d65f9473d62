import Foundation
import SwitchboardTestSupport
import Testing

/// The processes tests start get only the descriptors given them, however many the test
/// process has open (a pipe's end that leaked into a long-lived child would keep a reader from
/// ever seeing its end).
@Suite("Child processes")
struct ChildProcessTests {
    @Test("a child process and a command get only stdin, stdout and stderr, with over a thousand descriptors open in the test process; their exit status is reported")
    func onlyTheirOwnDescriptors() async throws {
        // Over a thousand open: starting a process must not depend on how many this one has.
        var limit = rlimit()
        getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        if limit.rlim_cur < 2_048, limit.rlim_max >= 2_048 {
            limit.rlim_cur = 2_048
            setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        }
        let extra = (0..<min(1_100, Int(limit.rlim_cur) - 400)).map { _ in open("/dev/null", O_RDONLY) }
        defer { for descriptor in extra where descriptor >= 0 { close(descriptor) } }
        #expect(extra.allSatisfy { $0 >= 0 })

        // `ls` lists its own descriptors: the three it was given and the one it reads the list with.
        let listing = try ChildProcess(URL(fileURLWithPath: "/bin/ls"), ["/proc/self/fd"])
        defer { listing.stop() }
        #expect(await listing.exit(within: 30))
        #expect(Set(listing.readOutput().split(separator: "\n")) == ["0", "1", "2", "3"], "\(listing.outputSoFar)")
        #expect(listing.terminationStatus == 0)

        let command = try await runCommand(URL(fileURLWithPath: "/bin/sh"), ["-c", "ls /proc/self/fd; exit 3"])
        #expect(Set(command.stdout.split(separator: "\n")) == ["0", "1", "2", "3"], "\(command)")
        #expect(command.status == 3)
    }

    @Test("a child process and a command are told no key folder (SB_KEY_DIR) unless the test names one: an sb a test starts never uses the data/keys that Scripts/run leaves in the working directory")
    func noKeyFolderOfTheDeveloper() async throws {
        let child = try ChildProcess(URL(fileURLWithPath: "/usr/bin/env"), [])
        defer { child.stop() }
        #expect(await child.exit(within: 30))
        #expect(child.readOutput().split(separator: "\n").contains("SB_KEY_DIR=/nonexistent/sb-test-keys"), "\(child.outputSoFar)")
        let named = try await runCommand(URL(fileURLWithPath: "/usr/bin/env"), [], environment: ["SB_KEY_DIR": "/tmp/keys"])
        #expect(named.stdout.split(separator: "\n").contains("SB_KEY_DIR=/tmp/keys"), "\(named)")
    }

    @Test("input for a command that ends without reading it is dropped: the test process goes on")
    func inputNotRead() async throws {
        let result = try await runCommand(URL(fileURLWithPath: "/bin/true"), [], input: Data(repeating: 120, count: 1_048_576))
        #expect(result.status == 0)
        let reader = try ChildProcess(URL(fileURLWithPath: "/bin/true"), [])
        defer { reader.stop() }
        #expect(await reader.exit(within: 30))
        reader.send(String(repeating: "x", count: 1_048_576))
    }
}
