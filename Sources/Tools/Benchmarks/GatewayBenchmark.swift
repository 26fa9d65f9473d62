import ArgumentParser
import AsyncHTTPClient
import BusKit
import BusProtocol
import Foundation
import NIOCore
import SwitchboardTestSupport

/// The gateway's fan-out: many Server-Sent Event streams on one `switchboard gateway`
/// process, fed by one kernel subscription. Events delivered per second across all
/// streams, and the gateway's memory (its own process, so nothing else is counted).
struct GatewayBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "gateway",
        abstract: "Event streams on one gateway: events/s delivered to N SSE clients, and the gateway's memory."
    )

    @Option(help: "SSE clients held open at once.")
    var clients = 500
    @Option(help: "State updates written while they listen.")
    var updates = 2_000
    @Option(help: "The switchboard executable (default: beside this one).")
    var switchboard: String?

    func run() async throws { printTable(try await measure()) }

    func measure() async throws -> [Row] {
        let executable = switchboard ?? URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("switchboard").path
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw ValidationError("no switchboard executable at \(executable); build it (swift build -c release --product switchboard) or pass --switchboard")
        }
        let kernel = try await TestKernel.start { $0.subscriberBacklog = 1_000_000 }
        defer { Task { await kernel.stop() } }
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("sb-bench-gateway-\(getpid())")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let port = freePort()
        let config = folder.appendingPathComponent("gateway.yaml")
        try """
            log_level: warning
            kernel: {broker: \(kernel.endpoints.broker), snapshot: \(kernel.endpoints.snapshot), publisher: \(kernel.endpoints.publisher), collector: \(kernel.endpoints.collector)}
            services: {echo: {enabled: false}, store: {enabled: false}, fetcher: {enabled: false}, search: {enabled: false}, pricing: {enabled: false}, streams: {enabled: false}}
            security: {curve: false}
            gateway: {listen: 127.0.0.1:\(port), prefixes: [/bench/], history: \(max(updates, 1_000))}
            """.write(to: config, atomically: true, encoding: .utf8)
        let gateway = try ChildProcess(URL(fileURLWithPath: executable), ["gateway", "--config", config.path])
        defer { gateway.stop() }

        var configuration = HTTPClient.Configuration()
        configuration.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: clients + 8)
        let http = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
        do {
            let rows = try await measure(gateway, http: http, port: port, kernel: kernel)
            try await http.shutdown()
            return rows
        } catch {
            try? await http.shutdown()
            throw error
        }
    }

    private func measure(_ gateway: ChildProcess, http: HTTPClient, port: Int, kernel: TestKernel) async throws -> [Row] {
        let base = "http://127.0.0.1:\(port)"
        let deadline = Date().addingTimeInterval(30)
        while (try? await http.execute(HTTPClientRequest(url: "\(base)/healthz"), timeout: .seconds(1)).status) != .ok {
            guard Date() < deadline, gateway.isRunning else { throw ValidationError("the gateway did not start") }
            try await Task.sleep(for: .milliseconds(50))
        }
        let idle = Memory.residentBytes(of: "\(gateway.pid)")
        progress("Gateway benchmark: \(clients) SSE clients on one gateway process, \(updates) updates, \(ProcessInfo.processInfo.activeProcessorCount) cores")

        // Every client opens its stream and reads it to the `synced` marker, then counts updates.
        let (ready, readySink) = AsyncStream<Void>.makeStream()
        let readers = (0..<clients).map { _ in
            Task { () -> Int in
                let response = try await http.execute(HTTPClientRequest(url: "\(base)/events?prefix=/bench/"), timeout: .seconds(600))
                var counter = EventCounter()
                var synced = false
                for try await chunk in response.body {
                    counter.feed(chunk)
                    if !synced, counter.synced > 0 {
                        synced = true
                        readySink.yield()
                    }
                    if counter.updates >= updates { break }
                }
                return counter.updates
            }
        }
        var opened = 0
        for await _ in ready {
            opened += 1
            if opened == clients { break }
        }
        let connected = Memory.residentBytes(of: "\(gateway.pid)")

        let writer = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(60))
        defer { Task { await writer.close() } }
        let publisher = StatePublisher(client: writer)
        let started = DispatchTime.now().uptimeNanoseconds
        for batch in stride(from: 0, to: updates, by: 500) {
            let entries = (batch..<min(batch + 500, updates)).map { i -> (key: String, value: JSONValue?) in
                ("/bench/k\(i % 100)", ["n": .int(Int64(i))])
            }
            for outcome in await publisher.set(many: entries) { _ = try outcome.get() }
        }
        var delivered = 0
        for reader in readers { delivered += try await reader.value }
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - started) / 1e9
        let peak = Memory.peakBytes(of: "\(gateway.pid)")
        // The gateway trims its heap once a second: what it keeps once the burst is over.
        try await Task.sleep(for: .milliseconds(2_500))
        let settled = Memory.residentBytes(of: "\(gateway.pid)")
        let mib = { (bytes: Int) in String(format: "%.1f MiB", Double(bytes) / 1_048_576) }
        return [
            Row("\(clients) SSE clients, \(updates) updates each: events delivered", rate: Double(delivered) / seconds,
                note: "\(delivered) events in \(String(format: "%.2f", seconds)) s, 0 lost"),
            Row("gateway memory (RSS)", note: "idle \(mib(idle)), \(clients) streams open \(mib(connected)), peak \(mib(peak)), 2.5 s after the burst \(mib(settled))"),
        ]
    }
}

/// Counts `event: update` and `event: synced` lines in a byte stream cut anywhere.
struct EventCounter {
    var updates = 0
    var synced = 0
    private var line: [UInt8] = []

    mutating func feed(_ chunk: ByteBuffer) {
        for byte in chunk.readableBytesView {
            if byte == UInt8(ascii: "\n") {
                if line.elementsEqual("event: update".utf8) { updates += 1 } else if line.elementsEqual("event: synced".utf8) { synced += 1 }
                line.removeAll(keepingCapacity: true)
            } else if line.count < 32 {
                line.append(byte)
            }
        }
    }
}
