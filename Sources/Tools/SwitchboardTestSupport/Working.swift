public import BusKit
import Synchronization

/// A service's work (``ServiceWork``) running in a test as its process's `ServiceGroup` runs
/// it, started and stopped where the test says: ``start()`` prepares it and runs its work as
/// a task, ``stop()`` cancels the work, waits for it and finishes the service.
public final class Working: Sendable {
    private let prepare: @Sendable () async -> Void
    private let work: @Sendable () async -> Void
    private let finish: @Sendable () async -> Void
    private let task = Mutex<Task<Void, Never>?>(nil)

    public init(_ service: some ServiceWork) {
        prepare = { await service.prepare() }
        work = { await service.work() }
        finish = { await service.finish() }
    }

    public func start() async {
        await prepare()
        let work = self.work
        // Test support: the test owns the task's life (stop() ends it).
        task.withLock { $0 = Task { await work() } }
    }

    public func stop() async {
        let running = task.withLock { task in
            defer { task = nil }
            return task
        }
        running?.cancel()
        await running?.value
        await finish()
    }
}
