// swift-tools-version:6.1
import PackageDescription

/// One settings list for every target: Swift 6 language mode (the tools version's
/// default) plus the upcoming features we hold ourselves to.
let sharedSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

let package = Package(
    name: "Switchboard",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "switchboard", targets: ["switchboard"]),
        .executable(name: "sb", targets: ["sb"]),
        .library(name: "Frames", targets: ["Frames"]),
        .library(name: "ZeroMQ", targets: ["ZeroMQ"]),
        .library(name: "BusProtocol", targets: ["BusProtocol"]),
        .library(name: "Kernel", targets: ["Kernel"]),
        .library(name: "BusKit", targets: ["BusKit"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-collections", from: "1.1.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift", from: "0.2.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.6.0"),
        .package(url: "https://github.com/jpsim/Yams", from: "5.0.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.0.0"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.0"),
        .package(url: "https://github.com/apple/swift-crypto", from: "3.12.0"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.20.0"),
        // Already in the graph through async-http-client; named for its error types and, for
        // the etcd client's TLS settings, NIOSSL's.
        .package(url: "https://github.com/apple/swift-nio", from: "2.60.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.27.0"),
        // Trace context: the instrumentation API, and W3C traceparent parsing.
        .package(url: "https://github.com/apple/swift-distributed-tracing", from: "1.1.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.4.1"),
        // OpenTelemetry export of the bus's spans and metrics, OTLP/HTTP only (no gRPC stack to build).
        .package(url: "https://github.com/swift-otel/swift-otel", from: "1.6.0", traits: ["OTLPHTTP"]),
        .package(url: "https://github.com/swift-otel/swift-w3c-trace-context", from: "1.0.0"),
        // The HTTP edge (`switchboard gateway`).
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.0.0"),
        // Already in the graph through Hummingbird; named for AsyncChannel, a hand-over with
        // back-pressure between tasks.
        .package(url: "https://github.com/apple/swift-async-algorithms", from: "1.0.0"),
    ],
    targets: [
        // libzmq through its system headers; see the module map for why no pkg-config.
        .systemLibrary(
            name: "CZeroMQ",
            path: "Sources/Bus/CZeroMQ",
            providers: [.apt(["libzmq3-dev"])]
        ),
        // Frame and Message: the bytes of multipart messages, with no sockets and no libzmq.
        .target(
            name: "Frames",
            path: "Sources/Bus/Frames",
            swiftSettings: sharedSettings
        ),
        // A safe Swift layer over libzmq, and the bridge between sockets and async code.
        .target(
            name: "ZeroMQ",
            dependencies: [
                "CZeroMQ", "Frames",
                .product(name: "DequeModule", package: "swift-collections"),
            ],
            path: "Sources/Bus/ZeroMQ",
            swiftSettings: sharedSettings
        ),
        // Encoders and strict decoders for 7/MDP, 8/MMI, 12/CHP and JSON-RPC 2.0, over
        // Frames: no sockets, no libzmq.
        .target(
            name: "BusProtocol",
            dependencies: ["Frames"],
            path: "Sources/Bus/BusProtocol",
            swiftSettings: sharedSettings
        ),
        // Every service's contract (kernel, echo, store, fetcher, search, pricing): the one
        // place a method's name, params and result are written; `sb` and callers use them.
        // `Kit/` is how a contract is stated: typed params and results, JSON Schema generated
        // from them, params checked before a handler runs, `rpc.discover`, the method table,
        // trace context and exactly-once keys.
        .target(
            name: "Contracts",
            dependencies: [
                "BusProtocol",
                .product(name: "Instrumentation", package: "swift-distributed-tracing"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "W3CTraceContext", package: "swift-w3c-trace-context"),
            ],
            path: "Sources/Bus/Contracts",
            swiftSettings: sharedSettings
        ),
        // The kernel: Majordomo broker, CHP state server and the built-in `kernel` service.
        .target(
            name: "Kernel",
            dependencies: [
                "BusProtocol", "Contracts", "Etcd", "SwitchboardConfig", "ZeroMQ",
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "HeapModule", package: "swift-collections"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Sources/Bus/Kernel",
            swiftSettings: sharedSettings
        ),
        // TLS to the servers a deployment names (etcd, PostgreSQL): its files read when the
        // client is made.
        .target(
            name: "ClientTLS",
            dependencies: [.product(name: "NIOSSL", package: "swift-nio-ssl")],
            path: "Sources/Bus/ClientTLS"
        ),
        // A client of etcd's v3 API (keys, transactions, leases, watches) over its JSON
        // gateway: where a deployment keeps the kernel's state when it grows past one kernel.
        .target(
            name: "Etcd",
            dependencies: [
                "BusProtocol", "ClientTLS",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            path: "Sources/Bus/Etcd",
            swiftSettings: sharedSettings
        ),
        // The runtime every client and service uses: BusClient, Subscription, ServiceHost,
        // StatePublisher.
        .target(
            name: "BusKit",
            dependencies: [
                "BusProtocol", "Contracts", "SwitchboardConfig", "ZeroMQ",
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Sources/Bus/BusKit",
            swiftSettings: sharedSettings
        ),
        // Reading a configuration file: YAML, SWITCHBOARD_* overrides, checked values with
        // errors that name the key. Knows no module's settings: each module reads its own section.
        .target(
            name: "SwitchboardConfig",
            dependencies: [.product(name: "Yams", package: "Yams")],
            path: "Sources/Bus/SwitchboardConfig",
            swiftSettings: sharedSettings
        ),
        // Config/switchboard.yaml as a whole: every module's section, and where each piece
        // finds the kernels. For the `switchboard` executable.
        .target(
            name: "Deployment",
            dependencies: ["BusKit", "BusProtocol", "Contracts", "FetcherService", "Gateway", "Kernel", "StoreService", "StreamsService", "Supervisor", "SwitchboardConfig", "Telemetry"],
            path: "Sources/Operations/Deployment",
            swiftSettings: sharedSettings
        ),
        // Load against a live bus (request/reply, publish/subscribe) with HDR-histogram
        // latencies: `sb bench`, and the full-stack rows of `switchboard-bench kernel`.
        .target(
            name: "BusBench",
            dependencies: ["BusKit", "BusProtocol", "ZeroMQ", .product(name: "Histogram", package: "hdrhistogram-swift")],
            path: "Sources/Operations/BusBench",
            swiftSettings: sharedSettings
        ),
        // OpenTelemetry: the `telemetry:` section, and the OTLP exporters of the bus's spans and the kernel's metrics
        // (swift-otel) for the processes that turn it on.
        .target(
            name: "Telemetry",
            dependencies: [
                "Contracts", "SwitchboardConfig",
                .product(name: "OTel", package: "swift-otel"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Sources/Operations/Telemetry",
            swiftSettings: sharedSettings
        ),
        // The programs' stdin, stdout and stderr: closed ones held, output that could not be written said and
        // exit status 74.
        .target(
            name: "StandardStreams",
            path: "Sources/Operations/StandardStreams",
            swiftSettings: sharedSettings
        ),
        // How the programs refuse a word where a verb should be: naming the verbs there are.
        .target(
            name: "CommandWords",
            dependencies: [.product(name: "ArgumentParser", package: "swift-argument-parser")],
            path: "Sources/Operations/CommandWords",
            swiftSettings: sharedSettings
        ),
        // `switchboard up`: runs the kernel and the services as processes, restarts them, stops them in order.
        .target(
            name: "Supervisor",
            dependencies: ["Contracts", "BusKit", "BusProtocol", "SwitchboardConfig", "CSpawn", .product(name: "Logging", package: "swift-log")],
            path: "Sources/Operations/Supervisor",
            swiftSettings: sharedSettings
        ),
        // A service that answers with what it is sent: for tests, benchmarks and trying the bus.
        .target(
            name: "EchoService",
            dependencies: ["Contracts", "BusKit", "BusProtocol"],
            path: "Sources/Services/EchoService",
            swiftSettings: sharedSettings
        ),
        // The five apps' data: models, tolerant-but-strict decoders, and the bundled copies
        // (the fixtures) as the offline fallback.
        .target(
            name: "Catalog",
            dependencies: ["BusProtocol", "Contracts", .product(name: "Crypto", package: "swift-crypto")],
            path: "Sources/Services/Catalog",
            resources: [.copy("Resources")],
            swiftSettings: sharedSettings
        ),
        // The `fetcher` service: downloads the datasets, keeps the last good copy, publishes changes.
        .target(
            name: "FetcherService",
            dependencies: [
                "Contracts", "BusKit", "BusProtocol", "Catalog", "SwitchboardConfig", "ZeroMQ",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Sources/Services/FetcherService",
            swiftSettings: sharedSettings
        ),
        // The durable engines the store and the streams service keep their data in: a
        // SQLite file written with group commit, or a PostgreSQL database several processes
        // share, each with the requests' results beside their effects.
        .target(
            name: "Storage",
            dependencies: [
                "BusKit", "BusProtocol", "ClientTLS", "Contracts", "SwitchboardConfig", "ZeroMQ",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Sources/Services/Storage",
            swiftSettings: sharedSettings
        ),
        // The `store` service: history, saved articles, selections and dataset snapshots in SQLite.
        .target(
            name: "StoreService",
            dependencies: [
                "Contracts", "BusKit", "BusProtocol", "Storage", "SwitchboardConfig",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Sources/Services/StoreService",
            swiftSettings: sharedSettings
        ),
        // The `streams` service: durable streams and their consumers, in SQLite or PostgreSQL.
        .target(
            name: "StreamsService",
            dependencies: [
                "Contracts", "BusKit", "BusProtocol", "Storage", "SwitchboardConfig",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Sources/Services/StreamsService",
            swiftSettings: sharedSettings
        ),
        // Following the fetcher's `/catalog/*`: services that keep their own copies of datasets.
        .target(
            name: "CatalogFeed",
            dependencies: ["Contracts", "BusKit", "BusProtocol", "Catalog", .product(name: "Logging", package: "swift-log")],
            path: "Sources/Services/CatalogFeed",
            swiftSettings: sharedSettings
        ),
        // The `search` service: in-memory indexes over the catalog, rebuilt when it changes.
        .target(
            name: "SearchService",
            dependencies: [
                "Contracts", "BusKit", "BusProtocol", "Catalog", "CatalogFeed",
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Sources/Services/SearchService",
            swiftSettings: sharedSettings
        ),
        // The `pricing` service: round-trip quotes, the current route, deals.
        .target(
            name: "PricingService",
            dependencies: [
                "Contracts", "BusKit", "BusProtocol", "Catalog", "CatalogFeed",
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Sources/Services/PricingService",
            swiftSettings: sharedSettings
        ),
        // The HTTP edge: JSON-RPC over POST, state as Server-Sent Events with resume, metrics,
        // health, and the five apps' page (Resources/page).
        .target(
            name: "Gateway",
            dependencies: [
                "Contracts", "BusKit", "BusProtocol", "SwitchboardConfig", "ZeroMQ",
                .product(name: "AsyncAlgorithms", package: "swift-async-algorithms"),
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Sources/Operations/Gateway",
            resources: [.copy("Resources")],
            swiftSettings: sharedSettings
        ),
        // The `switchboard` executable: `up`, `kernel`, `serve NAME`, `gateway`, `keygen`.
        .executableTarget(
            name: "switchboard",
            dependencies: [
                "BusProtocol", "Contracts",
                "Kernel", "BusKit", "EchoService", "FetcherService", "PricingService", "SearchService", "StoreService", "Storage", "StreamsService", "Supervisor",
                "Gateway", "Deployment", "CommandWords", "StandardStreams", "Telemetry",
                "SwitchboardConfig", "ZeroMQ",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Sources/Programs/switchboard",
            swiftSettings: sharedSettings
        ),
        // `sb`, the client CLI: links BusKit, not the services.
        .executableTarget(
            name: "sb",
            dependencies: [
                "BusBench", "CommandWords", "Contracts", "StandardStreams", "Telemetry",
                "BusKit", "BusProtocol", "SwitchboardConfig", "ZeroMQ",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
            ],
            path: "Sources/Programs/sb",
            swiftSettings: sharedSettings
        ),
        // Helpers for tests: in-process kernels, free ports, child processes, bounded waits, a
        // bus with a store and a fetcher over files.
        .target(
            name: "SwitchboardTestSupport",
            dependencies: ["Contracts", "Etcd", "Kernel", "ZeroMQ", "BusKit", "BusProtocol", "Catalog", "StoreService", "FetcherService", "Supervisor",
                           .product(name: "Logging", package: "swift-log")],
            path: "Sources/Tools/SwitchboardTestSupport",
            swiftSettings: sharedSettings
        ),
        // Benchmarks that print figures (release build): `swift run -c release switchboard-bench`.
        .executableTarget(
            name: "switchboard-bench",
            dependencies: [
                "BusBench", "Contracts", "ZeroMQ", "BusProtocol", "Etcd", "Kernel", "BusKit", "EchoService", "StoreService", "FetcherService", "SearchService", "Catalog",
                "Storage", "StreamsService", "SwitchboardTestSupport",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            path: "Sources/Tools/Benchmarks",
            swiftSettings: sharedSettings
        ),
        // The decoders of untrusted input as fuzz targets, and libFuzzer's driver entry.
        .target(
            name: "FuzzTargets",
            dependencies: ["BusProtocol", "Catalog", "Contracts", "Kernel", "ZeroMQ", .product(name: "Logging", package: "swift-log")],
            path: "Sources/Tools/FuzzTargets",
            swiftSettings: sharedSettings
        ),
        .target(name: "CLibFuzzer", path: "Sources/Tools/CLibFuzzer"),
        // posix_spawn's GNU file actions (close every other descriptor, change directory) for `Spawn`.
        .target(name: "CSpawn", path: "Sources/Operations/CSpawn"),
        // Heap allocations counted per thread and per process: HotPathCostTests holds the hot
        // paths to a cost per message.
        .target(name: "CRuntimeCounters", path: "Sources/Tools/RuntimeCounters"),
        // Heap allocations per message on the hot paths, in a process of its own.
        .executableTarget(
            name: "switchboard-costs",
            dependencies: ["BusKit", "BusProtocol", "Contracts", "CRuntimeCounters", "EchoService", "Kernel", "SwitchboardTestSupport", "ZeroMQ"],
            path: "Sources/Tools/Costs",
            swiftSettings: sharedSettings
        ),
        // `Scripts/fuzz`: libFuzzer over FuzzTargets (docs/FUZZING.md).
        .executableTarget(
            name: "switchboard-fuzz",
            dependencies: ["FuzzTargets", "CLibFuzzer"],
            path: "Sources/Tools/Fuzz",
            swiftSettings: sharedSettings
        ),
        // The metal the kernel is measured against: a raw libzmq broker, echo workers and
        // pipelining clients in C (`switchboard-bench kernel` runs them beside the kernel).
        .executableTarget(
            name: "zmq-baseline",
            path: "Sources/Tools/ZMQBaseline",
            linkerSettings: [.linkedLibrary("zmq"), .linkedLibrary("pthread")]
        ),
        // Soak and chaos over a whole `switchboard up`: `Scripts/soak`.
        .executableTarget(
            name: "switchboard-soak",
            dependencies: ["Contracts", "BusKit", "BusProtocol", "Catalog", "Supervisor", "SwitchboardTestSupport", "ZeroMQ",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Sources/Tools/Soak",
            swiftSettings: sharedSettings
        ),
        // docs/ARCHITECTURE.md, Package.swift and the imports agree (reads files; links nothing).
        .testTarget(
            name: "ArchitectureTests",
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "ZeroMQTests",
            dependencies: ["ZeroMQ", "SwitchboardTestSupport"],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "KernelTests",
            dependencies: ["Contracts", "Kernel", "BusProtocol", "SwitchboardTestSupport", "ZeroMQ"],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "BusKitTests",
            dependencies: ["Contracts", "BusKit", "BusProtocol", "EchoService", "Etcd", "Kernel", "SwitchboardTestSupport", "ZeroMQ",
                           .product(name: "Logging", package: "swift-log"),
                           .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                           .product(name: "W3CTraceContext", package: "swift-w3c-trace-context")],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "SwitchboardConfigTests",
            dependencies: ["Deployment", "SwitchboardConfig", "BusKit", "FetcherService", "Gateway", "Kernel", "Catalog", "StoreService", "Supervisor", "ZeroMQ"],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "CatalogTests",
            dependencies: ["Catalog", "BusProtocol"],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "FetcherServiceTests",
            dependencies: ["Contracts", "FetcherService", "StoreService", "Catalog", "BusKit", "BusProtocol", "Kernel", "SwitchboardTestSupport"],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "EtcdTests",
            dependencies: ["Etcd", "BusProtocol", "BusKit", "Contracts", "Kernel", "SwitchboardConfig", "ZeroMQ", "SwitchboardTestSupport"],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "StoreServiceTests",
            dependencies: ["Contracts", "Storage", "StoreService", "BusKit", "Catalog", "BusProtocol", "Kernel", "SwitchboardTestSupport",
                           .product(name: "GRDB", package: "GRDB.swift")],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "StreamsServiceTests",
            dependencies: ["Contracts", "Storage", "StreamsService", "BusKit", "BusProtocol", "Kernel", "SwitchboardTestSupport", "ZeroMQ",
                           .product(name: "GRDB", package: "GRDB.swift")],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "SearchServiceTests",
            dependencies: ["Contracts", "SearchService", "FetcherService", "StoreService", "Catalog", "BusKit", "BusProtocol", "Kernel",
                           "SwitchboardTestSupport"],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "PricingServiceTests",
            dependencies: ["Contracts", "PricingService", "FetcherService", "StoreService", "Catalog", "BusKit", "BusProtocol", "Kernel",
                           "SwitchboardTestSupport"],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "SBTests",
            dependencies: ["Contracts", "SearchService", "PricingService", "EchoService", "StreamsService", "Catalog", "BusKit", "BusProtocol", "Frames", "ZeroMQ",
                           "SwitchboardTestSupport"],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "DeploymentTests",
            dependencies: ["Contracts", "BusKit", "BusProtocol", "Catalog", "Etcd", "SwitchboardTestSupport", "ZeroMQ"],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "GatewayTests",
            dependencies: ["Contracts", 
                "Gateway", "BusKit", "BusProtocol", "EchoService", "StreamsService", "SwitchboardConfig", "SwitchboardTestSupport",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
            ],
            swiftSettings: sharedSettings
        ),
        // Heap allocations per request and per state update (`switchboard-costs`), with bounds.
        .testTarget(
            name: "HotPathCostTests",
            dependencies: ["SwitchboardTestSupport"],
            swiftSettings: sharedSettings
        ),
        .testTarget(
            name: "BusProtocolTests",
            dependencies: ["BusProtocol", "ZeroMQ", "FuzzTargets"],
            swiftSettings: sharedSettings
        ),
    ]
)
