import ArgumentParser
import BusBench
import Foundation
import Histogram
import ZeroMQ

/// Benchmarks that print figures. Build in release mode:
/// `swift run -c release switchboard-bench zmq`.
@main
struct SwitchboardBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "switchboard-bench",
        abstract: "Measure Switchboard's layers and print the figures.",
        subcommands: [AllBenchmarks.self, ZeroMQBenchmark.self, KernelBenchmark.self, EtcdStateBenchmark.self, CellsBenchmark.self, StoreBenchmark.self, DurableStreamsBenchmark.self, FetcherBenchmark.self, SearchBenchmark.self, JSONBenchmark.self, GatewayBenchmark.self, StreamBenchmark.self, SocketLayerFloorCommand.self]
    )
}

/// Every benchmark with its default settings, one after the other, in one table.
struct AllBenchmarks: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "all",
        abstract: "Run every benchmark with its defaults and print one table (a few minutes).")

    func run() async throws {
        let started = Date()
        var rows: [Row] = []
        func section(_ name: String, _ measured: [Row]) {
            rows += measured.map { row in
                var row = row
                row.name = "\(name): \(row.name)"
                return row
            }
        }
        progress("switchboard-bench all: zmq, json, kernel, etcd, cells, store, streams, search, fetcher, gateway, stream (each with its defaults)")
        section("zmq", try await ZeroMQBenchmark.parse([]).measure())
        section("json", try JSONBenchmark.parse([]).measure())
        section("kernel", try await KernelBenchmark.parse([]).measure())
        section("etcd", try await EtcdStateBenchmark.parse([]).measure())
        section("cells", try await CellsBenchmark.parse([]).measure())
        section("store", try await StoreBenchmark.parse([]).measure())
        section("streams", try await DurableStreamsBenchmark.parse([]).measure())
        section("search", try await SearchBenchmark.parse([]).measure())
        section("fetcher", try await FetcherBenchmark.parse([]).measure())
        section("gateway", try await GatewayBenchmark.parse([]).measure())
        section("stream", try await StreamBenchmark.parse([]).measure())
        say("Switchboard benchmarks, \(Date().formatted(.iso8601.year().month().day())), \(machineDescription()), \(String(format: "%.0f", Date().timeIntervalSince(started))) s")
        printTable(rows)
    }
}

/// The machine the figures come from: cores, memory, CPU model, kernel.
func machineDescription() -> String {
    let cpu = (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8))?
        .split(separator: "\n").first { $0.hasPrefix("model name") }?
        .split(separator: ":", maxSplits: 1).last?.trimmingCharacters(in: .whitespaces) ?? "unknown CPU"
    let memory = ProcessInfo.processInfo.physicalMemory / 1_073_741_824
    return "\(ProcessInfo.processInfo.activeProcessorCount) cores (\(cpu)), \(memory) GiB, Linux \(ProcessInfo.processInfo.operatingSystemVersionString)"
}

/// Writes a line to standard output at once (unbuffered), so figures appear as they
/// are measured, also when piped to a file.
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// The user and system CPU time the process `pid` has used so far, from `/proc/PID/stat`
/// (Linux; nil elsewhere or once it ended).
func cpuSeconds(of pid: Int32) -> Double? {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")") else { return nil }
    // Fields after the command's closing parenthesis, from the third: utime is the 14th, stime the 15th.
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return nil }
    return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

/// The user and system CPU time of this process's children that ended so far (those
/// still running are not in it).
func childrenCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_CHILDREN.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6
}

/// Writes a progress line to standard error.
func progress(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}

/// Runs `operation` in a loop in `lanes` tasks at once for `seconds`: the total rate, and the
/// latency of every operation. `operation` is given its lane and how many it did before.
func measureRate(lanes: Int, seconds: Double,
                 _ operation: @escaping @Sendable (_ lane: Int, _ done: Int) async throws -> Void) async throws -> (rate: Double, latencies: Histogram<UInt64>) {
    let nanoseconds = UInt64(seconds * 1e9), start = monotonicNanoseconds()
    let results = try await withThrowingTaskGroup(of: (Int, Histogram<UInt64>).self) { group in
        for lane in 0..<lanes {
            group.addTask {
                var latencies = latencyHistogram(), done = 0
                while monotonicNanoseconds() - start < nanoseconds {
                    let sent = monotonicNanoseconds()
                    try await operation(lane, done)
                    _ = latencies.record(monotonicNanoseconds() - sent)
                    done += 1
                }
                return (done, latencies)
            }
        }
        var all: [(Int, Histogram<UInt64>)] = []
        for try await result in group { all.append(result) }
        return all
    }
    let elapsed = Double(monotonicNanoseconds() - start) / 1e9
    var latencies = latencyHistogram()
    for (_, histogram) in results { latencies.add(histogram) }
    return (Double(results.map(\.0).reduce(0, +)) / elapsed, latencies)
}
