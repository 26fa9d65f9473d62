public import ServiceLifecycle

/// A service's work beside answering requests (following the catalog, refreshing, publishing
/// its state), as one part of its process's `ServiceGroup`. The group lists a process's parts
/// in dependency order (client, subscription, publisher, ``requiredParts``, service, host)
/// and stops them in reverse: the host drains the requests in flight while the work and what
/// ``finish()`` releases are still there, and the client that carried it all stops last.
///
/// Structured: ``work()`` runs as a child task of ``run()`` until graceful shutdown cancels
/// it, and whatever it starts runs in task groups that end with it; nothing outlives the part.
public protocol ServiceWork: Service, Actor {
    /// What must be done before the work starts, awaited (bringing back saved copies);
    /// cancelled, like the work, by graceful shutdown.
    func prepare() async
    /// The work itself: until cancelled (or done).
    func work() async
    /// After the work ended: releases what it held (HTTP clients).
    func finish() async
    /// Parts of its process that must run before it and stop after it (the store's database
    /// connections): the group lists them just before the service.
    nonisolated var requiredParts: [any Service] { get }
}

extension ServiceWork {
    public func prepare() async {}
    public func finish() async {}
    public nonisolated var requiredParts: [any Service] { [] }

    public func run() async throws {
        await withDiscardingTaskGroup { group in
            // Preparing is cancelled by graceful shutdown too: what it awaits (requests to
            // a kernel changing hands, each with its own timeout) must not hold up the stop.
            group.addTask {
                await self.prepare()
                guard !Task.isCancelled else { return }
                await self.work()
            }
            // Until graceful shutdown (or cancellation): then the work is cancelled, and the
            // group waits for it to end.
            try? await gracefulShutdown()
            group.cancelAll()
        }
        await finish()
    }
}

extension BusClient: Service {
    /// Serves its owners until graceful shutdown, then closes.
    public func run() async throws {
        try? await gracefulShutdown()
        await close()
    }
}

extension StatePublisher: Service {
    /// Publishes until graceful shutdown, then refuses to publish more.
    public func run() async throws {
        try? await gracefulShutdown()
        close()
    }
}

extension Subscription: Service {
    /// Delivers until graceful shutdown, then cancels.
    public func run() async throws {
        try? await gracefulShutdown()
        await cancel()
    }
}
