import ArgumentParser
import BusKit
import Contracts
import EchoService
import Foundation
import Histogram
import Kernel
import SwitchboardTestSupport
import ZeroMQ

/// A request that crosses to another cell (docs/CELLS.md) against the same request in one
/// cell, in the same run: two kernels on one etcd, the echo service in cell b only, the same
/// clients asking b's kernel, then a's. Each row's ratio is to the one-cell row above it.
struct CellsBenchmark: AsyncParsableCommand {
    typealias Measured = (rate: Double, latencies: Histogram<UInt64>)

    static let configuration = CommandConfiguration(
        commandName: "cells",
        abstract: "Echo requests across two cells against the same in one cell: one at a time (p50) and pipelined (rate)."
    )

    @Option(help: "Seconds each measurement runs.")
    var seconds = 3.0
    @Option(help: "Requests in flight for the pipelined rows.")
    var inFlight = 64

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
        let p50 = Double(crossing.one.latencies.valueAtPercentile(50)) / Double(max(1, local.one.latencies.valueAtPercentile(50)))
        return [
            Row("one cell: one at a time", rate: local.one.rate, latencies: local.one.latencies),
            Row("across cells: one at a time", rate: crossing.one.rate, latencies: crossing.one.latencies, note: String(format: "p50 %.2fx one cell's", p50)),
            Row("one cell: \(inFlight) in flight", rate: local.pipelined.rate, latencies: local.pipelined.latencies),
            Row("across cells: \(inFlight) in flight", rate: crossing.pipelined.rate, latencies: crossing.pipelined.latencies,
                note: String(format: "%.2fx one cell's rate", crossing.pipelined.rate / local.pipelined.rate)),
        ]
    }
}
