import BusKit
import Contracts
import BusProtocol
import Catalog
import Foundation
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// A configuration for a whole bus on free ports in `folder`: datasets read from files
/// there (no traffic beyond loopback), fast heartbeats and restarts.
func writeDeploymentConfig(in folder: URL, services: String = """
    echo: {workers: 1}
      store: {workers: 2}
      fetcher: {workers: 2}
      search: {workers: 2}
      pricing: {workers: 1}
      streams: {workers: 1}
    """, security: String? = nil, extra: String = "", ports given: [Int]? = nil) throws -> (config: URL, broker: String) {
    let (config, ports) = try writeBusConfiguration(in: folder, services: services, supervisor: """
        restart_backoff_ms: 100
          stop_timeout_seconds: 10
        """, security: security, extra: extra, ports: given)
    return (config, "tcp://127.0.0.1:\(ports[0])")
}

/// The services section of a bus with echo alone, for tests that need no more.
let echoOnly = """
    echo: {workers: 1}
      store: {enabled: false}
      fetcher: {enabled: false}
      search: {enabled: false}
      pricing: {enabled: false}
      streams: {enabled: false}
    """

/// The pids in `switchboard up`'s banner ("  search   2 workers, pid 123"), by piece.
func bannerPids(_ output: String) -> [String: Int32] {
    var pids: [String: Int32] = [:]
    for line in output.split(separator: "\n") where line.hasPrefix("  ") {
        let words = line.split(separator: " ")
        if let name = words.first, let pid = words.last.flatMap({ Int32($0) }), line.contains("pid ") { pids[String(name)] = pid }
    }
    return pids
}

func isAlive(_ pid: Int32) -> Bool {
    kill(pid, 0) == 0 || errno != ESRCH
}

@Suite("switchboard up: the whole bus as a supervised process tree", .serialized)
struct UpTests {
    @Test("all register; kill -9 of a service is followed by its restart while the bus answers; SIGTERM ends everything cleanly")
    func processTree() async throws {
        let folder = try temporaryDirectory("up")
        let ports = (0..<5).map { _ in freePort() }
        let (config, broker) = try writeDeploymentConfig(in: folder, ports: ports)
        let (snapshot, publisher) = ("tcp://127.0.0.1:\(ports[1])", "tcp://127.0.0.1:\(ports[2])")
        let up = try ChildProcess(switchboardExecutable(), ["up", "--config", config.path])
        defer { up.stop(grace: 15) }
        let banner = try await up.waitForOutput(containing: "Switchboard is up", within: 120)
        try await up.waitForOutput(containing: "Stop with Ctrl-C")
        let pids = bannerPids(up.outputSoFar)
        #expect(Set(pids.keys) == ["kernel", "echo", "store", "streams", "fetcher", "search", "pricing", "gateway"], "\(banner)")
        #expect(up.outputSoFar.contains("Connect with: export SB_ENDPOINT=\(broker) "))
        #expect(up.outputSoFar.contains(" SB_KEY_DIR=\(busKeyFolder(in: folder).path); sb services"))

        let bus = try await BusClient(brokers: [broker], timeout: .seconds(10), curve: try busKeyFolder(in: folder).clientKeys())
        let list = try await bus.request(service: "kernel", method: "services.list")
        for (name, workers) in [("echo", 1), ("store", 2), ("fetcher", 2), ("search", 2), ("pricing", 1)] {
            #expect(list["services"]?.arrayValue?.first { $0["name"]?.stringValue == name }?["workers"]?.intValue == Int64(workers), "\(name)")
        }
        let countries = try await bus.request(service: "search", method: "countries.search", params: ["query": "par"])
        #expect(countries["countries"]?.arrayValue?.first?["name"] == "Paraguay")

        // A traced request: its trace id is in the log of every service it touched (search,
        // and the store, which search asks to record the place).
        let traced = try await runCommand(sbExecutable(), ["request", "search", "locations.resolve", #"{"query":"Amsterdam"}"#, "--trace",
                                                           "--endpoint", broker, "--key-dir", busKeyFolder(in: folder).path])
        let traceID = try #require(traced.stderr.split(separator: "\n").first { $0.hasPrefix("sb: trace ") }?.split(separator: " ").last, "\(traced)")
        #expect(traced.status == 0 && traceID.count == 32, "\(traced)")
        try await up.waitForOutput("both services logged the trace", within: 10) { output in
            let lines = output.split(separator: "\n").filter { $0.contains("trace_id=\(traceID)") }
            return lines.contains { $0.contains("switchboard.search:") && $0.contains("method=locations.resolve") }
                && lines.contains { $0.contains("switchboard.store:") && $0.contains("method=history.add") }
        }

        // kill -9 a service: the supervisor restarts it; requests meanwhile are answered
        // (by the old process's redispatch or the new one) and the new process registers.
        let search = try #require(pids["search"])
        kill(search, SIGKILL)
        let during = try await bus.request(service: "search", method: "countries.search", params: ["query": "fra"])
        #expect(during["countries"]?.arrayValue?.isEmpty == false)
        try await up.waitForOutput(containing: "search (pid \(search)) was killed by signal 9 (SIGKILL); restarting")
        let restarted = try await up.waitForOutput(containing: "started search")
        #expect(restarted.components(separatedBy: "started search").count == 3, "started at boot and once more")
        let curve = try busKeyFolder(in: folder).clientKeys()
        try await workers("search", snapshot: snapshot, publisher: publisher, within: 30, curve: curve, "the new search registered") { $0 == 2 }
        #expect(try await bus.request(service: "search", method: "countries.search", params: ["query": "ger"])["countries"] != nil)
        #expect(try await bus.request(service: "pricing", method: "route.cheapest")["cheapestOutbound"] != nil)

        // kill -9 the kernel: restarted on the same endpoints, every service registers again.
        let kernel = try #require(pids["kernel"])
        kill(kernel, SIGKILL)
        try await up.waitForOutput(containing: "kernel (pid \(kernel)) was killed by signal 9 (SIGKILL); restarting")
        try await awaitState(snapshot: snapshot, publisher: publisher, prefix: KernelAPI.StateKeys.servicesPrefix, within: 60, curve: curve,
                             "every service registered with the new kernel") { state in
            let workers = state.reduce(into: [String: Int64]()) { workers, entry in
                if let count = entry.value["workers"]?.intValue, count > 0 { workers[String(entry.key.dropFirst(KernelAPI.StateKeys.servicesPrefix.count))] = count }
            }
            return workers == ["echo": 1, "store": 2, "streams": 1, "fetcher": 2, "search": 2, "pricing": 1, "supervisor": 1]
        }
        #expect(try await bus.request(service: "search", method: "countries.search", params: ["query": "par"])["countries"] != nil)
        await bus.close()

        // SIGTERM: services drain, then the kernel; exit 0; no process left.
        let before = up.outputSoFar.utf8.count
        up.signal(SIGTERM)
        #expect(await up.exit(within: 60))
        #expect(up.terminationStatus == 0, "\(up.readOutput().suffix(2_000))")
        let output = String(decoding: up.readOutput().utf8.dropFirst(before), as: UTF8.self)
        let servicesStopped = ["echo", "store", "streams", "fetcher", "search", "pricing"].compactMap { name in
            output.range(of: "] \(name) (pid")?.lowerBound
        }
        let kernelStopped = try #require(output.range(of: "] kernel (pid")?.lowerBound)
        #expect(servicesStopped.count == 6 && servicesStopped.allSatisfy { $0 < kernelStopped }, "services stop before the kernel")
        for (name, pid) in pids where name != "search" && name != "kernel" { #expect(!isAlive(pid), "\(name) (pid \(pid)) is still running") }
    }

    @Test("a service that keeps dying is restarted with a capped back-off, never stops the bus, and sb services says so")
    func keepsDying() async throws {
        let folder = try temporaryDirectory("up-failing")
        let (config, ports) = try writeBusConfiguration(in: folder, services: """
            echo: {workers: 1}
              store: {enabled: false}
              fetcher: {workers: 1}
              search: {workers: 1}
              pricing: {enabled: false}
              streams: {enabled: false}
            """, supervisor: """
            restart_backoff_ms: 500
              restart_backoff_max_ms: 2000
              restart_limit: 2
              stop_timeout_seconds: 10
            """)
        let broker = "tcp://127.0.0.1:\(ports[0])"
        let up = try ChildProcess(switchboardExecutable(), ["up", "--config", config.path])
        defer { up.stop(grace: 15) }
        try await up.waitForOutput(containing: "Stop with Ctrl-C", within: 120)
        let pids = bannerPids(up.outputSoFar)
        let bus = try await BusClient(brokers: [broker], timeout: .seconds(10), curve: try busKeyFolder(in: folder).clientKeys())
        @Sendable func echoStatus() async throws -> SupervisorStatus? {
            try await bus.call(KernelAPI.stateGet, .init(prefix: SupervisorStatus.key("echo"))).entries.first?.value.decode(as: SupervisorStatus.self)
        }
        // Four kills of each new echo process in a row.
        var killed: Set<Int32> = []
        for _ in 0..<4 {
            let earlier = killed
            let pid = try await within(30, "a new echo process runs") { () -> Int32 in
                while true {
                    if let status = try await echoStatus(), status.state == .running, let pid = status.pid.map(Int32.init), !earlier.contains(pid) { return pid }
                    try await Task.sleep(for: .milliseconds(20))
                }
            }
            kill(pid, SIGKILL)
            killed.insert(pid)
        }
        try await up.waitForOutput(containing: "echo keeps failing")
        // Between restarts sb services says so, and the other services keep answering.
        let services = try await runCommand(sbExecutable(), ["services", "--endpoint", broker, "--key-dir", busKeyFolder(in: folder).path])
        #expect(services.status == 0 && services.stdout.contains("echo: failing, restarting"), "\(services)")
        #expect(try await bus.request(service: "search", method: "countries.search", params: ["query": "par"])["countries"] != nil)
        // Once it stays up, it is running again and serves; up never stopped.
        let (snapshot, publisher) = ("tcp://127.0.0.1:\(ports[1])", "tcp://127.0.0.1:\(ports[2])")
        let curve = try busKeyFolder(in: folder).clientKeys()
        try await awaitState(snapshot: snapshot, publisher: publisher, prefix: SupervisorStatus.key("echo"), within: 30, curve: curve, "echo runs again") { state in
            (try? state[SupervisorStatus.key("echo")]?.decode(as: SupervisorStatus.self))?.state == .running
        }
        try await workers("echo", snapshot: snapshot, publisher: publisher, within: 30, curve: curve, "echo registered again") { $0 == 1 }
        #expect(try await bus.request(service: "echo", method: "echo", params: ["x": 1])["x"] == 1)
        #expect(up.isRunning)
        #expect(!up.outputSoFar.contains("stopping everything"))
        for name in ["kernel", "search", "fetcher"] { #expect(isAlive(try #require(pids[name])), "\(name) kept running") }
        await bus.close()
    }

    @Test("if the supervisor is killed, its processes end by themselves (the lifeline)")
    func lifeline() async throws {
        let folder = try temporaryDirectory("up-lifeline")
        let (config, _) = try writeDeploymentConfig(in: folder, services: echoOnly)
        let up = try ChildProcess(switchboardExecutable(), ["up", "--config", config.path])
        defer { up.stop() }
        try await up.waitForOutput(containing: "Stop with Ctrl-C", within: 60)
        let pids = bannerPids(up.outputSoFar)
        #expect(Set(pids.keys) == ["kernel", "echo", "gateway"])
        up.signal(SIGKILL)
        _ = await up.exit(within: 10)
        try await eventually(20, "the kernel and echo ended") { pids.values.allSatisfy { !isAlive($0) } }
    }

    @Test("another kernel already on the endpoints: up says so and exits 1, leaving it alone")
    func endpointsTaken() async throws {
        let folder = try temporaryDirectory("up-taken")
        let (config, broker) = try writeDeploymentConfig(in: folder, security: "curve: false")
        let other = try ChildProcess(switchboardExecutable(), ["kernel", "--config", config.path])
        defer { other.stop() }
        let bus = try await BusClient(brokers: [broker], timeout: .seconds(1))
        // Sent before the kernel has bound its port: libzmq holds it until it connects.
        _ = try await bus.request(service: "kernel", method: "ping", timeout: .seconds(20))
        let result = try await runCommand(switchboardExecutable(), ["up", "--config", config.path], seconds: 60)
        #expect(result.status == 1 && result.stderr.contains("another kernel (pid \(other.pid)) already answers at \(broker)"), "\(result)")
        #expect(other.isRunning)
        // Nothing of the refused `up` joined the running bus: no second supervisor to answer
        // `sb restart` or `sb reload` for it.
        #expect(!other.outputSoFar.contains("service=supervisor"), "\(other.outputSoFar)")
        await bus.close()
    }

    @Test("another program on the gateway's address: up (in one process too) says so and exits 1, never up; the gateway alone says so once it has a kernel, and stops at SIGTERM while it waits for one")
    func gatewayAddressTaken() async throws {
        let folder = try temporaryDirectory("up-gateway-taken")
        // Accepts connections, as a gateway would once up: the supervisor must not take it for ours.
        let holder = try SilentListener()
        let (config, _) = try writeDeploymentConfig(in: folder, services: echoOnly, ports: [freePort(), freePort(), freePort(), freePort(), holder.port])
        for mode in [[], ["--single-process"]] {
            let result = try await runCommand(switchboardExecutable(), ["up"] + mode + ["--config", config.path], seconds: 60)
            let said = result.stdout + result.stderr
            #expect(result.status == 1 && !said.contains("Switchboard is up") && said.contains("at 127.0.0.1:\(holder.port)")
                     && said.contains("(gateway.listen)"), "\(mode): \(result)")
        }
        // No kernel answers: the gateway waits for its state, and a SIGTERM then ends it.
        let waiting = try ChildProcess(switchboardExecutable(), ["gateway", "--config", config.path])
        defer { waiting.stop() }
        try await waiting.waitForOutput(containing: "waiting for the kernel's state", within: 60)
        waiting.signal(SIGTERM)
        #expect(await waiting.exit(within: 20), "\(waiting.outputSoFar)")
        #expect(waiting.terminationStatus == 0, "\(waiting.outputSoFar)")
        // With a kernel, the bind itself is refused: said with the setting, not as the system's call.
        let kernel = try ChildProcess(switchboardExecutable(), ["kernel", "--config", config.path])
        defer { kernel.stop() }
        let refused = try await runCommand(switchboardExecutable(), ["gateway", "--config", config.path], seconds: 60)
        #expect(refused.status == 1 && refused.stderr.contains("switchboard: gateway: cannot listen at 127.0.0.1:\(holder.port) (gateway.listen): Address already in use"),
                "\(refused)")
    }

    @Test("bad configuration: exit 78 naming the key, for up, kernel, serve and check; check says what a good one sets up; a word that names no verb is refused naming the verbs (64)")
    func badConfiguration() async throws {
        let folder = try temporaryDirectory("up-bad")
        let bad = folder.appendingPathComponent("bad.yaml")
        try "kernel:\n  heartbeat_ms: soon\n".write(to: bad, atomically: true, encoding: .utf8)
        for arguments in [["up"], ["kernel"], ["serve", "echo"], ["check"]] {
            let result = try await runCommand(switchboardExecutable(), arguments + ["--config", bad.path])
            #expect(result.status == 78, "\(arguments)")
            #expect(result.stderr.contains(#"kernel.heartbeat_ms: expected an integer from 1 to 3600000, got "soon""#), "\(result.stderr)")
        }
        let variable = try await runCommand(switchboardExecutable(), ["kernel", "--config", bad.path], environment: ["SWITCHBOARD_KERNEL_HEARTBEAT": "5"])
        #expect(variable.status == 78 && variable.stderr.contains("SWITCHBOARD_KERNEL_HEARTBEAT: unknown variable"), "\(variable.stderr)")
        // A bad value from a variable is blamed on the variable, not on the file.
        let good = folder.appendingPathComponent("good.yaml")
        try "log_level: info\n".write(to: good, atomically: true, encoding: .utf8)
        let badVariable = try await runCommand(switchboardExecutable(), ["kernel", "--config", good.path], environment: ["SWITCHBOARD_KERNEL_HEARTBEAT_MS": "soon"])
        #expect(badVariable.status == 78, "\(badVariable)")
        #expect(badVariable.stderr.contains(#"SWITCHBOARD_KERNEL_HEARTBEAT_MS (overrides kernel.heartbeat_ms): expected an integer from 1 to 3600000, got "soon""#), "\(badVariable.stderr)")
        // A file that cannot be read: the system's reason, not Foundation's error dump; one
        // that never ends is read no further than any configuration needs.
        let binary = folder.appendingPathComponent("binary.yaml")
        try Data([0x6B, 0x3A, 0x20, 0xFF, 0xFE, 0x0A]).write(to: binary)
        for (path, reason) in [(folder.appendingPathComponent("none.yaml").path, "No such file or directory"), (folder.path, "it is a folder"),
                               ("/dev/zero", "it holds more than the limit of 1048576 bytes"), (binary.path, "it is not UTF-8 text")] {
            let unreadable = try await runCommand(switchboardExecutable(), ["check", "--config", path])
            #expect(unreadable.status == 78 && unreadable.stderr == "switchboard: \(path): cannot read \(path): \(reason)\n", "\(unreadable)")
        }
        // check: the same refusals, and for a good file what it sets up, nothing started.
        let checked = try await runCommand(switchboardExecutable(), ["check", "--config", good.path], environment: ["SWITCHBOARD_SERVICES_SEARCH_WORKERS": "3"])
        #expect(checked.status == 0 && checked.stdout.hasPrefix("\(good.path): fine\n") && checked.stdout.contains("search 3,"), "\(checked)")
        // --cell as up takes it: a cell needs the etcd of the cells' directory.
        let cellWithoutEtcd = try await runCommand(switchboardExecutable(), ["check", "--config", good.path, "--cell", "a"])
        #expect(cellWithoutEtcd.status == 78 && cellWithoutEtcd.stderr.contains("kernel.cell.etcd"), "\(cellWithoutEtcd)")
        let cells = try await runCommand(switchboardExecutable(), ["check", "--config", repositoryRoot().appendingPathComponent("Config/cells/cell-a.yaml").path, "--cell", "b"])
        #expect(cells.status == 0 && cells.stdout.contains("cell b"), "\(cells)")
        #expect(try await runCommand(switchboardExecutable(), ["check", "--cell", "a b"]).status == 64)
        // A word where a verb should be that names none is refused naming the verbs, as sb does.
        let typo = try await runCommand(switchboardExecutable(), ["kernal", "--config", good.path])
        #expect(typo.status == 64 && typo.stderr == """
            Error: switchboard has no verb 'kernal'; its verbs: up, kernel, serve, gateway, keygen, check
            Usage: switchboard <subcommand>
              See 'switchboard --help' for more information.

            """, "\(typo)")
        #expect(try await runCommand(switchboardExecutable(), ["help", "check"]).status == 0)
        // Keys given by hand that the kernel or a service would refuse at its start: check
        // refuses them too, reading the file as up does (CURVE on unless it says otherwise,
        // which up tells the pieces it starts by SWITCHBOARD_SECURITY_CURVE).
        let made = try await runCommand(switchboardExecutable(), ["keygen", "--out", folder.appendingPathComponent("hand").path])
        #expect(made.status == 0, "\(made)")
        let keyFile = folder.appendingPathComponent("hand.key").path
        for (security, piece, refusal) in [("kernel_secret_key_file: \(keyFile)", ["kernel"], "security.worker_keys: no key is allowed"),
                                           ("secret_key_file: \(keyFile)", ["serve", "echo"], "security.server_key: required with security.secret_key")] {
            let byHand = folder.appendingPathComponent("by-hand.yaml")
            try "security:\n  \(security)\n".write(to: byHand, atomically: true, encoding: .utf8)
            let checkedByHand = try await runCommand(switchboardExecutable(), ["check", "--config", byHand.path])
            #expect(checkedByHand.status == 78 && checkedByHand.stderr.contains(refusal), "\(security): \(checkedByHand)")
            let started = try await runCommand(switchboardExecutable(), piece + ["--config", byHand.path], environment: ["SWITCHBOARD_SECURITY_CURVE": "true"])
            #expect(started.status == 78 && started.stderr.contains(refusal), "\(piece) \(security): \(started)")
        }
        let curve = folder.appendingPathComponent("curve.yaml")
        try "security:\n  curve: true\n  keys_dir: \(folder.appendingPathComponent("keys").path)\n".write(to: curve, atomically: true, encoding: .utf8)
        let missing = try await runCommand(switchboardExecutable(), ["kernel", "--config", curve.path])
        #expect(missing.status == 78 && missing.stderr.contains("security.keys_dir: \(folder.path)/keys/kernel.key is missing (`switchboard up` creates it on first run)"), "\(missing.stderr)")
        try FileManager.default.createDirectory(at: folder.appendingPathComponent("keys"), withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: folder.appendingPathComponent("keys/kernel.key").path, withDestinationPath: "/dev/zero")
        let endless = try await runCommand(switchboardExecutable(), ["kernel", "--config", curve.path])
        #expect(endless.status == 78 && endless.stderr.contains("keys/kernel.key cannot be read: it holds more than the limit of 65536 bytes"), "\(endless.stderr)")
        let unknownService = try await runCommand(switchboardExecutable(), ["serve", "mailer"])
        #expect(unknownService.status == 64 && unknownService.stderr.contains("unknown service 'mailer'"))
        // --db is the file of a service that keeps one (store, streams); given to another it is refused, not ignored.
        let noDatabase = try await runCommand(switchboardExecutable(), ["serve", "echo", "--db", folder.appendingPathComponent("x.sqlite").path])
        #expect(noDatabase.status == 64 && noDatabase.stderr.contains("--db names the SQLite file of store or streams; echo keeps no database"), "\(noDatabase)")
        // A database's place that cannot be used is refused at the start, naming its key (or
        // --db), rather than answered -32007 at every request while the bus says it is up.
        let aFile = folder.appendingPathComponent("a-file")
        try "".write(to: aFile, atomically: true, encoding: .utf8)
        let underAFile = try await runCommand(switchboardExecutable(), ["up", "--config", good.path], environment: ["SWITCHBOARD_STORE_PATH": aFile.path + "/store.sqlite"])
        #expect(underAFile.status == 78 && underAFile.stderr.contains("SWITCHBOARD_STORE_PATH (overrides store.path): cannot create the folder \(aFile.path)"), "\(underAFile)")
        let aFolder = try await runCommand(switchboardExecutable(), ["serve", "streams", "--db", folder.path])
        #expect(aFolder.status == 64 && aFolder.stderr == "switchboard: --db: the database file cannot be opened: it is a folder\n", "\(aFolder)")
        // An endpoint another program holds is named with its setting, and what to do.
        let holder = try ZMQSocket(ZMQContext(), .router)
        defer { holder.close() }
        let taken = try holder.bind("tcp://127.0.0.1:*")
        let any = "tcp://127.0.0.1:*"
        let inUse = try await runCommand(switchboardExecutable(), ["kernel", "--config", good.path, "--broker", taken, "--snapshot", any, "--publisher", any, "--collector", any])
        #expect(inUse.status == 1 && inUse.stderr.contains("another program listens there") && inUse.stderr.contains("(kernel.broker)"), "\(inUse)")
        // A flag read as its setting is: the error names the flag, not a variable nobody set.
        let badListen = try await runCommand(switchboardExecutable(), ["gateway", "--config", good.path, "--listen", "foo"])
        #expect(badListen.status == 64 && badListen.stderr.contains("--listen: expected HOST:PORT") && !badListen.stderr.contains("SWITCHBOARD_"), "\(badListen)")
        // A mistyped endpoint is a usage error naming its flag, before any socket is opened.
        let badBind = try await runCommand(switchboardExecutable(), ["kernel", "--config", good.path, "--broker", "tcp://127.0.0.1:port"])
        #expect(badBind.status == 64 && badBind.stderr.contains("--broker 'tcp://127.0.0.1:port' is not an endpoint"), "\(badBind)")
        // A writable prefix without its leading '/' would let the collector take no key.
        let badPrefix = try await runCommand(switchboardExecutable(), ["kernel", "--config", good.path, "--writable-prefix", "client/"])
        #expect(badPrefix.status == 64 && badPrefix.stderr.contains("--writable-prefix 'client/' is not a key prefix") && badPrefix.stderr.contains("/client/"), "\(badPrefix)")
        let badBroker = try await runCommand(switchboardExecutable(), ["serve", "echo", "--broker", "127.0.0.1:5555"])
        #expect(badBroker.status == 64 && badBroker.stderr.contains("--broker 127.0.0.1:5555: give tcp://HOST:PORT"), "\(badBroker)")
    }

    @Test("keygen and up's key folder: a name that is no file or a pair that exists is a usage error with keygen's usage; a folder that cannot be made is 73 with the system's reason; --force replaces the pair whole")
    func keyFiles() async throws {
        let folder = try temporaryDirectory("up-keys")
        let alice = folder.appendingPathComponent("keys/alice").path
        let made = try await runCommand(switchboardExecutable(), ["keygen", "--out", alice])
        #expect(made.status == 0 && made.stdout.contains("wrote \(alice).key (secret) and \(alice).pub"), "\(made)")
        func publicKeys() throws -> [Substring] {
            try [".key", ".pub"].map { try String(contentsOfFile: alice + $0, encoding: .utf8).split(separator: "\n").first { $0.hasPrefix("public-key") } ?? "" }
        }
        let first = try publicKeys()
        let again = try await runCommand(switchboardExecutable(), ["keygen", "--out", alice])
        #expect(again.status == 64 && again.stderr.contains("\(alice).key exists; use --force to replace it"), "\(again)")
        #expect(again.stderr.contains("Usage: switchboard keygen [--out <out>] [--force]"), "keygen's usage, not switchboard's: \(again)")
        #expect(try publicKeys() == first)
        let replaced = try await runCommand(switchboardExecutable(), ["keygen", "--out", alice, "--force"])
        let second = try publicKeys()
        #expect(replaced.status == 0 && second != first && second[0] == second[1], "\(replaced)")
        // A public key that cannot be put in place (a folder has its name) leaves the pair
        // that was there, and no file of the attempt beside it.
        let bob = folder.appendingPathComponent("keys/bob").path
        #expect(try await runCommand(switchboardExecutable(), ["keygen", "--out", bob]).status == 0)
        let bobsSecret = try String(contentsOfFile: bob + ".key", encoding: .utf8)
        try FileManager.default.removeItem(atPath: bob + ".pub")
        try FileManager.default.createDirectory(atPath: bob + ".pub/in-the-way", withIntermediateDirectories: true)
        let blockedPublic = try await runCommand(switchboardExecutable(), ["keygen", "--out", bob, "--force"])
        #expect(blockedPublic.status == 73 && blockedPublic.stderr.contains("\(bob).pub cannot be written: Is a directory"), "\(blockedPublic)")
        #expect(try String(contentsOfFile: bob + ".key", encoding: .utf8) == bobsSecret)
        #expect(try FileManager.default.contentsOfDirectory(atPath: folder.appendingPathComponent("keys").path).sorted() == ["alice.key", "alice.pub", "bob.key", "bob.pub"])
        for name in ["", folder.path + "/"] {
            let noFile = try await runCommand(switchboardExecutable(), ["keygen", "--out", name])
            #expect(noFile.status == 64 && noFile.stderr.contains("names no file"), "\(name): \(noFile)")
        }
        // Where a folder should be, a file: the system's reason, not Foundation's error dump.
        let notAFolder = folder.appendingPathComponent("file")
        try Data("x".utf8).write(to: notAFolder)
        let under = notAFolder.appendingPathComponent("more")
        let blocked = try await runCommand(switchboardExecutable(), ["keygen", "--out", under.appendingPathComponent("bob").path])
        #expect(blocked.status == 73 && blocked.stderr == "switchboard keygen: \(under.path) cannot be made: Not a directory\n", "\(blocked)")
        let keysDir = notAFolder.appendingPathComponent("keys").path
        let up = try await runCommand(switchboardExecutable(), ["up"], environment: ["SWITCHBOARD_SECURITY_KEYS_DIR": keysDir])
        #expect(up.status == 73 && up.stderr.contains("security.keys_dir: cannot make the CURVE keys: \(keysDir) cannot be made: Not a directory"), "\(up)")
        #expect(!up.stderr.contains("Domain"), "\(up)")
    }
}

@Suite("switchboard up with CURVE, and sb's key options", .serialized)
struct SecuredUpTests {
    @Test("up with CURVE on: sb with an allowed key is served, without keys or with an unknown key it is not")
    func securedBus() async throws {
        let folder = try temporaryDirectory("up-curve")
        // The kernel's public key starts with "-=", which parsers read as a flag (CI once drew
        // such a key): `sb --server-key KEY` must still take it.
        var kernelPair = try CurveKeyPair.generate()
        while !kernelPair.publicKey.hasPrefix("-=") { kernelPair = try CurveKeyPair.generate() }
        try CurveKeyFile.secretFile(kernelPair).write(to: folder.appendingPathComponent("kernel.key"), atomically: true, encoding: .utf8)
        try CurveKeyFile.publicFile(kernelPair).write(to: folder.appendingPathComponent("kernel.pub"), atomically: true, encoding: .utf8)
        for name in ["services", "alice", "mallory"] {
            let result = try await runCommand(switchboardExecutable(), ["keygen", "--out", folder.appendingPathComponent(name).path])
            #expect(result.status == 0, "\(result)")
        }
        func publicKey(_ name: String) throws -> String {
            let text = try String(contentsOf: folder.appendingPathComponent("\(name).pub"), encoding: .utf8)
            return try #require(text.split(separator: "\n").first { $0.hasPrefix("public-key = ") }).dropFirst("public-key = ".count).description
        }
        let attributes = try FileManager.default.attributesOfItem(atPath: folder.appendingPathComponent("alice.key").path)
        #expect((attributes[.posixPermissions] as? Int) == 0o600, "secret key files are private")
        let (config, broker) = try writeDeploymentConfig(in: folder, services: echoOnly, security: """
            curve: true
              kernel_secret_key_file: \(folder.appendingPathComponent("kernel.key").path)
              server_key: "\(try publicKey("kernel"))"
              secret_key_file: \(folder.appendingPathComponent("services.key").path)
              worker_keys: ["\(try publicKey("services"))"]
              client_keys: ["\(try publicKey("alice"))"]
            """)
        let up = try ChildProcess(switchboardExecutable(), ["up", "--config", config.path])
        defer { up.stop() }
        try await up.waitForOutput(containing: "Stop with Ctrl-C", within: 60)
        #expect(up.outputSoFar.contains("SB_SERVER_KEY='\(try publicKey("kernel"))' SB_KEY_FILE=YOUR.key; sb services"))

        let keyed = ["--endpoint", broker, "--server-key", try publicKey("kernel")]
        let alice = try await runCommand(sbExecutable(), ["request", "echo", "echo", #"{"hi":1}"#, "--key-file", folder.appendingPathComponent("alice.key").path] + keyed)
        #expect(alice.status == 0 && alice.stdout.contains(#""hi""#), "\(alice)")
        let mallory = try await runCommand(sbExecutable(), ["ping", "--timeout", "1s", "--key-file", folder.appendingPathComponent("mallory.key").path] + keyed)
        #expect(mallory.status == 69 && mallory.stderr.contains("no kernel answers")
                && mallory.stderr.contains("refused this client's handshake") && mallory.stderr.contains("(the kernel there does not allow this client's key"), "\(mallory)")
        // Alice's own key given as the server's: the kernel cannot read the handshake, and says nothing.
        let wrongServer = try await runCommand(sbExecutable(), ["ping", "--timeout", "1s", "--endpoint", broker, "--server-key", try publicKey("alice"),
                                                                "--key-file", folder.appendingPathComponent("alice.key").path])
        #expect(wrongServer.status == 69 && wrongServer.stderr.contains("the server key is not that kernel's"), "\(wrongServer)")
        let plain = try await runCommand(sbExecutable(), ["ping", "--timeout", "1s", "--endpoint", broker])
        #expect(plain.status == 69 && plain.stderr.contains("this client spoke plain text"), "\(plain)")
        let publicOnly = try await runCommand(sbExecutable(), ["ping", "--key-file", folder.appendingPathComponent("alice.pub").path] + keyed)
        #expect(publicOnly.status == 64 && publicOnly.stderr.contains("holds no secret key"), "\(publicOnly)")
        // A "key file" that never ends is read no further than a key file could be long.
        let endless = try await runCommand(sbExecutable(), ["ping", "--key-file", "/dev/zero"] + keyed)
        #expect(endless.status == 64 && endless.stderr.contains("--key-file: cannot read /dev/zero: it holds more than the limit of 65536 bytes"), "\(endless)")
        let stats = try await runCommand(sbExecutable(), ["stats", "--prometheus", "--key-file", folder.appendingPathComponent("alice.key").path] + keyed)
        #expect(stats.status == 0 && stats.stdout.contains("switchboard_refused_connections_total"), "\(stats)")
        #expect(!stats.stdout.contains("switchboard_refused_connections_total 0\n"), "mallory and the plain client were refused")

        up.signal(SIGTERM)
        #expect(await up.exit(within: 30))
        #expect(up.terminationStatus == 0)
    }

    @Test("up --single-process: the kernel and the services in one process, reachable over TCP")
    func singleProcess() async throws {
        let folder = try temporaryDirectory("up-single")
        let (config, broker) = try writeDeploymentConfig(in: folder)
        let up = try ChildProcess(switchboardExecutable(), ["up", "--single-process", "--config", config.path])
        defer { up.stop() }
        try await up.waitForOutput(containing: "Switchboard is up in one process", within: 120)
        let keyed = ["SB_KEY_DIR": busKeyFolder(in: folder).path]
        let result = try await runCommand(sbExecutable(), ["countries", "par", "--json", "--endpoint", broker], environment: keyed)
        #expect(result.status == 0 && result.stdout.contains("Paraguay"), "\(result)")
        let services = try await runCommand(sbExecutable(), ["request", "kernel", "services.list", "--endpoint", broker], environment: keyed)
        for name in ["echo", "store", "streams", "fetcher", "search", "pricing"] { #expect(services.stdout.contains("\"\(name)\"")) }
        // A second one on the same configuration (its gateway off: a gateway's address taken is
        // refused before anything starts) finds the kernel's port taken, and says which setting names it.
        let second = try await runCommand(switchboardExecutable(), ["up", "--single-process", "--config", config.path],
                                          environment: ["SWITCHBOARD_GATEWAY_ENABLED": "false"])
        #expect(second.status == 1 && second.stderr.contains("another program listens there") && second.stderr.contains("(kernel.broker)"), "\(second)")
        up.signal(SIGTERM)
        #expect(await up.exit(within: 30))
        #expect(up.terminationStatus == 0, "\(up.readOutput().suffix(1_500))")
    }
}
