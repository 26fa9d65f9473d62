@testable import BusKit
import BusProtocol
import Contracts
import EchoService
import Foundation
import Kernel
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// Hosts an echo service against `kernel`, with fast heartbeats for tests.
func hostEcho(_ kernel: TestKernel, instance: String = "echo", connections: Int = 2, window: Int = 16, curve: CurveClientKeys? = nil,
              maxMessageSize: Int? = nil,
              onReregistered: @escaping @Sendable () async -> Void = {}) async throws -> ServiceHost<EchoService> {
    let options = ServiceHost<EchoService>.Options(brokers: [kernel.endpoints.broker], connections: connections, window: window,
                                                   heartbeatInterval: kernel.configuration.heartbeatInterval,
                                                   heartbeatLiveness: kernel.configuration.heartbeatLiveness, curve: curve,
                                                   maxMessageSize: maxMessageSize ?? kernel.configuration.maxMessageSize)
    let host = try ServiceHost(service: EchoService(instance: instance), options: options, onReregistered: onReregistered)
    try await host.start()
    return host
}

@Suite("BusKit: client, service hosting and subscriptions through a live kernel")
struct BusKitTests {
    @Test("a request reaches the hosted service and its result comes back")
    func requestReply() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let host = try await hostEcho(kernel)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        try await kernel.workers("echo")
        #expect(try await bus.request(service: "echo", method: "echo", params: ["hello": "world"]) == ["hello": "world"])
        #expect(try await bus.request(service: "kernel", method: "ping")["pong"] == true)
        await bus.close()
        await host.stop()
        await kernel.stop()
    }

    @Test("a call made for a purpose names it and the service; the service's code and data stay, its message is said once and its data only as data")
    func callNeededFor() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        do {
            _ = try await bus.call(KernelAPI.stateSet, .init(key: "/client/needed", value: 1, revision: 5), neededFor: "the test's write")
            Issue.record("expected -32004")
        } catch {
            #expect(error.code == -32004 && error.data?["expected"] == 5 && error.data?["service"] == "kernel", "\(error)")
            #expect(error.message.hasPrefix("the test's write needs the kernel service: kernel: error -32004: Conflict: /client/needed is absent, not at revision 5; read it again and decide"), "\(error.message)")
            #expect(!error.message.contains("{"), "the data is not in the message: \(error.message)")
        }
        await bus.close()
        await kernel.stop()
    }

    @Test("typed errors: unknown method -32601, bad params -32602 naming the field, a service's own error")
    func errors() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let host = try await hostEcho(kernel)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        try await kernel.workers("echo")
        await #expect(throws: BusError.remote(service: "echo", .methodNotFound("nope"))) {
            try await bus.request(service: "echo", method: "nope")
        }
        do {
            _ = try await bus.request(service: "echo", method: "count", params: ["n": "three"])
            Issue.record("expected -32602")
        } catch {
            #expect(error.code == -32602)
            guard case .remote(_, let rpc) = error else { Issue.record("expected a remote error"); return }
            #expect(rpc.data?["field"] == "n")
            #expect(rpc.message.contains("must be an integer"))
        }
        do {
            _ = try await bus.request(service: "echo", method: "count", params: [:])
            Issue.record("expected -32602")
        } catch {
            guard case .remote(_, let rpc) = error else { Issue.record("expected a remote error"); return }
            #expect(rpc.data?["field"] == "n")
            #expect(rpc.message.contains("is required"))
        }
        await #expect(throws: BusError.remote(service: "echo", JSONRPCError(code: -32042, message: "nope"))) {
            try await bus.request(service: "echo", method: "fail", params: ["code": -32042, "message": "nope"])
        }
        // Malformed JSON sent as an opaque body is answered with -32700.
        let reply = try await bus.call(service: "echo", body: ["{not json"])
        #expect(try JSONRPC.parseResponses(reply[0].bytes).first?.outcome.failureCode == -32700)
        await bus.close()
        await host.stop()
        await kernel.stop()
    }

    @Test("no worker: -32001 within the queue timeout; nobody answers: the client's own timeout")
    func unavailableAndTimeout() async throws {
        let kernel = try await TestKernel.start { $0.queueTimeout = .milliseconds(300) }
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        let started = ContinuousClock.now
        do {
            _ = try await bus.request(service: "ghost", method: "x", timeout: .seconds(5))
            Issue.record("expected -32001")
        } catch {
            #expect(error.code == -32001)
            guard case .unavailable(let service, let message) = error else { Issue.record("\(error)"); return }
            #expect(service == "ghost")
            #expect(message.contains("no worker for 'ghost'"))
        }
        #expect(ContinuousClock.now - started < .seconds(3))
        // A kernel that is not there: the client's timeout, named, kept by the client's clock
        // (moved here: 30 s pass in no time).
        let clock = ManualClock()
        let nowhere = try await BusClient(brokers: ["tcp://127.0.0.1:\(freePort())"], clock: clock)
        let outcome = Task { () -> BusError? in
            do throws(BusError) { _ = try await nowhere.request(service: "echo", method: "echo", timeout: .seconds(30)) } catch { return error }
            return nil
        }
        try await eventually(5, "the request waits") { await nowhere.waitingCount() == 1 }
        clock.advance(.seconds(30))
        #expect(try await within(5, "the timeout") { await outcome.value } == BusError.timedOut(service: "echo", method: "echo", after: .seconds(30)))
        await nowhere.close()
        await bus.close()
        await kernel.stop()
    }

    @Test("a request asked by a task already cancelled ends at once as .cancelled, alone or in a batch; it never waits for its timeout")
    func askedWhenCancelled() async throws {
        // No kernel, and a clock nobody moves: only the cancellation can end these requests.
        let clock = ManualClock()
        let nowhere = try await BusClient(brokers: ["tcp://127.0.0.1:\(freePort())"], clock: clock)
        // A child task added to a group already cancelled starts cancelled.
        let errors = try await within(5, "the cancelled requests") {
            await withTaskGroup(of: [BusError?].self) { group in
                group.cancelAll()
                group.addTask {
                    var errors: [BusError?] = []
                    do throws(BusError) {
                        _ = try await nowhere.request(service: "echo", method: "echo", timeout: .seconds(30))
                        errors.append(nil)
                    } catch { errors.append(error) }
                    for outcome in await nowhere.batch(KernelAPI.ping, [NoParams(), NoParams()], timeout: .seconds(30)) {
                        if case .failure(let error) = outcome { errors.append(error) } else { errors.append(nil) }
                    }
                    return errors
                }
                return await group.next() ?? []
            }
        }
        let cancelledPing = BusError.cancelled(service: "kernel", method: "ping")
        #expect(errors == [.cancelled(service: "echo", method: "echo"), cancelledPing, cancelledPing])
        #expect(await nowhere.waitingCount() == 0)
        await nowhere.close()
    }

    @Test("a closed client answers every later request at once with .closed; it never waits on its stopped loop")
    func useAfterClose() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(30))
        _ = try await bus.request(service: "kernel", method: "ping")
        await bus.close()
        try await within(5, "requests after close") {
            await #expect(throws: BusError.closed) { try await bus.request(service: "kernel", method: "ping") }
            #expect(await bus.batch(KernelAPI.ping, [NoParams()]).map { (try? $0.get())?.pong } == [nil])
            await #expect(throws: BusError.closed) { try await bus.hasWorkers("kernel") }
        }
        await kernel.stop()
    }

    @Test("a request over the kernel's max_message_size fails at once with -32010 naming the limit; a reply over it is answered -32010 by the worker")
    func oversizedRequest() async throws {
        let limit = 256 * 1024
        let kernel = try await TestKernel.start { $0.maxMessageSize = limit }
        let host = try await hostEcho(kernel)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(10), maxMessageSize: limit)
        try await kernel.workers("echo")
        let started = ContinuousClock.now
        let error = await rpcError { try await bus.request(service: "echo", method: "echo", params: ["blob": .string(String(repeating: "x", count: limit))]) }
        #expect(ContinuousClock.now - started < .seconds(1), "at once, not after the timeout")
        #expect(error?.code == JSONRPCError.tooLargeCode && error?.message.contains("kernel.max_message_size") == true, "\(String(describing: error))")
        #expect(error?.data?["limit"] == .int(Int64(limit)))
        let batch = await bus.batch(EchoAPI.echo, [["blob": .string(String(repeating: "x", count: limit))]])
        #expect(batch.count == 1 && (try? batch[0].get()) == nil)
        let small = try await bus.request(service: "echo", method: "echo", params: ["blob": .string(String(repeating: "x", count: limit / 2))])
        #expect(small["blob"]?.stringValue?.count == limit / 2)
        #expect(await bus.counters().resent == 0, "nothing was sent that the kernel would drop")
        await host.stop()

        // A reply over its worker's limit is answered -32010 by the worker itself, not lost
        // with the connection the kernel would drop.
        let strict = try await hostEcho(kernel, maxMessageSize: limit / 4)
        try await kernel.workers("echo")
        let bigReply = await rpcError { try await bus.request(service: "echo", method: "echo", params: ["blob": .string(String(repeating: "x", count: limit / 2))]) }
        #expect(bigReply?.code == JSONRPCError.tooLargeCode && bigReply?.message.contains("the reply is") == true, "\(String(describing: bigReply))")
        #expect(try await bus.request(service: "echo", method: "whoami") == "echo", "the worker still serves")
        await bus.close()
        await strict.stop()
        await kernel.stop()
    }

    @Test("two hosted workers share the load")
    func loadSharing() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let first = try await hostEcho(kernel, instance: "first", connections: 1)
        let second = try await hostEcho(kernel, instance: "second", connections: 1)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        try await kernel.workers("echo", atLeast: 2)
        let answers = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<40 {
                // Generous: on a loaded machine a worker may miss heartbeats and re-register, and
                // the kernel re-sends its request after the expiry; the test is about sharing.
                group.addTask { try await bus.request(service: "echo", method: "sleep", params: ["ms": 5], timeout: .seconds(15))["instance"]?.stringValue ?? "" }
            }
            var answers: [String] = []
            for try await answer in group { answers.append(answer) }
            return answers
        }
        #expect(answers.count == 40)
        #expect(answers.contains("first") && answers.contains("second"))
        #expect(await first.service.handled + second.service.handled == 40)
        await bus.close()
        await first.stop()
        await second.stop()
        await kernel.stop()
    }

    @Test("10 clients with 1,000 requests each in flight get every reply exactly once")
    func manyInFlight() async throws {
        let kernel = try await TestKernel.start { configuration in
            fastHeartbeats(&configuration)
            configuration.queueTimeout = .seconds(60)
        }
        let host = try await hostEcho(kernel, connections: 4)
        let probe = try await BusClient(brokers: [kernel.endpoints.broker])
        try await kernel.workers("echo")
        let totals = try await within(120, "10,000 requests") {
            try await withThrowingTaskGroup(of: Int.self) { group in
                for client in 0..<10 {
                    group.addTask {
                        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(60))
                        let seen = try await withThrowingTaskGroup(of: Int64.self) { requests in
                            for index in 0..<1_000 {
                                requests.addTask {
                                    try await bus.request(service: "echo", method: "count", params: ["n": .int(Int64(client * 1_000 + index))]).intValue ?? -1
                                }
                            }
                            var seen: [Int64] = []
                            for try await value in requests { seen.append(value) }
                            return seen
                        }
                        await bus.close()
                        #expect(Set(seen) == Set((0..<1_000).map { Int64(client * 1_000 + $0) }))
                        return seen.count
                    }
                }
                var total = 0
                for try await count in group { total += count }
                return total
            }
        }
        #expect(totals == 10_000)
        #expect(await host.service.handled == 10_000)
        await probe.close()
        await host.stop()
        await kernel.stop()
    }

    @Test("a subscription gets the snapshot, then every update once, in order, while writers race it")
    func subscription() async throws {
        let kernel = try await TestKernel.start()
        let bus = try await BusClient(brokers: [kernel.endpoints.broker])
        let publisher = StatePublisher(client: bus)
        for index in 0..<20 { try await publisher.set("/catalog/item\(index)", ["v": 0]) }
        // Writers keep going while the subscription starts: nothing may be lost or doubled.
        let writer = Task {
            for round in 1...50 {
                for index in 0..<20 { try await publisher.set("/catalog/item\(index)", ["v": .int(Int64(round))]) }
            }
            try await publisher.set("/catalog/done", true)
        }
        let subscription = try await Subscription.open(snapshot: kernel.endpoints.snapshot, publisher: kernel.endpoints.publisher,
                                                       prefixes: ["/catalog/"])
        let values = try await within(30, "all updates") {
            var values: [String: Int64] = [:]
            var lastSequence: UInt64 = 0
            var snapshotDone = false
            for try await event in subscription {
                if case .synced = event { continue }
                let update = try #require(event.update, "no gap: \(event)")
                if update.fromSnapshot { #expect(!snapshotDone) } else { snapshotDone = true }
                if !update.fromSnapshot {
                    #expect(update.sequence > lastSequence, "updates arrive once, in sequence order")
                    lastSequence = update.sequence
                }
                if update.key == "/catalog/done" { break }
                let value = update.json?["v"]?.intValue ?? -1
                if let previous = values[update.key] { #expect(value >= previous, "\(update.key) went back") }
                values[update.key] = value
            }
            return values
        }
        try await writer.value
        #expect(values.count == 20)
        #expect(values.values.allSatisfy { $0 == 50 })
        await subscription.cancel()
        await bus.close()
        await kernel.stop()
    }

    @Test("a kernel restart under a live worker and a live subscription: re-registration, resync, state kept")
    func kernelRestart() async throws {
        var kernel = try await TestKernel.start(fixedPorts: true, fastHeartbeats)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(2))
        let publisher = StatePublisher(client: bus)
        let republished = Observed(0)
        let host = try await hostEcho(kernel, onReregistered: {
            let count = await publisher.republish()
            republished.update { $0 += count }
        })
        try await kernel.workers("echo")
        let sequenceBefore = try await publisher.set("/store/history", ["items": ["paris"]])
        let subscription = try await Subscription.open(snapshot: kernel.endpoints.snapshot, publisher: kernel.endpoints.publisher,
                                                       prefixes: ["/store/"], silenceTimeout: .seconds(2))
        let first = try await within(10, "snapshot") { try await subscription.next()?.update }
        #expect(first?.key == "/store/history" && first?.fromSnapshot == true)

        await kernel.stop()
        kernel = try await kernel.restarted()
        let restarted = kernel

        // The worker registers again by itself; requests work again.
        try await kernel.workers("echo", within: 15)
        // A connection may still be settling in (a request it lost is re-sent after its expiry).
        #expect(try await bus.request(service: "echo", method: "whoami", timeout: .seconds(15)) == "echo")
        // The service republished its state, so the new kernel has it...
        try await kernel.state("/store/", "state republished") { $0.count == 1 }
        // Counted once the republish returns, which can be after the kernel holds what it wrote.
        _ = try await republished.wait(within: 15, "the republish counted", until: { $0 >= 1 })
        // ...and the subscription resynchronised and goes on with live updates. Sequence
        // numbers keep growing across the restart.
        let sequenceAfter = try await publisher.set("/store/history", ["items": ["paris", "rome"]])
        #expect(sequenceAfter > sequenceBefore)
        let next = try await within(15, "update after restart") { () -> StateUpdate? in
            while let event = try await subscription.next() {
                if let update = event.update, update.json?["items"]?.arrayValue?.count == 2 { return update }
            }
            return nil
        }
        #expect(next?.key == "/store/history")
        #expect(await subscription.resyncCount() >= 1)
        await subscription.cancel()
        await host.stop()
        await bus.close()
        await restarted.stop()
    }

    @Test("a request in flight when the kernel dies is sent again to the new kernel and answered once")
    func requestSurvivesKernelRestart() async throws {
        var kernel = try await TestKernel.start(fixedPorts: true, fastHeartbeats)
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(20))
        let careful = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(20), resendAfterReconnect: false)
        // No worker yet: both requests wait in the kernel's queue when it goes down.
        let answer = Task { try await bus.request(service: "echo", method: "echo", params: ["survived": true]) }
        let refused = Task { try await careful.request(service: "echo", method: "echo", params: ["survived": true]) }
        try await eventually(5, "both requests queued in the kernel") {
            let list = try await bus.request(service: "kernel", method: "services.list", timeout: .milliseconds(500))
            return list["services"]?.arrayValue?.first { $0["name"] == "echo" }?["queued"] == 2
        }
        await kernel.stop()
        // The careful client's request might have run: it fails at once with -32006.
        await #expect(throws: BusError.remote(service: "echo", .outcomeUnknown("echo", JSONRPCError.connectionDropped))) { try await refused.value }
        kernel = try await kernel.restarted()
        let host = try await hostEcho(kernel)
        #expect(try await answer.value == ["survived": true])
        let counters = await bus.counters()
        #expect(counters.resent == 1)
        #expect(counters.duplicateReplies == 0)
        await host.stop()
        await bus.close()
        await careful.close()
        await kernel.stop()
    }

    @Test("requests still queued for a connection when it drops reach the kernel once after the reconnect, not twice")
    func queuedRequestsSentOnceAfterReconnect() async throws {
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        let context = try ZMQContext()
        // A stand-in that takes one message and no more: the rest back up in TCP's buffers and
        // in libzmq's queue for the connection, which outlives it and would send them again.
        var standIn = try await kernelStandIn(at: endpoint, in: context, receiveHighWaterMark: 1)
        let client = try await BusClient(brokers: [endpoint], timeout: .seconds(60))
        let count = 64
        let padding = JSONValue.string(String(repeating: "x", count: 256 * 1024))
        let requests = (0..<count).map { n in
            Task { try? await client.request(service: "echo", method: "echo", params: ["n": .int(Int64(n)), "padding": padding]) }
        }
        try await eventually(10, "every request handed to the connection") { await client.waitingCount() == count }
        _ = try await standIn.receiveOffPool()
        standIn.close()
        standIn = try await kernelStandIn(at: endpoint, in: context)
        func received() async throws -> Int? {
            let message = try await standIn.receiveOffPool()
            return try JSONValue(parsing: message.frames.last!.bytes)["params"]?["n"]?.intValue.map { Int($0) }
        }
        var copies: [Int: Int] = [:]
        while copies.count < count, let n = try await received() { copies[n, default: 0] += 1 }
        // Whatever was sent again went out before this last request, on the same connection.
        #expect(await client.counters().resent > 0)
        let last = Task { try? await client.request(service: "echo", method: "echo", params: ["n": .int(Int64(count))]) }
        while let n = try await received(), n != count { copies[n, default: 0] += 1 }
        #expect(copies.count == count && copies.values.allSatisfy { $0 == 1 }, "sent twice: \(copies.filter { $0.value > 1 }.keys.sorted())")
        await client.close()
        for request in requests + [last] { _ = await request.value }
        standIn.close()
    }

    @Test("a worker process killed mid-request: the other worker answers it")
    func killedWorkerProcess() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let arguments = { (instance: String) in
            ["serve", "echo", "--broker", kernel.endpoints.broker, "--connections", "1", "--heartbeat-ms", "100",
             "--liveness", "10", "--instance", instance, "--log-level", "warning"]
        }
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(30))
        // The doomed worker registers first, so it is the least recently used: it gets the request.
        let doomed = try ChildProcess(switchboardExecutable(), arguments("doomed"))
        defer { doomed.stop(grace: 1) }
        try await kernel.workers("echo", within: 20, "the doomed worker registered") { $0 == 1 }
        let survivor = try ChildProcess(switchboardExecutable(), arguments("survivor"))
        defer { survivor.stop() }
        try await kernel.workers("echo", within: 20, "the survivor registered") { $0 == 2 }
        let slow = Task { try await bus.request(service: "echo", method: "sleep", params: ["ms": 1_500]) }
        try await eventually(10, "the request is in flight") {
            let list = try await bus.request(service: "kernel", method: "services.list")
            return list["services"]?.arrayValue?.first { $0["name"] == "echo" }?["inFlight"] == 1
        }
        doomed.signal(SIGKILL)
        let answer = try await slow.value
        #expect(answer["instance"] == "survivor")
        #expect(answer["slept"] == 1_500)
        let stats = try await bus.request(service: "kernel", method: "stats")
        #expect(stats["services"]?["echo"]?["redispatched"] == 1)
        await bus.close()
        await kernel.stop()
    }
}

extension Result where Success == JSONValue, Failure == JSONRPCError {
    var failureCode: Int? { if case .failure(let error) = self { error.code } else { nil } }
}

/// A service whose `block` holds its thread (no await) for `ms` milliseconds, as a handler
/// that parses a huge body or makes a blocking database call does.
private actor Blocking: BusService {
    static let name = "blocking"
    struct Params: Codable, Sendable { var ms: Int }
    static let block = Method<Params, Int>(name, "block", "Holds its thread for ms milliseconds, then answers with ms.")

    nonisolated func methods(_ table: inout MethodTable<Blocking>) {
        table.on(Self.block) { _, params in
            usleep(UInt32(params.ms) * 1_000)
            return params.ms
        }
    }
}

@Suite("ServiceHost keeps its heartbeats whatever its handlers do")
struct HandlerIsolationTests {
    @Test("handlers that hold their threads for three worker expiries: every connection keeps beating, each reply arrives, no worker is dropped or request sent twice")
    func blockingHandlers() async throws {
        let kernel = try await TestKernel.start(fastHeartbeats)
        let expiry = kernel.configuration.heartbeatInterval * kernel.configuration.heartbeatLiveness
        let options = ServiceHost<Blocking>.Options(brokers: [kernel.endpoints.broker], connections: 2, window: 2,
                                                    heartbeatInterval: kernel.configuration.heartbeatInterval,
                                                    heartbeatLiveness: kernel.configuration.heartbeatLiveness)
        let host = try ServiceHost(service: Blocking(), options: options)
        try await host.start()
        let bus = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(60))
        try await kernel.workers("blocking", atLeast: 2)
        let ms = Int((expiry * 3) / .milliseconds(1))
        // As many at once as the host has places: every connection's handlers hold threads.
        let answers = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<4 { group.addTask { try await bus.call(Blocking.block, .init(ms: ms)) } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(answers == [ms, ms, ms, ms])
        let stats = try await bus.call(KernelAPI.stats).services["blocking"]
        #expect(stats?.workers == 2 && stats?.redispatched == 0 && stats?.replies == 4, "\(String(describing: stats))")
        await bus.close()
        await host.stop()
        await kernel.stop()
    }
}
