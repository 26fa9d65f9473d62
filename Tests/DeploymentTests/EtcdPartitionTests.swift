import BusProtocol
import Foundation
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// A state key through `sb kv` on one host: `get`, `put`, and `create` or `update` for
/// compare-and-set, each a process of its own, as a script would call them.
private struct CommandLineRegister: RegisterClient {
    let hosts: SwitchedHosts
    let host: Int
    let endpoints: String
    let key: String

    func perform(_ call: RegisterOperation.Call) async -> RegisterOperation.Answer {
        let verb: [String] = switch call {
        case .read: ["get", key]
        case .write(let value): ["put", key, "\"\(value)\""]
        case .compareAndSet(0, let value): ["create", key, "\"\(value)\""]
        case .compareAndSet(let expected, let value): ["update", key, "\"\(value)\"", "\(expected)"]
        }
        guard let result = try? await hosts.run(on: host, sbExecutable(), ["kv"] + verb + ["--endpoint", endpoints, "--timeout", "3s", "--json"], seconds: 20)
        else { return .unknown }
        if result.status == 0, let answer = try? JSONValue(parsing: Array(result.stdout.utf8)),
           let revision = answer["revision"]?.intValue.map({ UInt64(clamping: $0) }) {
            if case .read = call { return .read(answer["value"]?.stringValue, sequence: revision) }
            return .written(sequence: revision)
        }
        if case .read = call, result.status == 1, result.stderr.contains("no key") { return .read(nil, sequence: 0) }
        // A compare-and-set refused names the key's revision: "-32004 ... revision N".
        if result.stderr.contains("\(JSONRPCError.conflictCode)"), let revision = Self.revision(in: result.stderr) {
            return .conflict(sequence: revision)
        }
        return .unknown
    }

    /// The number after the last "revision" in `text`.
    static func revision(in text: String) -> UInt64? {
        guard let range = text.range(of: "revision", options: .backwards) else { return nil }
        return UInt64(text[range.upperBound...].drop { !$0.isNumber }.prefix { $0.isNumber })
    }

    func close() async {}
}

/// The state on a three-member etcd and two kernels on it, in network namespaces: the active
/// kernel's host cut off from the rest while clients on both sides read and write.
@Suite(.serialized, .enabled(if: NetworkNamespaces.available && TestEtcd.available, "skipped: needs root, network namespaces and etcd-server"))
struct EtcdPartitionTests {
    static let key = "/client/register"

    /// The kernel on host `index`: its state in the etcd on all three hosts, a lease of 2 s
    /// (the takeover after a cut waits for it).
    fileprivate static func configuration(_ hosts: SwitchedHosts, _ index: Int, etcd: TestEtcd) -> String {
        let address = hosts.addresses[index]
        return """
            kernel:
              broker: tcp://\(address):5555
              snapshot: tcp://\(address):5556
              publisher: tcp://\(address):5557
              collector: tcp://\(address):5558
              state:
                backend: etcd
                etcd:
                  endpoints: [\(etcd.clientURLs.joined(separator: ", "))]
                  lease_seconds: 2
            """
    }

    @Test("the active kernel's host cut off from etcd's majority and the other kernel while clients on both sides read, write and compare-and-set: the other kernel takes over once the cut-off one's lease ran out, the cut-off one stops serving the state before that, every acknowledged write is in etcd, and the clients' history is linearizable",
          .timeLimit(.minutes(5)))
    func activeKernelCutOff() async throws {
        let hosts = try SwitchedHosts.make(count: 3)
        defer { hosts.remove() }
        let etcd = try await TestEtcd.start(on: (0..<3).map { (hosts.hosts[$0], hosts.addresses[$0]) })
        defer { etcd.stop() }
        let folder = try temporaryDirectory("etcd-partition")
        var kernels: [ChildProcess] = []
        defer { for kernel in kernels { kernel.stop() } }
        for index in 0..<2 {
            let config = folder.appendingPathComponent("kernel\(index).yaml")
            try Self.configuration(hosts, index, etcd: etcd).write(to: config, atomically: true, encoding: .utf8)
            kernels.append(try hosts.start(on: index, switchboardExecutable(), ["kernel", "--config", config.path]))
            // The first serves; the second waits for the election.
            try await kernels[index].waitForOutput(containing: index == 0 ? "kernel started" : "another kernel writes this state", within: 60)
        }
        let endpoints = hosts.broker(0) + "," + hosts.broker(1)
        let createdAt = monotonicNanoseconds()
        let created = try await hosts.run(on: 2, sbExecutable(), ["kv", "put", Self.key, #""start""#, "--endpoint", endpoints, "--json"])
        try #require(created.status == 0, "\(created)\nkernel 0:\n\(kernels[0].outputSoFar)\nkernel 1:\n\(kernels[1].outputSoFar)")
        let start = RegisterOperation(client: 3, call: .write("start"), answer: .written(sequence: try #require(UInt64(exactly: JSONValue(parsing: Array(created.stdout.utf8))["revision"]?.intValue ?? -1))),
                                      called: createdAt, answered: monotonicNanoseconds())

        // Client 0 on the cut-off host, clients 1 and 2 on the third (etcd's majority
        // without the cut-off host); client 2 cuts the first host off before its call 8
        // (counting from 0) and joins it again before its call 32.
        let clientHosts = [0, 2, 2]
        let operations = try await registerWorkload(clients: 3, operations: 45, connect: { client in
            CommandLineRegister(hosts: hosts, host: clientHosts[client], endpoints: endpoints, key: Self.key)
        }, before: { client, n in
            guard client == 2 else { return }
            if n == 8 { try hosts.setPort(0, up: false) }
            if n == 32 { try hosts.setPort(0, up: true) }
        })

        // The cut-off kernel stopped serving once its lease may have run out, the other took
        // over, and the first, back, found its election gone.
        try await kernels[0].waitForOutput(containing: "it serves the state no more", within: 30)
        try await kernels[1].waitForOutput(containing: "kernel started", within: 30)
        try await kernels[0].waitForOutput(containing: "no longer writes the state", within: 30)
        let written = operations.compactMap { operation -> (sequence: UInt64, value: String)? in
            switch (operation.call, operation.answer) {
            case (.write(let value), .written(let sequence)), (.compareAndSet(_, let value), .written(let sequence)): (sequence, value)
            default: nil
            }
        }
        let fromMajority = operations.filter { $0.client != 0 && $0.answer != .unknown }.count
        #expect(fromMajority >= 70, "the clients beside etcd's majority were answered throughout, but for the takeover: \(fromMajority) of 90")
        #expect(Set(written.map(\.sequence)).count == written.count, "no two acknowledged writes share a sequence: \(written)")

        // Every acknowledged write is in etcd: the key at each write's revision holds its value
        // (a sequence is its etcd revision times 1,000 plus its place in the transaction).
        for write in written {
            let revision = write.sequence / 1_000
            let read = try await hosts.run(on: 2, URL(fileURLWithPath: "/usr/bin/etcdctl"), [
                "--endpoints", etcd.clientURLs[2], "get", "/switchboard/state" + Self.key, "--rev", "\(revision)", "--print-value-only"])
            #expect(read.status == 0 && read.stdout.contains("\"\(write.value)\""), "acknowledged \(write) not in etcd at revision \(revision): \(read)")
        }
        // And the history, with a last read through whichever kernel is active, is linearizable.
        let called = monotonicNanoseconds()
        let read = try await hosts.run(on: 2, sbExecutable(), ["kv", "get", Self.key, "--endpoint", endpoints, "--timeout", "5s", "--json"])
        let answered = monotonicNanoseconds()
        try #require(read.status == 0, "\(read)\nkernel 0:\n\(kernels[0].outputSoFar)\nkernel 1:\n\(kernels[1].outputSoFar)")
        let last = try JSONValue(parsing: Array(read.stdout.utf8))
        let history = [start] + operations + [RegisterOperation(client: 3, call: .read, answer: .read(last["value"]?.stringValue, sequence: UInt64(clamping: last["revision"]?.intValue ?? 0)),
                                                      called: called, answered: answered)]
        #expect(isLinearizable(history), "\(history.sorted { $0.called < $1.called })")
    }
}
