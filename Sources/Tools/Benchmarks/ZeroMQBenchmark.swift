import ArgumentParser
import BusBench
import Foundation
import Histogram
import SwitchboardTestSupport
import ZeroMQ

/// Raw libzmq sockets driven from one thread against the same sockets reached through the
/// SocketLoop bridge from async code: 64-byte messages to an echo peer over TCP loopback.
struct ZeroMQBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "zmq",
        abstract: "Raw sockets against the SocketLoop bridge (round trips and pipelining)."
    )

    @Option(help: "Synchronous round trips per measurement.")
    var roundTrips = 50_000

    @Option(help: "Messages per pipelined measurement.")
    var messages = 500_000

    @Option(help: "Requests in flight when pipelining.")
    var window = 1_000

    @Option(help: "Message size in bytes.")
    var size = 64

    @Option(help: "Rounds of measurements; the median round is reported.")
    var runs = 3

    func run() async throws { printTable(try await measure()) }

    /// The figures, as table rows.
    func measure() async throws -> [Row] {
        let echo = try EchoPeer()
        defer { echo.stop() }
        let payload = Frame([UInt8](repeating: 0xAB, count: size))
        progress("ZeroMQ \(ZMQLibrary.versionString), \(size)-byte messages over \(echo.endpoint), \(ProcessInfo.processInfo.activeProcessorCount) cores")

        // Every measurement once per round, rounds interleaved, then the median round of
        // each: a disturbance on the machine hits raw and bridge alike.
        var rawSync: [(Double, Histogram<UInt64>)] = [], rawPipe: [Double] = []
        var bridgeSync: [(Double, Histogram<UInt64>)] = [], bridgePipe: [Double] = []
        for round in 1...runs {
            progress("round \(round) of \(runs)")
            rawSync.append(try rawRoundTrips(echo.endpoint, payload))
            rawPipe.append(try rawPipelined(echo.endpoint, payload))
            bridgeSync.append(try await bridgeRoundTrips(echo.endpoint, payload))
            bridgePipe.append(try await bridgePipelined(echo.endpoint, payload))
        }
        let raw = medianByP50(rawSync), rawRate = median(rawPipe)
        var rows = [
            Row("raw round trip (1 thread)", rate: raw.0, latencies: raw.1),
            Row("raw pipelined (window \(window))", rate: rawRate),
        ]
        let sync = medianByP50(bridgeSync), pipelined = median(bridgePipe)
        let ratio = Double(sync.1.valueAtPercentile(50)) / Double(raw.1.valueAtPercentile(50))
        rows.append(Row("bridge round trip (LoopSocket, a task on the global pool)", rate: sync.0, latencies: sync.1,
                        note: String(format: "p50 %.2fx raw", ratio)))
        rows.append(Row("bridge pipelined (LoopSocket)", rate: pipelined,
                        note: String(format: "%.0f%% of raw", pipelined / rawRate * 100)))
        return rows
    }

    // MARK: Raw sockets, one thread

    private func rawRoundTrips(_ endpoint: String, _ payload: Frame) throws -> (Double, Histogram<UInt64>) {
        let context = try ZMQContext()
        let socket = try ZMQSocket(context, .dealer)
        try socket.set(.receiveTimeout, 10_000) // a lost reply fails the run instead of hanging it
        try socket.connect(endpoint)
        for _ in 0..<1_000 { try socket.send([payload]); _ = try socket.receive() }
        var latencies = latencyHistogram()
        let start = monotonicNanoseconds()
        for _ in 0..<roundTrips {
            let sent = monotonicNanoseconds()
            try socket.send([payload])
            _ = try socket.receive()
            _ = latencies.record(monotonicNanoseconds() - sent)
        }
        let rate = Double(roundTrips) / (Double(monotonicNanoseconds() - start) / 1e9)
        return (rate, latencies)
    }

    private func rawPipelined(_ endpoint: String, _ payload: Frame) throws -> Double {
        let context = try ZMQContext()
        let socket = try ZMQSocket(context, .dealer)
        try socket.set(.receiveTimeout, 10_000) // a lost reply fails the run instead of hanging it
        try socket.connect(endpoint)
        try socket.send([payload]); _ = try socket.receive()
        let message: Message = [payload]
        let start = monotonicNanoseconds()
        var sent = 0, received = 0
        while received < messages {
            while sent < messages && sent - received < window {
                try socket.send(message)
                sent += 1
            }
            _ = try socket.receive()
            received += 1
        }
        return Double(messages) / (Double(monotonicNanoseconds() - start) / 1e9)
    }

    // MARK: Through the bridge, from async code

    private func bridgeRoundTrips(_ endpoint: String, _ payload: Frame) async throws -> (Double, Histogram<UInt64>) {
        let loop = try SocketLoop(context: try ZMQContext(), name: "bench-loop")
        let dealer = try await LoopSocket.open(.dealer, on: loop) { try $0.connect(endpoint) }
        let message: Message = [payload]
        for _ in 0..<1_000 { try dealer.send(message); _ = try await dealer.receive() }
        var latencies = latencyHistogram()
        let start = monotonicNanoseconds()
        for _ in 0..<roundTrips {
            let sent = monotonicNanoseconds()
            try dealer.send(message)
            _ = try await dealer.receive()
            _ = latencies.record(monotonicNanoseconds() - sent)
        }
        let rate = Double(roundTrips) / (Double(monotonicNanoseconds() - start) / 1e9)
        await loop.shutdown()
        return (rate, latencies)
    }

    private func bridgePipelined(_ endpoint: String, _ payload: Frame) async throws -> Double {
        let loop = try SocketLoop(context: try ZMQContext(), name: "bench-loop")
        let dealer = try await LoopSocket.open(.dealer, on: loop) { try $0.connect(endpoint) }
        let message: Message = [payload]
        try dealer.send(message); _ = try await dealer.receive()
        let start = monotonicNanoseconds()
        var sent = 0, received = 0
        while received < messages {
            while sent < messages && sent - received < window {
                try dealer.send(message)
                sent += 1
            }
            _ = try await dealer.receive()
            received += 1
        }
        let rate = Double(messages) / (Double(monotonicNanoseconds() - start) / 1e9)
        await loop.shutdown()
        return rate
    }
}

/// A ROUTER on its own thread and context that sends every message straight back.
final class EchoPeer: @unchecked Sendable {
    let context: ZMQContext
    let endpoint: String
    private let thread: Thread

    init(endpoint requested: String = "tcp://127.0.0.1:*") throws {
        context = try ZMQContext()
        let socket = try ZMQSocket(context, .router)
        // A plain ROUTER drops replies when the peer's pipe is full; mandatory makes it
        // wait instead, so pipelined runs never lose a message.
        try socket.set(.routerMandatory, true)
        try socket.set(.sendHighWaterMark, 100_000)
        try socket.set(.receiveHighWaterMark, 100_000)
        endpoint = try socket.bind(requested)
        // The socket moves to the echo thread once, before anything else touches it.
        nonisolated(unsafe) let owned = socket
        thread = Thread {
            while true {
                guard let message = try? owned.receive() else { break }
                do { try owned.send(message) } catch let error as ZMQError { if error.isTerminated { break } } catch { break }
            }
            owned.close()
        }
        thread.start()
    }

    func stop() { context.shutdown() }
}
