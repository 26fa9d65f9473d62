import BusKit
import BusProtocol
import ContractKit
import EchoService
import FetcherService
import Foundation
import Logging
import PricingService
import SearchService
import ServiceLifecycle
import StoreService
import SwitchboardConfig
import ZeroMQ

/// Where a service finds its kernel and how it connects: what `switchboard serve` and
/// `switchboard up --single-process` both need to build a service.
struct Connection {
    var brokers: [String]
    var state: StateEndpoints
    var workers: Int
    /// Requests each worker connection holds at once.
    var window: Int
    var heartbeatInterval: Duration
    var liveness: Int
    var curve: CurveClientKeys?
    /// A shared context (in one process, for inproc:// endpoints); nil: each piece its own.
    var context: ZMQContext?
    var instance: String?
    /// The kernel's `max_message_size`.
    var maxMessageSize = MDP.defaultMaxMessageSize

    func hostOptions<S>() -> ServiceHost<S>.Options {
        ServiceHost<S>.Options(brokers: brokers, connections: workers, window: window, heartbeatInterval: heartbeatInterval,
                               heartbeatLiveness: liveness, curve: curve, maxMessageSize: maxMessageSize)
    }

    func client() async throws -> BusClient {
        try await BusClient(brokers: brokers, context: context, curve: curve, maxMessageSize: maxMessageSize)
    }

    /// `/catalog/*` from the kernel's state server, for services that follow the datasets.
    func catalogSubscription() async throws -> Subscription {
        try await Subscription.open(snapshot: state.snapshot, publisher: state.publisher, prefixes: ["/catalog/"],
                                    context: context, curve: curve)
    }
}

/// The services `switchboard` can run, by name.
enum Pieces {
    static let names = ConfigFile.serviceNames

    /// Builds service `name`, ready to run in a `ServiceGroup`.
    static func service(_ name: String, file: ConfigFile, connection: Connection) async throws -> any Service {
        let logger = Logger(label: "switchboard.\(name)")
        switch name {
        case "store":
            let service = StoreService(configuration: file.store, logger: logger)
            let client = try await connection.client()
            let publisher = StatePublisher(client: client)
            let host = try ServiceHost(service: service, options: connection.hostOptions(), context: connection.context, logger: logger,
                                       onReregistered: { await service.publish(through: publisher) })
            return HostedService(host: host, afterStart: { await service.publish(through: publisher) },
                                 beforeStop: { await service.stopPublishing() }, afterStop: { await client.close() })
        case "fetcher":
            let service = FetcherService(configuration: file.fetcher, logger: logger)
            let client = try await connection.client()
            let publisher = StatePublisher(client: client)
            let host = try ServiceHost(service: service, options: connection.hostOptions(), context: connection.context, logger: logger,
                                       onReregistered: { await service.republish() })
            return HostedService(host: host, afterStart: { await service.start(client: client, publisher: publisher) },
                                 beforeStop: { await service.stop() }, afterStop: { await client.close() })
        case "search":
            let service = SearchService(logger: logger)
            let client = try await connection.client()
            let catalog = try await connection.catalogSubscription()
            let host = try ServiceHost(service: service, options: connection.hostOptions(), context: connection.context, logger: logger)
            return HostedService(host: host, afterStart: { await service.start(client: client, catalog: catalog) },
                                 beforeStop: { await service.stop() }, afterStop: {
                                     await catalog.cancel()
                                     await client.close()
                                 })
        case "pricing":
            let service = PricingService(logger: logger)
            let client = try await connection.client()
            let publisher = StatePublisher(client: client)
            let catalog = try await connection.catalogSubscription()
            let host = try ServiceHost(service: service, options: connection.hostOptions(), context: connection.context, logger: logger,
                                       onReregistered: { _ = await publisher.republish() })
            return HostedService(host: host, afterStart: { await service.start(client: client, publisher: publisher, catalog: catalog) },
                                 beforeStop: { await service.stop() }, afterStop: {
                                     await catalog.cancel()
                                     await client.close()
                                 })
        case "echo":
            return try ServiceHost(service: EchoService(instance: connection.instance ?? "echo-\(getpid())"),
                                   options: connection.hostOptions(), context: connection.context, logger: logger)
        default:
            preconditionFailure("unknown service \(name)")
        }
    }
}

/// A hosted service with work to do once it is registered (publish its state) and
/// around its shutdown.
struct HostedService<S: BusService>: Service {
    let host: ServiceHost<S>
    let afterStart: @Sendable () async -> Void
    let beforeStop: @Sendable () async -> Void
    let afterStop: @Sendable () async -> Void

    func run() async throws {
        try await host.start()
        await afterStart()
        try? await gracefulShutdown()
        await beforeStop()
        await host.stop()
        await afterStop()
    }
}
