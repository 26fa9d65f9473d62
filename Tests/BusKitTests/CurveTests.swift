import BusKit
import BusProtocol
import Contracts
import EchoService
import Foundation
import Kernel
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// A kernel with CURVE on every endpoint, one allowed client key, one operator's key and one
/// allowed worker key.
struct SecuredBus {
    let kernel: TestKernel
    let kernelKeys: CurveKeyPair
    let client: CurveClientKeys
    let `operator`: CurveClientKeys
    let worker: CurveClientKeys

    /// `fastHeartbeats`: a worker silent for a second is dropped (off for raw workers that
    /// do not beat).
    static func start(fastHeartbeats fast: Bool = true) async throws -> SecuredBus {
        let kernelKeys = try CurveKeyPair.generate(), clientPair = try CurveKeyPair.generate(), workerPair = try CurveKeyPair.generate()
        let operatorPair = try CurveKeyPair.generate()
        let kernel = try await TestKernel.start {
            if fast { fastHeartbeats(&$0) }
            $0.security = KernelSecurity(secretKey: kernelKeys.secretKey, clientKeys: [clientPair.publicKey], workerKeys: [workerPair.publicKey],
                                         operatorKeys: [operatorPair.publicKey])
        }
        return SecuredBus(kernel: kernel, kernelKeys: kernelKeys,
                          client: try CurveClientKeys(serverKey: kernelKeys.publicKey, secretKey: clientPair.secretKey),
                          operator: try CurveClientKeys(serverKey: kernelKeys.publicKey, secretKey: operatorPair.secretKey),
                          worker: try CurveClientKeys(serverKey: kernelKeys.publicKey, secretKey: workerPair.secretKey))
    }

    func keys(_ secretKey: String) throws -> CurveClientKeys {
        try CurveClientKeys(serverKey: kernelKeys.publicKey, secretKey: secretKey)
    }

    func host(with keys: CurveClientKeys) async throws -> ServiceHost<EchoService> {
        try await hostEcho(kernel, instance: "secured", connections: 1, curve: keys)
    }

    func stats(_ bus: BusClient) async throws -> JSONValue {
        try await bus.request(service: "kernel", method: "stats")
    }
}

@Suite("CURVE: encryption and allow-lists on every kernel endpoint", .serialized)
struct CurveTests {
    @Test("an allowed client reaches a service registered with a worker key, and subscribes")
    func allowedClient() async throws {
        let secured = try await SecuredBus.start()
        let host = try await secured.host(with: secured.worker)
        let bus = try await BusClient(brokers: [secured.kernel.endpoints.broker], curve: secured.client)
        try await secured.kernel.workers("echo", curve: secured.client)
        #expect(try await bus.request(service: "echo", method: "echo", params: ["secret": "sauce"]) == ["secret": "sauce"])
        #expect(try await secured.stats(bus)["security"]?["curve"] == true)
        // Replies in parts (18/MDP) and a request to every worker, over CURVE too.
        var numbers: [Int] = []
        for try await number in bus.stream(EchoAPI.numbers, .init(n: 3)) { numbers.append(number) }
        #expect(numbers == [1, 2, 3])
        #expect(try await bus.gather(EchoAPI.whoami).end() == GatherSummary(expected: 1, answered: 1, missing: []))

        let subscription = try await Subscription.open(snapshot: secured.kernel.endpoints.snapshot, publisher: secured.kernel.endpoints.publisher,
                                                       prefixes: ["/kernel/services/echo"], curve: secured.client)
        let update = try await within(5, "the snapshot") { try await subscription.next()?.update }
        #expect(update?.key == "/kernel/services/echo")
        await subscription.cancel()
        await bus.close()
        await host.stop()
        await secured.kernel.stop()
    }

    @Test("an unknown key gets no service; a plain-text client cannot talk to a secured kernel")
    func strangersAreRefused() async throws {
        let secured = try await SecuredBus.start()
        let host = try await secured.host(with: secured.worker)
        let insider = try await BusClient(brokers: [secured.kernel.endpoints.broker], curve: secured.client)
        try await secured.kernel.workers("echo", curve: secured.client)

        let stranger = try await BusClient(brokers: [secured.kernel.endpoints.broker], timeout: .milliseconds(500),
                                           curve: try secured.keys(try CurveKeyPair.generate().secretKey))
        await #expect(throws: BusError.timedOut(service: "echo", method: "echo", after: .milliseconds(500))) {
            try await stranger.request(service: "echo", method: "echo", params: ["x": 1])
        }
        try await eventually(5, "the kernel refused the unknown key") {
            (try await secured.stats(insider)["security"]?["refusedConnections"]?.intValue ?? 0) >= 1
        }
        let plain = try await BusClient(brokers: [secured.kernel.endpoints.broker], timeout: .milliseconds(500))
        await #expect(throws: BusError.timedOut(service: "kernel", method: "ping", after: .milliseconds(500))) {
            try await plain.request(service: "kernel", method: "ping")
        }
        // The kernel keeps serving the allowed client.
        #expect(try await insider.request(service: "echo", method: "echo", params: ["still": "here"]) == ["still": "here"])
        await stranger.close()
        await plain.close()
        await insider.close()
        await host.stop()
        await secured.kernel.stop()
    }

    @Test("a service whose handshake the kernel refuses (no keys, a key it does not allow), or whose broker endpoint is another program's, says so and why in its log, not as reconnections; it, and one with no kernel at all, stops without waiting for a drain nobody can acknowledge")
    func refusedServiceSaysWhy() async throws {
        let secured = try await SecuredBus.start()
        let watcher = try await BusClient(brokers: [secured.kernel.endpoints.broker], curve: secured.client)
        let stranger = try secured.keys(try CurveKeyPair.generate().secretKey)
        let nobody = "tcp://127.0.0.1:\(freePort())"
        let otherProgram = try ClosingListener()
        let refusals: @Sendable () async throws -> Int = { Int(try await secured.stats(watcher)["security"]?["refusedConnections"]?.intValue ?? 0) }
        let refused = "the kernel refused this service's handshake", notBroker = "the broker endpoint ends each connection before a ZeroMQ handshake"
        // Each: where it connects, with which keys, what its log says and why, and a count of
        // its tries (to see them said once, not as a reconnection each time).
        let cases: [(String, CurveClientKeys?, (said: String, why: String)?, (@Sendable () async throws -> Int)?)] = [
            (secured.kernel.endpoints.broker, stranger, (refused, "the kernel does not allow this service's key"), refusals),
            (secured.kernel.endpoints.broker, nil, (refused, "this service has CURVE off"), nil),
            (nobody, nil, nil, nil),
            (otherProgram.endpoint, nil, (notBroker, "not a kernel's broker endpoint: another program"), { otherProgram.connections }),
        ]
        for (broker, keys, said, tries) in cases {
            let log = LogLines()
            let options = ServiceHost<EchoService>.Options(brokers: [broker], connections: 1, heartbeatInterval: .milliseconds(200),
                                                           heartbeatLiveness: 3, drainTimeout: .seconds(120), curve: keys)
            let host = try ServiceHost(service: EchoService(instance: "refused"), options: options, logger: log.logger("refused"))
            try await host.start()
            if let said {
                try await log.waitFor(said.said, within: 20, "the refusal in the log")
                #expect(log.text.contains(said.why), "\(log.text)")
            }
            if let said, let tries {
                // Tried again and again: said once, and not as a reconnection each time.
                let before = try await tries()
                try await eventually(20, "more tries") { try await tries() >= before + 3 }
                #expect(log.lines.value.filter { $0.contains(said.said) }.count == 1, "\(log.text)")
                #expect(!log.text.contains("registering again"), "\(log.text)")
            }
            // Nothing heard from a kernel: nothing to wait for, not the drain's two minutes.
            let stopping = ContinuousClock.now
            await host.stop()
            #expect(ContinuousClock.now - stopping < .seconds(60), "\(broker) \(said?.why ?? "")")
            #expect(!log.text.contains("drain timed out"), "\(log.text)")
        }
        await watcher.close()
        await secured.kernel.stop()
    }

    @Test("a client key cannot register a worker nor write outside the writable prefixes")
    func clientKeyCannotServe() async throws {
        let secured = try await SecuredBus.start()
        let impostor = try await secured.host(with: secured.client)
        let bus = try await BusClient(brokers: [secured.kernel.endpoints.broker], curve: secured.client)
        try await eventually(5, "the READY refused") {
            (try await secured.stats(bus)["security"]?["refusedRegistrations"]?.intValue ?? 0) >= 1
        }
        #expect(try await bus.hasWorkers("echo") == false)
        let forbidden = await #expect(throws: BusError.self) {
            try await bus.request(service: "kernel", method: "state.set", params: ["key": "/catalog/countries", "value": 1])
        }
        #expect(forbidden?.code == JSONRPCError.forbiddenCode)
        #expect(try await bus.request(service: "kernel", method: "state.set", params: ["key": "/client/note", "value": 1])["sequence"] != nil)

        // The same service with a worker key registers.
        let host = try await secured.host(with: secured.worker)
        try await secured.kernel.workers("echo", curve: secured.client)
        let worker = try await BusClient(brokers: [secured.kernel.endpoints.broker], curve: secured.worker)
        #expect(try await worker.request(service: "kernel", method: "state.set", params: ["key": "/catalog/test", "value": 1])["sequence"] != nil)
        await worker.close()
        await bus.close()
        await impostor.stop()
        await host.stop()
        await secured.kernel.stop()
    }

    @Test("keys a reload takes out: a client still connected with one is refused -32011 from then on, a worker with one is told to go; put back, both are served again")
    func keysTakenOutAtReload() async throws {
        let secured = try await SecuredBus.start()
        let host = try await secured.host(with: secured.worker)
        try await secured.kernel.workers("echo", curve: secured.operator)
        let client = try await BusClient(brokers: [secured.kernel.endpoints.broker], curve: secured.client)
        #expect(try await client.request(service: "echo", method: "echo", params: ["before": 1]) == ["before": 1])

        var reloaded = secured.kernel.configuration
        reloaded.security?.clientKeys = []
        reloaded.security?.workerKeys = []
        await secured.kernel.kernel.reconfigure(reloaded)
        let refused = await #expect(throws: BusError.self) { try await client.request(service: "kernel", method: "ping") }
        #expect(refused?.code == JSONRPCError.forbiddenCode && "\(String(describing: refused))".contains("no longer among the kernel's allowed keys"),
                "\(String(describing: refused))")
        try await secured.kernel.workers("echo", curve: secured.operator, "the worker whose key was taken out gone") { $0 == 0 }

        await secured.kernel.kernel.reconfigure(secured.kernel.configuration)
        try await secured.kernel.workers("echo", curve: secured.operator)
        #expect(try await client.request(service: "echo", method: "echo", params: ["after": 1]) == ["after": 1])
        await client.close()
        await host.stop()
        await secured.kernel.stop()
    }

    @Test("a collector connection whose key a reload took out: its KVSETs are dropped and counted")
    func collectorKeyTakenOutAtReload() async throws {
        let secured = try await SecuredBus.start()
        let subscription = try await Subscription.open(snapshot: secured.kernel.endpoints.snapshot, publisher: secured.kernel.endpoints.publisher,
                                                       prefixes: ["/client/"], curve: secured.operator)
        let context = try ZMQContext()
        let collector = try ZMQSocket(context, .pub)
        try collector.set(.linger, 0)
        try collector.secure(secured.client)
        try collector.connect(secured.kernel.endpoints.collector)
        // A PUB drops what it sends before its connection is up: sent again until it arrives.
        #expect(try await Self.sendUntilSeen("/client/before", from: collector, by: subscription), "the first KVSET arrived within 10 s")

        var reloaded = secured.kernel.configuration
        reloaded.security?.clientKeys = []
        await secured.kernel.kernel.reconfigure(reloaded)
        try collector.send(CHP.kv(KVEntry(key: "/client/after", value: Frame("1"))))
        // A refused KVSET leaves nothing to await but its count.
        let operatorClient = try await BusClient(brokers: [secured.kernel.endpoints.broker], curve: secured.operator)
        var refused: Int64 = 0
        for _ in 0..<200 where refused == 0 {
            try await Task.sleep(for: .milliseconds(50))
            refused = try await secured.stats(operatorClient)["state"]?["refusedForbidden"]?.intValue ?? 0
        }
        #expect(refused == 1)
        let entries = try await operatorClient.request(service: "kernel", method: "state.get", params: ["prefix": "/client/"])["entries"]
        #expect(entries?.arrayValue?.compactMap { $0["key"]?.stringValue } == ["/client/before"])
        await operatorClient.close()
        collector.close()
        await subscription.cancel()
        await secured.kernel.stop()
    }

    /// Sends `key` every 50 ms until `subscription` shows it, for up to 10 s: whether it did.
    private static func sendUntilSeen(_ key: String, from collector: ZMQSocket, by subscription: Subscription) async throws -> Bool {
        for _ in 0..<200 {
            try collector.send(CHP.kv(KVEntry(key: key, value: Frame("1"))))
            try await Task.sleep(for: .milliseconds(50))
            while let event = subscription.nextIfReady() {
                if case .update(let update) = event, update.key == key { return true }
            }
        }
        return false
    }

    @Test("a worker whose READY says callers=1 gets each request's sender as the kernel ranks it; a plain worker gets the body alone")
    func callers() async throws {
        // The kernel's default heartbeats: these raw workers do not beat, and a loaded machine
        // may take seconds before their requests come.
        let secured = try await SecuredBus.start(fastHeartbeats: false)
        let context = try ZMQContext()
        func worker(_ service: String, callers: Bool) throws -> ZMQSocket {
            let socket = try ZMQSocket(context, .dealer)
            try socket.set(.linger, 0)
            try socket.set(.receiveTimeout, 10_000)
            try socket.secure(secured.worker)
            try socket.connect(secured.kernel.endpoints.broker)
            try socket.send(MDP.encode(.ready(service: service, window: 1, callers: callers)))
            return socket
        }
        let asking = try worker("asking", callers: true), plain = try worker("plain", callers: false)
        let client = try await BusClient(brokers: [secured.kernel.endpoints.broker], curve: secured.client)
        let operatorClient = try await BusClient(brokers: [secured.kernel.endpoints.broker], curve: secured.operator)
        try await secured.kernel.workers("asking", curve: secured.client)
        try await secured.kernel.workers("plain", curve: secured.client)
        /// The body `socket`, serving `service`, receives for a request `bus` sends, answered "ok".
        func bodyReceived(by socket: ZMQSocket, _ service: String, from bus: BusClient) async throws -> [Frame] {
            async let reply = bus.call(service: service, body: ["x"])
            var command: BrokerToWorker
            repeat { command = try MDP.decodeAtWorker(try socket.receive()) } while command == .heartbeat
            guard case .request(let sender, let body) = command else { return [] }
            try socket.send(MDP.encode(.reply(client: sender, body: ["ok"])))
            #expect(try await reply == ["ok"])
            return body
        }
        #expect(try await bodyReceived(by: asking, "asking", from: client) == [Frame("client:" + secured.client.publicKey), "x"])
        #expect(try await bodyReceived(by: asking, "asking", from: operatorClient) == [Frame("operator:" + secured.operator.publicKey), "x"])
        #expect(try await bodyReceived(by: plain, "plain", from: client) == ["x"])
        await client.close()
        await operatorClient.close()
        asking.close()
        plain.close()
        await secured.kernel.stop()
    }
}
