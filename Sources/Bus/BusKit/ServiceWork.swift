public import ServiceLifecycle

/// A service's work beside answering requests (following the catalog, publishing its
/// state), as one part of its process's `ServiceGroup`: started when the group runs,
/// stopped at graceful shutdown. The group lists a process's parts in dependency order
/// (client, subscription, publisher, host, service) and stops them in reverse, so the
/// work stops first and the client that carried it last.
public protocol ServiceWork: Service, Actor {
    func start() async
    func stop() async
}

extension ServiceWork {
    public func run() async throws {
        await start()
        try? await gracefulShutdown()
        await stop()
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
