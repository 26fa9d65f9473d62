import BusKit
import BusProtocol
import Foundation
import SwitchboardTestSupport
import Testing

/// Two "machines" for a kernel pair: network namespaces joined by two veth pairs, one the
/// network clients and services use, one the link between the kernels (the Guide's Binary
/// Star setup), so that the kernels' link can be cut alone.
private struct PairHosts {
    let hosts: [String]
    /// Each host's address on the clients' network and on the kernels' link.
    let serviceAddresses: [String]
    let linkAddresses: [String]
    let serviceDevices: [String]
    let linkDevices: [String]

    static func make() throws -> PairHosts {
        let tag = String(UInt32.random(in: 0..<UInt32.max), radix: 36)
        let subnet = "10.\(Int.random(in: 200...250))"
        let third = Int.random(in: 1...120)
        let pair = PairHosts(hosts: ["sbpa-\(tag)", "sbpb-\(tag)"],
                             serviceAddresses: ["\(subnet).\(third).1", "\(subnet).\(third).2"],
                             linkAddresses: ["\(subnet).\(third + 120).1", "\(subnet).\(third + 120).2"],
                             serviceDevices: ["ps0-\(tag)", "ps1-\(tag)"], linkDevices: ["pl0-\(tag)", "pl1-\(tag)"])
        do {
            for host in pair.hosts { try NetworkNamespaces.ip(["netns", "add", host]) }
            for (devices, addresses) in [(pair.serviceDevices, pair.serviceAddresses), (pair.linkDevices, pair.linkAddresses)] {
                try NetworkNamespaces.addLink(devices[0], peer: devices[1])
                for side in 0..<2 {
                    try NetworkNamespaces.ip(["link", "set", devices[side], "netns", pair.hosts[side]])
                    try NetworkNamespaces.ip(["-n", pair.hosts[side], "addr", "add", "\(addresses[side])/24", "dev", devices[side]])
                    try NetworkNamespaces.ip(["-n", pair.hosts[side], "link", "set", devices[side], "up"])
                }
            }
            for host in pair.hosts { try NetworkNamespaces.ip(["-n", host, "link", "set", "lo", "up"]) }
        } catch {
            pair.remove()
            throw error
        }
        return pair
    }

    /// Cuts (or restores) the link between the kernels, on the second host's side.
    func setKernelLink(up: Bool) throws {
        try NetworkNamespaces.ip(["-n", hosts[1], "link", "set", linkDevices[1], up ? "up" : "down"])
    }

    /// Takes host `side` off the clients' network (or puts it back): its kernel stays
    /// reachable on its own host and over the link between the kernels.
    func setServiceLink(_ side: Int, up: Bool) throws {
        try NetworkNamespaces.ip(["-n", hosts[side], "link", "set", serviceDevices[side], up ? "up" : "down"])
    }

    /// Takes host `side` off both networks, as a machine that is gone.
    func disconnect(_ side: Int) throws {
        for device in [serviceDevices[side], linkDevices[side]] {
            try NetworkNamespaces.ip(["-n", hosts[side], "link", "set", device, "down"])
        }
    }

    /// Host `side` sends on the clients' network at `rate` (as tc writes it: 2mbit) at most.
    func limitLink(_ side: Int, rate: String) throws {
        try NetworkNamespaces.tc(["-n", hosts[side], "qdisc", "add", "dev", serviceDevices[side], "root", "tbf", "rate", rate,
                                  "burst", "32kbit", "latency", "30s"])
    }

    /// Host `side`'s kernel sends its peer at `rate` at most, in a class of its own on the
    /// kernels' link: its acknowledgements of what the peer sends are not queued behind that
    /// data, as on a link with fair queueing (a single queue would hold them there, and the
    /// peer's TCP, hearing no acknowledgement, would hold back its heartbeats).
    func limitKernelData(_ side: Int, rate: String) throws {
        try NetworkNamespaces.limit(["match", "ip", "dst", "\(linkAddresses[1 - side])/32", "match", "ip", "dport", "5560", "0xffff"],
                                    on: linkDevices[side], in: hosts[side], rate: rate)
    }

    func remove() {
        for host in hosts { _ = try? NetworkNamespaces.ip(["netns", "del", host]) }
    }

    func broker(_ side: Int) -> String { "tcp://\(serviceAddresses[side]):5555" }

    /// A kernel pair configuration for `side` (0: primary, 1: backup), CURVE on with the
    /// keys in `keys` (both kernels hold the same key pair).
    func configuration(_ side: Int, keys: String) -> String {
        let address = serviceAddresses[side]
        return """
            kernel:
              broker: tcp://\(address):5555
              snapshot: tcp://\(address):5556
              publisher: tcp://\(address):5557
              collector: tcp://\(address):5558
              heartbeat_ms: 200
              liveness: 5
            pair:
              role: \(side == 0 ? "primary" : "backup")
              listen: tcp://\(linkAddresses[side]):5560
              peer: tcp://\(linkAddresses[1 - side]):5560
              peer_broker: \(broker(1 - side))
              heartbeat_ms: 200
            security:
              curve: true
              keys_dir: \(keys)
            """
    }

    /// A test's temporary folder named `name`, with a key folder in it holding the key pairs
    /// `names` (the kernels' among them), for ``startKernels(in:keys:)`` and `sb`.
    static func testFolder(_ name: String, keys names: [String]) throws -> (folder: URL, keys: KeyFolder) {
        let folder = try temporaryDirectory(name)
        let keys = busKeyFolder(in: folder)
        _ = try keys.create(names)
        return (folder, keys)
    }

    /// Both kernels, each with its configuration written to `folder` as `sideN.yaml`.
    func startKernels(in folder: URL, keys: String) throws -> [ChildProcess] {
        var kernels: [ChildProcess] = []
        for side in 0..<2 {
            let config = self.config(side, in: folder)
            try configuration(side, keys: keys).write(to: config, atomically: true, encoding: .utf8)
            do {
                kernels.append(try start(on: side, ["kernel", "--config", config.path]))
            } catch {
                for kernel in kernels { kernel.stop() }
                throw error
            }
        }
        return kernels
    }

    /// Where ``startKernels(in:keys:)`` wrote side `side`'s configuration.
    func config(_ side: Int, in folder: URL) -> URL { folder.appendingPathComponent("side\(side).yaml") }

    /// Both kernels and an echo on the second host registered with both (one connection
    /// each), once the backup holds the whole state.
    func startPairWithEcho(in folder: URL, keys: String) async throws -> (kernels: [ChildProcess], echo: ChildProcess) {
        let kernels = try startKernels(in: folder, keys: keys)
        do {
            let echo = try start(on: 1, ["serve", "echo", "--config", config(1, in: folder).path, "--connections", "1"])
            do {
                try await kernels[0].waitForOutput(containing: "the passive peer holds every change", within: 60)
                try await kernels[0].waitForOutput(containing: "worker registered", within: 60)
                return (kernels, echo)
            } catch {
                echo.stop()
                throw error
            }
        } catch {
            for kernel in kernels { kernel.stop() }
            throw error
        }
    }

    /// `sb` on the second host reading a reply in parts from the pair (a part every 5 s, at
    /// most 60 s of silence), once its first part is in.
    func readerOfParts(keys: String) async throws -> ChildProcess {
        let reader = try NetworkNamespaces.start(in: hosts[1], sbExecutable(), [
            "request", "echo", "numbers", #"{"n":3,"everyMs":5000}"#, "--stream", "--endpoint", broker(0) + "," + broker(1),
            "--timeout", "60s", "--key-dir", keys,
        ])
        do {
            try await reader.waitForOutput(containing: #"{"part":1}"#, within: 30)
        } catch {
            reader.stop()
            throw error
        }
        return reader
    }

    func start(on side: Int, _ arguments: [String]) throws -> ChildProcess {
        try NetworkNamespaces.start(in: hosts[side], switchboardExecutable(), arguments)
    }

    func sb(on side: Int, keys: String, _ arguments: [String]) async throws -> CommandResult {
        try await NetworkNamespaces.run(in: hosts[side], sbExecutable(), arguments, environment: ["SB_KEY_DIR": keys])
    }
}

@Suite("Kernel pair split: only the link between the kernels is cut")
struct PairSplitTests {
    @Test("never two active kernels (CURVE on every link): clients on both hosts are served by the active one, one that asks only the passive one gets a clear error; healed, the passive one copies what it missed and can take over with it",
          .enabled(if: NetworkNamespaces.available, "skipped: needs root, iproute2 and network namespaces (ip netns add failed)"))
    func kernelLinkCut() async throws {
        let hosts = try PairHosts.make()
        defer { hosts.remove() }
        let (folder, keys) = try PairHosts.testFolder("pair-split", keys: [KeyFolder.kernel, "echo", KeyFolder.client])
        @Sendable func sb(on side: Int, _ arguments: [String]) async throws -> CommandResult {
            try await hosts.sb(on: side, keys: keys.path, arguments)
        }
        let kernels = try hosts.startKernels(in: folder, keys: keys.path)
        var services: [ChildProcess] = []
        defer { for process in services + kernels { process.stop() } }
        for side in 0..<2 {
            services.append(try hosts.start(on: side, ["serve", "echo", "--config", hosts.config(side, in: folder).path, "--instance", "echo-\(side)"]))
        }
        let both = hosts.broker(0) + "," + hosts.broker(1), backupFirst = hosts.broker(1) + "," + hosts.broker(0)
        @Sendable func stateSequence(_ side: Int) async throws -> JSONValue? {
            let result = try await sb(on: side, ["request", "kernel", "stats", "--endpoint", hosts.broker(side), "--timeout", "1s", "--json"])
            return try JSONValue(parsing: Array(result.stdout.utf8))["state"]?["sequence"]
        }
        @Sendable func pairState(_ side: Int, from host: Int) async throws -> JSONValue? {
            let result = try await sb(on: host, ["request", "kernel", "ping", "--endpoint", hosts.broker(side), "--timeout", "1s", "--json"])
            return try JSONValue(parsing: Array(result.stdout.utf8))["pair"]
        }
        try await eventually(30, "the primary active, the backup passive with the whole state, echo registered") {
            let primary = try await pairState(0, from: 1), backup = try await pairState(1, from: 0)
            let echo = try await sb(on: 1, ["request", "echo", "whoami", "--endpoint", both, "--timeout", "1s"])
            return primary?["state"] == "active" && backup?["state"] == "passive" && backup?["synced"] == true && echo.status == 0
        }

        try hosts.setKernelLink(up: false)
        try await eventually(10, "the backup no longer hears the primary") {
            ((try await pairState(1, from: 1))?["peer"]?["lastHeardSecondsAgo"]?.doubleValue ?? 0) > 1
        }
        // Clients on both hosts, the one on the backup's host asking the backup first.
        let fromA = try await sb(on: 0, ["request", "echo", "echo", #"{"from":"a"}"#, "--endpoint", both, "--timeout", "3s"])
        #expect(fromA.status == 0, "\(fromA)")
        let fromB = try await sb(on: 1, ["request", "echo", "echo", #"{"from":"b"}"#, "--endpoint", backupFirst, "--timeout", "3s"])
        #expect(fromB.status == 0, "\(fromB)")
        let written = try await sb(on: 1, ["pub", "/client/split/during", #""cut""#, "--endpoint", backupFirst, "--timeout", "3s"])
        #expect(written.status == 0, "\(written)")
        // Asked alone, the passive one refuses with the reason rather than become a second active one.
        let onlyB = try await sb(on: 1, ["request", "echo", "echo", "{}", "--endpoint", hosts.broker(1), "--timeout", "2s"])
        #expect(onlyB.status == 69 && onlyB.stderr.contains("two active kernels"), "\(onlyB)")
        for host in 0..<2 {
            #expect(try await pairState(0, from: host)?["state"] == "active")
            #expect(try await pairState(1, from: host)?["state"] == "passive")
        }

        // Healed: the backup copies what it missed; then the primary goes, and the backup
        // takes over with the write made during the cut.
        try hosts.setKernelLink(up: true)
        try await eventually(20, "the backup hears the primary and holds the whole state again, to the primary's sequence") {
            let backup = try await pairState(1, from: 1)
            guard backup?["state"] == "passive", backup?["synced"] == true else { return false }
            let sequences = [try await stateSequence(0), try await stateSequence(1)]
            return sequences[0] != nil && sequences[0] == sequences[1]
        }
        kernels[0].stop()
        let after = try await sb(on: 1, ["request", "kernel", "state.get", #"{"prefix":"/client/split/"}"#, "--endpoint", both, "--timeout", "5s", "--json"])
        let backupLog = kernels[1].outputSoFar.split(separator: "\n").filter { !$0.contains(" info ") || $0.contains("state") }.joined(separator: "\n")
        #expect(after.status == 0 && after.stdout.contains("cut"), "\(after)\nthe backup kernel's log:\n\(backupLog)")
        #expect(try await pairState(1, from: 1)?["state"] == "active")
    }

    @Test("a pair's client on a slow link: a reply that takes longer to arrive than a stopped kernel is given (10 s) is not taken for a kernel gone or stopped; the active kernel's machine gone: the client notices within seconds and the other kernel serves",
          .enabled(if: NetworkNamespaces.available, "skipped: needs root, iproute2 and network namespaces (ip netns add failed)"))
    func slowLinkThenMachineGone() async throws {
        let hosts = try PairHosts.make()
        defer { hosts.remove() }
        let (folder, keys) = try PairHosts.testFolder("pair-slow-link", keys: [KeyFolder.kernel, "echo", KeyFolder.client])
        @Sendable func sb(on side: Int, _ arguments: [String]) async throws -> CommandResult {
            try await hosts.sb(on: side, keys: keys.path, arguments)
        }
        let (kernels, echo) = try await hosts.startPairWithEcho(in: folder, keys: keys.path)
        defer { for process in [echo] + kernels { process.stop() } }
        let both = hosts.broker(0) + "," + hosts.broker(1), backupFirst = hosts.broker(1) + "," + hosts.broker(0)

        // A megabyte of state, written on the primary's host; read from the other host over a
        // link of 700 kbit/s: about twelve seconds of one reply arriving.
        let value = "\"" + String(repeating: "v", count: 100_000) + "\""
        for index in 0..<10 {
            let written = try await sb(on: 0, ["pub", "/client/big/\(index)", value, "--endpoint", both, "--timeout", "10s"])
            try #require(written.status == 0, "\(written)")
        }
        try hosts.limitLink(0, rate: "700kbit")
        let started = ContinuousClock.now
        let slow = try await sb(on: 1, ["request", "kernel", "state.get", #"{"prefix":"/client/big/"}"#, "--endpoint", both, "--timeout", "60s", "--json"])
        #expect(slow.status == 0 && slow.stdout.utf8.count > 900_000, "\(slow.status) \(slow.stderr)")
        print("a 1 MB reply over 700 kbit/s to a pair's client: \(ContinuousClock.now - started)")

        // A reply in parts from the primary, its first part in; then the primary's machine is
        // gone. The client hears nothing more, and notices well before its 60 s of silence.
        let reader = try await hosts.readerOfParts(keys: keys.path)
        defer { reader.stop() }
        try hosts.disconnect(0)
        let cutAt = ContinuousClock.now
        #expect(await reader.exit(within: 20), "the reader still waits for the kernel whose machine is gone")
        let noticedAfter = ContinuousClock.now - cutAt
        #expect(reader.readOutput().contains("the connection to the kernel dropped after 1 part"), "\(reader.outputSoFar)")
        // The backup takes over and serves the state it holds.
        let after = try await sb(on: 1, ["request", "kernel", "state.get", #"{"prefix":"/client/big/9"}"#, "--endpoint", backupFirst, "--timeout", "30s", "--json"])
        #expect(after.status == 0 && after.stdout.contains("vvvv"), "\(after.status) \(after.stderr)")
        print("the active kernel's machine gone: its client noticed after \(noticedAfter), the backup served \(ContinuousClock.now - cutAt) after")
    }

    @Test("a slow link between the kernels: each change, and a copy of the whole state that takes seconds to cross, arrive without the link being taken for silent or the copy asked for again",
          .enabled(if: NetworkNamespaces.available, "skipped: needs root, iproute2 and network namespaces (ip netns add failed)"))
    func slowKernelLink() async throws {
        let hosts = try PairHosts.make()
        defer { hosts.remove() }
        let (folder, keys) = try PairHosts.testFolder("pair-slow-kernel-link", keys: [KeyFolder.kernel, KeyFolder.client])
        @Sendable func sb(_ arguments: [String]) async throws -> CommandResult {
            try await hosts.sb(on: 0, keys: keys.path, arguments)
        }
        var kernels = try hosts.startKernels(in: folder, keys: keys.path)
        defer { for kernel in kernels { kernel.stop() } }
        try await kernels[0].waitForOutput(containing: "the passive peer holds every change", within: 60)
        @Sendable func stateSequence(_ side: Int) async throws -> JSONValue? {
            let result = try await sb(["request", "kernel", "stats", "--endpoint", hosts.broker(side), "--timeout", "2s", "--json"])
            return try JSONValue(parsing: Array(result.stdout.utf8))["state"]?["sequence"]
        }
        // 1 Mbit/s from the primary to the backup: each 100 kB change takes 0.8 s to cross,
        // longer than the pair's heartbeats give a silent peer (400 ms).
        try hosts.limitKernelData(0, rate: "1mbit")
        let value = "\"" + String(repeating: "v", count: 100_000) + "\""
        for index in 0..<3 {
            let written = try await sb(["pub", "/client/big/\(index)", value, "--endpoint", hosts.broker(0), "--timeout", "20s"])
            try #require(written.status == 0, "\(written)")
        }
        #expect(try await stateSequence(0) == stateSequence(1))
        #expect(!kernels[0].outputSoFar.contains("the passive peer is silent"), "\(kernels[0].outputSoFar)")
        #expect(!kernels[1].outputSoFar.contains("copying its state again"), "\(kernels[1].outputSoFar)")

        // The backup restarted after more changes: the whole state (600 kB, about five
        // seconds over this link) is copied once.
        kernels[1].stop()
        for index in 3..<6 {
            let written = try await sb(["pub", "/client/big/\(index)", value, "--endpoint", hosts.broker(0), "--timeout", "20s"])
            try #require(written.status == 0, "\(written)")
        }
        let started = ContinuousClock.now
        kernels[1] = try hosts.start(on: 1, ["kernel", "--config", hosts.config(1, in: folder).path])
        @Sendable func copiesSent(_ output: String) -> Int { output.components(separatedBy: "sent the state to the peer").count - 1 }
        try await kernels[0].waitForOutput("the state sent to the restarted backup", within: 60) { copiesSent($0) >= 2 }
        // A write while the copy crosses the link: acknowledged without waiting for it.
        let duringCopy = try await sb(["pub", "/client/small", #""during the copy""#, "--endpoint", hosts.broker(0), "--timeout", "20s"])
        #expect(duringCopy.status == 0, "\(duringCopy)")
        #expect(!kernels[1].outputSoFar.contains("copied the active peer's state"), "the write waited for the copy")
        _ = try await kernels[1].waitForOutput(containing: "copied the active peer's state", within: 60)
        print("600 kB of state copied over 1 Mbit/s in \(ContinuousClock.now - started)")
        // Then changes wait for the backup again, and it may take over.
        try await kernels[0].waitForOutput("the primary waiting for the backup again", within: 20) {
            $0.components(separatedBy: "the passive peer holds every change").count - 1 >= 2
        }
        #expect(try await stateSequence(0) == stateSequence(1))
        #expect(copiesSent(kernels[0].outputSoFar) == 2, "the primary sent its state more than twice:\n\(kernels[0].outputSoFar)")
    }

    @Test("a change that takes seconds to cross the link between the kernels: the passive kernel hears the active one in the change's bytes while the heartbeats wait behind them, and a client that asks it meanwhile is refused, not served by a second active kernel",
          .enabled(if: NetworkNamespaces.available, "skipped: needs root, iproute2 and network namespaces (ip netns add failed)"))
    func passiveHearsALargeChange() async throws {
        let hosts = try PairHosts.make()
        defer { hosts.remove() }
        let (folder, keys) = try PairHosts.testFolder("pair-large-change", keys: [KeyFolder.kernel, KeyFolder.client])
        let kernels = try hosts.startKernels(in: folder, keys: keys.path)
        defer { for kernel in kernels { kernel.stop() } }
        try await kernels[0].waitForOutput(containing: "the passive peer holds every change", within: 60)
        // The backup's host off the clients' network: the primary's broker cannot answer its
        // questions, as when the clients' way crosses the same slow link. The link between
        // the kernels is all it has to tell whether the primary is there.
        try hosts.setServiceLink(1, up: false)
        // 100 kB at 200 kbit/s from the primary to the backup: four seconds, ten times what
        // the pair's heartbeats give a silent peer.
        try hosts.limitKernelData(0, rate: "200kbit")
        let value = "\"" + String(repeating: "b", count: 100_000) + "\""
        async let written = hosts.sb(on: 0, keys: keys.path, ["pub", "/client/large/b", value, "--endpoint", hosts.broker(0), "--timeout", "60s"])
        try await kernels[1].waitForOutput(containing: "heartbeats are late but its bytes arrive", within: 30)
        let asked = try await hosts.sb(on: 1, keys: keys.path, ["pub", "/client/large/asked", #""of the passive""#,
                                                                "--endpoint", hosts.broker(1), "--timeout", "5s"])
        #expect(asked.status != 0 && asked.stderr.contains("passive"), "\(asked)")
        #expect(!kernels[1].outputSoFar.contains("failing over"), "\(kernels[1].outputSoFar)")
        let result = try await written
        #expect(result.status == 0, "\(result)")
        let read = try await hosts.sb(on: 0, keys: keys.path, ["request", "kernel", "state.get", #"{"prefix":"/client/large/"}"#,
                                                               "--endpoint", hosts.broker(0), "--timeout", "20s"])
        #expect(read.status == 0 && read.stdout.contains("bbbb"), "\(read.stdout.prefix(200)) \(read.stderr)")
    }

    @Test("the passive kernel stalled for a moment (SIGSTOP), then a write crossing a slow link, then the active kernel killed: the acknowledged write is on the kernel that takes over",
          .enabled(if: NetworkNamespaces.available, "skipped: needs root, iproute2 and network namespaces (ip netns add failed)"))
    func passiveStalledThenActiveKilled() async throws {
        let hosts = try PairHosts.make()
        defer { hosts.remove() }
        let (folder, keys) = try PairHosts.testFolder("pair-passive-stalled", keys: [KeyFolder.kernel, KeyFolder.client])
        let kernels = try hosts.startKernels(in: folder, keys: keys.path)
        defer {
            kernels[1].signal(SIGCONT)
            for kernel in kernels { kernel.stop() }
        }
        @Sendable func times(_ text: String, _ output: String) -> Int { output.components(separatedBy: text).count - 1 }
        let (waiting, silent) = ("the passive peer holds every change", "the passive peer is silent")
        try await kernels[0].waitForOutput("the primary waiting for the backup", within: 60) { times(waiting, $0) >= 1 }
        // The backup stalls for over two heartbeats: the primary serves alone. Back, having
        // missed no change, it is waited for again.
        let silentBefore = times(silent, kernels[0].outputSoFar)
        kernels[1].signal(SIGSTOP)
        try await kernels[0].waitForOutput("the primary serving alone", within: 30) { times(silent, $0) > silentBefore }
        let waitingBefore = times(waiting, kernels[0].outputSoFar)
        kernels[1].signal(SIGCONT)
        try await kernels[0].waitForOutput("the primary waiting for the backup again", within: 30) { times(waiting, $0) > waitingBefore }
        // 50 kB at 200 kbit/s from the primary to the backup: two seconds to cross. Once the
        // write is acknowledged the backup holds it, so the primary's end loses nothing.
        try hosts.limitKernelData(0, rate: "200kbit")
        let value = "\"" + String(repeating: "w", count: 50_000) + "\""
        let written = try await hosts.sb(on: 0, keys: keys.path, ["pub", "/client/stalled/w", value, "--endpoint", hosts.broker(0), "--timeout", "30s"])
        try #require(written.status == 0, "\(written)")
        kernels[0].signal(SIGKILL)
        let read = try await hosts.sb(on: 1, keys: keys.path, ["request", "kernel", "state.get", #"{"prefix":"/client/stalled/"}"#,
                                                               "--endpoint", hosts.broker(1) + "," + hosts.broker(0), "--timeout", "20s"])
        #expect(read.status == 0 && read.stdout.contains("wwww"),
                "the acknowledged write is not on the kernel that took over: \(read.stdout.prefix(200)) \(read.stderr)\nthe primary's log:\n\(kernels[0].outputSoFar)")
    }

    @Test("the active kernel's process stopped (its machine still acknowledging): a pair's client notices that it sends nothing and the other kernel serves",
          .enabled(if: NetworkNamespaces.available, "skipped: needs root, iproute2 and network namespaces (ip netns add failed)"))
    func activeKernelStopped() async throws {
        let hosts = try PairHosts.make()
        defer { hosts.remove() }
        let (folder, keys) = try PairHosts.testFolder("pair-stopped", keys: [KeyFolder.kernel, "echo", KeyFolder.client])
        let (kernels, echo) = try await hosts.startPairWithEcho(in: folder, keys: keys.path)
        defer {
            kernels[0].signal(SIGCONT)
            for process in [echo] + kernels { process.stop() }
        }
        let reader = try await hosts.readerOfParts(keys: keys.path)
        defer { reader.stop() }
        kernels[0].signal(SIGSTOP)
        let stoppedAt = ContinuousClock.now
        // It sends no byte for 10 s: noticed well before the reader's 60 s of silence.
        #expect(await reader.exit(within: 30), "the reader still waits for the stopped kernel")
        let noticedAfter = ContinuousClock.now - stoppedAt
        #expect(reader.readOutput().contains("the connection to the kernel dropped after 1 part"), "\(reader.outputSoFar)")
        // A write, which only the active kernel takes: the backup takes over at once (its
        // peer's broker accepts a connection but greets nobody), not once libzmq gives up
        // that handshake (30 s).
        let backupFirst = hosts.broker(1) + "," + hosts.broker(0)
        let after = try await hosts.sb(on: 1, keys: keys.path, ["pub", "/client/after", #""stopped""#, "--endpoint", backupFirst, "--timeout", "10s"])
        #expect(after.status == 0, "\(after)")
        print("the active kernel's process stopped: its client noticed after \(noticedAfter), the backup took a write \(ContinuousClock.now - stoppedAt) after")
    }
}
