import BusKit
import BusProtocol
import Foundation
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// What a hostile local user found against `switchboard up` with the shipped configuration
/// (issue "Secure by default"), each tried again against the bus as `up` now runs it.
@Suite("switchboard up is secure by default: keys made on first run, CURVE on, rights per key", .serialized)
struct SecureByDefaultTests {
    @Test("first run makes private keys; sb finds its key without flags; rogue workers and forged state are refused; quotas per client key; a client key copied into clients/ is let in at sb reload, which names it")
    func secureByDefault() async throws {
        let folder = try temporaryDirectory("up-secure")
        // The key folder where sb looks by default (data/keys) when run from `folder`.
        let keys = KeyFolder(folder.appendingPathComponent("data/keys").path)
        // A second client allowed in, as a user would add one: its .pub in clients/.
        let bob = try await runCommand(switchboardExecutable(), ["keygen", "--out", keys.clientsFolder.appendingPathComponent("bob").path])
        #expect(bob.status == 0, "\(bob)")
        let (config, ports) = try writeBusConfiguration(in: folder, services: """
            echo: {workers: 1}
              store: {workers: 2}
              fetcher: {enabled: false}
              search: {enabled: false}
              pricing: {enabled: false}
              streams: {enabled: false}
            """, supervisor: "restart_backoff_ms: 100", security: "keys_dir: \(keys.path)")
        let broker = "tcp://127.0.0.1:\(ports[0])", collectorEndpoint = "tcp://127.0.0.1:\(ports[3])"
        let up = try ChildProcess(switchboardExecutable(), ["up", "--config", config.path], environment: ["SWITCHBOARD_KERNEL_CLIENT_STATE_MAX_KEYS": "20"])
        defer { up.stop() }
        let banner = try await up.waitForOutput(containing: "Stop with Ctrl-C", within: 60)

        // Keys made on first run, private.
        for name in ["kernel", "echo", "store", "client", "operator"] {
            let attributes = try FileManager.default.attributesOfItem(atPath: keys.secretKeyFile(name).path)
            #expect((attributes[.posixPermissions] as? Int) == 0o600, "\(name).key is private")
        }
        #expect((try FileManager.default.attributesOfItem(atPath: keys.path)[.posixPermissions] as? Int) == 0o700)
        #expect(FileManager.default.fileExists(atPath: keys.secretKeyFile("search").path), "a key for every service: another machine may run it")

        // The banner's line works as printed, from the bus's folder, with no key flags.
        let line = try #require(banner.split(separator: "\n").first { $0.hasPrefix("Connect with: ") })
        let command = String(line.dropFirst("Connect with: ".count).prefix { $0 != "(" }).trimmingCharacters(in: .whitespaces)
        #expect(command.hasSuffix("sb services") && !command.contains("--"), "\(command)")
        let path = sbExecutable().deletingLastPathComponent().path + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        let services = try await runCommand(URL(fileURLWithPath: "/bin/sh"), ["-c", command], environment: ["PATH": path, "SB_KEY_DIR": ""], in: folder)
        #expect(services.status == 0 && services.stdout.contains("store"), "\(services)")
        // And sb alone, run where the bus keeps its data: data/keys is where it looks by default.
        let plainSB = try await runCommand(sbExecutable(), ["services", "--endpoint", broker], environment: ["SB_KEY_DIR": ""], in: folder)
        #expect(plainSB.status == 0 && plainSB.stdout.contains("store"), "\(plainSB)")

        let client = try await BusClient(brokers: [broker], timeout: .seconds(5), curve: try keys.clientKeys())
        func storeWorkers() async throws -> Int64? {
            let list = try await client.request(service: "kernel", method: "services.list")
            return list["services"]?.arrayValue?.first { $0["name"] == "store" }?["workers"]?.intValue
        }
        #expect(try await storeWorkers() == 2)

        // 1. Nobody takes over a service: not a peer without keys, not the local client's
        //    key, not another service's key. Each READY as `store` is refused.
        let context = try ZMQContext()
        func rogueReady(as name: String?) throws -> Message? {
            let socket = try ZMQSocket(context, .dealer)
            defer { socket.close() }
            try socket.set(.linger, 0)
            try socket.set(.receiveTimeout, 1_500)
            if let name { try socket.secure(try keys.connectingKeys(as: name)) }
            try socket.connect(broker)
            try socket.send(MDP.encode(.ready(service: "store")))
            return try? socket.receive()
        }
        #expect(try rogueReady(as: nil) == nil, "a peer without keys gets nothing")
        for name in ["client", "echo"] {
            let answer = try rogueReady(as: name)
            #expect(answer.map { Array($0.frames.suffix(1)) } == [Frame([MDP.Command.disconnect.rawValue])], "\(name)'s key: \(String(describing: answer))")
        }
        #expect(try await storeWorkers() == 2, "no rogue store worker registered")
        let saved = try await client.request(service: "store", method: "articles.list")
        #expect(saved["articles"] != nil, "the real store answers")
        let stats = try await client.request(service: "kernel", method: "stats")
        #expect(stats["security"]?["refusedRegistrations"] == 2, "\(stats)")

        // 2. Nobody rewrites another service's state, through state.set or the collector.
        let environment = ["SB_ENDPOINT": broker, "SB_KEY_DIR": keys.path]
        for (key, value) in [("/pricing/route/current", #"{"forged":true}"#), ("/catalog/countries", "[]"), ("/store/sources/selected", "null")] {
            let forged = try await runCommand(sbExecutable(), ["request", "kernel", "state.set", #"{"key":"\#(key)","value":\#(value)}"#], environment: environment)
            #expect(forged.status == 1 && forged.stderr.contains("-32011"), "\(key): \(forged)")
        }
        let allowed = try await runCommand(sbExecutable(), ["request", "kernel", "state.set", #"{"key":"/client/mine","value":1}"#], environment: environment)
        #expect(allowed.status == 0, "\(allowed)")
        let echoKey = try await BusClient(brokers: [broker], timeout: .seconds(5), curve: try keys.connectingKeys(as: "echo"))
        let storeKeyByEcho = await rpcError { try await echoKey.request(service: "kernel", method: "state.set", params: ["key": "/store/history", "value": []]) }
        #expect(storeKeyByEcho?.code == JSONRPCError.forbiddenCode, "a service's key writes only its own prefix")
        _ = try await echoKey.request(service: "kernel", method: "state.set", params: ["key": "/echo/ok", "value": true])
        await echoKey.close()
        let collector = try ZMQSocket(context, .pub)
        try collector.set(.linger, 0)
        try collector.secure(try keys.clientKeys())
        try collector.connect(collectorEndpoint)
        // A PUB's first messages may go out before its connection is up: send until refused.
        let refusedBefore = try await client.request(service: "kernel", method: "stats")["state"]?["refusedForbidden"]?.intValue ?? 0
        #expect(refusedBefore == 4, "three forged state.set from sb, one from echo's key")
        var refused = refusedBefore
        for _ in 0..<100 where refused == refusedBefore {
            try collector.send(CHP.kv(KVEntry(key: "/pricing/route/current", value: Frame(#"{"forged":true}"#))))
            try await Task.sleep(for: .milliseconds(100))
            refused = try await client.request(service: "kernel", method: "stats")["state"]?["refusedForbidden"]?.intValue ?? 0
        }
        #expect(refused > refusedBefore, "the collector refused a KVSET outside /client/ from a client key")
        collector.close()
        let route = try await client.request(service: "kernel", method: "state.get", params: ["prefix": "/pricing/"])
        #expect(route["entries"]?.arrayValue?.isEmpty == true, "no forged route: \(route)")

        // 3. State per client key is bounded (client_state_max_keys: 20), each key its own quota.
        for index in 1..<20 {
            _ = try await client.request(service: "kernel", method: "state.set", params: ["key": .string("/client/q/\(index)"), "value": .int(Int64(index))])
        }
        let over = await rpcError { try await client.request(service: "kernel", method: "state.set", params: ["key": "/client/q/20", "value": 20]) }
        #expect(over?.code == JSONRPCError.tooLargeCode && over?.message.contains("kernel.client_state_max_keys") == true, "\(String(describing: over))")
        _ = try await client.request(service: "kernel", method: "state.set", params: ["key": "/client/q/1", "value": "replaced"])
        _ = try await client.request(service: "kernel", method: "state.set", params: ["key": "/client/q/2", "value": nil])
        _ = try await client.request(service: "kernel", method: "state.set", params: ["key": "/client/q/20", "value": 20])
        let bobKeys = try CurveClientKeys(serverKey: try #require(try keys.publicKey("kernel")),
                                          secretKey: try KeyFolder(keys.clientsFolder.path).secretKey("bob"))
        let bobClient = try await BusClient(brokers: [broker], timeout: .seconds(5), curve: bobKeys)
        _ = try await bobClient.request(service: "kernel", method: "state.set", params: ["key": "/client/bob", "value": 1])
        await bobClient.close()
        let limits = try await client.request(service: "kernel", method: "stats")
        #expect(limits["state"]?["refusedOverLimit"] == 1, "\(limits)")

        // 4. Only an operator's key drains workers, restarts or reloads: a client's is refused
        //    before anything reaches a worker; sb sends these with operator.key by itself.
        let drainByClient = await rpcError { try await client.request(service: "kernel", method: "workers.drain", params: ["service": "echo"]) }
        #expect(drainByClient?.code == JSONRPCError.forbiddenCode && drainByClient?.message.contains("operator") == true, "\(String(describing: drainByClient))")
        let restartByClient = await rpcError { try await client.request(service: "supervisor", method: "reload") }
        #expect(restartByClient?.code == JSONRPCError.forbiddenCode, "\(String(describing: restartByClient))")
        let security = try await client.request(service: "kernel", method: "stats")["security"]
        #expect(security?["refusedRequests"] == 2, "\(String(describing: security))")
        // Nor through the gateway, whose key is a client's: any holder of an HTTP token.
        let post = """
            import sys, urllib.request, urllib.error
            request = urllib.request.Request(sys.argv[1], data=sys.argv[3].encode(), headers={"Authorization": "Bearer " + sys.argv[2]})
            try:
                response = urllib.request.urlopen(request, timeout=10); print(response.status, response.read().decode())
            except urllib.error.HTTPError as error:
                print(error.code, error.read().decode())
            """
        let token = try #require(keys.gatewayToken())
        for (path, body) in [("supervisor", #"{"jsonrpc":"2.0","id":1,"method":"restart"}"#),
                             ("kernel", #"{"jsonrpc":"2.0","id":1,"method":"workers.drain","params":{"service":"store"}}"#)] {
            let http = try await runCommand(URL(fileURLWithPath: "/usr/bin/python3"), ["-c", post, "http://127.0.0.1:\(ports[4])/rpc/\(path)", token, body])
            #expect(http.stdout.hasPrefix("403 ") && http.stdout.contains("-32011"), "\(path) over HTTP: \(http)")
        }
        #expect(try await storeWorkers() == 2)
        let drainByOperator = try await runCommand(sbExecutable(), ["request", "kernel", "workers.drain", #"{"service":"nosuch"}"#], environment: environment)
        #expect(drainByOperator.status == 1 && drainByOperator.stderr.contains("-32602") && drainByOperator.stderr.contains("no worker offers 'nosuch'"),
                "admitted, and answered by the kernel: \(drainByOperator)")
        let reload = try await runCommand(sbExecutable(), ["reload", "--json"], environment: environment)
        #expect(reload.status == 0, "\(reload)")

        try await admitsClientsAtReload(keys, environment: environment)
        await client.close()
        up.signal(SIGTERM)
        #expect(await up.exit(within: 30))
        #expect(up.terminationStatus == 0, "\(up.readOutput().suffix(1_500))")
    }

    /// 5. A client let in while the bus runs, as a user would: its `.pub` copied into
    ///    `clients/`, then `sb reload`, which names the file; sb connects with `--key-file`
    ///    alone (the kernel's key from the folder). A file there that holds no key refuses
    ///    the reload, naming it, and the keys admitted stay; a file removed is named too, and
    ///    its key is refused again: at its next connection, and on the one it holds.
    private func admitsClientsAtReload(_ keys: KeyFolder, environment: [String: String]) async throws {
        let outside = try temporaryDirectory("carol")
        let made = try await runCommand(switchboardExecutable(), ["keygen", "--out", outside.appendingPathComponent("carol").path])
        #expect(made.status == 0, "\(made)")
        let carolPub = keys.clientsFolder.appendingPathComponent("carol.pub")
        func pingAsCarol() async throws -> CommandResult {
            try await runCommand(sbExecutable(), ["ping", "--timeout", "1s", "--key-file", outside.appendingPathComponent("carol.key").path], environment: environment)
        }
        func reload() async throws -> CommandResult { try await runCommand(sbExecutable(), ["reload"], environment: environment) }

        let stranger = try await pingAsCarol()
        #expect(stranger.status == 69 && stranger.stderr.contains("does not allow this client's key")
                && stranger.stderr.contains("copy its .pub into the kernel's KEYS/clients/ and run sb reload there"), "\(stranger)")
        try FileManager.default.copyItem(at: outside.appendingPathComponent("carol.pub"), to: carolPub)
        let added = try await reload()
        #expect(added.status == 0 && added.stdout.contains("applied: \(carolPub.path) (added)"), "\(added)")
        let admitted = try await pingAsCarol()
        #expect(admitted.status == 0 && admitted.stdout.hasPrefix("pong"), "\(admitted)")
        let carolKeys = try CurveClientKeys(serverKey: try #require(try keys.publicKey(KeyFolder.kernel)), secretKey: try KeyFolder(outside.path).secretKey("carol"))
        let carol = try await BusClient(brokers: [try #require(environment["SB_ENDPOINT"])], timeout: .seconds(5), curve: carolKeys)
        _ = try await carol.request(service: "kernel", method: "ping")

        let broken = keys.clientsFolder.appendingPathComponent("broken.pub")
        try Data("not a key\n".utf8).write(to: broken)
        let refused = try await reload()
        #expect(refused.status == 78 && refused.stderr.contains("security.keys_dir") && refused.stderr.contains("\(broken.path) holds no CURVE public key"),
                "\(refused)")
        #expect(try await pingAsCarol().status == 0, "the keys admitted before the refused reload stay")

        try FileManager.default.removeItem(at: broken)
        try FileManager.default.removeItem(at: carolPub)
        let removed = try await reload()
        #expect(removed.status == 0 && removed.stdout.contains("applied: \(carolPub.path) (removed)"), "\(removed)")
        #expect(try await pingAsCarol().status == 69, "a key removed is refused at its next connection")
        let stillConnected = await rpcError { try await carol.request(service: "kernel", method: "ping") }
        #expect(stillConnected?.code == JSONRPCError.forbiddenCode, "and on the connection it made before: \(String(describing: stillConnected))")
        await carol.close()
    }

    @Test("plain text only when the configuration says security.curve: false, with a warning; so too for a kernel run alone")
    func plainOnlyWhenAsked() async throws {
        let folder = try temporaryDirectory("up-plain")
        let keys = busKeyFolder(in: folder)
        let (config, broker) = try writeDeploymentConfig(in: folder, services: echoOnly, security: "curve: false\n  keys_dir: \(keys.path)")
        let up = try ChildProcess(switchboardExecutable(), ["up", "--config", config.path])
        defer { up.stop() }
        let banner = try await up.waitForOutput(containing: "Stop with Ctrl-C", within: 60)
        #expect(banner.contains("CURVE is off (security.curve: false)"), "\(banner)")
        #expect(!FileManager.default.fileExists(atPath: keys.path), "no keys made for a plain bus")
        let ping = try await runCommand(sbExecutable(), ["ping", "--endpoint", broker])
        #expect(ping.status == 0, "\(ping)")
        up.signal(SIGTERM)
        #expect(await up.exit(within: 30))

        // A services-only machine with nothing copied over says what it needs.
        let servicesOnly = try await runCommand(switchboardExecutable(), ["up", "--no-kernel", "--config", config.path],
                                                environment: ["SWITCHBOARD_SECURITY_CURVE": "true"])
        #expect(servicesOnly.status == 78 && servicesOnly.stderr.contains("copy kernel.pub, echo.key"), "\(servicesOnly)")

        // The kernel alone, with nothing said about CURVE: plain, for any ZeroMQ peer, with the warning.
        let empty = folder.appendingPathComponent("empty.yaml")
        try "log_level: info\n".write(to: empty, atomically: true, encoding: .utf8)
        let kernel = try ChildProcess(switchboardExecutable(), ["kernel", "--config", empty.path] + ["broker", "snapshot", "publisher", "collector"].flatMap {
            ["--\($0)", "tcp://127.0.0.1:\(freePort())"]
        })
        defer { kernel.stop() }
        try await kernel.waitForOutput(containing: "CURVE is off", within: 30)
    }

    @Test("two machines from the key folder: the kernel host makes every service's key; a services-only up with the copied files registers")
    func servicesOnlyMachineWithCopiedKeys() async throws {
        let kernelHost = try temporaryDirectory("up-kernel-host"), servicesHost = try temporaryDirectory("up-services-host")
        let kernelKeys = busKeyFolder(in: kernelHost), servicesKeys = busKeyFolder(in: servicesHost)
        let (config, ports) = try writeBusConfiguration(in: kernelHost, services: """
            echo: {enabled: false}
              store: {enabled: false}
              fetcher: {enabled: false}
              search: {enabled: false}
              pricing: {enabled: false}
              streams: {enabled: false}
            """, supervisor: "restart_backoff_ms: 100")
        let kernel = try ChildProcess(switchboardExecutable(), ["up", "--config", config.path])
        defer { kernel.stop() }
        try await kernel.waitForOutput(containing: "Stop with Ctrl-C", within: 60)
        // What an operator copies to the services machine: the kernel's public key and echo's pair.
        try FileManager.default.createDirectory(at: servicesKeys.url, withIntermediateDirectories: true)
        for file in [kernelKeys.publicKeyFile("kernel"), kernelKeys.secretKeyFile("echo"), kernelKeys.publicKeyFile("echo")] {
            try FileManager.default.copyItem(at: file, to: servicesKeys.url.appendingPathComponent(file.lastPathComponent))
        }
        let services = try ChildProcess(switchboardExecutable(), ["up", "--no-kernel", "--config", config.path],
                                        environment: ["SWITCHBOARD_SECURITY_KEYS_DIR": servicesKeys.path, "SWITCHBOARD_SERVICES_ECHO_ENABLED": "true"])
        defer { services.stop() }
        try await services.waitForOutput(containing: "Stop with Ctrl-C", within: 60)
        let echoed = try await runCommand(sbExecutable(), ["request", "echo", "echo", #"{"from":"elsewhere"}"#, "--endpoint", "tcp://127.0.0.1:\(ports[0])"],
                                          environment: ["SB_KEY_DIR": kernelKeys.path])
        #expect(echoed.status == 0 && echoed.stdout.contains("elsewhere"), "\(echoed)")
        services.signal(SIGTERM)
        #expect(await services.exit(within: 30))
        kernel.signal(SIGTERM)
        #expect(await kernel.exit(within: 30))
    }
}
