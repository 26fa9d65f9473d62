import ArgumentParser
import BusKit
import Contracts
import EchoService
import Foundation
import Histogram
import Kernel
import SwitchboardTestSupport
import ZeroMQ

/// What cells cost and what they add (docs/CELLS.md), each against one cell in the same run.
/// A request that crosses to another cell against the same request in one cell: two kernels
/// on one etcd, the echo service in cell b only, the same clients asking b's kernel, then a's.
/// Two cells serving one service together against one cell alone: ``together()``. Each
/// row's ratio is to the one-cell row above it.
struct CellsBenchmark: AsyncParsableCommand {
    typealias Measured = (rate: Double, latencies: Histogram<UInt64>)
    /// A rate of C clients, with the cores each cell's processes and the clients used meanwhile.
    typealias Load = (rate: Double, cellCores: [Double], clientCores: Double)

    static let configuration = CommandConfiguration(
        commandName: "cells",
        abstract: "Echo requests across two cells against the same in one cell (p50 one at a time, pipelined rate); two cells serving one service against one."
    )

    @Option(help: "Seconds each measurement runs.")
    var seconds = 3.0
    @Option(help: "Requests in flight for the pipelined rows.")
    var inFlight = 64
    @Option(help: "The share of one core each cell's processes may use in the rows of two cells together (a control group's quota; needs root).")
    var cellCores = 0.5
    @Option(help: "Requests each C client sends in the rows of two cells together.")
    var requests = 200_000
    @Option(help: "Rounds of the rows of two cells together, one cell and two alternating; the median is reported.")
    var runs = 3

    func validate() throws {
        guard cellCores > 0.05, cellCores <= 1 else { throw ValidationError("--cell-cores: expected a share of one core, 0.05 to 1") }
    }

    func run() async throws { printTable(try await measure()) }

    func measure() async throws -> [Row] {
        guard TestEtcd.available else {
            progress("etcd is not installed (Debian's etcd-server): the cells rows are left out")
            return []
        }
        let cluster = try await TestEtcd.start()
        defer { cluster.stop() }
        progress("cells benchmark: two kernels on one etcd, echo in cell b, \(inFlight) in flight for the pipelined rows, \(seconds) s per row")
        var settings = EtcdStateSettings(endpoints: cluster.clientURLs)
        settings.prefix = "/bench/cells"
        let a = try await TestKernel.start { $0.cell = CellConfiguration(name: "a", etcd: settings) }
        let b = try await TestKernel.start { $0.cell = CellConfiguration(name: "b", etcd: settings) }
        let host = try ServiceHost(service: EchoService(), options: .init(brokers: [b.endpoints.broker]))
        try await host.start()

        /// One request at a time, then `inFlight` at once, from a client of the kernel at `broker`.
        func measured(through broker: String) async throws -> (one: Measured, pipelined: Measured) {
            let loop = try SocketLoop(context: ZMQContext(), name: "bench-cells")
            let client = try await BusClient(brokers: [broker], loop: loop, timeout: .seconds(30))
            // Until the other cell's offer is there (the directory is read at start).
            while !(try await client.hasWorkers(EchoAPI.service)) { try await Task.sleep(for: .milliseconds(50)) }
            let params = EchoAPI.Count(n: 7)
            let one = try await measureRate(lanes: 1, seconds: seconds) { _, _ in _ = try await client.call(EchoAPI.count, params) }
            let pipelined = try await measureRate(lanes: inFlight, seconds: seconds) { _, _ in _ = try await client.call(EchoAPI.count, params) }
            await client.close()
            await loop.shutdown()
            return (one, pipelined)
        }
        let local = try await measured(through: b.endpoints.broker)
        let crossing = try await measured(through: a.endpoints.broker)
        await host.stop()
        await a.stop()
        await b.stop()
        let together = try await together()
        let p50 = Double(crossing.one.latencies.valueAtPercentile(50)) / Double(max(1, local.one.latencies.valueAtPercentile(50)))
        return [
            Row("one cell: one at a time", rate: local.one.rate, latencies: local.one.latencies),
            Row("across cells: one at a time", rate: crossing.one.rate, latencies: crossing.one.latencies, note: String(format: "p50 %.2fx one cell's", p50)),
            Row("one cell: \(inFlight) in flight", rate: local.pipelined.rate, latencies: local.pipelined.latencies),
            Row("across cells: \(inFlight) in flight", rate: crossing.pipelined.rate, latencies: crossing.pipelined.latencies,
                note: String(format: "%.2fx one cell's rate", crossing.pipelined.rate / local.pipelined.rate)),
        ] + together
    }

    /// Two cells serving one service together against one cell alone, as on three machines:
    /// network namespaces on one switch (``SwitchedHosts``), a host for each cell and one for
    /// the etcd member and the load. Each cell is a kernel process and a C window worker of
    /// the service, confined to a CPU of its own and to `cellCores` of it (``CPUBudget``), so
    /// that the cells, not the load, are what is measured: the C clients are not confined and
    /// have the rest of the machine. One C client asks each cell's kernel, whose own worker
    /// answers (a cell prefers its own workers): one cell is cell a with its client, two cells
    /// both with theirs, at once.
    private func together() async throws -> [Row] {
        if let why = CPUBudget.unavailable {
            progress("two cells together: left out, \(why)")
            return []
        }
        guard NetworkNamespaces.available else {
            progress("two cells together: left out, network namespaces cannot be made here (ip netns add failed)")
            return []
        }
        guard ProcessInfo.processInfo.activeProcessorCount >= 2 else {
            progress("two cells together: left out, a CPU for each cell needs two")
            return []
        }
        let baseline = productsDirectory().appendingPathComponent("zmq-baseline")
        guard FileManager.default.isExecutableFile(atPath: baseline.path) else {
            throw ValidationError("no zmq-baseline at \(baseline.path): swift build --product zmq-baseline")
        }
        progress("cells benchmark: two cells together in network namespaces, each on a CPU of its own with \(cellCores) of it, \(runs) rounds of \(requests) requests a client")
        let hosts = try SwitchedHosts.make(count: 3)
        let loadHost = 2
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("switchboard-bench-cells-\(getpid())")
        var etcd: TestEtcd?
        var cells: [(broker: String, budget: CPUBudget, processes: [ChildProcess])] = []
        defer {
            for cell in cells { for process in cell.processes { process.stop(grace: 2) } }
            for cell in cells { cell.budget.remove() }
            etcd?.stop()
            hosts.remove()
            try? FileManager.default.removeItem(at: folder)
        }
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        let cluster = try await TestEtcd.start(on: [(hosts.hosts[loadHost], hosts.addresses[loadHost])])
        etcd = cluster
        for (cpu, name) in ["a", "b"].enumerated() {
            let budget = try CPUBudget(name: "switchboard-bench-cell-\(name)-\(getpid())", cpu: cpu, cores: cellCores)
            cells.append((hosts.broker(cpu), budget, []))
            let address = hosts.addresses[cpu]
            let configuration = folder.appendingPathComponent("cell-\(name).yaml")
            try """
            kernel:
              broker: tcp://\(address):5555
              snapshot: tcp://\(address):5556
              publisher: tcp://\(address):5557
              collector: tcp://\(address):5558
              cell:
                name: \(name)
                etcd:
                  endpoints: [\(cluster.clientURLs.joined(separator: ", "))]
            """.write(to: configuration, atomically: true, encoding: .utf8)
            // At info its log says when the worker registered, and nothing for each request.
            let kernel = try hosts.start(on: cpu, switchboardExecutable(), ["kernel", "--config", configuration.path, "--log-level", "info"])
            cells[cpu].processes.append(kernel)
            try budget.add(kernel.pid)
            _ = try await kernel.waitForOutput(containing: "this cell is in the directory")
            let worker = try hosts.start(on: cpu, baseline, ["mdp-worker", hosts.broker(cpu), "window", "1", "1000"])
            cells[cpu].processes.append(worker)
            try budget.add(worker.pid)
            // Until the kernel has its worker: the clients' requests would otherwise wait in its queue.
            _ = try await kernel.waitForOutput("its worker registered") { output in
                output.split(separator: "\n").contains { $0.contains("worker registered") && $0.contains("service=window") }
            }
        }

        /// C clients asking `brokers` at once, one each.
        func rate(_ brokers: [String]) async throws -> Load {
            let cellsBefore = cells.map { cell in cell.processes.compactMap { cpuSeconds(of: $0.pid) }.reduce(0, +) }
            let clientsBefore = childrenCPUSeconds()
            let clock = ContinuousClock(), start = clock.now
            try await withThrowingTaskGroup(of: Void.self) { group in
                for broker in brokers {
                    let arguments = ["mdp-client", broker, "window", "1", String(requests), "500"]
                    group.addTask {
                        let result = try await hosts.run(on: loadHost, baseline, arguments, seconds: 300)
                        guard result.status == 0 else { throw ValidationError("zmq-baseline \(arguments.joined(separator: " ")): \(result)") }
                    }
                }
                try await group.waitForAll()
            }
            let elapsed = start.duration(to: clock.now)
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
            let cellsAfter = cells.map { cell in cell.processes.compactMap { cpuSeconds(of: $0.pid) }.reduce(0, +) }
            return (Double(requests * brokers.count) / seconds,
                    zip(cellsBefore, cellsAfter).map { ($1 - $0) / seconds },
                    (childrenCPUSeconds() - clientsBefore) / seconds)
        }
        var one: [Load] = [], two: [Load] = []
        for _ in 0..<runs {
            one.append(try await rate([cells[0].broker]))
            two.append(try await rate(cells.map(\.broker)))
        }
        let oneCell = one.sorted { $0.rate < $1.rate }[(runs - 1) / 2], twoCells = two.sorted { $0.rate < $1.rate }[(runs - 1) / 2]
        func used(_ run: Load, cells count: Int) -> String {
            let cellsUsed = run.cellCores.prefix(count).map { String(format: "%.2f", $0) }.joined(separator: " and ")
            return "cores used: cell\(count == 1 ? "" : "s") \(cellsUsed) of \(cellCores) each, C client\(count == 1 ? "" : "s") " + String(format: "%.2f", run.clientCores)
        }
        return [
            Row("one cell, a CPU's \(cellCores)", rate: oneCell.rate, note: "kernel and C window worker on a host of its own; a C client on another, window 500; " + used(oneCell, cells: 1)),
            Row("two cells together, a CPU's \(cellCores) each", rate: twoCells.rate,
                note: String(format: "%.2fx one cell; a C client each; ", twoCells.rate / oneCell.rate) + used(twoCells, cells: 2)),
        ]
    }
}
