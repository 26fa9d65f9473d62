public import BusKit
import Synchronization

/// Tests and tools start and stop a ``ServiceHost`` where they like, as a process's
/// `ServiceGroup` runs it: ``ServiceHost/start()`` serves it in a task the test owns (until
/// ``ServiceHost/stop()``), returning once it registered.
extension ServiceHost {
    public func start() async throws {
        let (stopped, stop) = AsyncStream.makeStream(of: Void.self)
        let (registered, didRegister) = AsyncThrowingStream.makeStream(of: Void.self)
        let task = Task {
            do {
                try await self.serve(onRegistered: { didRegister.yield() }) {
                    for await _ in stopped {}
                }
                didRegister.finish()
            } catch {
                didRegister.finish(throwing: error)
            }
        }
        StartedHosts.tasks.withLock { $0[ObjectIdentifier(self)] = (task, stop) }
        for try await _ in registered { return }
    }

    /// Unregisters after the requests in flight (up to the drain timeout) and waits for it.
    public func stop() async {
        guard let (task, stop) = StartedHosts.tasks.withLock({ $0.removeValue(forKey: ObjectIdentifier(self)) }) else { return }
        stop.finish()
        await task.value
    }
}

/// The hosts started by tests, by identity.
private enum StartedHosts {
    static let tasks = Mutex<[ObjectIdentifier: (Task<Void, Never>, AsyncStream<Void>.Continuation)]>([:])
}
