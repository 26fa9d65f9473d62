import ArgumentParser
import BusKit
import Catalog
import FetcherService
import Foundation
import Kernel
import SwitchboardTestSupport
import ZeroMQ

/// The fetcher: time to fetch, decode and publish each dataset from a local HTTP server,
/// and a generated items file of about 100 MB (a million records): throughput and peak memory.
struct FetcherBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fetcher",
        abstract: "Fetch, decode and publish each dataset; a 100 MB items file: MB/s and peak memory."
    )

    @Option(help: "Rounds per dataset; the median is reported.")
    var runs = 5
    @Option(help: "Records in the generated items file (pretty-printed, about 100 bytes each).")
    var records = 1_000_000

    func run() async throws { printTable(try await measure()) }

    /// The figures, as table rows.
    func measure() async throws -> [Row] {
        let server = try await LocalServer.start()
        // An in-process kernel on free loopback ports.
        let kernel = try await TestKernel.start()
        let endpoints = kernel.endpoints
        let client = try await BusClient(brokers: [endpoints.broker], timeout: .seconds(60))
        let publisher = StatePublisher(client: client)

        progress("Fetcher benchmark: local HTTP server (Python, 127.0.0.1), kernel in-process, \(ProcessInfo.processInfo.activeProcessorCount) cores, median of \(runs) runs")
        var rows: [Row] = []
        for dataset in Dataset.allCases {
            var times: [Double] = []
            for _ in 0..<runs {
                // A new fetcher each run, so every run downloads in full (no 304).
                let fetcher = FetcherService(configuration: sources([dataset: server.url("/ok/\(dataset.bundledFileName)")]), environment: [:],
                                             client: client, publisher: publisher)
                let start = monotonicNanoseconds()
                await fetcher.refresh(dataset)
                times.append(Double(monotonicNanoseconds() - start) / 1e6)
                await fetcher.finish()
            }
            let size = try dataset.bundledData().count
            rows.append(Row("\(dataset) (\(size / 1024) KiB)", note: String(format: "%.1f ms fetch + decode + publish", median(times))))
        }

        // The large file: decode alone, then the whole refresh with the peak memory it took.
        progress("generating and fetching an items file of \(records) records")
        let bytes = generatedItems(records: records)
        try Data(bytes).write(to: server.folder.appendingPathComponent("big-items.json"))
        let big = server.url("/ok/big-items.json")
        var decodeTimes: [Double] = []
        var decoded = 0
        for _ in 0..<3 {
            let start = monotonicNanoseconds()
            decoded = try Dataset.items.decode(bytes).content.count
            decodeTimes.append(Double(monotonicNanoseconds() - start) / 1e9)
        }
        let megabytesOfFile = Double(bytes.count) / 1e6
        rows.append(Row("decode items, \(String(format: "%.0f", megabytesOfFile)) MB, \(decoded) records",
                        note: String(format: "%.0f MB/s (%.2f s)", megabytesOfFile / median(decodeTimes), median(decodeTimes))))

        var source = FetcherConfiguration.Source(url: big, timeout: .seconds(120), maxBytes: 512 * 1_048_576)
        source.refreshInterval = .seconds(3_600)
        var configuration2 = sources([:])
        configuration2.sources[.items] = source
        let fetcher = FetcherService(configuration: configuration2, environment: [:], client: client, publisher: publisher)
        let baseline = Memory.residentBytes()
        Memory.resetPeak()
        let start = monotonicNanoseconds()
        await fetcher.refresh(.items)
        let seconds = Double(monotonicNanoseconds() - start) / 1e9
        let peak = Memory.peakBytes() - baseline
        rows.append(Row("fetch + decode + publish items, \(String(format: "%.0f", megabytesOfFile)) MB", note: String(
            format: "%.0f MB/s (%.2f s), peak memory +%.0f MB = %.1fx the file", megabytesOfFile / seconds, seconds,
            Double(peak) / 1e6, Double(peak) / Double(bytes.count))))
        await fetcher.finish()
        await client.close()
        await kernel.stop()
        await server.stop()
        try? FileManager.default.removeItem(at: server.folder)
        return rows
    }

    /// A hiring list of `records` entries, pretty-printed as many APIs serve JSON, every
    /// fourth name null and every fourth empty, like the real one.
    private func generatedItems(records: Int) -> [UInt8] {
        var bytes: [UInt8] = Array("[\n".utf8)
        bytes.reserveCapacity(records * 95)
        for index in 0..<records {
            let name = switch index % 4 { case 0: "null"; case 1: "\"\""; default: "\"Item \(index)\"" }
            if index > 0 { bytes.append(contentsOf: ",\n".utf8) }
            bytes.append(contentsOf: "        {\n            \"id\": \(index),\n            \"listId\": \(index % 4 + 1),\n            \"name\": \(name)\n        }".utf8)
        }
        bytes.append(contentsOf: "\n]\n".utf8)
        return bytes
    }

    private func sources(_ urls: [Dataset: URL]) -> FetcherConfiguration {
        var configuration = FetcherConfiguration(sources: [:])
        for dataset in Dataset.allCases {
            configuration.sources[dataset] = .init(url: urls[dataset], refreshInterval: .seconds(3_600), timeout: .seconds(30))
        }
        configuration.attempts = 1
        return configuration
    }
}

/// Tests/Interop/http_fixture_server.py (run from the package folder) over the bundled files.
enum LocalServer {
    static func start() async throws -> FixtureHTTPServer {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("sb-bench-fetcher-\(getpid())")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        try writeBundledCopies(to: folder)
        return try await FixtureHTTPServer.start(script: URL(fileURLWithPath: "Tests/Interop/http_fixture_server.py"), serving: folder)
    }
}

/// A process's memory (this one by default), from /proc (Linux).
enum Memory {
    static func residentBytes(of process: String = "self") -> Int { field("VmRSS:", process) }
    static func peakBytes(of process: String = "self") -> Int { field("VmHWM:", process) }
    /// Makes the peak start again from the current resident size.
    static func resetPeak() { try? "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8) }

    private static func field(_ name: String, _ process: String) -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(process)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix(name) }),
              let kilobytes = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") else { return 0 }
        return kilobytes * 1024
    }
}
