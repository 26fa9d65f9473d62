import Foundation
import Kernel
import Catalog
import Deployment
import FetcherService
import Gateway
import StoreService
import Supervisor
import SwitchboardConfig
import Testing
import BusKit
import ZeroMQ

@Suite("Config/switchboard.yaml")
struct ConfigFileTests {
    @Test("the shipped file parses to the defaults")
    func shippedFile() throws {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Config/switchboard.yaml")
        // It spells out the store's, the streams' and the fetcher's defaults, which the settings keep as given.
        var defaults = ConfigFile()
        defaults.store.path = "data/store.sqlite"
        defaults.streams.path = "data/streams.sqlite"
        defaults.streams.capture = ["route-prices": ["/pricing/route/"]]
        defaults.store.historyLimit = 100
        defaults.fetcher.attempts = 3
        #expect(try ConfigFile.load(url) == defaults)
    }

    @Test("values are read")
    func values() throws {
        let file = try ConfigFile.parse("""
            kernel:
              broker: tcp://0.0.0.0:6000
              heartbeat_ms: 1000
              liveness: 5
              no_retry: [store]
            """)
        #expect(file.kernel.brokerEndpoint == "tcp://0.0.0.0:6000")
        #expect(file.kernel.heartbeatInterval == .milliseconds(1000))
        #expect(file.kernel.heartbeatLiveness == 5)
        #expect(file.kernel.nonRetriableServices == ["store"])
    }

    @Test("the store and fetcher sections")
    func services() throws {
        let file = try ConfigFile.parse("""
            store:
              path: /var/lib/switchboard/store.sqlite
              history_limit: 20
              max_size_mb: 10
            fetcher:
              attempts: 5
              datasets:
                items:
                  url: file:///srv/hiring.json
                  refresh_seconds: 60
                  timeout_ms: 1500
                  max_mb: 2
                  headers: {X-Token: $TOKEN}
            """)
        #expect(file.store.path == "/var/lib/switchboard/store.sqlite" && file.store.historyLimit == 20)
        #expect(file.store.maxSizeBytes == 10 * 1_048_576)
        #expect(file.fetcher.attempts == 5)
        let items = file.fetcher.sources[.items]
        #expect(items?.url == URL(string: "file:///srv/hiring.json") && items?.refreshInterval == .seconds(60))
        #expect(items?.timeout == .milliseconds(1500) && items?.maxBytes == 2 * 1_048_576 && items?.headers == ["X-Token": "$TOKEN"])
        // Datasets not named keep the fetcher's defaults.
        #expect(file.fetcher.sources[.countries] == nil)
    }

    @Test("bad files are rejected with the key's path and what was expected", arguments: [
        ("kernel:\n  hearbeat_ms: 10", "kernel.hearbeat_ms: unknown key"),
        ("kernels: {}", "kernels: unknown key"),
        ("kernel:\n  heartbeat_ms: fast", #"kernel.heartbeat_ms: expected an integer from 1 to 3600000, got "fast""#),
        ("kernel:\n  liveness: -1", "kernel.liveness: expected an integer from 1 to 1000, got -1"),
        ("kernel:\n  broker: localhost:5555", #"kernel.broker: expected an endpoint such as tcp://127.0.0.1:5555, ipc:///PATH or inproc://NAME, got "localhost:5555""#),
        // A TCP endpoint's port is a number (or * to bind any), named here rather than by libzmq once up runs.
        ("kernel:\n  broker: tcp://127.0.0.1:notaport", #"kernel.broker: expected an endpoint such as tcp://127.0.0.1:5555, ipc:///PATH or inproc://NAME, got "tcp://127.0.0.1:notaport""#),
        ("pair:\n  role: primary\n  listen: tcp://127.0.0.1\n  peer: tcp://127.0.0.1:6560\n  peer_broker: tcp://127.0.0.1:6555", #"pair.listen: expected an endpoint"#),
        ("kernel:\n  writable_prefixes: [client]", "kernel.writable_prefixes: expected key prefixes starting with '/'"),
        ("kernel: [1, 2]", "kernel: expected a mapping of keys to values, got a list"),
        // A file that holds no mapping: what it holds is shown by its start, not printed back whole.
        (String(repeating: "x", count: 1_000), #"expected a mapping of keys to values, got "\#(String(repeating: "x", count: 80))…" (1000 characters)"#),
        ("kernel: {broker: [", "not valid YAML"),
        ("store:\n  history_limit: 0", "store.history_limit: expected an integer from 1 to 1000000, got 0"),
        ("store:\n  path: [a]", "store.path: expected a file path, got a list"),
        ("store:\n  paht: x", "store.paht: unknown key"),
        ("fetcher:\n  datasets:\n    planets: {}", "fetcher.datasets.planets: unknown key"),
        ("fetcher:\n  datasets:\n    items: {url: 'ftp://x/y'}", #"fetcher.datasets.items.url: expected an http, https or file URL, got "ftp://x/y""#),
        ("fetcher:\n  datasets:\n    items: {timeout_ms: soon}", #"fetcher.datasets.items.timeout_ms: expected an integer from 1 to 86400000, got "soon""#),
        ("fetcher:\n  attempts: -2", "fetcher.attempts: expected an integer from 1 to 100, got -2"),
        ("services:\n  mailer: {workers: 1}", "services.mailer: unknown key"),
        ("services:\n  store: {workers: many}", #"services.store.workers: expected an integer from 1 to 1000, got "many""#),
        ("services:\n  store: {enabled: maybe}", #"services.store.enabled: expected true or false, got "maybe""#),
        ("services:\n  store: {window: 0}", "services.store.window: expected an integer from 1 to 4096, got 0"),
        ("services:\n  store: {window: 5000}", "services.store.window: expected an integer from 1 to 4096, got 5000"),
        ("log_level: loud", #"log_level: expected one of trace, debug, info, notice, warning, error, critical, got "loud""#),
        ("security:\n  worker_keys: [abc]", #"security.worker_keys[0]: expected a CURVE key"#),
        ("security:\n  operator_keys: [abc]", #"security.operator_keys[0]: expected a CURVE key"#),
        ("security:\n  secret_key_file: /nonexistent/x.key", "security.secret_key_file: cannot read /nonexistent/x.key: No such file or directory"),
        ("security:\n  secret_key_file: /dev/zero", "security.secret_key_file: cannot read /dev/zero: it holds more than the limit of 65536 bytes"),
        ("security:\n  curve: yes please", #"security.curve: expected true or false"#),
        ("supervisor:\n  restart_limit: 0", "supervisor.restart_limit: expected an integer from 1 to 1000000, got 0"),
        // Numbers that would overflow once converted (milliseconds to nanoseconds, megabytes to bytes).
        ("kernel:\n  queue_timeout_ms: 99999999999999", "kernel.queue_timeout_ms: expected an integer from 1 to 86400000, got 99999999999999"),
        ("store:\n  max_size_mb: 9223372036854775807", "store.max_size_mb: expected an integer from 1 to 1048576, got 9223372036854775807"),
        ("kernel:\n  subscriber_backlog: 4294967296", "kernel.subscriber_backlog: expected an integer from 1 to 2147483647, got 4294967296"),
        ("kernel:\n  state_max_value_bytes: 1.5", "kernel.state_max_value_bytes: expected an integer from 1 to 1073741824, got 1.5"),
        ("gateway:\n  listen: 8080", "gateway.listen: expected HOST:PORT"),
        ("gateway:\n  listen: 127.0.0.1:99999", "gateway.listen: expected HOST:PORT"),
        ("gateway:\n  prefixes: []", "gateway.prefixes: expected at least one key prefix"),
        ("gateway:\n  prefixes: [/client/, catalog/]", "gateway.prefixes: expected at least one key prefix, each starting with '/'"),
        ("gateway:\n  tokens: [{token: short}]", "gateway.tokens[0]: a token must be at least 16 characters"),
        ("gateway:\n  tokens: [{services: [search]}]", "gateway.tokens[0]: give token (the text) or token_file"),
        ("gateway:\n  tokens: [{token: 0123456789abcdef, scope: x}]", "gateway.tokens[0].scope: unknown key"),
        ("gateway:\n  token_file: x", "gateway.token_file: unknown key"),
        ("gateway:\n  tokens: [{token_file: /dev/zero}]", "gateway.tokens[0].token_file: cannot read /dev/zero: it holds more than the limit of 65536 bytes"),
        ("gateway:\n  tokens: [{token: 0123456789abcdef, writable_prefixes: [client/]}]", "gateway.tokens[0].writable_prefixes: expected key prefixes starting with '/'"),
        ("gateway:\n  tokens: [{token: 0123456789abcdef, readable_prefixes: [/pricing/, catalog/]}]", "gateway.tokens[0].readable_prefixes: expected key prefixes starting with '/'"),
        ("gateway:\n  trusted_proxies: [balancer.internal]", "gateway.trusted_proxies: expected IP addresses (a proxy's, as its connections come from), got 'balancer.internal'"),
    ])
    func rejected(text: String, message: String) {
        let error = #expect(throws: ConfigError.self) { try ConfigFile.parse(text) }
        #expect(error?.description.hasPrefix(message) == true, "\(error?.description ?? "-")")
    }

    @Test("the gateway section")
    func gateway() throws {
        let folder = try FileManager.default.url(for: .itemReplacementDirectory, in: .userDomainMask, appropriateFor: URL(fileURLWithPath: "/tmp"), create: true)
        let tokenFile = folder.appendingPathComponent("ops.token")
        try "  0123456789abcdef-ops\n".write(to: tokenFile, atomically: true, encoding: .utf8)
        let file = try ConfigFile.parse("""
            gateway:
              listen: "[::1]:9090"
              max_body_bytes: 2048
              prefixes: [/pricing/, /store/]
              heartbeat_seconds: 5
              tokens:
                - token: 0123456789abcdef-page
                  services: [search, pricing]
                  readable_prefixes: [/pricing/]
                - token_file: \(tokenFile.path)
                  writable_prefixes: [/client/]
              cors_origins: [https://apps.example]
              max_calls_per_address: 16
              trusted_proxies: [10.0.0.5, "0:0:0:0:0:0:0:1", "::FFFF:10.0.0.6"]
            """)
        let gateway = file.gateway
        // An address as a connection's is written, an IPv4 address mapped into IPv6 as IPv4.
        #expect(gateway.maxCallsPerAddress == 16 && gateway.trustedProxies == ["10.0.0.5", "::1", "10.0.0.6"], "\(gateway.trustedProxies)")
        #expect(gateway.enabled && gateway.host == "::1" && gateway.port == 9090 && gateway.maxBodyBytes == 2048)
        #expect(gateway.prefixes == ["/pricing/", "/store/"] && gateway.heartbeat == .seconds(5) && gateway.corsOrigins == ["https://apps.example"])
        #expect(gateway.tokens == [GatewayToken(token: "0123456789abcdef-page", services: ["search", "pricing"], readablePrefixes: ["/pricing/"]),
                                   GatewayToken(token: "0123456789abcdef-ops", services: ["*"], writablePrefixes: ["/client/"])])
        #expect(gateway.tokens[0].allows(service: "search") && !gateway.tokens[0].allows(service: "store") && gateway.tokens[1].allows(service: "store"))
        #expect(gateway.tokens[0].mayRead("/pricing/route/") && !gateway.tokens[0].mayRead("/store/") && gateway.tokens[1].mayRead("/store/"))
        let overridden = try ConfigFile.parse("", environment: ["SWITCHBOARD_GATEWAY_ENABLED": "false", "SWITCHBOARD_GATEWAY_LISTEN": "0.0.0.0:80"])
        #expect(!overridden.gateway.enabled && overridden.gateway.host == "0.0.0.0" && overridden.gateway.port == 80)
        #expect(try ConfigFile.parse("").gateway == GatewaySettings())
    }

    @Test("the services, security and supervisor sections")
    func newSections() throws {
        let pair = try CurveKeyPair.generate(), kernel = try CurveKeyPair.generate()
        let keyFile = try temporaryFile(CurveKeyFile.secretFile(pair))
        defer { try? FileManager.default.removeItem(at: keyFile) }
        let file = try ConfigFile.parse("""
            log_level: warning
            kernel: {log_level: debug}
            services:
              echo: {enabled: false}
              store: {workers: 3, window: 1, log_level: trace}
            security:
              curve: true
              kernel_secret_key: "\(kernel.secretKey)"
              server_key: "\(kernel.publicKey)"
              secret_key_file: \(keyFile.path)
              worker_keys: ["\(pair.publicKey)"]
            supervisor: {restart_limit: 2, restart_backoff_ms: 50}
            """)
        #expect(file.services["echo"]?.enabled == false && file.services["store"]?.workers == 3 && file.services["store"]?.window == 1)
        #expect(file.services["search"] == ServiceSettings(workers: 4, window: 16))
        #expect(file.logLevel(for: "store") == "trace" && file.logLevel(for: "kernel") == "debug" && file.logLevel(for: "search") == "warning")
        #expect(try file.security.kernelSecurity() == KernelSecurity(secretKey: kernel.secretKey, workerKeys: [pair.publicKey]))
        let keys = try file.security.connectingKeys(as: "store")
        #expect(keys?.publicKey == pair.publicKey && keys?.serverKey == kernel.publicKey)
        #expect(file.supervisor.restartLimit == 2 && file.supervisor.restartBackoff == .milliseconds(50))
        // CURVE off: nothing is needed, nothing is returned.
        #expect(try ConfigFile().security.kernelSecurity() == nil)
    }

    @Test("keys from the key folder: each service's key may serve that service only; clients from client.pub and clients/")
    func keyFolder() throws {
        let folder = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("keys-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: folder) }
        let keys = KeyFolder(folder.path)
        #expect(try keys.create(["kernel", "store", "echo", "client"]) == ["kernel", "store", "echo", "client"])
        #expect(try keys.create(["kernel", "store", "search"]) == ["search"], "existing keys are kept")
        let bob = try CurveKeyPair.generate()
        try KeyFolder.write(bob, to: keys.clientsFolder.appendingPathComponent("bob").path)
        let file = try ConfigFile.parse("security:\n  curve: true\n  keys_dir: \(folder.path)\n")
        let security = try #require(try file.security.kernelSecurity())
        #expect(security.secretKey == (try keys.secretKey("kernel")))
        #expect(security.serviceKeys == [try #require(try keys.publicKey("store")): "store", try #require(try keys.publicKey("echo")): "echo",
                                         try #require(try keys.publicKey("search")): "search"])
        let client = try #require(try keys.publicKey("client"))
        #expect(security.clientKeys.count == 2 && security.clientKeys.contains(client))
        #expect(security.workerKeys.isEmpty)
        // Operators: operator.pub, operators/*.pub and security.operator_keys.
        #expect(security.operatorKeys.isEmpty)
        #expect(try keys.create(["operator"]) == ["operator"])
        try KeyFolder.write(try CurveKeyPair.generate(), to: keys.operatorsFolder.appendingPathComponent("ann").path)
        let listed = try CurveKeyPair.generate().publicKey
        let operators = try #require(try ConfigFile.parse("security:\n  curve: true\n  keys_dir: \(folder.path)\n  operator_keys: [\"\(listed)\"]\n")
            .security.kernelSecurity()).operatorKeys
        let local = try #require(try keys.publicKey("operator"))
        #expect(operators.count == 3 && operators.contains(local) && operators.contains(listed))
        let store = try #require(try file.security.connectingKeys(as: "store"))
        let storePublic = try keys.publicKey("store"), kernelPublic = try keys.publicKey("kernel")
        #expect(store.publicKey == storePublic && store.serverKey == kernelPublic)
        // A key shown to a person goes by the name the folder knows it by.
        #expect(keys.name(of: client) == "client" && keys.name(of: bob.publicKey) == "clients/bob" && keys.name(of: local) == "operator")
        #expect(keys.name(of: listed) == nil)
        // Unsaid: off for a piece run alone (`up` turns it on).
        #expect(try ConfigFile.parse("security:\n  keys_dir: \(folder.path)\n").security.kernelSecurity() == nil)
        let missing = #expect(throws: ConfigError.self) { try ConfigFile.parse("security:\n  curve: true\n  keys_dir: /nonexistent/keys\n").security.connectingKeys(as: "store") }
        #expect(missing?.description == "security.keys_dir: /nonexistent/keys/kernel.pub is missing (`switchboard up` creates it on first run)")
    }

    @Test("the state limits; a bad value from a variable names the variable")
    func limitsAndBlame() throws {
        let file = try ConfigFile.parse("kernel:\n  state_max_keys: 10\n  client_state_max_bytes: 4096\n",
                                        environment: ["SWITCHBOARD_KERNEL_CLIENT_STATE_MAX_KEYS": "7"])
        #expect(file.kernel.stateMaxKeys == 10 && file.kernel.clientStateMaxKeys == 7 && file.kernel.clientStateMaxBytes == 4096)
        let error = #expect(throws: ConfigError.self) { try ConfigFile.parse("kernel:\n  liveness: 3\n", environment: ["SWITCHBOARD_KERNEL_LIVENESS": "-1"]) }
        #expect(error?.description == "SWITCHBOARD_KERNEL_LIVENESS (overrides kernel.liveness): expected an integer from 1 to 1000, got -1")
        let fromFile = #expect(throws: ConfigError.self) { try ConfigFile.parse("kernel:\n  liveness: -1\n", environment: ["SWITCHBOARD_KERNEL_BROKER": "tcp://127.0.0.1:1"]) }
        #expect(fromFile?.description == "kernel.liveness: expected an integer from 1 to 1000, got -1")
    }

    @Test("SWITCHBOARD_* variables override the file, typed as YAML")
    func environmentOverrides() throws {
        let file = try ConfigFile.parse("kernel:\n  broker: tcp://127.0.0.1:1\n", environment: [
            "SWITCHBOARD_KERNEL_BROKER": "tcp://0.0.0.0:7000",
            "SWITCHBOARD_KERNEL_NO_RETRY": "[store, pricing]",
            "SWITCHBOARD_SERVICES_STORE_WORKERS": "16",
            "SWITCHBOARD_SERVICES_PRICING_WINDOW": "4",
            "SWITCHBOARD_FETCHER_DATASETS_ITEMS_URL": "file:///srv/items.json",
            "HOME": "/root",
        ])
        #expect(file.kernel.brokerEndpoint == "tcp://0.0.0.0:7000")
        #expect(file.kernel.nonRetriableServices == ["store", "pricing"])
        #expect(file.services["store"]?.workers == 16 && file.services["pricing"]?.window == 4)
        #expect(file.fetcher.sources[.items]?.url == URL(string: "file:///srv/items.json"))
        #expect(ConfigFile.variable(for: "kernel.heartbeat_ms") == "SWITCHBOARD_KERNEL_HEARTBEAT_MS")

        // A key is taken as given, even when it starts with a YAML indicator (Z85 has ! & * [ {).
        for indicator in ["!", "*", "&", "[", "-"] {
            var pair = try CurveKeyPair.generate()
            while !pair.publicKey.hasPrefix(indicator) { pair = try CurveKeyPair.generate() }
            let keyed = try ConfigFile.parse("", environment: ["SWITCHBOARD_SECURITY_SERVER_KEY": pair.publicKey])
            #expect(keyed.security.serverKey == pair.publicKey)
        }

        let unknown = #expect(throws: ConfigError.self) { try ConfigFile.parse("", environment: ["SWITCHBOARD_KERNEL_BROKR": "x"]) }
        #expect(unknown?.description.hasPrefix("SWITCHBOARD_KERNEL_BROKR: unknown variable") == true)
        let bad = #expect(throws: ConfigError.self) { try ConfigFile.parse("", environment: ["SWITCHBOARD_KERNEL_LIVENESS": "often"]) }
        #expect(bad?.description == #"SWITCHBOARD_KERNEL_LIVENESS (overrides kernel.liveness): expected an integer from 1 to 1000, got "often""#)
    }

    private func temporaryFile(_ text: String) throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("sb-config-\(UUID().uuidString).key")
        try text.write(to: url, atomically: true, encoding: .utf8)
        return url
    }

    @Test("the two-machine example parses once its keys are filled in")
    func twoMachineExample() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("sb-two-machines-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        var pairs: [String: CurveKeyPair] = [:]
        for name in ["kernel", "services", "alice"] {
            let pair = try CurveKeyPair.generate()
            pairs[name] = pair
            try CurveKeyFile.secretFile(pair).write(to: folder.appendingPathComponent("\(name).key"), atomically: true, encoding: .utf8)
        }
        func filled(_ file: String) throws -> ConfigFile {
            var text = try String(contentsOf: root.appendingPathComponent("Config/two-machines/\(file)"), encoding: .utf8)
            for (name, pair) in pairs {
                text = text.replacingOccurrences(of: "REPLACE: the public-key line of keys/\(name).pub", with: pair.publicKey)
            }
            text = text.replacingOccurrences(of: "keys/", with: folder.path + "/")
            #expect(!text.contains("REPLACE"))
            return try ConfigFile.parse(text)
        }
        let kernelHost = try filled("kernel-host.yaml"), servicesHost = try filled("services-host.yaml")
        let security = try #require(try kernelHost.security.kernelSecurity())
        #expect(security.workerKeys == [pairs["kernel"]!.publicKey, pairs["services"]!.publicKey])
        #expect(security.clientKeys == [pairs["alice"]!.publicKey])
        #expect(kernelHost.kernel.brokerEndpoint == "tcp://0.0.0.0:5555")
        #expect(servicesHost.kernel.brokerEndpoint == "tcp://10.0.0.1:5555")
        #expect(try servicesHost.security.connectingKeys(as: "store")?.publicKey == pairs["services"]!.publicKey)
        #expect(servicesHost.services["echo"]?.enabled == false && servicesHost.services["store"]?.enabled == true)
        // As shipped, the placeholders are rejected with the key's path.
        let unfilled = #expect(throws: ConfigError.self) {
            try ConfigFile.parse(String(contentsOf: root.appendingPathComponent("Config/two-machines/services-host.yaml"), encoding: .utf8))
        }
        #expect(unfilled?.path.hasPrefix("security.") == true)
    }

    @Test("the kernel pair example parses: each side's role, the link, and every piece connecting to both kernels")
    func kernelPairExample() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let primary = try ConfigFile.load(root.appendingPathComponent("Config/kernel-pair/primary.yaml"))
        let backup = try ConfigFile.load(root.appendingPathComponent("Config/kernel-pair/backup.yaml"))
        #expect(primary.kernel.pair == PairConfiguration(role: .primary, listen: "tcp://192.168.100.1:5560", peer: "tcp://192.168.100.2:5560",
                                                         heartbeatInterval: .milliseconds(200), peerBroker: "tcp://10.0.0.2:5555"))
        #expect(backup.kernel.pair?.role == .backup && backup.kernel.pair?.peer == primary.kernel.pair?.listen)
        #expect(primary.brokerEndpoints == ["tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"])
        #expect(backup.brokerEndpoints == ["tcp://10.0.0.2:5555", "tcp://10.0.0.1:5555"])
        #expect(backup.stateEndpoints.map(\.publisher) == ["tcp://10.0.0.2:5557", "tcp://10.0.0.1:5557"])
        #expect(primary.security.curve == true && backup.services["store"]?.enabled == false)
        // The one-machine pair of the README's session.
        let here = try ["primary", "backup"].map { try ConfigFile.load(root.appendingPathComponent("Config/kernel-pair/one-machine/\($0).yaml")) }
        #expect(here[0].brokerEndpoints == ["tcp://127.0.0.1:5555", "tcp://127.0.0.1:6555"] && here[1].brokerEndpoints == ["tcp://127.0.0.1:6555", "tcp://127.0.0.1:5555"])
        #expect(here[0].kernel.pair?.peer == here[1].kernel.pair?.listen && here[1].kernel.pair?.peer == here[0].kernel.pair?.listen)
    }

    @Test("a pair section with a missing or wrong value is refused, naming the key")
    func badPair() throws {
        let complete = "pair:\n  role: primary\n  listen: tcp://127.0.0.1:5560\n  peer: tcp://127.0.0.1:6560\n  peer_broker: tcp://127.0.0.1:6555\n"
        #expect(try ConfigFile.parse(complete).pair?.peerState.snapshot == "tcp://127.0.0.1:6556")
        for (text, path) in [(complete.replacingOccurrences(of: "role: primary", with: "role: leader"), "pair.role"),
                             (complete.replacingOccurrences(of: "  peer_broker: tcp://127.0.0.1:6555\n", with: ""), "pair.peer_broker"),
                             (complete.replacingOccurrences(of: "listen: tcp://127.0.0.1:5560", with: "listen: 5560"), "pair.listen"),
                             (complete + "  heartbeat_ms: 0\n", "pair.heartbeat_ms"),
                             (complete + "  peer_state: nowhere\n", "pair.peer_state"),
                             // Three parts, each an endpoint (not any three words).
                             (complete + "  peer_state: a,b,c\n", "pair.peer_state")] {
            let error = #expect(throws: ConfigError.self) { try ConfigFile.parse(text) }
            #expect(error?.path == path, "\(String(describing: error))")
        }
    }

    @Test("store.backend: postgres with its URL, pool, TLS and deadline (and the deadline's key, for errors to name); a bad value (a CA file without TLS too) is refused naming the key, without repeating a URL's password")
    func storeOnPostgres() throws {
        let file = try ConfigFile.parse("store:\n  backend: postgres\n  url: postgres://sb:s3cret@db.example:5433/switchboard\n  pool_size: 4\n  tls: require\n  timeout_ms: 1500\n")
        #expect(file.store.postgres == PostgresSection(url: "postgres://sb:s3cret@db.example:5433/switchboard", poolSize: 4, tls: "require", caFile: nil,
                                                       timeout: .milliseconds(1_500), timeoutKey: "store.timeout_ms"))
        #expect(try ConfigFile.parse("store:\n  path: x.sqlite\n").store.postgres == nil)
        // The streams service reads the same keys.
        #expect(try ConfigFile.parse("streams:\n  backend: postgres\n  url: postgres://sb:s3cret@db.example/bus\n").streams.postgres
                    == PostgresSection(url: "postgres://sb:s3cret@db.example/bus", timeoutKey: "streams.timeout_ms"))
        #expect(try ConfigFile.parse("streams:\n  path: x.sqlite\n").streams.postgres == nil)
        for (text, path) in [("store:\n  backend: mysql\n", "store.backend"),
                             ("store:\n  backend: postgres\n", "store.url"),
                             ("store:\n  backend: postgres\n  url: http://sb:s3cret@db/x\n", "store.url"),
                             ("store:\n  backend: postgres\n  url: postgres://sb@db/x\n  tls: always\n", "store.tls"),
                             ("store:\n  backend: postgres\n  url: postgres://sb@db/x\n  tls: disable\n  ca_file: ca.pem\n", "store.ca_file"),
                             ("store:\n  backend: postgres\n  url: postgres://sb:s3cret@db/x?sslmode=verify-full\n", "store.url"),
                             ("store:\n  backend: postgres\n  url: postgres://sb@db/x\n  timeout_ms: 0\n", "store.timeout_ms"),
                             ("store:\n  timeout_ms: 1000\n", "store.timeout_ms"),
                             ("store:\n  url: postgres://sb@db/x\n", "store.url"),
                             ("streams:\n  backend: postgres\n", "streams.url"),
                             ("streams:\n  pool_size: 4\n", "streams.pool_size")] {
            let error = #expect(throws: ConfigError.self) { try ConfigFile.parse(text) }
            #expect(error?.path == path && error?.description.contains("s3cret") == false, "\(String(describing: error))")
        }
    }

    @Test("streams.capture: stream names, each with the state's key prefixes it keeps; anything else is refused naming the key")
    func streamsCapture() throws {
        #expect(try ConfigFile.parse("streams:\n  capture:\n    prices: [/pricing/, /client/prices/]\n").streams.capture == ["prices": ["/pricing/", "/client/prices/"]])
        for (text, path) in [("streams:\n  capture: [/pricing/]\n", "streams.capture"),
                             ("streams:\n  capture:\n    prices: /pricing/\n", "streams.capture.prices"),
                             ("streams:\n  capture:\n    prices: [pricing.]\n", "streams.capture.prices"),
                             ("streams:\n  capture:\n    prices: []\n", "streams.capture.prices")] {
            let error = #expect(throws: ConfigError.self) { try ConfigFile.parse(text) }
            #expect(error?.path == path, "\(String(describing: error))")
        }
    }

    @Test("streams' quotas per client key and most pending per consumer are read, client_max_mb in MiB; a value out of range is refused naming the key")
    func streamsClientQuotas() throws {
        let streams = try ConfigFile.parse("streams:\n  client_max_streams: 5\n  client_max_mb: 64\n  client_max_consumers: 20\n  max_ack_pending: 500\n").streams
        #expect(streams.clientMaxStreams == 5 && streams.clientMaxBytes == 64 * 1_048_576 && streams.clientMaxConsumers == 20 && streams.maxAckPending == 500)
        let error = #expect(throws: ConfigError.self) { try ConfigFile.parse("streams:\n  client_max_streams: -1\n") }
        #expect(error?.path == "streams.client_max_streams", "\(String(describing: error))")
    }

    @Test("the store-on-PostgreSQL example parses: both hosts on one database, store workers only on the second")
    func storeOnPostgresExample() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let hosts = try ["kernel-host", "store-host"].map { try ConfigFile.load(root.appendingPathComponent("Config/store-on-postgres/\($0).yaml")) }
        #expect(hosts.allSatisfy { $0.store.postgres?.url == "postgres://switchboard@10.0.0.3:5432/switchboard" })
        #expect(hosts[1].services.filter { $0.value.enabled }.map(\.key) == ["store"])
    }

    @Test("the state-on-etcd example parses: the kernel's state in the three-member etcd")
    func stateOnEtcdExample() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let host = try ConfigFile.load(root.appendingPathComponent("Config/state-on-etcd/kernel-host.yaml"))
        #expect(host.kernel.stateEtcd?.endpoints == ["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"])
        #expect(host.kernel.stateEtcd?.prefix == "/switchboard/state")
    }

    @Test("the cells example parses once each file is given its cell's name (switchboard up --cell): one directory and one state in the three-member etcd")
    func cellsExample() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let cells = try ["a", "b"].map { name in
            let text = try String(contentsOf: root.appendingPathComponent("Config/cells/cell-\(name).yaml"), encoding: .utf8)
            return try ConfigFile.parse(text.replacingOccurrences(of: "  cell:\n", with: "  cell:\n    name: \(name)\n"))
        }
        let members = ["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"]
        #expect(cells.map { $0.kernel.cell?.name } == ["a", "b"])
        #expect(cells.allSatisfy { $0.kernel.cell?.etcd.endpoints == members && $0.kernel.stateEtcd?.endpoints == members })
        #expect(cells[0].kernel.stateEtcd?.prefix == cells[1].kernel.stateEtcd?.prefix)
    }

    @Test("a pair on etcd, or in a cell, is refused at the pair section, saying what to run instead")
    func pairOnEtcdRefused() throws {
        let text = "kernel:\n  state:\n    backend: etcd\n    etcd:\n      endpoints: [http://127.0.0.1:2379]\n"
            + "pair:\n  role: primary\n  listen: tcp://127.0.0.1:5560\n  peer: tcp://127.0.0.1:6560\n  peer_broker: tcp://127.0.0.1:6555\n"
        let error = #expect(throws: ConfigError.self) { try ConfigFile.parse(text) }
        #expect(error?.path == "pair" && error?.problem.contains("leave out pair; a second kernel with the same kernel.state") == true, "\(String(describing: error))")
        // Nor in a cell: a cell's second kernel waits for its election in etcd instead.
        let cell = "kernel:\n  cell:\n    name: a\n    etcd:\n      endpoints: [http://127.0.0.1:2379]\n"
            + "pair:\n  role: primary\n  listen: tcp://127.0.0.1:5560\n  peer: tcp://127.0.0.1:6560\n  peer_broker: tcp://127.0.0.1:6555\n"
        let inCell = #expect(throws: ConfigError.self) { try ConfigFile.parse(cell) }
        #expect(inCell?.path == "pair" && inCell?.problem.contains("kernel.state.backend: etcd") == true, "\(String(describing: inCell))")
    }
}
