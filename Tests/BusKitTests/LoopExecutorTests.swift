@testable import BusKit
import BusProtocol
import Contracts
import Foundation
import Kernel
import SwitchboardTestSupport
import Testing
import ZeroMQ
#if canImport(Glibc)
import Glibc
#endif

private enum ThreadsAPI {
    static let service = "threads"
    static let plain = Method<NoParams, Int>(service, "plain", "Answers without awaiting anything.")
    static let whereRun = Method<NoParams, String>(service, "where", "The threads the handler ran on: at its start, after a sleep, in the service actor.")
}

/// Names the threads its handler runs on: at its start, after it awaited a sleep, and inside
/// the service's own (default) actor.
private actor Threads: BusService {
    static let name = ThreadsAPI.service
    nonisolated func methods(_ table: inout MethodTable<Threads>) {
        table.on(ThreadsAPI.whereRun) { service, _ in
            let first = currentThreadName()
            try await Task.sleep(for: .milliseconds(1))
            let afterSleep = currentThreadName()
            let inActor = await service.threadName()
            return "\(first) \(afterSleep) \(inActor)"
        }
        table.on(ThreadsAPI.plain) { _, _ in 1 }
    }

    func threadName() -> String { currentThreadName() }
}

private func currentThreadName() -> String { "\(UInt(bitPattern: Int(bitPattern: pthread_self())))" }

/// The thread `loop` runs on, named as ``currentThreadName()`` names threads.
private func thread(of loop: SocketLoop) async throws -> String {
    try await loop.run { currentThreadName() }
}

/// A kernel, the threads service hosted on `connections` connections, and a client.
private func startThreads(connections: Int) async throws -> (TestKernel, ServiceHost<Threads>, BusClient) {
    let kernel = try await TestKernel.start(fastHeartbeats)
    let host = try ServiceHost(service: Threads(), options: DatasetBus.hostOptions(kernel, connections: connections))
    try await host.start()
    try await kernel.workers(ThreadsAPI.service, atLeast: connections)
    return (kernel, host, try await BusClient(brokers: [kernel.endpoints.broker]))
}

@Suite("Loops as task executors: a hosted handler keeps off its connection's loop; a client's caller stays on the client's loop")
struct LoopExecutorTests {
    @Test("a handler never runs on its connection's loop thread, before or after it awaits (the loop keeps the heartbeats); a caller that prefers bus.executor is answered on the client's loop")
    func threads() async throws {
        let (kernel, host, bus) = try await startThreads(connections: 2)

        var handlerThreads: Set<String> = []
        for _ in 0..<20 {
            let names = try await bus.call(ThreadsAPI.whereRun).split(separator: " ").map(String.init)
            #expect(names.count == 3, "\(names)")
            handlerThreads.formUnion(names)
        }
        var hostLoops: Set<String> = []
        for loop in host.loops { hostLoops.insert(try await thread(of: loop)) }
        #expect(hostLoops.count == 2, "a loop thread per connection")
        #expect(!handlerThreads.isEmpty && handlerThreads.isDisjoint(with: hostLoops), "the handlers ran off the connections' loops: \(handlerThreads) and \(hostLoops)")

        let answeredOn = try await withTaskExecutorPreference(bus.executor) {
            _ = try await bus.call(ThreadsAPI.whereRun)
            return currentThreadName()
        }
        #expect(answeredOn == (try await thread(of: bus.loop)))

        await bus.close()
        await host.stop()
        await kernel.stop()
    }

    @Test("a request costs its host's loop a bounded number of jobs: taking the request, and the reply handed back")
    func jobsPerRequest() async throws {
        let (kernel, host, bus) = try await startThreads(connections: 1)
        _ = try await bus.call(ThreadsAPI.plain)
        let loop = host.loops[0]
        let requests = 200
        let before = try await loop.run { loop.jobsRun }
        for _ in 0..<requests { _ = try await bus.call(ThreadsAPI.plain) }
        let jobs = try await loop.run { loop.jobsRun } - before
        // One at a time, five in a debug build: the request resumes the connection's task, and
        // the reply comes back to the connection as an actor hop; the handler runs on the pool.
        #expect(jobs <= 5 * requests + 10, "\(jobs) jobs for \(requests) requests")
        await bus.close()
        await host.stop()
        await kernel.stop()
    }
}
