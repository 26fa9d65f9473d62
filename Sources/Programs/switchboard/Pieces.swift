import BusKit
import BusProtocol
import Contracts
import EchoService
import FetcherService
import Foundation
import Logging
import PricingService
import SearchService
import ServiceLifecycle
import StoreService
import StreamsService
import Deployment
import SwitchboardConfig
import ZeroMQ

/// Where a service finds its kernel and how it connects: what `switchboard serve` and
/// `switchboard up --single-process` both need to build a service.
struct Connection {
    /// The kernel, or the two kernels of a pair, with each one's CHP endpoints.
    var brokers: [String]
    var state: [StateEndpoints]
    var workers: Int
    /// Requests each worker connection holds at once.
    var window: Int
    var heartbeatInterval: Duration
    var liveness: Int
    var curve: CurveClientKeys?
    /// A shared context (in one process, for inproc:// endpoints); nil: each piece its own.
    var context: ZMQContext?
    var instance: String?
    /// The kernel's `max_message_size` and `max_batch_items`.
    var maxMessageSize = MDP.defaultMaxMessageSize
    var maxBatchItems = BodyLimits().maxBatchItems

    func hostOptions() -> ServiceHostOptions {
        ServiceHostOptions(brokers: brokers, connections: workers, window: window, heartbeatInterval: heartbeatInterval,
                           heartbeatLiveness: liveness, curve: curve, maxMessageSize: maxMessageSize, maxBatchItems: maxBatchItems)
    }

    /// A client for the kernel, whose `subscribe` follows `state`.
    func client() async throws -> BusClient {
        try await BusClient(brokers: brokers, context: context, curve: curve, maxMessageSize: maxMessageSize, maxBatchItems: maxBatchItems, state: state)
    }
}

/// The services `switchboard` can run, by name.
enum Pieces {
    static let names = ConfigFile.serviceNames

    /// Builds service `name` as the parts of its process, in dependency order, for one
    /// `ServiceGroup`: the client, the catalog subscription (for services that follow the
    /// datasets), the state publisher (for services that publish), the parts the service
    /// requires (the store's database connections), the service's own work, then the host.
    /// The group stops them in reverse: the host drains its requests while what they use
    /// (the database, the HTTP clients, the work) is still there.
    static func service(_ name: String, file: ConfigFile, connection: Connection) async throws -> [any Service] {
        let logger = Logger(label: "switchboard.\(name)")
        switch name {
        case StoreAPI.service:
            let client = try await connection.client()
            let publisher = StatePublisher(client: client)
            let service = StoreService(configuration: StoreConfiguration(file.store), logger: logger, publisher: publisher)
            // On PostgreSQL it registers once the database answers (trying again meanwhile).
            let host = try ServiceHost(service: service, options: connection.hostOptions(), context: connection.context, logger: logger,
                                       onReregistered: { await service.republish() }, ready: { await service.waitUntilReady() })
            return [client, publisher] + service.requiredParts + [service, host]
        case StreamsAPI.service:
            let client = try await connection.client()
            var configuration = StreamsConfiguration(file.streams)
            configuration.mostWaitingReads = StreamsConfiguration.mostWaitingReads(connections: connection.workers, window: connection.window)
            let service = StreamsService(configuration: configuration, logger: logger, client: client)
            // On PostgreSQL it registers once the database answers (trying again meanwhile).
            let host = try ServiceHost(service: service, options: connection.hostOptions(), context: connection.context, logger: logger,
                                       ready: { await service.waitUntilReady() })
            return [client] + service.requiredParts + [service, host]
        case FetcherAPI.service:
            let client = try await connection.client()
            let publisher = StatePublisher(client: client)
            let service = FetcherService(configuration: FetcherConfiguration(file.fetcher), logger: logger, client: client, publisher: publisher)
            let host = try ServiceHost(service: service, options: connection.hostOptions(), context: connection.context, logger: logger,
                                       onReregistered: { await service.republish() })
            return [client, publisher, service, host]
        case SearchAPI.service:
            let client = try await connection.client()
            let catalog = try await client.subscribe(prefixes: [FetcherAPI.catalogPrefix])
            let service = SearchService(logger: logger, client: client, catalog: catalog)
            let host = try ServiceHost(service: service, options: connection.hostOptions(), context: connection.context, logger: logger)
            return [client, catalog, service, host]
        case PricingAPI.service:
            let client = try await connection.client()
            let publisher = StatePublisher(client: client)
            let catalog = try await client.subscribe(prefixes: [FetcherAPI.catalogPrefix])
            let service = PricingService(logger: logger, client: client, publisher: publisher, catalog: catalog)
            let host = try ServiceHost(service: service, options: connection.hostOptions(), context: connection.context, logger: logger,
                                       onReregistered: { _ = await publisher.republish() })
            return [client, catalog, publisher, service, host]
        case EchoAPI.service:
            return [try ServiceHost(service: EchoService(instance: connection.instance ?? "echo-\(getpid())"),
                                    options: connection.hostOptions(), context: connection.context, logger: logger)]
        default:
            preconditionFailure("unknown service \(name)")
        }
    }

    /// The parts of a service for its process's `ServiceGroup`: the host, last, returns on
    /// its own only when a kernel drained it (`sb drain`); `drained` says what the group does
    /// then (a `serve` process shuts down gracefully and exits 0; `up --single-process`, which
    /// runs other services too, carries on without it).
    static func grouped(_ parts: [any Service], drained: ServiceGroupConfiguration.ServiceConfiguration.TerminationBehavior) -> [ServiceGroupConfiguration.ServiceConfiguration] {
        parts.enumerated().map { index, part in
            index == parts.count - 1 ? .init(service: part, successTerminationBehavior: drained) : .init(service: part)
        }
    }
}
