import BusProtocol
import Foundation
import SwitchboardTestSupport
import Testing

/// Two cells on three machines (network namespaces on one switch), their directory and one
/// state in the three-member etcd that spans them: cell a's kernel on the first, cell b's
/// kernel and the echo service on the second, etcd on all three.
@Suite(.serialized, .enabled(if: NetworkNamespaces.available && TestEtcd.available, "skipped: needs root, network namespaces and etcd-server"))
struct CellPartitionTests {
    /// Cell `name`'s kernel on host `index`: quick heartbeats (a silent cell is dropped after
    /// a second), requests wait 5 s for a worker, its record's lease is 2 s; the state in etcd.
    static func configuration(_ hosts: SwitchedHosts, _ index: Int, cell name: String, etcd: TestEtcd) -> String {
        let address = hosts.addresses[index]
        return """
            kernel:
              broker: tcp://\(address):5555
              snapshot: tcp://\(address):5556
              publisher: tcp://\(address):5557
              collector: tcp://\(address):5558
              heartbeat_ms: 200
              liveness: 5
              queue_timeout_ms: 5000
              cell:
                name: \(name)
                etcd:
                  endpoints: [\(etcd.clientURLs.joined(separator: ", "))]
                  lease_seconds: 2
              state:
                backend: etcd
                etcd:
                  endpoints: [\(etcd.clientURLs.joined(separator: ", "))]
            """
    }

    @Test("a client of cell a is answered by cell b's worker, in one answer, in parts and as every worker of the bus, and with a request that takes seconds to cross a slow link, and sees the state written through b; b's kernel killed with requests in flight: they are answered once it is back; b's machine cut off: a's client gets -32001 within a's queue timeout, never a hang; joined again: served again, nothing restarted",
          .timeLimit(.minutes(3)))
    func cutAndHealed() async throws {
        let hosts = try SwitchedHosts.make(count: 3)
        defer { hosts.remove() }
        let etcd = try await TestEtcd.start(on: (0..<3).map { (hosts.hosts[$0], hosts.addresses[$0]) })
        defer { etcd.stop() }
        let folder = try temporaryDirectory("cell-partition")
        var processes: [ChildProcess] = []
        defer { for process in processes { process.stop() } }
        for (index, name) in ["a", "b"].enumerated() {
            let config = folder.appendingPathComponent("\(name).yaml")
            try Self.configuration(hosts, index, cell: name, etcd: etcd).write(to: config, atomically: true, encoding: .utf8)
            processes.append(try hosts.start(on: index, switchboardExecutable(), ["kernel", "--config", config.path]))
            try await processes[index].waitForOutput(containing: "this cell is in the directory", within: 60)
        }
        processes.append(try hosts.start(on: 1, switchboardExecutable(), [
            "serve", "echo", "--config", folder.appendingPathComponent("b.yaml").path, "--connections", "1", "--heartbeat-ms", "200"]))
        let a = processes[0]
        try await a.waitForOutput(containing: "another cell offers a service", within: 30)
        /// `sb` on cell `index`'s machine (a's by default), asking that cell's kernel.
        @Sendable func sb(_ arguments: [String], on index: Int = 0) async throws -> CommandResult {
            try await hosts.run(on: index, sbExecutable(), arguments + ["--endpoint", hosts.broker(index), "--timeout", "10s"], seconds: 30)
        }
        let count = try await sb(["request", "echo", "count", #"{"n":7}"#])
        #expect(count.status == 0 && count.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "7", "\(count)\n\(a.outputSoFar)")
        let parts = try await sb(["request", "echo", "numbers", #"{"n":3}"#, "--stream"])
        #expect(parts.status == 0 && parts.stdout.split(separator: "\n").prefix(3) == [#"{"part":1}"#, #"{"part":2}"#, #"{"part":3}"#], "\(parts)")
        let everyWorker = try await sb(["request", "echo", "whoami", "--all"])
        #expect(everyWorker.status == 0 && everyWorker.stdout.contains(#""cell":"b","result""#) && everyWorker.stdout.contains(#""answered":1"#), "\(everyWorker)")

        // A large request handed to cell b over a slow link: 1 MB from a's kernel at 2 Mbit/s,
        // four seconds on the way against the cells' one second of heartbeats. b's link to a
        // hears no heartbeat meanwhile, but bytes: it keeps its offer, and the request arrives.
        // Only what a's broker sends b is slowed (etcd's traffic is not): the switch's port to
        // b sends it in a class of its own.
        try NetworkNamespaces.limit(["match", "ip", "src", "\(hosts.addresses[0])/32", "match", "ip", "sport", "5555", "0xffff"],
                                    on: hosts.ports[1], in: hosts.switchHost, rate: "2mbit")
        let script = folder.appendingPathComponent("large.jsonl")
        try #"{"service":"echo","method":"echo","params":{"a":"\#(String(repeating: "x", count: 1_000_000))"}}"#
            .write(to: script, atomically: true, encoding: .utf8)
        let large = try await sb(["run", script.path])
        #expect(large.status == 0 && large.stdout.utf8.count > 1_000_000, "\(large.status) \(large.stderr)")
        #expect(!processes[1].outputSoFar.contains("went silent"), "\(processes[1].outputSoFar)")
        try NetworkNamespaces.tc(["-n", hosts.switchHost, "qdisc", "del", "dev", hosts.ports[1], "root"])

        // One state: written through cell b, seen by a subscriber of cell a.
        let written = try await sb(["publish", "/client/written-in-b", #""hello""#], on: 1)
        #expect(written.status == 0, "\(written)")
        let seen = try await sb(["subscribe", "/client/", "--count", "1"])
        #expect(seen.status == 0 && seen.stdout.contains("/client/written-in-b") && seen.stdout.contains("hello"), "\(seen)")

        // Cell b's kernel killed with three requests in flight there: a hands them to b again
        // once b's kernel is back (started again, as `switchboard up` would) and its worker
        // registered with it, and each is answered.
        let slow = (1...3).map { _ in Task { try await sb(["request", "echo", "sleep", #"{"ms":1000}"#]) } }
        try await eventually(20, "three requests in flight at cell b's echo worker") {
            let listed = try JSONValue(parsing: Array(try await sb(["request", "kernel", "services.list"], on: 1).stdout.utf8))
            return listed["services"]?.arrayValue?.first { $0["name"] == "echo" }?["inFlight"] == 3
        }
        processes[1].signal(SIGKILL)
        processes.append(try hosts.start(on: 1, switchboardExecutable(), ["kernel", "--config", folder.appendingPathComponent("b.yaml").path]))
        for request in slow {
            let answered = try await request.value
            #expect(answered.status == 0, "\(answered)\n\(a.outputSoFar)")
        }

        // Cell b's machine cut off: told, well before the client's own 10 s.
        try hosts.setPort(1, up: false)
        let offers = a.outputSoFar.components(separatedBy: "another cell offers a service").count
        let asked = ContinuousClock.now
        let cut = try await sb(["request", "echo", "count", #"{"n":1}"#])
        let waited = ContinuousClock.now - asked
        #expect(cut.status == 69 && cut.stderr.contains("Service unavailable: no worker for 'echo' within 5 s"), "\(cut)")
        #expect(waited < .seconds(9), "answered after \(waited): a's queue timeout is 5 s, counted from when a took the request; a silent cell is dropped after 1 s")

        // Joined again: b offers echo again by itself.
        try hosts.setPort(1, up: true)
        _ = try await a.waitForOutput("cell b offering echo again", within: 60) {
            $0.components(separatedBy: "another cell offers a service").count > offers
        }
        let again = try await sb(["request", "echo", "count", #"{"n":9}"#])
        #expect(again.status == 0 && again.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "9", "\(again)\n\(a.outputSoFar)")
    }
}
