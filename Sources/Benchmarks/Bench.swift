import ArgumentParser
import Foundation

/// Benchmarks that print figures. Build in release mode:
/// `swift run -c release switchboard-bench zmq`.
@main
struct SwitchboardBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "switchboard-bench",
        abstract: "Measure Switchboard's layers and print the figures.",
        subcommands: [ZeroMQBenchmark.self, KernelBenchmark.self, StoreBenchmark.self, FetcherBenchmark.self, SearchBenchmark.self, JSONBenchmark.self]
    )
}

/// Writes a line to standard output at once (unbuffered), so figures appear as they
/// are measured, also when piped to a file.
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// Writes a progress line to standard error.
func progress(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}
