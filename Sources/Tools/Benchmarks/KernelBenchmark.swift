import ArgumentParser
import BusBench
import BusKit
import BusProtocol
import Contracts
import EchoService
import Foundation
import Histogram
import Kernel
import Synchronization
import SwitchboardTestSupport
import ZeroMQ

/// The kernel under load: request round trips and pipelining through the Majordomo broker
/// against a direct round trip, and CHP updates from the collector to subscribers.
struct KernelBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kernel",
        abstract: "Round trips and pipelining through the kernel; CHP updates to subscribers."
    )

    @Option(help: "Synchronous round trips per measurement.")
    var roundTrips = 20_000
    @Option(help: "Requests per pipelined measurement (in all, shared by the clients).")
    var requests = 200_000
    @Option(help: "Requests in flight per client when pipelining.")
    var window = 500
    @Option(help: "Connections of the plain 7/MDP C echo worker (one request each).")
    var workerSockets = 64
    @Option(help: "Requests the window C echo worker holds at once on its one connection (the Switchboard extension).")
    var workerWindow = 1_000
    @Option(help: "CHP updates per measurement.")
    var updates = 500_000
    @Option(help: "Rounds of measurements; the median is reported.")
    var runs = 3
    @Option(help: "Transport for the kernel's endpoints: tcp (loopback) or ipc (Unix sockets in a temporary folder).")
    var transport = "tcp"

    /// The full stack's shape (``busKitRows(_:kernelPipelined:kernelShape:kernelManyOverOne:)``), which the C rows at the same shape repeat:
    /// requests in flight from one client, the host's worker connections and each one's window.
    static let fullStackInFlight = 64, fullStackConnections = 2, fullStackWindow = 16
    /// The host's window in the row at the pipelined window (`window` in flight, as NATS's
    /// pipelined row): deep enough that the service's window does not bound it first.
    static let deepWindow = 256
    /// Clients sharing those requests in flight in the many-clients rows, and each one's share.
    static let fullStackClients = 8
    static var fullStackInFlightEach: Int { fullStackInFlight / fullStackClients }

    func validate() throws {
        guard ["tcp", "ipc"].contains(transport) else { throw ValidationError("--transport must be tcp or ipc") }
    }

    /// An endpoint of the chosen transport with a name of its own.
    private func endpoint(_ name: String) -> String {
        transport == "tcp" ? "tcp://127.0.0.1:*" : "ipc://\(NSTemporaryDirectory())sb-bench-\(getpid())-\(name).ipc"
    }

    func run() async throws { printTable(try await measure()) }

    /// The figures, as table rows.
    func measure() async throws -> [Row] {
        var configuration = KernelConfiguration()
        configuration.brokerEndpoint = endpoint("broker")
        configuration.snapshotEndpoint = endpoint("snapshot")
        configuration.publisherEndpoint = endpoint("publisher")
        configuration.collectorEndpoint = endpoint("collector")
        configuration.queueTimeout = .seconds(60)
        let kernel = try Kernel(configuration: configuration, context: ZMQContext())
        let endpoints = try await kernel.start()
        // A single-connection worker for round trips (like the single-socket direct peer).
        let single = try RawEchoWorker(broker: endpoints.broker, service: "bench1", sockets: 1)
        let direct = try EchoPeer(endpoint: endpoint("direct"))
        let payload = Frame([UInt8](repeating: 0x5A, count: 64))
        progress("Kernel benchmark: 64-byte bodies over \(transport == "tcp" ? "tcp://127.0.0.1" : "ipc://"), \(ProcessInfo.processInfo.activeProcessorCount) cores")
        try await waitForWorkers(endpoints.broker, service: "bench1", count: 1)
        let metal = try await Metal.start(workerSockets: workerSockets, workerWindow: workerWindow)
        defer { metal.stop() }
        try await waitForWorkers(metal.kernelBroker, service: "window", count: 1)
        try await waitForWorkers(metal.kernelBroker, service: "plain", count: workerSockets)
        try await waitForWorkers(metal.kernelBroker, service: "shape", count: Self.fullStackConnections)

        // Round trips: direct, MMI and through the kernel once per round, rounds
        // interleaved, then the median round of each.
        var directRuns: [(Double, Histogram<UInt64>)] = [], mmiRuns = directRuns, kernelRuns = directRuns
        // Pipelined rates by path and client count, every path once per round.
        var rates: [Metal.Path: [Int: [Double]]] = [:]
        // The broker process's CPU time (user and system) per request in the same runs: a
        // cost the machine's other load disturbs far less than a rate.
        var cpu: [Metal.Path: [Int: [Double]]] = [:]
        // One C client sending one request at a time through the C 7/MDP broker and through
        // the kernel, to the same C window worker program.
        var syncRates: [Metal.Path: [Double]] = [:]
        // The broker process's CPU per round trip in the same runs: with one request at a time
        // the rate moves with the machine's scheduling far more than the work done does.
        var syncCPU: [Metal.Path: [Double]] = [:]
        for round in 1...runs {
            progress("round \(round) of \(runs)")
            directRuns.append(try directRoundTrips(direct.endpoint, payload))
            mmiRuns.append(try mmiRoundTrips(endpoints.broker))
            kernelRuns.append(try kernelRoundTrips(endpoints.broker, payload))
            for path in [Metal.Path.cMDP, .kernelWindow] {
                let measured = try await metal.rateAndCPU(path, clients: 1, requests: roundTrips, window: 1)
                syncRates[path, default: []].append(measured.rate)
                if let perRequest = measured.cpu { syncCPU[path, default: []].append(perRequest) }
            }
            for clients in [1, 8] {
                for path in Metal.Path.pipelined {
                    let measured = try await metal.rateAndCPU(path, clients: clients, requests: requests, window: window)
                    rates[path, default: [:]][clients, default: []].append(measured.rate)
                    if let perRequest = measured.cpu { cpu[path, default: [:]][clients, default: []].append(perRequest) }
                }
            }
            // The same in flight from one client, and shared by 8 clients (the C program runs each
            // on a thread of its own; the full stack's 8 BusClients share one socket thread).
            for path in [Metal.Path.cMDPFullStackShape, .kernelFullStackShape] {
                for clients in [1, Self.fullStackClients] {
                    let measured = try await metal.rateAndCPU(path, clients: clients, requests: requests / 2, window: Self.fullStackInFlight / clients)
                    rates[path, default: [:]][clients, default: []].append(measured.rate)
                    if let perRequest = measured.cpu { cpu[path, default: [:]][clients, default: []].append(perRequest) }
                }
            }
        }
        let directRT = medianByP50(directRuns), mmiRT = medianByP50(mmiRuns), kernelRT = medianByP50(kernelRuns)
        func versusDirect(_ run: (Double, Histogram<UInt64>)) -> String {
            String(format: "p50 %.2fx direct", Double(run.1.valueAtPercentile(50)) / Double(directRT.1.valueAtPercentile(50)))
        }
        var rows: [Row] = [
            Row("direct round trip (DEALER-ROUTER)", rate: directRT.0, latencies: directRT.1),
            Row("kernel MMI round trip (kernel answers)", rate: mmiRT.0, latencies: mmiRT.1, note: versusDirect(mmiRT)),
            Row("kernel round trip (MDP)", rate: kernelRT.0, latencies: kernelRT.1, note: versusDirect(kernelRT)),
        ]
        let syncMDP = median(syncRates[.cMDP]!), syncKernel = median(syncRates[.kernelWindow]!)
        func syncCPUNote(_ path: Metal.Path) -> String {
            syncCPU[path].map { String(format: "; CPU %.1f µs a round trip", median($0)) } ?? ""
        }
        rows.append(Row("C 7/MDP broker, synchronous, C client and worker", rate: syncMDP,
                        note: String(format: "mean round trip %.1f µs; one request at a time", 1e6 / syncMDP) + syncCPUNote(.cMDP)))
        rows.append(Row("kernel, synchronous, C client and worker", rate: syncKernel,
                        note: String(format: "mean round trip %.1f µs, %.2fx the C 7/MDP broker's", 1e6 / syncKernel, syncMDP / syncKernel)
                            + syncCPUNote(.kernelWindow)))
        for clients in [1, 8] {
            let plural = clients == 1 ? "" : "s"
            func rate(_ path: Metal.Path) -> Double { median(rates[path]![clients]!) }
            let raw = rate(.raw), mdp = rate(.cMDP)
            func ratios(_ value: Double) -> String { String(format: "%.2fx raw C, %.2fx C MDP", value / raw, value / mdp) }
            /// The broker process's CPU per request, median of the rounds.
            func cpuNote(_ path: Metal.Path) -> String {
                cpu[path]?[clients].map { String(format: "; CPU %.2f µs a request", median($0)) } ?? ""
            }
            rows.append(Row("raw libzmq C broker, pipelined, \(clients) client\(plural)", rate: raw,
                            note: "the metal: ROUTER-ROUTER, no protocol, C clients (window \(window) each) and worker"))
            rows.append(Row("C 7/MDP broker, pipelined, \(clients) client\(plural)", rate: mdp,
                            note: String(format: "%.2fx raw C; the kernel's frames in C, window worker", mdp / raw) + cpuNote(.cMDP)))
            rows.append(Row("kernel, C window worker, pipelined, \(clients) client\(plural)", rate: rate(.kernelWindow),
                            note: "\(ratios(rate(.kernelWindow))); switchboard kernel process, one connection, window \(workerWindow)\(cpuNote(.kernelWindow))"))
            rows.append(Row("kernel, plain MDP C worker, pipelined, \(clients) client\(plural)", rate: rate(.kernelPlain),
                            note: "\(ratios(rate(.kernelPlain))); \(workerSockets) connections, one request each"))
            rows.append(Row("the kernel's socket layer alone, pipelined, \(clients) client\(plural)", rate: rate(.floor),
                            note: "\(ratios(rate(.floor))); a Swift 7/MDP forwarder on SocketLoop with the kernel's codec, no bookkeeping: the kernel's floor\(cpuNote(.floor))"))
        }
        // The full stack's shape with C ends: what a client and a host that cost nothing would
        // leave of the kernel's pipelined rate, with only 64 requests in flight and 16 a connection.
        let kernelPipelined = median(rates[.kernelWindow]![1]!), cPipelined = median(rates[.cMDP]![1]!)
        let cShape = median(rates[.cMDPFullStackShape]![1]!), kernelShape = median(rates[.kernelFullStackShape]![1]!)
        func shapeCPU(_ path: Metal.Path) -> String {
            cpu[path]?[1].map { String(format: "; CPU %.2f µs a request", median($0)) } ?? ""
        }
        let shape = "C client \(Self.fullStackInFlight) in flight, C worker \(Self.fullStackConnections) connections x window \(Self.fullStackWindow)"
        rows.append(Row("C 7/MDP broker, the full stack's shape", rate: cShape,
                        note: String(format: "%.2fx its pipelined rate; ", cShape / cPipelined) + shape + shapeCPU(.cMDPFullStackShape)))
        rows.append(Row("kernel, the full stack's shape", rate: kernelShape,
                        note: String(format: "%.2fx the kernel's pipelined rate, %.2fx the C 7/MDP broker's at this shape; ", kernelShape / kernelPipelined, kernelShape / cShape)
                            + shape + shapeCPU(.kernelFullStackShape)))
        // The same in flight shared by 8 C clients, each on a thread of its own with blocking
        // receives: what 8 connections cost C, beside the full stack's 8 BusClients.
        let many = Self.fullStackClients, manyWindow = Self.fullStackInFlightEach
        let cMany = median(rates[.cMDPFullStackShape]![many]!), kernelMany = median(rates[.kernelFullStackShape]![many]!)
        rows.append(Row("C 7/MDP broker, the full stack's shape, \(many) C clients x \(manyWindow)", rate: cMany,
                        note: String(format: "%.2fx one C client's %d in flight; each C client a thread of its own, blocking receives", cMany / cShape, Self.fullStackInFlight)))
        rows.append(Row("kernel, the full stack's shape, \(many) C clients x \(manyWindow)", rate: kernelMany,
                        note: String(format: "%.2fx one C client's %d in flight; each C client a thread of its own, blocking receives", kernelMany / kernelShape, Self.fullStackInFlight)))
        // NATS beside the full stack: what a team would run instead (when Scripts/bench set it up).
        let nats = NATSAnchor.available
            ? try await NATSAnchor.measure(runs: runs, requests: requests, window: window, inFlight: Self.fullStackInFlight, roundTrips: roundTrips)
            : nil
        if let nats {
            rows.append(Row("nats-server, C requester and responder, pipelined", rate: nats.pipelined,
                            note: "the anchor: libnats (window \(window)), the better of answers sent at once and libnats's gathering flusher"))
            rows.append(Row("nats-server, C requester and responder, \(Self.fullStackInFlight) in flight", rate: nats.atFullStackShape,
                            note: "the full stack's shape from one client"))
            rows.append(Row("nats-server, C requester and responder, sync", rate: nats.sync,
                            note: String(format: "p50 %.1f µs; natsConnection_Request, one at a time", nats.syncP50Microseconds)))
        }
        rows.append(contentsOf: try await busKitRows(endpoints.broker, kernelPipelined: kernelPipelined, kernelShape: kernelShape,
                                                     kernelManyOverOne: kernelMany / kernelShape, nats: nats))
        // CHP: C publisher and subscribers, through a raw XSUB/XPUB proxy and through the
        // kernel, interleaved; a subscriber's rate is what it received per second.
        var fanOut: [Metal.FanOut: [Int: [(rate: Double, gaps: Int, missing: Int)]]] = [:]
        for _ in 0..<runs {
            for subscribers in [1, 10] {
                for path in Metal.FanOut.allCases {
                    fanOut[path, default: [:]][subscribers, default: []].append(try await metal.fanOut(path, subscribers: subscribers, updates: updates))
                }
            }
        }
        for subscribers in [1, 10] {
            let plural = subscribers == 1 ? "" : "s"
            let raw = median(fanOut[.raw]![subscribers]!.map(\.rate))
            let kernelRuns = fanOut[.kernel]![subscribers]!, kernelRate = median(kernelRuns.map(\.rate))
            let bareRate = median(fanOut[.kernelWithoutHistory]![subscribers]!.map(\.rate))
            /// A row for `path` beside the raw proxy and the kernel: its ratio to raw C, what it is, its gaps and losses.
            func besideRow(_ path: Metal.FanOut, _ title: String, _ what: String) -> Row {
                let runs = fanOut[path]![subscribers]!, rate = median(runs.map(\.rate))
                return Row(title, rate: rate, note: String(format: "%.2fx raw C; ", rate / raw)
                               + "\(what); \(runs.map(\.gaps).reduce(0, +)) gaps, \(runs.map(\.missing).reduce(0, +)) never came")
            }
            let oneRaw = median(fanOut[.raw]![1]!.map(\.rate)), oneKernel = median(fanOut[.kernel]![1]!.map(\.rate))
            rows.append(Row("raw libzmq C XSUB/XPUB proxy, \(subscribers) subscriber\(plural)", rate: raw,
                            note: String(format: "the metal: C PUB and SUBs, 5-frame updates; %.2fx one subscriber; %d never came",
                                         raw / oneRaw, fanOut[.raw]![subscribers]!.map(\.missing).reduce(0, +))))
            rows.append(Row("CHP collector to \(subscribers) subscriber\(plural)", rate: kernelRate,
                            note: String(format: "%.2fx raw C, %.2fx one subscriber, %.2fx without history; %d gaps, %d never came (dropped by the collector's PUB) in %d runs of %d updates",
                                         kernelRate / raw, kernelRate / oneKernel, kernelRate / bareRate, kernelRuns.map(\.gaps).reduce(0, +),
                                         kernelRuns.map(\.missing).reduce(0, +), runs, updates)))
            rows.append(besideRow(.kernelWithoutHistory, "CHP collector to \(subscribers) subscriber\(plural), history of 1 change",
                                  "kernel.state_history_changes 1: what revisions and history cost is the row above's ratio"))
            rows.append(besideRow(.floor, "the kernel's socket layer alone, CHP to \(subscribers) subscriber\(plural)",
                                  "a Swift republisher on SocketLoop, no state, history or quotas: the collector's floor"))
        }
        rows.append(contentsOf: try await historyMemory(metal))
        single.stop()
        direct.stop()
        await kernel.stop()
        // The process may end before libzmq unlinks its ipc:// files; remove them here.
        if transport == "ipc" {
            for name in ["broker", "snapshot", "publisher", "collector", "direct"] {
                try? FileManager.default.removeItem(atPath: String(endpoint(name).dropFirst("ipc://".count)))
            }
        }
        return rows
    }

    /// The kernel's memory with its history at its bounds: 20,000 acknowledged writes of 1 KiB
    /// values to 100 keys (the history holds 8 MiB of them), beside the kernel that keeps one
    /// change; resident MiB of each, before and after.
    private func historyMemory(_ metal: Metal) async throws -> [Row] {
        func resident(_ process: ChildProcess) -> Double {
            let status = (try? String(contentsOfFile: "/proc/\(process.pid)/status", encoding: .utf8)) ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
            return (Double(line.split(separator: " ").dropFirst().first ?? "") ?? 0) / 1024
        }
        let value = JSONValue.string(String(repeating: "v", count: 1_024))
        var rows: [Row] = []
        for (name, broker, process) in [("kernel", metal.kernelBroker, metal.kernel), ("kernel with a history of 1 change", metal.bareBroker, metal.bareKernel)] {
            let before = resident(process)
            let client = try await BusClient(brokers: [broker], timeout: .seconds(30))
            let started = ContinuousClock.now
            let writes = 20_000
            for n in 0..<writes { try await client.publish(key: "/client/history/k\(n % 100)", value: value) }
            let seconds = (ContinuousClock.now - started).seconds
            let stats = try await client.call(KernelAPI.stats)
            await client.close()
            let after = resident(process)
            rows.append(Row("history at its bounds: \(name)", rate: Double(writes) / seconds,
                            note: String(format: "acknowledged 1 KiB writes/s; resident %.1f MiB before, %.1f after; history %d changes, %.1f MiB",
                                         before, after, stats.state.history.changes, Double(stats.state.history.bytes) / 1_048_576)))
        }
        return rows
    }

    private func waitForWorkers(_ broker: String, service: String, count: Int) async throws {
        let bus = try await BusClient(brokers: [broker])
        defer { Task { await bus.close() } }
        for _ in 0..<500 {
            let list = try await bus.call(KernelAPI.servicesList)
            if list.services.first(where: { $0.name == service })?.workers == count { return }
            try await Task.sleep(for: .milliseconds(10))
        }
        throw ValidationError("the raw echo worker did not register")
    }

    // MARK: Round trips

    private func client(_ endpoint: String) throws -> (ZMQContext, ZMQSocket) {
        let context = try ZMQContext()
        let socket = try ZMQSocket(context, .dealer)
        try socket.set(.receiveTimeout, 10_000)
        try socket.set(.sendHighWaterMark, 0)
        try socket.set(.receiveHighWaterMark, 0)
        try socket.connect(endpoint)
        return (context, socket)
    }

    private func directRoundTrips(_ endpoint: String, _ payload: Frame) throws -> (Double, Histogram<UInt64>) {
        let (_, socket) = try client(endpoint)
        return try measureRoundTrips { try socket.send([payload]); _ = try socket.receive() }
    }

    private func kernelRoundTrips(_ broker: String, _ payload: Frame) throws -> (Double, Histogram<UInt64>) {
        let (_, socket) = try client(broker)
        let request = MDP.request(service: "bench1", body: [payload])
        return try measureRoundTrips { try socket.send(request); _ = try socket.receive() }
    }

    private func mmiRoundTrips(_ broker: String) throws -> (Double, Histogram<UInt64>) {
        let (_, socket) = try client(broker)
        let request = MDP.request(service: MMI.serviceQuery, body: ["bench"])
        return try measureRoundTrips { try socket.send(request); _ = try socket.receive() }
    }

    private func measureRoundTrips(_ roundTrip: () throws -> Void) throws -> (Double, Histogram<UInt64>) {
        for _ in 0..<1_000 { try roundTrip() }
        var latencies = latencyHistogram()
        let start = monotonicNanoseconds()
        for _ in 0..<roundTrips {
            let sent = monotonicNanoseconds()
            try roundTrip()
            _ = latencies.record(monotonicNanoseconds() - sent)
        }
        return (Double(roundTrips) / (Double(monotonicNanoseconds() - start) / 1e9), latencies)
    }

    // MARK: The metal

    /// Raw libzmq in C (`zmq-baseline`): a ROUTER-ROUTER broker with no protocol and an echo
    /// worker; a C broker moving exactly the kernel's 7/MDP frames; and `switchboard kernel`
    /// as its own process with a C echo worker offering a window (one connection) and a
    /// plain 7/MDP one (many connections); and the kernel's socket layer alone
    /// (`switchboard-bench socket-floor`, ``SocketLayerFloorCommand``) with a C window worker.
    /// The same C pipelining clients measure them all, in the same rounds as the rest.
    struct Metal {
        enum Path {
            case raw, cMDP, kernelWindow, kernelPlain, floor
            /// C client and worker at the full stack's shape (``fullStackInFlight`` and so on),
            /// through the C 7/MDP broker and through the kernel.
            case cMDPFullStackShape, kernelFullStackShape
            /// The paths measured at the pipelined window, 1 and 8 clients.
            static let pipelined: [Path] = [.raw, .cMDP, .kernelWindow, .kernelPlain, .floor]
        }
        /// Where CHP updates go: the raw proxy, the kernel, or a second kernel that keeps one
        /// change of history (the cost of revisions and history is the difference), or the
        /// socket layer's republisher (``SocketLayerFloorCommand``).
        enum FanOut: CaseIterable { case raw, kernel, kernelWithoutHistory, floor }
        let processes: [ChildProcess]
        let rawFront: String, mdpBroker: String, kernelBroker: String
        let proxyFront: String, proxyBack: String, kernelCollector: String, kernelPublisher: String
        let bareBroker: String, bareCollector: String, barePublisher: String
        let floorBroker: String, floorCollector: String, floorPublisher: String
        /// The C 7/MDP broker for ``Path/cMDPFullStackShape`` (its C broker serves one service).
        let shapeBroker: String
        /// The kernel processes, with and without history, and the socket layer's.
        var kernel: ChildProcess { processes[4] }
        var bareKernel: ChildProcess { processes[8] }
        var socketFloor: ChildProcess { processes[9] }

        static func start(workerSockets: Int, workerWindow: Int) async throws -> Metal {
            let baseline = productsDirectory().appendingPathComponent("zmq-baseline")
            guard FileManager.default.isExecutableFile(atPath: baseline.path) else {
                throw ValidationError("no zmq-baseline at \(baseline.path): swift build --product zmq-baseline")
            }
            let bench = productsDirectory().appendingPathComponent("switchboard-bench")
            let ports = (0..<17).map { _ in "tcp://127.0.0.1:\(freePort())" }
            // Each watches its standard input, a pipe this process holds: they end with it.
            let processes = [
                try ChildProcess(baseline, ["broker", ports[0], ports[1]]),
                try ChildProcess(baseline, ["worker", ports[1], "1"]),
                try ChildProcess(baseline, ["mdp-broker", ports[6], "window"]),
                try ChildProcess(baseline, ["mdp-worker", ports[6], "window", "1", String(workerWindow)]),
                try ChildProcess(switchboardExecutable(), ["kernel", "--log-level", "error", "--queue-timeout-ms", "60000", "--broker", ports[2],
                                                           "--snapshot", ports[3], "--publisher", ports[4], "--collector", ports[5]]),
                try ChildProcess(baseline, ["mdp-worker", ports[2], "window", "1", String(workerWindow)]),
                try ChildProcess(baseline, ["mdp-worker", ports[2], "plain", String(workerSockets)]),
                try ChildProcess(baseline, ["pubsub-proxy", ports[7], ports[8]]),
                try ChildProcess(switchboardExecutable(), ["kernel", "--log-level", "error", "--broker", ports[9], "--snapshot", ports[10],
                                                           "--publisher", ports[11], "--collector", ports[12]],
                                 environment: ["SWITCHBOARD_KERNEL_STATE_HISTORY_CHANGES": "1",
                                               "SWITCHBOARD_KERNEL_STATE_HISTORY_BYTES": "1"]),
                try ChildProcess(bench, ["socket-floor", "--broker", ports[13], "--collector", ports[14], "--publisher", ports[15]]),
                try ChildProcess(baseline, ["mdp-worker", ports[13], "window", "1", String(workerWindow)]),
                try ChildProcess(baseline, ["mdp-broker", ports[16], "shape"]),
                try ChildProcess(baseline, ["mdp-worker", ports[16], "shape", String(KernelBenchmark.fullStackConnections),
                                            String(KernelBenchmark.fullStackWindow)]),
                try ChildProcess(baseline, ["mdp-worker", ports[2], "shape", String(KernelBenchmark.fullStackConnections),
                                            String(KernelBenchmark.fullStackWindow)]),
            ]
            return Metal(processes: processes, rawFront: ports[0], mdpBroker: ports[6], kernelBroker: ports[2],
                         proxyFront: ports[7], proxyBack: ports[8], kernelCollector: ports[5], kernelPublisher: ports[4],
                         bareBroker: ports[9], bareCollector: ports[12], barePublisher: ports[11],
                         floorBroker: ports[13], floorCollector: ports[14], floorPublisher: ports[15], shapeBroker: ports[16])
        }

        /// The rate of `requests` (in all) from `clients` C clients through `path`, and the
        /// broker process's CPU per request in µs in the same run (nil when /proc cannot say).
        func rateAndCPU(_ path: Path, clients: Int, requests: Int, window: Int) async throws -> (rate: Double, cpu: Double?) {
            let before = brokerCPUSeconds(path)
            let rate = try await rate(path, clients: clients, requests: requests, window: window)
            guard let before, let after = brokerCPUSeconds(path) else { return (rate, nil) }
            return (rate, (after - before) / Double(requests) * 1e6)
        }

        /// The CPU time the process brokering `path` has used so far (``cpuSeconds(of:)``).
        private func brokerCPUSeconds(_ path: Path) -> Double? {
            let broker = switch path {
            case .raw: processes[0]
            case .cMDP: processes[2]
            case .cMDPFullStackShape: processes[11]
            case .kernelWindow, .kernelPlain, .kernelFullStackShape: kernel
            case .floor: socketFloor
            }
            return cpuSeconds(of: broker.pid)
        }

        func rate(_ path: Path, clients: Int, requests: Int, window: Int) async throws -> Double {
            let counts = [String(clients), String(requests), String(window)]
            switch path {
            case .raw: return try await rate(["client", rawFront] + counts)
            case .cMDP: return try await rate(["mdp-client", mdpBroker, "window"] + counts)
            case .kernelWindow: return try await rate(["mdp-client", kernelBroker, "window"] + counts)
            case .kernelPlain: return try await rate(["mdp-client", kernelBroker, "plain"] + counts)
            case .floor: return try await rate(["mdp-client", floorBroker, "window"] + counts)
            case .cMDPFullStackShape: return try await rate(["mdp-client", shapeBroker, "shape"] + counts)
            case .kernelFullStackShape: return try await rate(["mdp-client", kernelBroker, "shape"] + counts)
            }
        }

        /// `updates` KVSETs from a C publisher to `subscribers` C subscribers, through the
        /// kernel's collector and publisher or through the raw proxy: the slowest subscriber's
        /// rate, and the sequence gaps all of them saw.
        func fanOut(_ path: FanOut, subscribers: Int, updates: Int) async throws -> (rate: Double, gaps: Int, missing: Int) {
            // One prefix for every run: the same 1,000 keys, within the client quota however many runs.
            let prefix = "/client/bench/"
            let (publishTo, subscribeTo) = switch path {
            case .raw: (proxyFront, proxyBack)
            case .kernel: (kernelCollector, kernelPublisher)
            case .kernelWithoutHistory: (bareCollector, barePublisher)
            case .floor: (floorCollector, floorPublisher)
            }
            let baseline = productsDirectory().appendingPathComponent("zmq-baseline")
            return try await withThrowingTaskGroup(of: [Double]?.self) { group in
                for _ in 0..<subscribers {
                    group.addTask {
                        let result = try await runCommand(baseline, ["chp-sub", subscribeTo, prefix, String(updates)], seconds: 120)
                        guard result.status == 0 else { throw ValidationError("chp-sub: \(result)") }
                        return result.stdout.split(separator: " ").compactMap { Double($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
                    }
                }
                // The publisher waits half a second for the subscriptions before it sends.
                group.addTask {
                    let result = try await runCommand(baseline, ["chp-pub", publishTo, prefix, String(updates)], seconds: 120)
                    guard result.status == 0 else { throw ValidationError("chp-pub: \(result)") }
                    return nil
                }
                var rates: [Double] = [], gaps = 0, missing = 0
                for try await figures in group {
                    guard let figures else { continue }
                    guard figures.count == 3 else { throw ValidationError("chp-sub printed \(figures)") }
                    rates.append(figures[0])
                    gaps += Int(figures[1])
                    missing += Int(figures[2])
                }
                return (rates.min() ?? 0, gaps, missing)
            }
        }

        private func rate(_ arguments: [String]) async throws -> Double {
            let result = try await runCommand(productsDirectory().appendingPathComponent("zmq-baseline"), arguments, seconds: 120)
            guard result.status == 0, let rate = Double(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) else {
                throw ValidationError("zmq-baseline \(arguments.joined(separator: " ")): \(result)")
            }
            return rate
        }

        func stop() {
            for process in processes.reversed() { process.stop(grace: 2) }
        }
    }

    // MARK: The full stack: BusClient and a hosted service

    /// The same loads as `sb bench request` (``RequestBench``), against a kernel in this
    /// process: synchronous, 64 in flight from one client, and from 8 on one socket thread.
    /// `kernelPipelined`, `kernelShape`: the kernel's pipelined rate and its rate at the same
    /// shape with C ends; `kernelManyOverOne`: 8 C clients' rate at that shape over one's. For
    /// the ratios.
    private func busKitRows(_ broker: String, kernelPipelined: Double, kernelShape: Double, kernelManyOverOne: Double,
                            nats: NATSAnchor.Figures?) async throws -> [Row] {
        let host = try ServiceHost(service: EchoService(),
                                   options: .init(brokers: [broker], connections: Self.fullStackConnections, window: Self.fullStackWindow))
        try await host.start()
        let bus = try await BusClient(brokers: [broker], timeout: .seconds(30))
        try await waitForWorkers(broker, service: EchoAPI.service, count: Self.fullStackConnections)
        let sync = await RequestBench.echo(stop: .count(roundTrips / 2), warmup: 500).run(on: [bus])
        let pipelined = await RequestBench.echo(window: Self.fullStackInFlight, stop: .count(50_000), warmup: 500).run(on: [bus])
        // 8 connections sharing the first one's socket thread (as `sb bench --clients` runs them),
        // the same 64 in flight in all.
        let many = Self.fullStackClients, manyWindow = Self.fullStackInFlightEach
        var clients = [bus]
        for _ in 1..<many { clients.append(try await BusClient(brokers: [broker], loop: bus.loop, timeout: .seconds(30))) }
        let shared = await RequestBench.echo(window: manyWindow, stop: .count(50_000), warmup: 100).run(on: clients)
        for client in clients.dropFirst() { await client.close() }
        await host.stop()
        // At NATS's pipelined window, to a host whose window does not bound it first.
        let deepHost = try ServiceHost(service: EchoService(),
                                       options: .init(brokers: [broker], connections: Self.fullStackConnections, window: Self.deepWindow))
        try await deepHost.start()
        try await waitForWorkers(broker, service: EchoAPI.service, count: Self.fullStackConnections)
        let deep = await RequestBench.echo(window: window, stop: .count(100_000), warmup: 1_000).run(on: [bus])
        await bus.close()
        await deepHost.stop()
        let syncP50 = Double(sync.latencies.valueAtPercentile(50)) / 1_000
        let versusNATS = nats.map { String(format: "%.2fx NATS at its shape, %.2fx NATS pipelined; ", pipelined.rate / $0.atFullStackShape, pipelined.rate / $0.pipelined) } ?? ""
        let syncVersusNATS = nats.map { String(format: "p50 %.2fx NATS's, %.2fx its rate; ", syncP50 / $0.syncP50Microseconds, sync.rate / $0.sync) } ?? ""
        return [
            Row("BusClient to ServiceHost (JSON-RPC), sync", rate: sync.rate, latencies: sync.latencies,
                note: "\(syncVersusNATS)full stack, \(Self.fullStackConnections) worker connections, window \(Self.fullStackWindow) (sb bench)"),
            Row("BusClient to ServiceHost, \(Self.fullStackInFlight) in flight", rate: pipelined.rate, latencies: pipelined.latencies,
                note: versusNATS + String(format: "%.2fx the kernel's pipelined rate, %.2fx its rate at this shape with C ends; full stack, one client (sb bench --window %d)",
                                          pipelined.rate / kernelPipelined, pipelined.rate / kernelShape, Self.fullStackInFlight)),
            Row("BusClient to ServiceHost, \(window) in flight", rate: deep.rate, latencies: deep.latencies,
                note: (nats.map { String(format: "%.2fx NATS pipelined; ", deep.rate / $0.pipelined) } ?? "")
                    + String(format: "%.2fx the row above; host %d connections x window %d (sb bench --window %d, switchboard serve --window %d)",
                             deep.rate / pipelined.rate, Self.fullStackConnections, Self.deepWindow, window, Self.deepWindow)),
            Row("BusClient to ServiceHost, \(many) clients x \(manyWindow) in flight", rate: shared.rate, latencies: shared.latencies,
                note: String(format: "%.2fx one client's %d in flight (C clients through the kernel: %.2fx); one socket thread (sb bench --clients %d --window %d)",
                             shared.rate / pipelined.rate, Self.fullStackInFlight, kernelManyOverOne, many, manyWindow)),
        ]
    }
}

/// A plain Majordomo worker on one thread, one request per connection: it answers every
/// REQUEST at once with the body it carries.
final class RawEchoWorker: @unchecked Sendable {
    let context: ZMQContext
    private let thread: Thread
    private let running = Counter()  // 0 while running, 1 once asked to stop

    init(broker: String, service: String, sockets count: Int) throws {
        context = try ZMQContext()
        var sockets: [ZMQSocket] = []
        for _ in 0..<count {
            let socket = try ZMQSocket(context, .dealer)
            try socket.set(.sendHighWaterMark, 0)
            try socket.set(.receiveHighWaterMark, 0)
            try socket.connect(broker)
            try socket.send(MDP.encode(.ready(service: service)))
            sockets.append(socket)
        }
        nonisolated(unsafe) let owned = sockets
        let running = self.running
        thread = Thread {
            var poller = ZMQPoller()
            for socket in owned { _ = try? poller.add(socket) }
            var lastBeat = monotonicNanoseconds()
            while running.value == 0 {
                guard (try? poller.poll(timeoutMilliseconds: 500)) != nil else { break }
                for (index, socket) in owned.enumerated() where poller.events(at: index).contains(.readable) {
                    while let message = try? socket.tryReceive() {
                        if case .request(let client, let body)? = try? MDP.decodeAtWorker(message) {
                            try? socket.send(MDP.encode(.reply(client: client, body: body[...])))
                        }
                    }
                }
                if monotonicNanoseconds() - lastBeat > 1_000_000_000 {
                    for socket in owned { try? socket.send(MDP.encode(.heartbeat())) }
                    lastBeat = monotonicNanoseconds()
                }
            }
            for socket in owned { socket.close() }
        }
        thread.start()
    }

    func stop() { running.set(1) }
}

/// A counter shared between threads.
final class Counter: Sendable {
    private let atomic = Atomic<Int>(0)
    var value: Int { atomic.load(ordering: .relaxed) }
    func add(_ amount: Int) { atomic.add(amount, ordering: .relaxed) }
    func set(_ value: Int) { atomic.store(value, ordering: .relaxed) }
}
