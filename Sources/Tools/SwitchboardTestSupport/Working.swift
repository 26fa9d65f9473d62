public import BusKit
import ServiceLifecycle
import Synchronization

/// A service's work (``ServiceWork``) running in a test as its process's `ServiceGroup` runs
/// it, started and stopped where the test says: ``start()`` runs the parts it needs (the
/// store's database connections), prepares it and runs its work as a task; ``stop()`` cancels
/// the work, waits for it, finishes the service, then stops those parts.
public final class Working: Sendable {
    private let prepare: @Sendable () async -> Void
    private let work: @Sendable () async -> Void
    private let finish: @Sendable () async -> Void
    private let needed: [any Service]
    private let tasks = Mutex<(work: Task<Void, Never>?, needed: [Task<Void, Never>])>((nil, []))

    public init(_ service: some ServiceWork) {
        prepare = { await service.prepare() }
        work = { await service.work() }
        finish = { await service.finish() }
        needed = service.requiredParts
    }

    public func start() async {
        // Test support: the test owns these tasks' life (stop() ends them).
        let needed = self.needed.map { part in Task { _ = try? await part.run() } }
        tasks.withLock { $0.needed = needed }
        await prepare()
        let work = self.work
        tasks.withLock { $0.work = Task { await work() } }
    }

    public func stop() async {
        let running = tasks.withLock { tasks in
            defer { tasks = (nil, []) }
            return tasks
        }
        running.work?.cancel()
        await running.work?.value
        await finish()
        for part in running.needed.reversed() {
            part.cancel()
            await part.value
        }
    }
}
