import BusKit
import BusProtocol
import Contracts
import Foundation
import Synchronization
import SwitchboardTestSupport
import ZeroMQ
#if canImport(Glibc)
import Glibc
#endif

/// What the hostile-client review did to the bus, one case after another, with an ordinary
/// client's key and the gateway's token (`switchboard-soak --hostile`). Each case runs for a
/// while beside the ordinary load; a ``Bystander`` measures what it costs everyone else.
final class HostileClient: Sendable {
    enum Case: String, CaseIterable, Sendable {
        case quiet = "quiet (no hostile client)"
        case numbers = "huge, negative and NaN ttl (state.set, state.publish, KVSET)"
        case batches = "batches of 40 state.get over 10 MB of state"
        case stuckSubscriber = "a subscriber that never reads, 1 MB values overwritten"
        case stuckStreams = "50 SSE streams that never read, 100 kB values"
        case slowRequests = "64 echo.sleep of 3 s at once, again and again"
        case manyParts = "echo requests of 100,000 one-byte parts, 5 a second"
        case cancelFlood = "20,000 CANCELs a second naming nothing, 4 places held"
        case unreadStreams = "160 echo replies of a million parts each, never read"
    }

    /// The processes whose memory the hostile run watches: each must be back within 1.5x of
    /// its start once the hostile client left.
    static let measured = ["kernel", "gateway", "echo"]

    let client: BusClient
    let context: ZMQContext
    let kernel: KernelPorts
    let curve: CurveClientKeys?
    let gatewayToken: String?
    /// Answers that should have been refused (a ttl taken, a huge batch answered whole).
    let accepted = Atomic<Int>(0)

    init(client: BusClient, context: ZMQContext, kernel: KernelPorts, curve: CurveClientKeys?, gatewayToken: String?) {
        (self.client, self.context, self.kernel, self.curve, self.gatewayToken) = (client, context, kernel, curve, gatewayToken)
    }

    /// A raw connection to the kernel's broker with the hostile client's key, for speaking
    /// MDP as no BusClient would; the caller closes it.
    private func brokerDealer() throws -> ZMQSocket {
        let dealer = try ZMQSocket(context, .dealer)
        try dealer.secure(curve)
        try dealer.set(.linger, 0)
        try dealer.connect(kernel.broker)
        return dealer
    }

    /// Runs `hostileCase` until `deadline`; leaves nothing behind (sockets closed, keys deleted).
    func run(_ hostileCase: Case, until deadline: Date) async throws {
        switch hostileCase {
        case .quiet:
            while Date() < deadline { try await Task.sleep(for: .milliseconds(100)) }
        case .numbers:
            let collector = try ZMQSocket(context, .pub)
            try collector.secure(curve)
            try collector.set(.linger, 0)
            try collector.connect(kernel.state.collector)
            defer { collector.close() }
            while Date() < deadline {
                for (method, ttl) in [("state.set", 1e300), ("state.publish", 2e10), ("state.set", 1e11), ("state.publish", -1)] as [(String, Double)] {
                    if (try? await client.request(service: KernelAPI.service, method: method, params: ["key": "/client/hostile/ttl", "value": 1, "ttl": .double(ttl)])) != nil {
                        accepted.add(1, ordering: .relaxed)
                    }
                }
                try collector.send(CHP.kv(KVEntry(key: "/client/hostile/kv", properties: [("ttl", "1e11")], value: Frame("1"))))
                try await Task.sleep(for: .milliseconds(20))
            }
        case .batches:
            let value = JSONValue.string(String(repeating: "b", count: 1_000_000))
            for index in 0..<10 { _ = try? await client.request(service: KernelAPI.service, method: "state.publish", params: ["key": .string("/client/hostile/big/\(index)"), "value": value]) }
            let batch = (0..<40).map { JSONRPCRequest(id: .number(Int64($0)), method: "state.get", params: ["prefix": "/client/hostile/big/"]).jsonBytes }
            let body = Frame(JSONRPC.batchReply(batch)!)
            while Date() < deadline { _ = try? await client.call(service: KernelAPI.service, body: [body], timeout: .seconds(30)) }
            for index in 0..<10 { _ = try? await client.request(service: KernelAPI.service, method: "state.publish", params: ["key": .string("/client/hostile/big/\(index)"), "value": nil]) }
        case .stuckSubscriber:
            let stuck = try ZMQSocket(context, .sub)
            try stuck.secure(curve)
            try stuck.set(.linger, 0)
            try stuck.set(.receiveHighWaterMark, 1)
            try stuck.subscribe("")
            try stuck.connect(kernel.state.publisher)
            defer { stuck.close() }
            let value = JSONValue.string(String(repeating: "s", count: 1_000_000))
            while Date() < deadline { _ = try? await client.request(service: KernelAPI.service, method: "state.publish", params: ["key": "/client/hostile/large", "value": value]) }
            _ = try? await client.request(service: KernelAPI.service, method: "state.publish", params: ["key": "/client/hostile/large", "value": nil])
        case .stuckStreams:
            let streams = (0..<50).compactMap { _ in try? StuckStream(port: kernel.gatewayPort, token: gatewayToken) }
            defer { withExtendedLifetime(streams) {} }
            let value = JSONValue.string(String(repeating: "e", count: 100_000))
            while Date() < deadline {
                _ = try? await client.request(service: KernelAPI.service, method: "state.publish", params: ["key": "/client/hostile/sse", "value": value])
                try await Task.sleep(for: .milliseconds(5))
            }
            _ = try? await client.request(service: KernelAPI.service, method: "state.publish", params: ["key": "/client/hostile/sse", "value": nil])
        case .manyParts:
            // libzmq bounds a part's size, not how many parts a message has.
            let dealer = try brokerDealer()
            defer { dealer.close() }
            let request = MDP.request(service: EchoAPI.service, body: Array(repeating: Frame("x"), count: 100_000))
            while Date() < deadline {
                try dealer.send(request)
                try await Task.sleep(for: .milliseconds(200))
            }
        case .unreadStreams:
            // 18/MDP requests asking for a million parts each, on connections that read
            // nothing: the kernel ends each stream when its client's backlog is full and tells
            // the worker to stop; meanwhile the worker's outgoing parts stay bounded.
            let dealers = try (0..<10).map { _ in try brokerDealer() }
            defer { for dealer in dealers { dealer.close() } }
            let body = JSONRPCRequest(id: .number(1), method: EchoAPI.numbersMethod.name, params: ["n": 1_000_000], stream: true).jsonBytes
            let request = MDP.request(service: EchoAPI.service, body: [Frame(body)], version: .v02)
            for dealer in dealers {
                for _ in 0..<16 { try dealer.send(request) }
            }
            while Date() < deadline { try await Task.sleep(for: .milliseconds(100)) }
        case .cancelFlood:
            // The kernel looks for what a CANCEL names among the service's workers only while
            // its sender holds a place of that service: this one holds four (replies in parts
            // that come once a second), then names requests it never sent.
            let dealer = try brokerDealer()
            defer { dealer.close() }
            let request = { (id: Int64, method: String, params: JSONValue) in
                MDP.request(service: EchoAPI.service, body: [Frame(JSONRPCRequest(id: .number(id), method: method, params: params, stream: true).jsonBytes)],
                            version: .v02)
            }
            for id in 1...4 { try dealer.send(request(Int64(id), EchoAPI.numbersMethod.name, ["n": 1_000_000, "everyMs": 1_000])) }
            var id: Int64 = 4
            while Date() < deadline {
                for _ in 0..<200 {
                    id += 1
                    // Dropped rather than waited for when the kernel's side is full.
                    try? dealer.send(MDP.cancel(of: request(id, EchoAPI.echo.name, ["say": "x"]))!, options: .dontWait)
                }
                try await Task.sleep(for: .milliseconds(10))
            }
        case .slowRequests:
            while Date() < deadline {
                await withTaskGroup(of: Void.self) { group in
                    for _ in 0..<64 {
                        group.addTask { [client] in _ = try? await client.call(EchoAPI.sleep, .init(ms: 3_000), timeout: .seconds(30)) }
                    }
                }
            }
        }
    }
}

/// An HTTP connection that asks the gateway for `/events` and never reads the answer.
final class StuckStream {
    let connection: RawConnection
    init(port: Int, token: String?) throws {
        // A small receive buffer: the gateway's side fills soon.
        do {
            connection = try RawConnection(port: port, receiveBuffer: 4_096)
        } catch {
            throw SoakFailure("cannot connect to the gateway on port \(port)")
        }
        connection.write(Array("GET /events?prefix=/client/\(token.map { "&access_token=\($0)" } ?? "") HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".utf8))
    }
}

/// An ordinary client beside the hostile one: a `kernel ping` and an `echo echo` every
/// 20 ms, timed, by the case running meanwhile.
final class Bystander: Sendable {
    struct Figures: Sendable {
        var ping: [Double] = []
        var echo: [Double] = []
        var failures = 0
        /// What the first failed request was told.
        var firstFailure: String?

        mutating func record(_ outcome: Result<Double, any Error>, into times: WritableKeyPath<Figures, [Double]>, _ method: String) {
            switch outcome {
            case .success(let milliseconds): self[keyPath: times].append(milliseconds)
            case .failure(let error):
                failures += 1
                if firstFailure == nil { firstFailure = "\(method): \(error)" }
            }
        }
    }
    let figures = Mutex<[HostileClient.Case: Figures]>([:])
    let current = Mutex<HostileClient.Case>(.quiet)

    func run(_ client: BusClient, until deadline: Date) async {
        while Date() < deadline {
            let hostileCase = current.withLock { $0 }
            let ping = await Self.timed { _ = try await client.call(KernelAPI.ping, timeout: .seconds(10)) }
            let echo = await Self.timed {
                _ = try await client.request(service: EchoAPI.service, method: EchoAPI.echo.name, params: ["n": 1], timeout: .seconds(10))
            }
            figures.withLock { figures in
                var entry = figures[hostileCase] ?? Figures()
                entry.record(ping, into: \.ping, "kernel ping")
                entry.record(echo, into: \.echo, "echo echo")
                figures[hostileCase] = entry
            }
            try? await Task.sleep(for: .milliseconds(20))
        }
    }

    /// How long `call` took (milliseconds), or what it threw.
    private static func timed(_ call: () async throws -> Void) async -> Result<Double, any Error> {
        let started = ContinuousClock.now
        do {
            try await call()
            return .success((ContinuousClock.now - started) / .milliseconds(1))
        } catch {
            return .failure(error)
        }
    }
}

/// The `q` quantile of `values` (milliseconds), nearest rank.
func quantile(_ values: [Double], _ q: Double) -> Double {
    guard !values.isEmpty else { return .nan }
    let sorted = values.sorted()
    return sorted[min(sorted.count - 1, max(0, Int((Double(sorted.count) * q).rounded(.up)) - 1))]
}
