import BusKit
import Logging
import SwitchboardTestSupport
import ServiceLifecycle
import Testing

/// A service's own work, recording what happened to it.
private actor RecordingWork: ServiceWork {
    private(set) var events: [String] = []
    private var working: CheckedContinuation<Void, Never>?

    func prepare() { events.append("prepare") }

    func work() async {
        events.append("work")
        // A child task of the work, as a service's schedules are: it must end with it.
        await withDiscardingTaskGroup { group in
            group.addTask {
                while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
                await self.note("child ended")
            }
            group.addTask { await self.started() }
        }
        events.append("work ended")
    }

    func finish() { events.append("finish") }

    func note(_ event: String) { events.append(event) }

    private func started() {
        working?.resume()
        working = nil
    }

    /// Returns once `work()` runs.
    func waitUntilWorking() async {
        if events.contains("work") { return }
        await withCheckedContinuation { working = $0 }
    }
}

/// A service whose preparing waits until it is cancelled (requests to a kernel that does
/// not answer, each waiting its timeout).
private actor StuckPreparing: ServiceWork {
    private(set) var events: [String] = []
    private var preparing: CheckedContinuation<Void, Never>?

    func prepare() async {
        events.append("prepare")
        preparing?.resume()
        preparing = nil
        while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
        events.append("prepare cancelled")
    }

    func work() { events.append("work") }

    func finish() { events.append("finish") }

    /// Returns once `prepare()` runs.
    func waitUntilPreparing() async {
        if events.contains("prepare") { return }
        await withCheckedContinuation { preparing = $0 }
    }
}

@Suite("ServiceWork: a service's work lives inside its run()")
struct ServiceWorkTests {
    @Test("run() prepares, works until graceful shutdown, cancels the work and its children, then finishes")
    func gracefulShutdown() async throws {
        let work = RecordingWork()
        let group = ServiceGroup(services: [work], logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        try await withThrowingTaskGroup { tasks in
            tasks.addTask { try await group.run() }
            await work.waitUntilWorking()
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
        }
        #expect(await work.events == ["prepare", "work", "child ended", "work ended", "finish"])
    }

    @Test("graceful shutdown while it prepares cancels the preparing; the work never starts, and the service finishes")
    func shutdownWhilePreparing() async throws {
        let service = StuckPreparing()
        let group = ServiceGroup(services: [service], logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        try await within(10, "the group stopped") {
            try await withThrowingTaskGroup { tasks in
                tasks.addTask { try await group.run() }
                await service.waitUntilPreparing()
                await group.triggerGracefulShutdown()
                try await tasks.waitForAll()
            }
        }
        #expect(await service.events == ["prepare", "prepare cancelled", "finish"])
    }

    @Test("Working (test support) starts the work as run() would and stop() ends it: prepared, cancelled with its children, finished")
    func working() async throws {
        let work = RecordingWork()
        let working = Working(work)
        await working.start()
        await work.waitUntilWorking()
        await working.stop()
        #expect(await work.events == ["prepare", "work", "child ended", "work ended", "finish"])
    }
}
