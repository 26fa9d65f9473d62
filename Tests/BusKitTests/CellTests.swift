import BusKit
import BusProtocol
import Contracts
import EchoService
import Etcd
import Foundation
import Kernel
import SwitchboardTestSupport
import Testing
import ZeroMQ

@Suite("Cells: kernels that find each other through etcd and send a request to the cell whose workers serve it",
       .serialized, .enabled(if: TestEtcd.available, "needs etcd-server (Scripts/bootstrap --tests installs it)"))
struct CellTests {
    /// A kernel of cell `name` on `etcd`'s directory, with heartbeats a test need not wait for.
    private func cell(_ name: String, on settings: EtcdStateSettings, queueTimeout: Duration = .seconds(5)) -> (inout KernelConfiguration) -> Void {
        { configuration in
            fastHeartbeats(&configuration)
            configuration.queueTimeout = queueTimeout
            configuration.cell = CellConfiguration(name: name, etcd: settings)
        }
    }

    /// etcd's settings on `etcd`, its keys under `prefix`: each test's own.
    private func etcdSettings(on etcd: TestEtcd, prefix: String) -> EtcdStateSettings {
        var settings = EtcdStateSettings(endpoints: etcd.clientURLs)
        settings.prefix = prefix
        return settings
    }

    private func echo(_ instance: String, at kernel: TestKernel) throws -> ServiceHost<EchoService> {
        try ServiceHost(service: EchoService(instance: instance), options: .init(brokers: [kernel.endpoints.broker], connections: 1,
                                                                                  heartbeatInterval: .milliseconds(100), heartbeatLiveness: 10))
    }

    @Test("a client of cell a calls a service only cell b serves, in one answer and in parts; a's own worker comes first once it has one; a reader that leaves stops b's worker; b's kernel gone: -32001 within a's queue timeout; b back: served again; a client of both cells moves to b when a goes")
    func crossing() async throws {
        let etcd = try await TestEtcd.start()
        defer { etcd.stop() }
        var settings = etcdSettings(on: etcd, prefix: "/sb-test/cells")
        settings.leaseSeconds = 2
        let a = try await TestKernel.start(cell("a", on: settings, queueTimeout: .seconds(2)))
        var b = try await TestKernel.start(fixedPorts: true, cell("b", on: settings))
        let hostB = try echo("b", at: b)
        try await hostB.start()
        let client = try await BusClient(brokers: [a.endpoints.broker], timeout: .seconds(10))

        try await a.offers(EchoAPI.service, from: ["b"])
        #expect(try await client.call(EchoAPI.count, .init(n: 7)) == 7)
        #expect(try await client.call(EchoAPI.whoami) == "b")
        var numbers: [Int] = []
        for try await number in client.stream(EchoAPI.numbers, .init(n: 3)) { numbers.append(number) }
        #expect(numbers == [1, 2, 3])
        let services = try await client.call(KernelAPI.servicesList)
        #expect(services.services.first { $0.name == EchoAPI.service }?.cells == ["b"])
        // Counted per cell: what a handed to b and b answered, and what b took from other cells.
        let sentToB = try #require(try await client.call(KernelAPI.stats).cell?.peers["b"])
        #expect(sentToB.sent == 3 && sentToB.answered == 3 && sentToB.p50LatencyMicroseconds != nil, "\(sentToB)")
        let clientOfB = try await BusClient(brokers: [b.endpoints.broker], timeout: .seconds(10))
        #expect(try await clientOfB.call(KernelAPI.stats).cell?.received == 3)
        #expect(try await clientOfB.call(KernelAPI.metrics).text.contains("switchboard_cell_received_total 3"))
        await clientOfB.close()

        // A worker of its own: cell a asks it, not cell b.
        let hostA = try echo("a", at: a)
        try await hostA.start()
        try await a.workers(EchoAPI.service)
        for _ in 1...5 { #expect(try await client.call(EchoAPI.whoami) == "a") }
        await hostA.stop()
        #expect(try await client.call(EchoAPI.whoami) == "b")

        // Readers that leave a stream in parts, one closing its client, one only leaving its
        // loop (its client cancels): the worker in cell b is told to stop each, as its own
        // kernel would tell it, and its places are free at once.
        let leaving = try await BusClient(brokers: [a.endpoints.broker], timeout: .seconds(10))
        var endless = leaving.stream(EchoAPI.numbers, .init(n: 1_000_000, everyMs: 20)).makeAsyncIterator()
        #expect(try await endless.next() == 1)
        await leaving.close()
        for try await number in client.stream(EchoAPI.numbers, .init(n: 1_000_000, everyMs: 20)) where number == 2 { break }
        let observer = try await BusClient(brokers: [b.endpoints.broker], timeout: .seconds(10))
        try await eventually(10, "cell b's echo worker stopped the streams nobody reads") {
            try await observer.call(KernelAPI.servicesList).services.first { $0.name == EchoAPI.service }?.inFlight == 0
        }
        await observer.close()

        // Cell b's kernel goes: a's client is told within a's queue timeout, never left waiting.
        await b.stop()
        let asked = ContinuousClock.now
        let failure = await #expect(throws: BusError.self) { try await client.call(EchoAPI.count, .init(n: 1)) }
        #expect(failure?.code == JSONRPCError.serviceUnavailableCode, "\(String(describing: failure))")
        #expect(ContinuousClock.now - asked < .seconds(5))
        try await a.offers(EchoAPI.service, from: [])

        // Back (its worker reconnects by itself): served across again, without a restart of a.
        b = try await b.restarted()
        try await a.offers(EchoAPI.service, from: ["b"], within: 15)
        #expect(try await client.call(EchoAPI.count, .init(n: 9)) == 9)

        // A client given both cells moves to the other when its own goes.
        let ofBoth = try await BusClient(brokers: [a.endpoints.broker, b.endpoints.broker], timeout: .seconds(10))
        #expect(try await ofBoth.call(EchoAPI.count, .init(n: 1)) == 1)
        await a.stop()
        #expect(try await ofBoth.call(EchoAPI.count, .init(n: 2)) == 2)

        await ofBoth.close()
        await client.close()
        await hostB.stop()
        await b.stop()
    }

    @Test("cells on one state kept in etcd: a change made through either cell reaches the subscribers of both once, in order, with the same sequence number; a compare-and-set through one cell is refused once the key moved through the other; each cell keeps its own kernel keys")
    func oneState() async throws {
        let etcd = try await TestEtcd.start()
        defer { etcd.stop() }
        let directory = etcdSettings(on: etcd, prefix: "/sb-test/state-cells")
        let state = etcdSettings(on: etcd, prefix: "/sb-test/cells-state")
        var kernels: [TestKernel] = [], clients: [BusClient] = [], subscriptions: [Subscription] = []
        for name in ["a", "b"] {
            let kernel = try await TestKernel.start { configuration in
                cell(name, on: directory)(&configuration)
                configuration.stateEtcd = state
            }
            kernels.append(kernel)
            let client = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(10), state: [kernel.stateEndpoints])
            clients.append(client)
            subscriptions.append(try await client.subscribe(prefixes: ["/pricing/"]))
        }

        // Written through a, then b, then a...: every copy holds each change at its number.
        var written: [String] = [], sequences: [UInt64] = []
        for index in 0..<10 {
            let key = "/pricing/\(index % 3)"
            let sequence = try await clients[index % 2].call(KernelAPI.stateSet, .init(key: key, value: .int(Int64(index)))).sequence
            written.append("\(key) \(sequence) \(index)")
            sequences.append(sequence)
        }
        #expect(sequences == sequences.sorted() && Set(sequences).count == sequences.count)
        for (index, subscription) in subscriptions.enumerated() {
            let seen = try await within(30, "cell \(index)'s subscriber saw every change") {
                var seen: [String] = []
                for try await event in subscription {
                    guard case .update(let update) = event, !update.fromSnapshot else { continue }
                    seen.append("\(update.key) \(update.sequence) \(update.json?.intValue.map(String.init) ?? "?")")
                    if seen.count == 10 { break }
                }
                return seen
            }
            #expect(seen == written, "cell \(index)")
        }

        // A compare-and-set compares with what either cell wrote.
        let first = try await clients[0].call(KernelAPI.stateSet, .init(key: "/pricing/cas", value: 1, revision: 0)).sequence
        let second = try await clients[1].call(KernelAPI.stateSet, .init(key: "/pricing/cas", value: 2, revision: first)).sequence
        let refused = await #expect(throws: BusError.self) {
            try await clients[0].call(KernelAPI.stateSet, .init(key: "/pricing/cas", value: 3, revision: first))
        }
        guard case .remote(_, let conflict)? = refused else { Issue.record("expected -32004, got \(String(describing: refused))"); return }
        #expect(conflict.code == JSONRPCError.conflictCode && conflict.data?["revision"]?.intValue == Int64(second), "\(conflict)")

        // Each cell's own keys, side by side in the one state.
        let own = try await clients[1].call(KernelAPI.stateGet, .init(prefix: KernelAPI.StateKeys.prefix + "cells/"))
        let keys = Set(own.entries.map(\.key))
        #expect(keys.isSuperset(of: [KernelAPI.StateKeys.instance(cell: "a"), KernelAPI.StateKeys.instance(cell: "b")]), "\(keys)")

        for subscription in subscriptions { await subscription.cancel() }
        for client in clients { await client.close() }
        for kernel in kernels { await kernel.stop() }
    }

    @Test("two kernels of one cell on its state in etcd: one serves, the other waits for the cell's election; the serving one stops: the other takes over, its services register with it, and the other cell's clients are served through it")
    func pairInACell() async throws {
        let etcd = try await TestEtcd.start()
        defer { etcd.stop() }
        let directory = etcdSettings(on: etcd, prefix: "/sb-test/pair-cells")
        let state = etcdSettings(on: etcd, prefix: "/sb-test/pair-cells-state")
        // On ports known before it starts: the second kernel of b is waited for meanwhile.
        func kernel(_ name: String) -> KernelConfiguration {
            TestKernel.configuration(fixedPorts: true) { configuration in
                cell(name, on: directory)(&configuration)
                configuration.stateEtcd = state
            }
        }
        let a = try await TestKernel.start(kernel("a"))
        let first = try await TestKernel.start(kernel("b")), second = kernel("b")
        // Waits for cell b's election until the first kernel of b lets it go.
        let standing = Task { try await TestKernel.start(second) }
        let host = try ServiceHost(service: EchoService(instance: "b"), options: .init(brokers: [first.endpoints.broker, second.brokerEndpoint],
                                                                                         connections: 1, heartbeatInterval: .milliseconds(100), heartbeatLiveness: 10))
        try await host.start()
        let client = try await BusClient(brokers: [a.endpoints.broker], timeout: .seconds(10))
        try await a.offers(EchoAPI.service, from: ["b"])
        #expect(try await client.call(EchoAPI.count, .init(n: 3)) == 3)

        await first.stop()
        let taken = try await within(30, "the second kernel of cell b took its election") { try await standing.value }
        // Asked at once: a request that finds no offer of cell b yet waits for one.
        #expect(try await client.call(EchoAPI.count, .init(n: 4)) == 4)
        let ofSecond = try await BusClient(brokers: [taken.endpoints.broker], timeout: .seconds(10))
        #expect(try await ofSecond.call(KernelAPI.stats).cell?.received == 1)

        await ofSecond.close()
        await client.close()
        await host.stop()
        await taken.stop()
        await a.stop()
    }

    @Test("switchboard gateway given both cells' kernels (--broker and --state, repeated): answered through cell a, and through cell b once a's kernel is gone")
    func gatewayOfBothCells() async throws {
        let etcd = try await TestEtcd.start()
        defer { etcd.stop() }
        let settings = etcdSettings(on: etcd, prefix: "/sb-test/gateway-cells")
        let a = try await TestKernel.start(cell("a", on: settings))
        let b = try await TestKernel.start(cell("b", on: settings))
        let host = try echo("b", at: b)
        try await host.start()
        let folder = try temporaryDirectory("gateway-cells")
        defer { try? FileManager.default.removeItem(at: folder) }
        let config = folder.appendingPathComponent("switchboard.yaml")
        try "security:\n  curve: false\n  keys_dir: \(folder.appendingPathComponent("keys").path)\n".write(to: config, atomically: true, encoding: .utf8)
        let port = freePort()
        let kernels = [a, b].flatMap { kernel in
            ["--broker", kernel.endpoints.broker, "--state", "\(kernel.endpoints.snapshot),\(kernel.endpoints.publisher),\(kernel.endpoints.collector)"]
        }
        let gateway = try ChildProcess(switchboardExecutable(), ["gateway", "--config", config.path, "--listen", "127.0.0.1:\(port)"] + kernels)
        defer { gateway.stop() }
        @Sendable func count(_ n: Int) async throws -> String {
            try await runCommand(URL(fileURLWithPath: "/usr/bin/curl"), [
                "-s", "--max-time", "20", "-H", "Content-Type: application/json",
                "-d", #"{"jsonrpc":"2.0","id":1,"method":"count","params":{"n":"# + "\(n)}}", "http://127.0.0.1:\(port)/rpc/echo",
            ], seconds: 30).stdout
        }
        try await eventually(60, "the gateway answers through cell a, which hands echo to cell b") { try await count(1).contains(#""result":1"#) }

        await a.stop()
        let answer = try await count(2)
        #expect(answer.contains(#""result":2"#), "\(answer)\n\(gateway.outputSoFar)")

        await host.stop()
        await b.stop()
    }

    @Test("a request to every worker from a client of cell a reaches the workers of both cells: a's asked first, then the workers b says it asked, every answer tagged with its cell and counted in the FINAL; with none in a, b's alone; a worker of b that does not answer is timed out, named with its cell")
    func everyWorkerAcrossCells() async throws {
        let etcd = try await TestEtcd.start()
        defer { etcd.stop() }
        let settings = etcdSettings(on: etcd, prefix: "/sb-test/gathering-cells")
        let a = try await TestKernel.start(cell("a", on: settings, queueTimeout: .seconds(3)))
        // b lets a silent worker be for 10 s (below): it stands for one that is only slow.
        let b = try await TestKernel.start { configuration in
            cell("b", on: settings, queueTimeout: .seconds(10))(&configuration)
            configuration.heartbeatLiveness = 100
        }
        let hostA = try echo("a", at: a), hostB1 = try echo("b", at: b), hostB2 = try echo("b", at: b)
        for host in [hostA, hostB1, hostB2] { try await host.start() }
        try await a.workers(EchoAPI.service)
        try await b.workers(EchoAPI.service, atLeast: 2)
        let client = try await BusClient(brokers: [a.endpoints.broker], timeout: .seconds(15))
        try await a.offers(EchoAPI.service, from: ["b"])

        let gather = client.gather(EchoAPI.whoami)
        var asked: [[String]] = [], answers: [String: String] = [:]
        for try await event in gather {
            switch event {
            case .asked(let workers): asked.append(workers)
            case .answer(let worker, let outcome): answers[worker] = try outcome.get()
            }
        }
        #expect(asked.map(\.count) == [1, 2], "\(asked)")
        #expect(Set(answers.keys) == Set(asked.joined()))
        #expect(answers.values.sorted() == ["a", "b", "b"])
        #expect(try await gather.end() == GatherSummary(expected: 3, answered: 3, missing: []))

        // As plain JSON (what `sb request --all` prints): the first part names the other
        // cells asked, b's its cell, and b's answers are tagged with it.
        let plain = client.gather(service: EchoAPI.service, method: EchoAPI.whoami.name, paramsText: nil)
        var parts: [JSONValue] = []
        for try await part in plain { parts.append(part) }
        #expect(parts.first?["cells"] == ["b"] && parts.first?["expected"] == 1, "\(parts)")
        #expect(parts.filter { $0["cell"] == "b" && $0["workers"] != nil }.count == 1, "\(parts)")
        #expect(parts.filter { $0["cell"] == "b" && $0["result"] == "b" }.count == 2, "\(parts)")
        #expect(parts.filter { $0["cell"] == nil && $0["result"] == "a" }.count == 1, "\(parts)")

        // No worker in a: b's workers alone answer.
        await hostA.stop()
        try await a.workers(EchoAPI.service, "a's own echo worker gone") { $0 == 0 }
        let fromB = client.gather(EchoAPI.whoami)
        asked = []
        answers = [:]
        for try await event in fromB {
            switch event {
            case .asked(let workers): asked.append(workers)
            case .answer(let worker, let outcome): answers[worker] = try outcome.get()
            }
        }
        #expect(asked.map(\.count) == [0, 2], "\(asked)")
        #expect(answers.values.sorted() == ["b", "b"])
        #expect(try await fromB.end() == GatherSummary(expected: 2, answered: 2, missing: []))

        // A worker of b that takes its copy and never answers: a's deadline ends the gather,
        // and the FINAL names that worker with its cell.
        let context = try ZMQContext()
        let silent = try ZMQSocket(context, .dealer)
        try silent.set(.linger, 0)
        try silent.set(.routingID, Array("silent-worker".utf8))
        try silent.connect(b.endpoints.broker)
        try silent.send(MDP.encode(.ready(service: EchoAPI.service, window: 1)))
        try await b.workers(EchoAPI.service, atLeast: 3)
        let timedOut = try await client.gather(EchoAPI.whoami).end()
        #expect(timedOut.expected == 3 && timedOut.answered == 2, "\(timedOut)")
        #expect(timedOut.missing == [.init(worker: "silent-worker", reason: "timed_out", cell: "b")])
        silent.close()

        await client.close()
        for host in [hostB1, hostB2] { await host.stop() }
        await b.stop()
        await a.stop()
    }

    @Test("requests for a service only other cells serve are spread by the workers the directory counts in each: a cell with three echo workers is handed more than twice what one with one worker gets")
    func spreadByDirectory() async throws {
        let etcd = try await TestEtcd.start()
        defer { etcd.stop() }
        let settings = etcdSettings(on: etcd, prefix: "/sb-test/spreading-cells")
        let a = try await TestKernel.start(cell("a", on: settings))
        let b = try await TestKernel.start(cell("b", on: settings))
        let c = try await TestKernel.start(cell("c", on: settings))
        let hosts = [try echo("b", at: b)] + (try (1...3).map { _ in try echo("c", at: c) })
        for host in hosts { try await host.start() }
        try await b.workers(EchoAPI.service)
        try await c.workers(EchoAPI.service, atLeast: 3)
        let client = try await BusClient(brokers: [a.endpoints.broker], timeout: .seconds(15))
        let recordOfC = "/sb-test/spreading-cells/c"
        try await etcd.values(under: recordOfC, "cell c's record counts three echo workers") { records in
            (try? records[recordOfC].map { try JSONValue(parsing: $0) })??["services"]?[EchoAPI.service] == 3
        }
        try await a.offers(EchoAPI.service, from: ["b", "c"])

        // 400 requests that each take 20 ms, 40 at a time: each offer's window (64) would take
        // them alike; counted by what cell a handed each cell.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for sent in 0..<400 {
                if sent >= 40 { try await group.next() }
                group.addTask { _ = try await client.call(EchoAPI.sleep, .init(ms: 20)) }
            }
            try await group.waitForAll()
        }
        let handed = try #require(try await client.call(KernelAPI.stats).cell?.peers).mapValues(\.sent)
        #expect(handed.values.reduce(0, +) == 400)
        #expect(handed["c", default: 0] > 2 * handed["b", default: 0], "\(handed)")

        await client.close()
        for host in hosts { await host.stop() }
        for kernel in [c, b, a] { await kernel.stop() }
    }

    @Test("a cell's supervisor is not offered to the other cells: asked through another cell, it would restart that cell's pieces, not the asker's")
    func supervisorStaysInItsCell() async throws {
        let etcd = try await TestEtcd.start()
        defer { etcd.stop() }
        let settings = etcdSettings(on: etcd, prefix: "/sb-test/supervised-cells")
        let a = try await TestKernel.start(cell("a", on: settings))
        let b = try await TestKernel.start { configuration in
            cell("b", on: settings)(&configuration)
            // The stand-in supervisor below sends no heartbeats.
            configuration.heartbeatLiveness = 100
        }
        // Cell b's supervisor (a stand-in) registers first, then an echo worker: by the time
        // echo is offered to cell a, the supervisor would have been.
        let context = try ZMQContext()
        let supervisor = try ZMQSocket(context, .dealer)
        try supervisor.connect(b.endpoints.broker)
        try supervisor.send(MDP.encode(.ready(service: SupervisorAPI.service, window: 1)))
        try await b.workers(SupervisorAPI.service)
        let host = try echo("b", at: b)
        try await host.start()
        try await a.offers(EchoAPI.service, from: ["b"])
        let client = try await BusClient(brokers: [a.endpoints.broker], timeout: .seconds(10))
        let services = try await client.call(KernelAPI.servicesList).services
        #expect(services.first { $0.name == SupervisorAPI.service } == nil, "\(services)")
        // Nor does cell b's record in the directory list it among the services it offers.
        let records = try await etcd.values(under: "/sb-test/supervised-cells/b", "cell b's record listing echo") {
            $0.values.contains { (try? JSONValue(parsing: $0))?["services"]?[EchoAPI.service] != nil }
        }
        let record = try JSONValue(parsing: try #require(records.values.first))
        #expect(record["services"]?[SupervisorAPI.service] == nil, "\(record)")

        await client.close()
        supervisor.close()
        await host.stop()
        await b.stop()
        await a.stop()
    }

    @Test("with the state in memory a cell has one kernel: a second of the same cell is refused at start, naming the first; it starts once the first stopped, or when the record it finds names a broker where nothing listens")
    func oneKernelPerCell() async throws {
        let etcd = try await TestEtcd.start()
        defer { etcd.stop() }
        let settings = etcdSettings(on: etcd, prefix: "/sb-test/one-kernel-cells")
        let first = try await TestKernel.start(cell("b", on: settings))
        let directory = try EtcdClient(endpoints: etcd.clientURLs)
        let record = Array("/sb-test/one-kernel-cells/b".utf8)
        try await etcd.values(under: "/sb-test/one-kernel-cells/b", "cell b's record in the directory") { !$0.isEmpty }
        let refused = await #expect(throws: KernelRefusal.self) { try await TestKernel.start(cell("b", on: settings)) }
        #expect(refused?.description.contains("cell b already has a kernel, at \(first.endpoints.broker)") == true, "\(String(describing: refused))")
        await first.stop()
        let second = try await TestKernel.start(cell("b", on: settings))
        await second.stop()

        // A record a killed kernel left (its lease has not run out), naming a broker where
        // nothing listens: nothing to wait for.
        _ = try await directory.put(record, Array(#"{"broker":"tcp://127.0.0.1:\#(freePort())","instance":"killed","services":{}}"#.utf8))
        await directory.close()
        let third = try await TestKernel.start(cell("b", on: settings))
        await third.stop()
    }

    @Test("a reader of cell a that vanishes without a word while a worker of cell b holds its request and sends nothing: a's probe of the quiet stream finds it gone, and b's worker is told to stop")
    func vanishedReaderAcrossCells() async throws {
        let etcd = try await TestEtcd.start()
        defer { etcd.stop() }
        let settings = etcdSettings(on: etcd, prefix: "/sb-test/vanished-reader")
        let a = try await TestKernel.start(cell("a", on: settings))
        let b = try await TestKernel.start { configuration in
            cell("b", on: settings)(&configuration)
            // The test's worker sends no heartbeats: b lets it be silent for the whole test.
            configuration.heartbeatLiveness = 1_000
        }
        let context = try ZMQContext()
        let worker = try ZMQSocket(context, .dealer)
        try worker.set(.linger, 0)
        try worker.set(.receiveTimeout, 30_000)
        try worker.connect(b.endpoints.broker)
        try worker.send(MDP.encode(.ready(service: "quiet", window: 1)))
        try await a.offers("quiet", from: ["b"])
        /// The next command but a heartbeat, within 30 s.
        func nextCommand(_ what: String) async throws -> BrokerToWorker {
            let deadline = ContinuousClock.now + .seconds(30)
            var command: BrokerToWorker
            repeat {
                guard ContinuousClock.now < deadline else { throw TimedOut(what: what) }
                command = try MDP.decodeAtWorker(try await worker.receiveOffPool())
            } while command == .heartbeat
            return command
        }
        // An 18/MDP reader of cell a on a socket of its own, closed with nothing more said.
        let reader = try ZMQSocket(context, .dealer)
        try reader.set(.linger, 0)
        try reader.connect(a.endpoints.broker)
        try reader.send(MDP.request(service: "quiet", body: ["wait"], version: .v02))
        guard case .request(let client, let body) = try await nextCommand("the reader's request") else { Issue.record("expected the reader's request"); return }
        #expect(body == ["wait"])
        reader.close()
        #expect(try await nextCommand("stop=1 for the reader's request") == .stop(client: client))
        worker.close()
        await b.stop()
        await a.stop()
    }

    @Test("with CURVE the sender's key crosses with its request: a worker in cell b that asks who sent it is told the key of the client of cell a")
    func callerCrosses() async throws {
        let etcd = try await TestEtcd.start()
        defer { etcd.stop() }
        let settings = etcdSettings(on: etcd, prefix: "/sb-test/secured-cells")
        let keysA = try CurveKeyPair.generate(), keysB = try CurveKeyPair.generate()
        let clientPair = try CurveKeyPair.generate(), workerPair = try CurveKeyPair.generate()
        // Each cell's kernel key is a worker key of the other: it offers that cell its services.
        let a = try await TestKernel.start { configuration in
            cell("a", on: settings)(&configuration)
            configuration.security = KernelSecurity(secretKey: keysA.secretKey, clientKeys: [clientPair.publicKey], workerKeys: [keysB.publicKey])
        }
        let b = try await TestKernel.start { configuration in
            cell("b", on: settings)(&configuration)
            configuration.security = KernelSecurity(secretKey: keysB.secretKey, clientKeys: [clientPair.publicKey], workerKeys: [workerPair.publicKey, keysA.publicKey])
            // The test's worker sends no heartbeats: b lets it be silent for 10 s.
            configuration.heartbeatLiveness = 100
        }
        let context = try ZMQContext()
        let worker = try ZMQSocket(context, .dealer)
        try worker.set(.linger, 0)
        try worker.set(.receiveTimeout, 10_000)
        try worker.secure(CurveClientKeys(serverKey: keysB.publicKey, secretKey: workerPair.secretKey))
        try worker.connect(b.endpoints.broker)
        try worker.send(MDP.encode(.ready(service: "asking", window: 1, callers: true)))
        let clientKeys = try CurveClientKeys(serverKey: keysA.publicKey, secretKey: clientPair.secretKey)
        let client = try await BusClient(brokers: [a.endpoints.broker], timeout: .seconds(10), curve: clientKeys)
        try await a.offers("asking", from: ["b"], curve: clientKeys)

        async let reply = client.call(service: "asking", body: ["x"])
        var command: BrokerToWorker
        repeat { command = try MDP.decodeAtWorker(try worker.receive()) } while command == .heartbeat
        guard case .request(let sender, let body) = command else { Issue.record("expected a REQUEST, got \(command)"); return }
        #expect(body == [Frame("client:" + clientPair.publicKey), "x"])
        try worker.send(MDP.encode(.reply(client: sender, body: ["ok"])))
        #expect(try await reply == ["ok"])

        // A request to every worker crosses with its sender's key too.
        let gather = client.gather(service: "asking", method: "who", paramsText: nil)
        repeat { command = try MDP.decodeAtWorker(try worker.receive()) } while command == .heartbeat
        guard case .request(let gatherSender, let copy) = command, copy.count == 2,
              case .single(.request(let request)) = JSONRPC.parseRequests(copy[1].bytes) else { Issue.record("expected a copy, got \(command)"); return }
        #expect(copy[0] == Frame("client:" + clientPair.publicKey))
        try worker.send(MDP.encode(.reply(client: gatherSender, body: [Frame(JSONRPC.resultReply(id: request.id ?? .null, resultText: Array("\"ok\"".utf8)))])))
        #expect(try await gather.end() == ["expected": 1, "answered": 1, "missing": []])

        await client.close()
        worker.close()
        await b.stop()
        await a.stop()
    }
}
