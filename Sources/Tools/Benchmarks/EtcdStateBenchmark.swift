import ArgumentParser
import BusBench
import BusKit
import BusProtocol
import Contracts
import Etcd
import Foundation
import Histogram
import Kernel
import SwitchboardTestSupport
import ZeroMQ

/// The kernel's state on etcd (`kernel.state.backend: etcd`) against what the same etcd takes
/// from a client of its own, in the same run: acknowledged writes at the same concurrency, and
/// the collector's lossy writes to one subscriber (batched into transactions).
struct EtcdStateBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "etcd",
        abstract: "State writes through a kernel on etcd against etcd's own client; collector updates to a subscriber on etcd."
    )

    @Option(help: "Seconds each measurement runs.")
    var seconds = 3.0
    @Option(help: "Writes in flight at once (each waits for its answer).")
    var inFlight = 32
    @Option(help: "KVSETs the collector rows send.")
    var updates = 100_000

    func run() async throws { printTable(try await measure()) }

    func measure() async throws -> [Row] {
        guard TestEtcd.available else {
            progress("etcd is not installed (Debian's etcd-server): the etcd rows are left out")
            return []
        }
        let cluster = try await TestEtcd.start()
        defer { cluster.stop() }
        progress("etcd benchmark: one etcd member (its data in a temporary folder, fsync on), \(inFlight) writes in flight, 64-byte values, \(seconds) s per row")
        let value = [UInt8](repeating: UInt8(ascii: "A"), count: 64)

        // etcd's own client: the same writes, each a put of its own.
        let etcd = try EtcdClient(endpoints: cluster.clientURLs)
        let direct = try await measureRate(lanes: inFlight, seconds: seconds) { lane, _ in
            try await etcd.put(Array("/bench/direct/\(lane)".utf8), value)
        }
        await etcd.close()

        var settings = EtcdStateSettings(endpoints: cluster.clientURLs)
        settings.prefix = "/bench/state"
        let kernel = try await TestKernel.start { $0.stateEtcd = settings }
        let loop = try SocketLoop(context: ZMQContext(), name: "bench-clients")
        var clients: [BusClient] = []
        for _ in 0..<4 { clients.append(try await BusClient(brokers: [kernel.endpoints.broker], loop: loop, timeout: .seconds(30))) }
        let json = JSONValue.string(String(decoding: value, as: UTF8.self))
        let lanes = clients
        let throughKernel = try await measureRate(lanes: inFlight, seconds: seconds) { lane, _ in
            _ = try await lanes[lane % lanes.count].call(KernelAPI.stateSet, .init(key: "/bench/\(lane)", value: json))
        }
        for client in clients { await client.close() }
        await loop.shutdown()
        let collector = try await fanOut(kernel)
        await kernel.stop()

        let memory = try await TestKernel.start()
        let inMemory = try await fanOut(memory)
        await memory.stop()

        return [
            Row("etcd's own client: put, \(inFlight) in flight", rate: direct.rate, latencies: direct.latencies, note: "each put its own transaction"),
            Row("kernel on etcd: state.set, \(inFlight) in flight", rate: throughKernel.rate, latencies: throughKernel.latencies,
                note: String(format: "%.2fx etcd's own client", throughKernel.rate / direct.rate)),
            Row("kernel on etcd: collector -> 1 subscriber", rate: collector.rate,
                note: String(format: "%.2fx the kernel in memory; %d of %d dropped", collector.rate / inMemory.rate, collector.missing, updates)),
            Row("kernel in memory: collector -> 1 subscriber", rate: inMemory.rate, note: "\(inMemory.missing) of \(updates) dropped"),
        ]
    }

    /// `updates` KVSETs from the C publisher to the C subscriber (`zmq-baseline chp-pub` and
    /// `chp-sub`) through `kernel`'s collector and publisher: the rate the subscriber saw
    /// them at, and how many never came.
    private func fanOut(_ kernel: TestKernel) async throws -> (rate: Double, missing: Int) {
        let baseline = productsDirectory().appendingPathComponent("zmq-baseline")
        let prefix = "/client/bench/", updates = String(updates)
        return try await withThrowingTaskGroup(of: (rate: Double, missing: Int)?.self) { group in
            group.addTask {
                let result = try await runCommand(baseline, ["chp-sub", kernel.endpoints.publisher, prefix, updates], seconds: 180)
                let figures = result.stdout.split(separator: " ").compactMap { Double($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
                guard result.status == 0, figures.count == 3 else { throw ValidationError("chp-sub: \(result)") }
                return (figures[0], Int(figures[2]))
            }
            group.addTask {
                let result = try await runCommand(baseline, ["chp-pub", kernel.endpoints.collector, prefix, updates], seconds: 180)
                guard result.status == 0 else { throw ValidationError("chp-pub: \(result)") }
                return nil
            }
            var figures: (rate: Double, missing: Int)?
            for try await result in group where result != nil { figures = result }
            return figures!
        }
    }
}
