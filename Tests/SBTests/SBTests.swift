import BusKit
import BusProtocol
import Catalog
import Contracts
import EchoService
import Frames
import Foundation
import PricingService
import SearchService
import StreamsService
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// A kernel with every service (store, fetcher over files, search, pricing, echo, streams) for `sb`,
/// which runs as a separate process as users run it.
struct SBBus {
    let base: DatasetBus
    let search: SearchService
    let pricing: PricingService
    let hosts: [any Sendable]
    let works: [Working]
    let stops: [@Sendable () async -> Void]
    let catalog: Subscription
    let environment: [String: String]

    static func start() async throws -> SBBus {
        let base = try await DatasetBus.start()
        let catalog = try await base.catalogSubscription()
        let search = SearchService(busTimeout: .seconds(10), client: base.client, catalog: catalog)
        let searchHost = try ServiceHost(service: search, options: DatasetBus.hostOptions(base.kernel, connections: 4))
        let pricing = PricingService(busTimeout: .seconds(10), client: base.client, publisher: StatePublisher(client: base.client), catalog: catalog)
        let pricingHost = try ServiceHost(service: pricing, options: DatasetBus.hostOptions(base.kernel, connections: 2))
        let echoHost = try ServiceHost(service: EchoService(instance: "echo"), options: DatasetBus.hostOptions(base.kernel, connections: 2))
        // Capturing the route's prices as the bundled configuration does (sb flights history).
        var streamsConfiguration = StreamsConfiguration(path: try temporaryDirectory("sb-streams").appendingPathComponent("streams.sqlite").path)
        streamsConfiguration.capture = [PricingAPI.routeHistoryStream: ["/pricing/route/"]]
        let streams = StreamsService(configuration: streamsConfiguration, client: base.client)
        let streamsHost = try ServiceHost(service: streams, options: DatasetBus.hostOptions(base.kernel, connections: 1))
        try await searchHost.start()
        try await pricingHost.start()
        try await echoHost.start()
        try await streamsHost.start()
        try await base.waitForWorkers(["search", "pricing", "echo", "streams"])
        let works = [Working(search), Working(pricing), Working(streams)]
        for work in works { await work.start() }
        try await base.startFetcher()
        let endpoints = base.kernel.endpoints
        return SBBus(base: base, search: search, pricing: pricing, hosts: [searchHost, pricingHost, echoHost, streamsHost], works: works,
                     stops: [{ await searchHost.stop() }, { await pricingHost.stop() }, { await echoHost.stop() }, { await streamsHost.stop() }],
                     catalog: catalog,
                     environment: ["SB_ENDPOINT": endpoints.broker,
                                   "SB_STATE_ENDPOINT": "\(endpoints.snapshot),\(endpoints.publisher),\(endpoints.collector)",
                                   "NO_COLOR": ""])
    }

    /// Runs `sb` with this bus's endpoints.
    func sb(_ arguments: String..., input: String? = nil, environment extra: [String: String] = [:]) async throws -> CommandResult {
        try await sb(arguments, input: input, environment: extra)
    }

    func sb(_ arguments: [String], input: String? = nil, environment extra: [String: String] = [:]) async throws -> CommandResult {
        try await runCommand(sbExecutable(), arguments, environment: environment.merging(extra) { $1 }, input: input.map { Data($0.utf8) })
    }

    func stop() async {
        for stop in stops { await stop() }
        for work in works { await work.stop() }
        await catalog.cancel()
        await base.stop()
    }
}

@Suite("sb: every verb against a live bus, tables and JSON, exit statuses", .serialized)
struct SBTests {
    @Test("generic verbs: ping, services, request; exit statuses 0, 1, 64, 69, 75, 130")
    func genericVerbs() async throws {
        let bus = try await SBBus.start()
        let ping = try await bus.sb("ping")
        #expect(ping.status == 0 && ping.stdout.hasPrefix("pong from the kernel") && ping.stdout.contains(", version \(SwitchboardVersion.current))"), "\(ping)")
        // The build's version, from sb and switchboard alike, as scripts compare it.
        for program in [sbExecutable(), switchboardExecutable()] {
            let version = try await runCommand(program, ["--version"])
            #expect(version.status == 0 && version.stdout == SwitchboardVersion.current + "\n", "\(version)")
        }
        let services = try jsonLines(try await bus.sb("services", "--json").stdout).first?.arrayValue ?? []
        #expect(["echo", "fetcher", "pricing", "search", "store"].allSatisfy { name in services.contains { $0["name"] == .string(name) && $0["available"] == true } })
        let table = try await bus.sb("services")
        #expect(table.stdout.hasPrefix("SERVICE") && table.stdout.contains("pricing"))
        // Services named: their rows alone; a name the kernel does not know is 69, with those it does.
        let named = try await bus.sb("services", "search", "store")
        #expect(named.status == 0 && named.stdout.split(separator: "\n").map { $0.split(separator: " ").first ?? "" } == ["SERVICE", "search", "store"], "\(named)")
        let namedStats = try await bus.sb("stats", "pricing")
        #expect(namedStats.status == 0 && namedStats.stdout.split(separator: "\n").map { $0.split(separator: " ").first ?? "" } == ["SERVICE", "pricing"], "\(namedStats)")
        let namedJSON = try jsonLines(try await bus.sb("stats", "pricing", "echo", "--json").stdout).first?["services"]?.objectValue
        #expect(namedJSON.map { Set($0.keys) } == ["pricing", "echo"], "\(String(describing: namedJSON))")
        for verb in [["services", "search"], ["stats", "search"], ["workers"]] {
            let unknown = try await bus.sb(verb + ["mailer"])
            #expect(unknown.status == 69 && unknown.stdout.isEmpty && unknown.stderr.contains("the kernel knows no service 'mailer' (it knows echo, fetcher, pricing, search"), "\(unknown)")
        }
        #expect(try await bus.sb("stats", "search", "--prometheus").status == 64)

        let request = try await bus.sb("request", "search", "countries.search", #"{"query":"aland"}"#, "--json")
        let first = try jsonLines(request.stdout).first?["countries"]?.arrayValue?.first?["name"]
        #expect(request.status == 0 && first == "Åland Islands")
        let alias = try await bus.sb("req", "kernel", "ping")
        #expect(alias.status == 0 && alias.stdout.contains("pong"))

        let serviceError = try await bus.sb("request", "search", "countries.search", #"{"limit":0}"#)
        #expect(serviceError.status == 1 && serviceError.stderr.contains("error -32602") && serviceError.stdout.isEmpty)
        #expect(serviceError.stderr.contains("data: {") && serviceError.stderr.contains(#""field":"limit""#),
                "the error's data, as one line of JSON: \(serviceError.stderr)")
        let badJSON = try await bus.sb("request", "search", "countries.search", #"{"query":"#)
        #expect(badJSON.status == 64 && badJSON.stderr.contains("not valid JSON") && badJSON.stderr.contains("byte"))
        let badFlag = try await bus.sb("countries", "--limit", "ten")
        #expect(badFlag.status == 64)
        // A number that would trap once converted is a usage error.
        let hugeTimeout = try await bus.sb("ping", "--timeout", "1e300s")
        #expect(hugeTimeout.status == 64 && hugeTimeout.stderr.contains("--timeout"), "\(hugeTimeout)")
        let noService = try await bus.sb("request", "ghost", "x", "--timeout", "500ms")
        #expect(noService.status == 69 && noService.stderr.contains("no 'ghost' service") && noService.stderr.contains("; services with workers: echo, fetcher, pricing, search"),
                "\(noService)")
        let noKernel = try await bus.sb("ping", "--endpoint", "tcp://127.0.0.1:\(freePort())", "--timeout", "300ms")
        #expect(noKernel.status == 69 && noKernel.stderr.contains("no kernel answers") && noKernel.stderr.contains("nothing accepted a connection"))
        // Neither kernel of a pair there: both are asked at once and waited for once, for
        // --timeout, as the message says (asked one after the other for a second each, then
        // waited for again, they took --timeout and two seconds more). The bound leaves a
        // loaded machine most of those two seconds.
        let deadPair = ["tcp://127.0.0.1:\(freePort())", "tcp://127.0.0.1:\(freePort())"]
        let askedAt = ContinuousClock.now
        let noPair = try await bus.sb("services", "--endpoint", deadPair.joined(separator: ","), "--timeout", "2s", environment: ["SB_STATE_ENDPOINT": ""])
        let pairWait = ContinuousClock.now - askedAt
        #expect(noPair.status == 69 && noPair.stderr.hasPrefix("sb: no kernel answers at \(deadPair[0]), \(deadPair[1]) (waited 2 s)"), "\(noPair)")
        #expect(deadPair.allSatisfy { noPair.stderr.contains("nothing accepted a connection at \($0)") }, "\(noPair)")
        #expect(pairWait < .seconds(3.8), "waited \(pairWait)")
        // State endpoints that do not match the kernels given are a usage error before anything is asked.
        let mismatched = try await bus.sb("services", "--endpoint", deadPair.joined(separator: ","), "--timeout", "2s")
        #expect(mismatched.status == 64 && mismatched.stderr.contains("SB_STATE_ENDPOINT (for --state-endpoint) gives the state of 1 kernel, the endpoint 2"), "\(mismatched)")
        // A value from the environment is named as such.
        let badVariable = try await bus.sb("ping", environment: ["SB_TIMEOUT": "soon"])
        #expect(badVariable.status == 64 && badVariable.stderr.contains("SB_TIMEOUT (for --timeout): 'soon' is not a duration"), "\(badVariable)")
        // A connection the system accepts but nobody greets (a kernel stopped, or out of open
        // files): said so, rather than "connected".
        let silent = try SilentListener()
        let unanswered = try await bus.sb("ping", "--endpoint", silent.endpoint, "--timeout", "300ms")
        #expect(unanswered.status == 69 && unanswered.stderr.contains("nothing there answered its handshake"), "\(unanswered)")
        withExtendedLifetime(silent) {}
        // Another program on the port (an HTTP server, say): each connection ends unanswered.
        let other = try ClosingListener()
        let notKernel = try await bus.sb("ping", "--endpoint", other.endpoint, "--timeout", "500ms")
        #expect(notKernel.status == 69 && notKernel.stderr.contains("not a kernel's broker"), "\(notKernel)")
        withExtendedLifetime(other) {}
        // A kernel's state endpoints given as its broker: the publisher refuses this socket's
        // kind, the snapshot takes it and answers nothing; either is said not to be a broker.
        let endpoints = bus.base.kernel.endpoints
        for endpoint in [endpoints.publisher, endpoints.snapshot] {
            let stateAsBroker = try await bus.sb("ping", "--endpoint", endpoint, "--timeout", "500ms", environment: ["SB_STATE_ENDPOINT": ""])
            #expect(stateAsBroker.status == 69 && stateAsBroker.stderr.contains("not a kernel's broker"), "\(stateAsBroker)")
        }
        // Keys left from a bus with CURVE on, used against this one (CURVE off): the refusal says which.
        let keys = try temporaryDirectory("sb-keys")
        defer { try? FileManager.default.removeItem(at: keys) }
        let made = try await runCommand(switchboardExecutable(), ["keygen", "--out", keys.appendingPathComponent("other").path])
        #expect(made.status == 0, "\(made)")
        let publicFile = try String(contentsOf: keys.appendingPathComponent("other.pub"), encoding: .utf8)
        let serverKey = try #require(publicFile.split(separator: "\n").first { $0.hasPrefix("public-key = ") }?.dropFirst("public-key = ".count))
        let otherBus = try await bus.sb("ping", "--timeout", "1s", "--key-file", keys.appendingPathComponent("other.key").path,
                                        "--server-key", String(serverKey))
        #expect(otherBus.status == 69 && otherBus.stderr.contains("refused this client's handshake")
                && otherBus.stderr.contains("this client spoke CURVE, which a kernel with CURVE off does not"), "\(otherBus)")
        let slow = try await bus.sb("request", "echo", "sleep", #"{"ms":3000}"#, "--timeout", "300ms")
        #expect(slow.status == 75 && slow.stderr.contains("no answer within"))
        let timeoutFromEnvironment = try await bus.sb("request", "echo", "sleep", #"{"ms":3000}"#, environment: ["SB_TIMEOUT": "200ms"])
        #expect(timeoutFromEnvironment.status == 75)
        // Ctrl-C: 130, and the call named once.
        let interrupted = try ChildProcess(sbExecutable(), ["request", "echo", "numbers", #"{"n":3,"everyMs":10000}"#, "--stream"],
                                           environment: bus.environment)
        defer { interrupted.stop() }
        try await interrupted.waitForOutput(containing: #"{"part":1}"#, within: 30)
        interrupted.signal(SIGINT)
        #expect(await interrupted.exit(within: 30))
        #expect(interrupted.terminationStatus == 130 && interrupted.outputSoFar.hasSuffix("sb: echo numbers: cancelled\n"), "\(interrupted.outputSoFar)")
        await bus.stop()
    }

    @Test("sb describe: every method of every service with its summary and schemas; a wrong param is refused naming the field")
    func describe() async throws {
        let bus = try await SBBus.start()
        let all = try await bus.sb("describe", "--json")
        #expect(all.status == 0, "\(all)")
        let documents = try #require(try jsonLines(all.stdout).first?.objectValue)
        // Every document keeps OpenRPC's rules, as a validator nobody on this project wrote reads them.
        let folder = try temporaryDirectory("openrpc")
        defer { try? FileManager.default.removeItem(at: folder) }
        let documentsFile = folder.appendingPathComponent("documents.json")
        try Data(all.stdout.utf8).write(to: documentsFile)
        let checker = repositoryRoot().appendingPathComponent("Tests/Validators/check_openrpc.py")
        let checked = try await runCommand(URL(fileURLWithPath: "/usr/bin/python3"), [checker.path, documentsFile.path])
        #expect(checked.status == 0 && checked.stdout.contains("documents checked, 0 problems"), "\(checked)")
        // The kernel and every service on this bus answer rpc.discover, with each method of their table.
        let expected: [String: [String]] = [
            KernelAPI.service: ["ping", "services.list", "stats", "metrics", "state.set", "state.publish", "state.get", "state.history",
                                "workers.list", "workers.drain"],
            SearchAPI.service: ["countries.search", "locations.search", "locations.resolve", "items.grouped", "sources.list",
                                "headlines.list", "flights.list", "airlines.get", "indexes.list"],
            PricingAPI.service: ["route.quote", "route.cheapest", "route.current", "route.select", "deals.rollback", "deals.today"],
            StoreAPI.service: ["history.add", "history.list", "history.clear", "articles.save", "articles.list", "articles.delete",
                               "sources.select", "sources.selected", "route.select", "route.selected", "snapshots.put", "snapshots.get",
                               "snapshots.list"],
            FetcherAPI.service: ["datasets.list", "datasets.get", "datasets.refresh"],
            EchoAPI.service: ["echo", "sleep", "fail", "whoami", "count", "numbers"],
            StreamsAPI.service: ["stream.add", "stream.update", "stream.info", "stream.list", "stream.metrics", "stream.messages", "stream.delete", "stream.purge", "stream.publish", "consumer.add",
                                 "consumer.update", "consumer.info", "consumer.list", "consumer.delete", "consumer.fetch", "consumer.next", "consumer.ack", "consumer.nak", "consumer.progress",
                                 "consumer.term"],
        ]
        for (service, methods) in expected {
            let document = try #require(documents[service], "\(service) described")
            #expect(document["x-jsonSchemaDialect"] == "https://json-schema.org/draft/2020-12/schema")
            let described = document["methods"]?.arrayValue ?? []
            #expect(described.compactMap { $0["name"]?.stringValue } == methods, "\(service)")
            for method in described {
                #expect(method["summary"]?.stringValue?.isEmpty == false)
                #expect(method["result"]?["schema"] != nil && method["params"]?.arrayValue != nil)
            }
        }
        let quote = try #require(documents[PricingAPI.service]?["methods"]?.arrayValue?.first { $0["name"] == "route.quote" })
        #expect(quote["params"] == [["name": "inboundId", "required": true, "schema": ["type": "integer"]],
                                    ["name": "outboundId", "required": true, "schema": ["type": "integer"]]])
        #expect(quote["result"]?["schema"]?["required"] == ["outbound"])
        let total = quote["result"]?["schema"]?["properties"]?["total"]?.jsonString ?? ""
        #expect(total.contains(#""required":["amount","currency"]"#), "money is {amount, currency}: \(total)")

        // docs/CONTRACTS.md is what the contracts say (regenerate: sb describe --markdown > docs/CONTRACTS.md).
        let markdown = try await bus.sb("describe", "--markdown")
        let documented = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("docs/CONTRACTS.md")
        let file = try String(contentsOf: documented, encoding: .utf8)
        #expect(markdown.status == 0 && markdown.stdout == file, "docs/CONTRACTS.md differs from the contracts: regenerate it with sb describe --markdown")

        let table = try await bus.sb("describe", "search", "items.grouped")
        #expect(table.status == 0 && table.stdout.contains(#"order   "lexical"|"natural"  no"#), "\(table)")
        let unknown = try await bus.sb("describe", "search", "nope")
        #expect(unknown.status == 1 && unknown.stderr.contains("search has no method nope"), "\(unknown)")

        let wrong = try await bus.sb("request", "search", "items.grouped", #"{"order":"random"}"#, "--json")
        #expect(wrong.status == 1 && wrong.stderr.contains("-32602") && wrong.stderr.contains("order"), "\(wrong)")
        await bus.stop()
    }

    @Test("every method of every contract, called with its typed params, answers in the shape its result type states")
    func everyMethodFitsItsContract() async throws {
        let bus = try await SBBus.start()
        let client = bus.base.client
        // Each reply is decoded into the contract's type here, and checked against it by the
        // (debug-built) service before it is sent.
        #expect(try await client.call(KernelAPI.ping).pong)
        #expect(try await client.call(KernelAPI.servicesList).services.contains { $0.name == SearchAPI.service })
        _ = try await client.call(KernelAPI.stats)
        #expect(try await client.call(KernelAPI.metrics).text.contains("switchboard_requests_total"))
        #expect(try await client.call(KernelAPI.statePublish, .init(key: "/client/contract", value: 1)).sequence > 0)
        #expect(try await client.call(KernelAPI.stateGet, .init(prefix: "/client/")).entries.map(\.key) == ["/client/contract"])
        _ = try await client.call(KernelAPI.stateSet, .init(key: "/client/contract", value: nil))

        #expect(try await client.call(SearchAPI.countriesSearch, .init(query: "par", limit: 3)).countries.count == 3)
        #expect(try await client.call(SearchAPI.locationsSearch, .init(query: "52.37, 4.89", limit: 2)).places.first?.distanceKm != nil)
        #expect(try await client.call(SearchAPI.locationsResolve, .init(query: "Amsterdam")).historyRecorded)
        #expect(try await client.call(SearchAPI.itemsGrouped, .init(order: .natural, listId: 1)).groups.count == 1)
        #expect(try await client.call(SearchAPI.sourcesList, .init(language: "all")).total > 0)
        #expect(try await client.call(SearchAPI.headlinesList, .init()).status == "no-sources-selected")
        #expect(try await client.call(SearchAPI.flightsList, .init(direction: .inbound)).outbound == nil)
        _ = try await client.call(SearchAPI.airlinesGet, .init(id: "Vueling"))
        #expect(try await client.call(SearchAPI.indexesList).count == 7)

        #expect(try await client.call(PricingAPI.routeQuote, .init(outboundId: 1, inboundId: 12)).flightsVersion != nil)
        #expect(try await client.call(PricingAPI.routeCheapest).cheapestRoundTrip != nil)
        #expect(try await client.call(PricingAPI.routeSelect, .init(outboundId: 3, inboundId: 14)).status == "priced")
        #expect(try await client.call(PricingAPI.routeCurrent).outboundId == 3)
        #expect(try await client.call(PricingAPI.dealsRollback, .init(seed: 42)).seed == 42)
        #expect(try await client.call(PricingAPI.dealsToday, .init(date: "2026-12-24")).date == "2026-12-24")

        #expect(try await client.call(StoreAPI.historyAdd, .init(text: "Rome")).text == "Rome")
        #expect(try await client.call(StoreAPI.historyList, .init(limit: 5)).entries.first?.text == "Rome")
        let saved = try await client.call(StoreAPI.articlesSave, .init(article: ["url": "https://example.com/contract", "title": "t"]))
        #expect(try await client.call(StoreAPI.articlesList, .init()).articles.first?.id == saved.id)
        #expect(try await client.call(StoreAPI.articlesDelete, .init(url: saved.url)).deleted)
        #expect(try await client.call(StoreAPI.articlesDelete, .init(url: saved.url)).message != nil)
        #expect(try await client.call(StoreAPI.sourcesSelect, .init(ids: ["bbc-news"])).ids == ["bbc-news"])
        #expect(try await client.call(StoreAPI.sourcesSelected).ids == ["bbc-news"])
        #expect(try await client.call(StoreAPI.routeSelected)?.outboundId == 3)
        _ = try await client.call(StoreAPI.snapshotsPut, .init(name: "contract", body: "[]", version: "v1", origin: "remote", fetchedAt: "2026-11-24T00:00:00Z"))
        #expect(try await client.call(StoreAPI.snapshotsGet, .init(name: "contract"))?.version == "v1")
        #expect(try await client.call(StoreAPI.snapshotsList).contains { $0.name == "contract" })
        #expect(try await client.call(StoreAPI.historyClear).cleared == 2, "Amsterdam (resolved above) and Rome")

        #expect(try await client.call(FetcherAPI.datasetsList).count == 7)
        #expect(try await client.call(FetcherAPI.datasetsGet, .init(name: "flights", limit: 2)).records.count == 2)
        #expect(try await client.call(FetcherAPI.datasetsRefresh, .init(name: "airlines")).first?.name == "airlines")

        #expect(try await client.call(EchoAPI.echo, ["a": 1]) == ["a": 1])
        #expect(try await client.call(EchoAPI.count, .init(n: 3)) == 3)
        #expect(try await client.call(EchoAPI.whoami) == "echo")
        _ = try await client.call(EchoAPI.sleep, .init(ms: 1))
        await #expect(throws: BusError.self) { try await client.call(EchoAPI.fail, .init(code: -32099)) }

        #expect(try await client.call(StreamsAPI.streamAdd, .init(name: "contract", subjects: ["contract."])).deadLetters == "contract.dead")
        #expect(try await client.call(StreamsAPI.publish, .init(subject: "contract.a", data: ["n": 1], id: "c-1")).sequence == 1)
        #expect(try await client.call(StreamsAPI.consumerAdd, .init(stream: "contract", name: "reader", ackWait: 60)).waiting == 1)
        #expect(try await client.call(StreamsAPI.fetch, .init(stream: "contract", consumer: "reader", batch: 5)).messages.first?.data == ["n": 1])
        #expect(try await client.call(StreamsAPI.progress, .init(stream: "contract", consumer: "reader", sequences: [1])).done == [1])
        #expect(try await client.call(StreamsAPI.nak, .init(stream: "contract", consumer: "reader", sequences: [1], delay: 0)).done == [1])
        #expect(try await client.call(StreamsAPI.nextMethod, .init(stream: "contract", consumer: "reader", max: 1, expires: 10)).count == 1)
        #expect(try await client.call(StreamsAPI.term, .init(stream: "contract", consumer: "reader", sequences: [1])).done == [1])
        #expect(try await client.call(StreamsAPI.ack, .init(stream: "contract", consumer: "reader", sequences: [1])).notPending == [1])
        #expect(try await client.call(StreamsAPI.consumerInfo, .init(stream: "contract", name: "reader")).terminated == 1)
        #expect(try await client.call(StreamsAPI.streamInfo, .init(name: "contract")).consumers == ["reader"])
        #expect(try await client.call(StreamsAPI.streamList).streams.filter { $0.name.hasPrefix("contract") }.count == 2)
        #expect(try await client.call(StreamsAPI.streamMessages, .init(name: "contract", last: 1)).messages.first?.data == ["n": 1])
        #expect(try await client.call(StreamsAPI.consumerDelete, .init(stream: "contract", name: "reader")).messages == 0)
        #expect(try await client.call(StreamsAPI.streamPurge, .init(name: "contract")).messages == 1)
        #expect(try await client.call(StreamsAPI.streamDelete, .init(name: "contract")).messages == 0)
        await bus.stop()
    }

    @Test("usage errors are 64 and nothing is sent: params that are not an object or array, a bad endpoint, a word that names no verb, invalid UTF-8")
    func usageErrors() async throws {
        let bus = try await SBBus.start()
        let bare = try await bus.sb("request", "echo", "echo", #""str""#)
        #expect(bare.status == 64 && bare.stderr.contains("PARAMS must be a JSON object or array"), "\(bare)")
        for endpoint in ["garbage://x", "tcp://", "localhost:5555", "tcp://127.0.0.1:port", "tcp://:5555", "inproc://kernel"] {
            let bad = try await bus.sb("services", "--endpoint", endpoint)
            #expect(bad.status == 64 && bad.stderr.contains("is not an endpoint") && bad.stderr.contains("Usage: sb services"), "\(endpoint): \(bad)")
        }
        // A bad timeout, given or from the environment, is the verb's usage error, shown with its usage.
        for bad in [try await bus.sb("ping", "--timeout", "0s"), try await bus.sb("ping", environment: ["SB_TIMEOUT": "soon"])] {
            #expect(bad.status == 64 && bad.stderr.contains("is not a duration") && bad.stderr.contains("Usage: sb ping"), "\(bad)")
        }
        // State endpoints given are checked whatever the verb, not only by those that subscribe.
        for state in ["a,b,c", "tcp://127.0.0.1:port"] {
            let bad = try await bus.sb("services", "--state-endpoint", state)
            #expect(bad.status == 64 && bad.stderr.contains("--state-endpoint: give tcp://HOST:PORT"), "\(state): \(bad)")
        }
        // Lists as a person types them: spaces around the commas, an empty item.
        let spaced = try await bus.sb("services", environment: ["SB_ENDPOINT": " \(bus.environment["SB_ENDPOINT"]!) , "])
        #expect(spaced.status == 0 && spaced.stdout.contains("pricing"), "\(spaced)")
        // Connection options before the verb work too, as `sb --endpoint X services`.
        let before = try await bus.sb("--endpoint", bus.environment["SB_ENDPOINT"]!, "--timeout", "5s", "services", environment: ["SB_ENDPOINT": ""])
        #expect(before.status == 0 && before.stdout.contains("pricing"), "\(before)")
        let nested = try await bus.sb("--endpoint", bus.environment["SB_ENDPOINT"]!, "news", "saved", "--json", environment: ["SB_ENDPOINT": ""])
        #expect(nested.status == 0, "\(nested)")
        // A negative number after an option is its value, checked as one (not "Missing value").
        let negativeCount = try await bus.sb("sub", "/", "--count", "-1")
        #expect(negativeCount.status == 64 && negativeCount.stderr.contains("--count must be positive"), "\(negativeCount)")
        // A prefix that cannot match a key is refused, not waited on in silence.
        for pathless in [try await bus.sb("sub", "/client/", "pricing/"), try await bus.sb("kv", "watch", "pricing/")] {
            #expect(pathless.status == 64 && pathless.stderr.contains("prefix pricing/ matches no key") && pathless.stderr.contains("/pricing/"), "\(pathless)")
        }
        // Where the parser still takes a negative number for an option, sb says how to give it.
        for arguments in [["kv", "put", "/client/n", "-5"], ["flights", "route", "--select", "-5"], ["stream", "pub", "orders.new", "-5"]] {
            let taken = try await bus.sb(arguments)
            #expect(taken.status == 64 && taken.stderr.contains("Usage: sb ") && taken.stderr.hasSuffix("Note: sb took '-5' for an option; give such a value after -- (sb kv put KEY -- -5) or joined to its option (--NAME=-5).\n"), "\(arguments): \(taken)")
        }
        #expect(!negativeCount.stderr.contains("Note:"), "\(negativeCount)")
        let negativeWait = try await bus.sb("stream", "fetch", "orders", "reader", "--wait", "-1")
        #expect(negativeWait.status == 64 && negativeWait.stderr.contains("--wait must be 0 to 60 seconds"), "\(negativeWait)")
        // Every number a verb sends is checked against its contract's range, naming the flag.
        let outOfRange: [([String], String)] = [
            (["stream", "add", "x", "x.", "--max-messages", "0"], "--max-messages must be 1 to 1000000000"),
            (["stream", "add", "x", "x.", "--max-age", "-1"], "--max-age must be 0 to 3153600000 seconds"),
            (["stream", "consumer", "orders", "c", "--ack-wait", "-1"], "--ack-wait must be 0.001 to 86400 seconds"),
            (["stream", "fetch", "orders", "reader", "--batch", "0"], "--batch must be 1 to 1000"),
            (["stream", "read", "orders", "--last", "1001"], "--last must be 1 to 1000"),
            (["stream", "nak", "orders", "reader", "1", "--delay", "-5"], "--delay must be 0 to 86400 seconds"),
            (["flights", "history", "--last", "0"], "--last must be 1 to 1000"),
            (["countries", "par", "--limit", "0"], "--limit must be 1 to 1000"),
            (["news", "headlines", "--page-size", "1000"], "--page-size must be 1 to 100"),
            // One message for a TTL too long or not more than 0 (the kernel's 0 would delete at once).
            (["pub", "/client/x", "1", "--ttl", "1e12"], "--ttl must be more than 0 and at most 31536000 seconds (a year)"),
            (["kv", "put", "/client/x", "1", "--ttl", "0"], "--ttl must be more than 0 and at most 31536000 seconds (a year)"),
            (["kv", "put", "/client/x", "1", "--ttl", "366d"], "--ttl must be more than 0 and at most 31536000 seconds (a year)"),
            (["run", "-", "--parallel", "10001"], "--parallel must be 1 to 10000"),
        ]
        for (arguments, said) in outOfRange {
            let refused = try await runCommand(sbExecutable(), arguments, environment: bus.environment)
            #expect(refused.status == 64 && refused.stderr.contains(said), "\(arguments): \(refused)")
        }
        // A word where a verb should be that names none is refused naming the verbs there are,
        // connection options before it or not.
        let unknownVerbs: [([String], String)] = [
            (["kv", "set", "/client/x", "1"], "sb kv has no verb 'set'; its verbs: get, put, create, update, del, ls, history, watch\nUsage: sb kv <subcommand>"),
            (["--timeout", "5s", "news", "latest"], "sb news has no verb 'latest'; its verbs: sources, headlines, save, saved, delete\nUsage: sb news <subcommand>"),
            (["frobnicate"], "sb has no verb 'frobnicate'; its verbs: request, subscribe, publish, kv, "),
        ]
        for (arguments, said) in unknownVerbs {
            let refused = try await runCommand(sbExecutable(), arguments, environment: bus.environment)
            #expect(refused.status == 64 && refused.stderr.hasPrefix("Error: " + said), "\(arguments): \(refused)")
        }
        let badEnvironment = try await bus.sb("ping", environment: ["SB_ENDPOINT": "garbage://x"])
        #expect(badEnvironment.status == 64, "\(badEnvironment)")
        // Invalid UTF-8 (a lone 0xFF) in an argument is refused, not turned into U+FFFD.
        let shell = try await runCommand(URL(fileURLWithPath: "/bin/sh"), ["-c", #"exec "$0" request echo echo "$(printf '{"a":"\377"}')""#, sbExecutable().path],
                                         environment: bus.environment)
        #expect(shell.status == 64 && shell.stderr.contains("not valid UTF-8") && shell.stdout.isEmpty, "\(shell)")
        // In a script, that line is answered -32700 and the others run.
        let good = Array(#"{"service":"echo","method":"echo","params":{"a":"x"}}"#.utf8)
        let bad = Array(#"{"service":"echo","method":"echo","params":{"a":""#.utf8) + [0xFF] + Array(#""}}"#.utf8)
        let script = Data([good, bad].joined(separator: [0x0A]) + [0x0A])
        let run = try await runCommand(sbExecutable(), ["run", "-", "--continue-on-error"], environment: bus.environment, input: script)
        let answers = try jsonLines(run.stdout)
        #expect(answers.count == 2 && answers[0]["result"] == ["a": "x"] && answers[1]["error"]?["code"] == -32700, "\(run)")
        await bus.stop()
    }

    @Test("sb run: good, bad and mixed scripts; every line answered in order; exit status; stdin (a request's params too); each line sent as it is read; a line too long for a message refused unkept")
    func runScripts() async throws {
        let bus = try await SBBus.start()
        let folder = try temporaryDirectory("sb-run")
        let good = (0..<12).map { #"{"service":"echo","method":"echo","params":{"n":\#($0)}}"# }.joined(separator: "\n")
        let goodFile = folder.appendingPathComponent("good.jsonl")
        try good.write(to: goodFile, atomically: true, encoding: .utf8)
        let answers = try await bus.sb("run", goodFile.path, "--parallel", "4")
        let lines = try jsonLines(answers.stdout)
        #expect(answers.status == 0 && lines.count == 12)
        #expect(lines.compactMap { $0["result"]?["n"]?.intValue } == Array(0..<12))
        #expect(lines.compactMap { $0["line"]?.intValue } == Array(1...12))

        let mixed = """
            {"service":"echo","method":"echo","params":{"n":1}}
            # a comment, then a blank line

            not json
            {"service":"echo"}
            {"service":"search","method":"countries.search","params":{"limit":-1}}
            {"service":"echo","method":"echo","params":{"n":2}}
            """
        let all = try await bus.sb("run", "-", "--continue-on-error", "--parallel", "3", input: mixed)
        let allLines = try jsonLines(all.stdout)
        #expect(all.status == 1 && allLines.count == 5)
        #expect(allLines.compactMap { $0["line"]?.intValue } == [1, 4, 5, 6, 7])
        #expect(allLines.map { $0["error"]?["code"]?.intValue } == [nil, -32700, -32600, -32602, nil])
        #expect(allLines.last?["result"]?["n"] == 2)

        let stopped = try await bus.sb("run", "-", input: mixed)
        let stoppedLines = try jsonLines(stopped.stdout)
        #expect(stopped.status == 1 && stoppedLines.count == 2 && stoppedLines.last?["error"]?["code"] == -32700)

        let missing = try await bus.sb("run", folder.appendingPathComponent("none.jsonl").path)
        #expect(missing.status == 64 && missing.stderr.contains("none.jsonl: No such file or directory"), "\(missing)")
        #expect(missing.stderr.contains("Usage: sb run ") && missing.stderr.contains("See 'sb run --help'"), "the verb's usage, not sb's: \(missing)")
        let notAFile = try await bus.sb("run", folder.path)
        #expect(notAFile.status == 64 && notAFile.stderr.contains("it is a folder"), "\(notAFile)")

        // A script still being written (a program's output, a person typing): each line is
        // answered before the next is written, and a failure ends the run without its end.
        let writing = try ChildProcess(sbExecutable(), ["run", "-"], environment: bus.environment)
        for number in 1...2 {
            writing.send(#"{"service":"echo","method":"echo","params":{"n":\#(number)}}"# + "\n")
            try await writing.waitForOutput(containing: #""line":\#(number)"#)
        }
        writing.send("not json\n")
        #expect(await writing.exit(within: 30) && writing.terminationStatus == 1, "\(writing.outputSoFar)")
        #expect(writing.outputSoFar.contains(#""line":3"#) && writing.outputSoFar.contains("-32700"), "\(writing.outputSoFar)")

        // A line longer than one message may carry is answered as an error and not kept.
        let longest = MDP.defaultMaxMessageSize
        let tooLong = #"{"service":"echo","method":"echo","params":{"a":""# + String(repeating: "x", count: longest) + "\"}}\n" + good
        let long = try await bus.sb("run", "-", "--continue-on-error", input: tooLong)
        let longLines = try jsonLines(long.stdout)
        #expect(long.status == 1 && longLines.count == 13 && longLines.first?["error"]?["code"] == -32600, "\(long.stderr)")
        #expect(longLines.first?["error"]?["message"]?.stringValue?.contains("longer than \(longest) bytes") == true)
        #expect(longLines.last?["result"]?["n"] == 11 && longLines.last?["line"] == 13)

        // One request's params on standard input.
        let params = try await bus.sb("request", "echo", "echo", "-", "--json", input: #"{"n": 3}"#)
        #expect(params.status == 0 && params.stdout.contains(#""n":3"#), "\(params)")
        await bus.stop()
    }

    @Test("sb subscribe --count ends by itself; sb publish is acknowledged with its sequence; only /client/ is writable; sb kv: compare-and-set, ls (every page), history, watch")
    func subscribeAndPublish() async throws {
        let bus = try await SBBus.start()
        let snapshot = try await bus.sb("subscribe", "/pricing/", "--count", "2")
        let lines = try jsonLines(snapshot.stdout)
        #expect(snapshot.status == 0 && lines.count == 2 && lines.allSatisfy { $0["snapshot"] == true })
        #expect(Set(lines.compactMap { $0["key"]?.stringValue }) == ["/pricing/deal/today", "/pricing/route/current"])

        // The subscriber sees the write, live or (had it connected later) in its snapshot.
        let live = Task { try await bus.sb("sub", "/client/demo", "--count", "1") }
        let published = try await bus.sb("publish", "/client/demo", #"{"hello":"world"}"#, "--json")
        let publishedLine = try jsonLines(published.stdout).first
        #expect(published.status == 0 && publishedLine?["key"] == "/client/demo" && (publishedLine?["sequence"]?.intValue ?? 0) > 0)
        let update = try await live.value
        let updated = try jsonLines(update.stdout).first?["value"]
        #expect(update.status == 0 && updated == ["hello": "world"])

        let refused = try await bus.sb("pub", "/store/history", "1", "--timeout", "1s")
        #expect(refused.status == 1 && refused.stderr.contains("writable prefixes"))
        let notJSON = try await bus.sb("pub", "/client/x", "hello")
        #expect(notJSON.status == 64)
        // '-': the value on standard input, past what one command-line argument may hold.
        let large = #"{"blob":""# + String(repeating: "x", count: 200_000) + #""}"#
        let piped = try await bus.sb("kv", "put", "/client/large", "-", input: large + "\n")
        #expect(piped.status == 0, "\(piped)")
        let gotLarge = try await bus.sb("kv", "get", "/client/large", "--json")
        #expect(try jsonLines(gotLarge.stdout).first?["value"]?["blob"]?.stringValue?.count == 200_000)
        let pipedBad = try await bus.sb("pub", "/client/large", "-", input: "hello")
        #expect(pipedBad.status == 64 && pipedBad.stderr.contains("VALUE (from standard input) is not valid JSON"), "\(pipedBad)")

        // sb kv: revisions, compare-and-set, a listing, history, a watch from a revision.
        func revision(_ result: CommandResult) throws -> UInt64 { UInt64(try jsonLines(result.stdout).first?["revision"]?.intValue ?? -1) }
        let put = try revision(try await bus.sb("kv", "put", "/client/kv/route", #""LHR-JFK""#, "--json"))
        let got = try await bus.sb("kv", "get", "/client/kv/route")
        #expect(got.status == 0 && got.stdout == "/client/kv/route revision \(put)\n\"LHR-JFK\"\n")
        let listed = try await bus.sb("kv", "ls", "/client/kv/", "--json")
        #expect(try jsonLines(listed.stdout).map { [$0["key"], $0["revision"]] } == [[.string("/client/kv/route"), .int(Int64(put))]], "\(listed)")
        let changed = try revision(try await bus.sb("kv", "update", "/client/kv/route", #""CDG-SFO""#, "\(put)", "--json"))
        #expect(changed > put)
        let stale = try await bus.sb("kv", "update", "/client/kv/route", #""AMS-BOS""#, "\(put)")
        #expect(stale.status == 1 && stale.stderr.contains("-32004") && stale.stderr.contains("at revision \(changed)"))
        let taken = try await bus.sb("kv", "create", "/client/kv/route", #""x""#)
        #expect(taken.status == 1 && taken.stderr.contains("-32004"))
        let deleted = try revision(try await bus.sb("kv", "del", "/client/kv/route", "--revision", "\(changed)", "--json"))
        #expect(try await bus.sb("kv", "get", "/client/kv/route").status == 1)
        let history = try await bus.sb("kv", "history", "/client/kv/route")
        #expect(history.status == 0 && history.stdout.contains("\(deleted)  DEL") && history.stdout.contains("\(put)  PUT  \"LHR-JFK\""))
        let watched = try await bus.sb("kv", "watch", "/client/kv/", "--since", "\(put)", "--count", "2")
        #expect(watched.stdout == "\(changed) PUT /client/kv/route \"CDG-SFO\"\n\(deleted) DEL /client/kv/route\n")
        let resumed = try await bus.sb("sub", "/client/kv/", "--since", "\(changed)", "--count", "1")
        #expect(try jsonLines(resumed.stdout).first?["sequence"]?.intValue == Int64(deleted))
        // A key may hold any character: printed for people, its control characters are
        // escaped, so it cannot forge a line or move a terminal's cursor.
        let forged = "/client/kv/x\n999 PUT /client/kv/route \"forged\"\u{1B}[2J"
        let written = try await bus.sb("kv", "put", forged, "1")
        let shown = try await bus.sb("kv", "get", forged)
        let watchedForged = try await bus.sb("kv", "watch", forged, "--count", "1")
        for output in [written.stdout, shown.stdout, watchedForged.stdout] {
            #expect(output.contains(#"/client/kv/x\n999 PUT"#) && !output.contains("\u{1B}"), "\(output)")
        }
        #expect(written.stdout.split(separator: "\n").count == 1 && shown.stdout.split(separator: "\n").count == 2)
        // A follower whose reader has gone ends at once, as its next write would (SIGPIPE, 141
        // in a shell), not at a next change that may never come.
        for follower in [["sub"], ["kv", "watch"]] {
            let firstLine = try await runFirstLine(sbExecutable(), follower + ["/client/kv/"], environment: bus.environment)
            #expect(firstLine.stdout.hasSuffix("\n141 0\n") && firstLine.stdout.contains("/client/kv/x"), "\(follower): \(firstLine)")
        }
        let listedForged = try await bus.sb("kv", "ls", "/client/kv/")
        #expect(listedForged.stdout == #"/client/kv/x\n999 PUT /client/kv/route "forged"\u001b[2J"# + "\n", "\(listedForged)")

        // More keys than a page of state.get holds: every page is read, and a key under two
        // of the prefixes is listed once.
        let many = (0..<1_200).map { String(format: "/client/many/%04d", $0) }
        let writes = await bus.base.client.batch(KernelAPI.statePublish, many.map { KernelAPI.StateSetParams(key: $0, value: .int(1)) })
        #expect(writes.allSatisfy { (try? $0.get()) != nil })
        let all = try await bus.sb("kv", "ls", "/client/many/", "/client/many/1")
        #expect(all.status == 0 && all.stdout == many.map { $0 + "\n" }.joined(), "\(all.stdout.count) characters, \(all.stderr)")
        await bus.stop()
    }

    @Test("sb bench: requests from several clients with percentiles and a CSV, failures counted by kind, publish/subscribe with nothing lost and no keys left")
    func bench() async throws {
        let bus = try await SBBus.start()
        let folder = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: folder) }
        let csv = folder.appendingPathComponent("latencies.csv").path
        let requests = try await bus.sb("bench", "--clients", "2", "--window", "4", "--count", "300", "--warmup", "5", "--json", "--csv", csv)
        let report = try #require(try jsonLines(requests.stdout).first, "\(requests)")
        #expect(requests.status == 0 && report["kind"] == "request" && report["service"] == "echo")
        #expect(report["requests"] == 300 && report["succeeded"] == 300 && report["failed"] == 0)
        #expect(report["clientRates"]?.arrayValue?.count == 2 && (report["rate"]?.doubleValue ?? 0) > 0)
        let latency = try #require(report["latencyMicroseconds"])
        let (p50, p99, max) = (latency["p50"]?.doubleValue ?? 0, latency["p99"]?.doubleValue ?? 0, latency["max"]?.doubleValue ?? 0)
        #expect(p50 > 0 && p50 <= p99 && p99 <= max)
        let rows = try String(contentsOfFile: csv, encoding: .utf8).split(separator: "\n")
        #expect(rows.first == "client,sent_us,latency_us,ok" && rows.count == 301 && rows.dropFirst().allSatisfy { $0.hasSuffix(",true") })
        // The CSV is written through the path given, as a shell's `>` would: a link stays a
        // link (as a device stays a device: `--csv /dev/null` must not become a file).
        let link = folder.appendingPathComponent("link.csv").path
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: csv)
        let throughLink = try await bus.sb("bench", "--count", "10", "--warmup", "0", "--csv", link)
        #expect(throughLink.status == 0 && (try? FileManager.default.destinationOfSymbolicLink(atPath: link)) == csv, "\(throughLink)")
        #expect(try String(contentsOfFile: csv, encoding: .utf8).split(separator: "\n").count == 11)

        // Timed instead of counted; a service's errors counted by kind, and exit status 1.
        let timed = try await bus.sb("bench", "--duration", "300ms", "--warmup", "0", "--json")
        let timedReport = try jsonLines(timed.stdout).first
        #expect(timed.status == 0 && (timedReport?["requests"]?.intValue ?? 0) > 0 && (timedReport?["seconds"]?.doubleValue ?? 0) >= 0.3)
        let failing = try await bus.sb("bench", "request", "echo", "fail", #"{"code":-32050,"message":"no"}"#, "--count", "20", "--warmup", "0", "--json")
        let failures = try jsonLines(failing.stdout).first
        #expect(failing.status == 1 && failures?["failed"] == 20 && failures?["failures"] == ["-32050 no": 20])
        #expect(failing.stderr.contains("20 of 20 requests failed"))
        let nobody = try await bus.sb("bench", "request", "ghost", "x")
        #expect(nobody.status == 69 && nobody.stderr.contains("no worker offers 'ghost'"))
        let both = try await bus.sb("bench", "--count", "5", "--duration", "1s")
        #expect(both.status == 64 && both.stderr.contains("--count or --duration"))
        let unwritable = try await bus.sb("bench", "--csv", folder.appendingPathComponent("none/latencies.csv").path)
        #expect(unwritable.status == 64 && unwritable.stderr.contains("--csv: cannot write"))

        let published = try await bus.sb("bench", "publish", "--subscribers", "2", "--count", "500", "--keys", "20", "--json")
        let pubsub = try #require(try jsonLines(published.stdout).first, "\(published)")
        #expect(published.status == 0 && pubsub["published"] == 500 && pubsub["refused"] == 0)
        #expect(pubsub["received"] == [500, 500] && pubsub["gaps"] == 0 && pubsub["lost"] == 0)
        #expect((pubsub["deliveryMicroseconds"]?["p50"]?.doubleValue ?? 0) > 0)
        let left = try await bus.base.client.call(KernelAPI.stateGet, .init(prefix: "/client/bench/"))
        #expect(left.entries.isEmpty)
        let noKernel = try await bus.sb("bench", "publish", "--endpoint", "tcp://127.0.0.1:\(freePort())", "--timeout", "300ms")
        #expect(noKernel.status == 69 && noKernel.stderr.contains("no kernel answers"))
        await bus.stop()
    }

    @Test("app verbs: countries, deals, places (its history cleared too), items, news, flights, datasets, as tables and as JSON")
    func appVerbs() async throws {
        let bus = try await SBBus.start()
        let countries = try await bus.sb("countries", "par")
        let rows = countries.stdout.split(separator: "\n")
        #expect(countries.status == 0 && rows.first?.hasPrefix("NAME") == true && rows.dropFirst().first?.hasPrefix("Paraguay") == true)
        let countriesJSON = try jsonLines(try await bus.sb("countries", "--region", "EU", "--json").stdout).first
        #expect(countriesJSON?["countries"]?.arrayValue?.allSatisfy { $0["region"] == "EU" } == true)
        let deal = try await bus.sb("countries", "deal", "--seed", "9", "--json")
        #expect(deal.stdout == (try await bus.sb("countries", "deal", "--seed", "9", "--json")).stdout)
        #expect(try jsonLines(deal.stdout).first?["today"]?["title"] == "Deal of the Day!")
        #expect(try await bus.sb("countries", "deal").stdout.contains("Rollback Deal"))

        let open = try await bus.sb("places", "open", "12.9716, 77.5946")
        #expect(open.status == 0 && open.stdout.contains("wikipedia://places?latitude=12.9716&longitude=77.5946") && open.stdout.contains("Mumbai"))
        let history = try await bus.sb("places", "history", "--json")
        #expect(try jsonLines(history.stdout).first?["entries"]?.arrayValue?.first?["text"] == "12.9716, 77.5946")
        let cleared = try await bus.sb("places", "history", "--clear")
        #expect(cleared.status == 0 && cleared.stdout == "cleared the history of 1 place\n", "\(cleared)")
        #expect(try jsonLines(try await bus.sb("places", "history", "--json").stdout).first?["entries"]?.arrayValue?.isEmpty == true)
        #expect(try await bus.sb("places", "open", "91, 0").status == 1)
        // South and west are negative: coordinates as typed, quoted or not, with or without
        // the `--` other verbs need before a value beginning with '-'.
        for words in [["-33.86, 151.21"], ["-33.86,", "151.21"], ["--", "-33.86, 151.21"], ["--json", "-33.86,", "151.21"]] {
            let south = try await bus.sb(["places", "open"] + words)
            #expect(south.status == 0 && south.stdout.contains("latitude=-33.86&longitude=151.21"), "\(words): \(south)")
            let near = try await bus.sb(["places"] + words)
            #expect(near.status == 0 && near.stdout.contains("Mumbai"), "\(words): \(near)")
        }
        let afterTerminator = try await bus.sb("places", "open", "--json", "--", "-33.86,", "--151.21")
        #expect(afterTerminator.status == 1 && afterTerminator.stderr.contains("longitude '--151.21' is not a number"), "after --, text as it is: \(afterTerminator)")
        for (words, message) in [(["Amsterdam", "--lanch"], "Unknown option '--lanch'"), ([], "Missing expected argument '<query>'")] {
            let refused = try await bus.sb(["places", "open"] + words)
            #expect(refused.status == 64 && refused.stderr.contains(message) && refused.stderr.contains("Usage: sb places open"), "\(words): \(refused)")
        }
        #expect(try await bus.sb("places").stdout.contains("40.4380638, -3.7495758"))

        let items = try await bus.sb("items", "--natural", "--list", "1")
        #expect(items.stdout.hasPrefix("List 1 (81 items)\n  Item 0"))
        #expect(items.stdout.hasSuffix("81 items in list 1; 160 without a name left out\n"))
        let noList = try await bus.sb("items", "--list", "999")
        #expect(noList.status == 0 && noList.stderr.contains("no list 999 in the hiring list (its lists: 1, 2, 3, 4)"), "\(noList)")

        #expect(try await bus.sb("news", "headlines").stdout.contains("no news sources are selected"))
        // An id that is no source is refused, and nothing is selected; one asked for headlines is said.
        let noSource = try await bus.sb("news", "sources", "--select", "bbc-news", "bbc-nwes")
        #expect(noSource.status == 1 && noSource.stdout.isEmpty
                 && noSource.stderr.contains("no news source 'bbc-nwes' (sb news sources --language all lists them); the selection is unchanged"), "\(noSource)")
        #expect(try await bus.sb("news", "headlines").stdout.contains("no news sources are selected"))
        let fromNoSource = try await bus.sb("news", "headlines", "--source", "bbc-nwes")
        #expect(fromNoSource.status == 0 && fromNoSource.stderr.contains("no news source 'bbc-nwes'"), "\(fromNoSource)")
        let sources = try await bus.sb("news", "sources", "--select", "bbc-news", "reuters")
        #expect(sources.stdout.split(separator: "\n").filter { $0.hasPrefix("*") }.count == 2)
        let headlines = try jsonLines(try await bus.sb("news", "headlines", "--page-size", "3", "--json").stdout).first
        #expect(headlines?["status"] == "ok" && headlines?["articles"]?.arrayValue?.count == 3 && headlines?["hasMore"] == true)
        let url = try #require(headlines?["articles"]?.arrayValue?.first?["url"]?.stringValue)
        #expect(try await bus.sb("news", "save", url).status == 0)
        let saved = try jsonLines(try await bus.sb("news", "saved", "--json").stdout).first
        #expect(saved?["articles"]?.arrayValue?.first?["article"]?["title"] == headlines?["articles"]?.arrayValue?.first?["title"])
        #expect(try await bus.sb("news", "delete", url).stdout.hasPrefix("deleted"))

        let inbound = try await bus.sb("flights", "--inbound")
        #expect(inbound.stdout.split(separator: "\n").count == 6 && inbound.stdout.contains("50.00 EUR"))
        let selected = try await bus.sb("flights", "route", "--select", "3", "14")
        #expect(selected.status == 0 && selected.stdout.hasPrefix("Current route (priced)  55.00 EUR"))
        // Each published price of the route is kept (captured from the state) and listed.
        _ = try await bus.base.client.call(StreamsAPI.consumerAdd, .init(stream: PricingAPI.routeHistoryStream, name: "test", deliver: .all))
        // Each message by its sequence in the stream (one handed out again counts once).
        var prices: [String] = [], captured: [Int: JSONValue] = [:]
        func capture(until done: () -> Bool) async throws {
            while !done() {
                let fetched = try await bus.base.client.call(StreamsAPI.fetch, .init(stream: PricingAPI.routeHistoryStream, consumer: "test", batch: 10, wait: 15),
                                                             timeout: .seconds(30))
                try #require(!fetched.messages.isEmpty, "the route's prices so far: \(prices)")
                for message in fetched.messages { captured[message.sequence] = message.data }
                prices += fetched.messages.compactMap { $0.data["value"]?["total"]?["amount"]?.stringValue }
            }
        }
        try await capture { prices.contains("55.00") }
        let priceHistory = try await bus.sb("flights", "history")
        #expect(priceHistory.status == 0 && priceHistory.stdout.hasPrefix("PRICED")
                 && priceHistory.stdout.split(separator: "\n").last?.contains("55.00 EUR") == true, "\(priceHistory.stdout)")
        // The route lost with the kernel's state and published again unchanged, as after a
        // restart of a kernel without its state: the same prices, none twice, no empty line.
        let republisher = StatePublisher(client: bus.base.client), before = captured.count
        let last = try #require(captured.max { $0.key < $1.key }?.value["value"])
        try await republisher.set(PricingAPI.StateKeys.routeCurrent, nil)
        try await republisher.set(PricingAPI.StateKeys.routeCurrent, last)
        try await capture { captured.count >= before + 2 }
        #expect(try await bus.sb("flights", "history").stdout == priceHistory.stdout)
        // Priced anew by a restarted pricing, which no longer knows the total before: the same
        // price, listed once; a new price then says the total listed before it.
        var repriced = try last.decode(as: PricingAPI.CurrentRoute.self)
        (repriced.pricedAt, repriced.previousTotal) = ("2030-01-01T00:00:00.000Z", nil)
        try await republisher.set(PricingAPI.StateKeys.routeCurrent, try JSONValue(encoding: repriced))
        try await capture { captured.count >= before + 3 }
        #expect(try await bus.sb("flights", "history").stdout == priceHistory.stdout)
        (repriced.pricedAt, repriced.status, repriced.total) = ("2030-01-01T00:00:01.000Z", "unavailable", nil)
        try await republisher.set(PricingAPI.StateKeys.routeCurrent, try JSONValue(encoding: repriced))
        try await capture { captured.count >= before + 4 }
        let unavailable = try await bus.sb("flights", "history").stdout.split(separator: "\n").last ?? ""
        // PRICED, STATUS, ROUTE ..., TOTAL "-", BEFORE "55.00 EUR".
        let fields = unavailable.split(separator: " ")
        #expect(fields.first == "2030-01-01T00:00:01.000Z" && fields.dropFirst().first == "unavailable" && fields.suffix(3) == ["-", "55.00", "EUR"], "\(unavailable)")
        try await republisher.set(PricingAPI.StateKeys.routeCurrent, last)
        let read = try await bus.sb("stream", "read", PricingAPI.routeHistoryStream, "--last", "1")
        #expect(read.status == 0 && read.stdout.contains("/pricing/route/current"), "\(read.stdout)")
        let unrelated = try await bus.sb("flights", "route", "--select", "1", "13")
        #expect(unrelated.status == 1 && unrelated.stderr.contains("-32004"))
        #expect(try await bus.sb("flights", "route").stdout.contains("55.00 EUR"))
        let cheapest = try await bus.sb("flights", "cheapest").stdout
        #expect(cheapest.contains("Cheapest round trip  45.00 EUR"))
        #expect(cheapest.contains("Cheapest outbound and its cheapest return  45.00 EUR"), "the total is the pair's: \(cheapest)")

        let datasets = try jsonLines(try await bus.sb("datasets", "--json").stdout).first?.arrayValue
        #expect(datasets?.count == 7 && datasets?.allSatisfy { $0["origin"] == "remote" } == true)
        let refreshed = try await bus.sb("datasets", "refresh", "flights")
        #expect(refreshed.status == 0 && refreshed.stdout.contains("flights") && refreshed.stderr.isEmpty)
        // A word that names no verb of a verb that lists by default is refused naming the
        // verbs, with the verb's usage, not its default's.
        for (words, said) in [(["flights", "quote", "3", "14"], "sb flights has no verb 'quote'; its verbs: list, route, history, cheapest\nUsage: sb flights <subcommand>"),
                              (["datasets", "lst"], "sb datasets has no verb 'lst'; its verbs: list, refresh\nUsage: sb datasets <subcommand>"),
                              (["stream", "frob"], "sb stream has no verb 'frob'; its verbs: ls, info, add, edit, rm, purge, pub, read, consumer, fetch, sub, ack, nak, progress, term\nUsage: sb stream <subcommand>")] {
            let refused = try await bus.sb(words)
            #expect(refused.status == 64 && refused.stderr.hasPrefix("Error: " + said), "\(refused)")
        }
        await bus.stop()
    }

    @Test("sb kv ls stops with exit status 1 when a kernel's next page would not start past the last one (it would list it for ever)")
    func kvListCursorMovesOn() async throws {
        let endpoint = "tcp://127.0.0.1:\(freePort())"
        let context = try ZMQContext()
        let standIn = try await kernelStandIn(at: endpoint, in: context)
        let folder = try temporaryDirectory("sb-no-keys")
        let listing = Task {
            try await runCommand(sbExecutable(), ["kv", "ls", "/client/", "--endpoint", endpoint, "--key-dir", folder.path, "--timeout", "10s"],
                                 environment: ["NO_COLOR": ""])
        }
        // A stand-in kernel whose pages of state.get are all the same: one key, and "next"
        // that key again. sb asks for two and stops (one that went on would wait for the
        // third page's answer and time out).
        var pages = 0
        while pages < 2 {
            let message = try await standIn.receiveOffPool()
            guard case .request(let client, let service, let body, _) = try MDP.decodeAtBroker(message), let request = body.last else { continue }
            let id = try JSONValue(parsing: request.bytes)["id"] ?? .null
            let page: JSONValue = ["sequence": 1, "entries": [["key": "/client/a", "sequence": 1, "value": 1]], "next": "/client/a"]
            let reply: JSONValue = ["jsonrpc": "2.0", "id": id, "result": page]
            try standIn.send(MDP.reply(to: client, service: service, body: [Frame(reply.jsonBytes)]))
            pages += 1
        }
        let listed = try await listing.value
        standIn.close()
        #expect(listed.status == 1 && listed.stderr.contains("the page cursor did not move on (this page came after /client/a, the next would come after /client/a)"), "\(listed)")
        #expect(listed.stdout == "/client/a\n")
        try? FileManager.default.removeItem(at: folder)
    }

    @Test("output that cannot be written (a full disk, a closed stdout, a reader gone while SIGPIPE is ignored) is exit status 74 with the reason, for sb and switchboard alike; a closed stdout is never a socket's")
    func unwritableOutput() async throws {
        try await stopping(try await TestKernel.start(), with: { await $0.stop() }) { kernel in
            // $1 is sb, $2 switchboard; each script ends with the status of its first command.
            func shell(_ script: String) async throws -> CommandResult {
                try await runCommand(URL(fileURLWithPath: "/bin/bash"), ["-c", script + #"; echo "status ${PIPESTATUS[0]}""#, "bash",
                                                                         sbExecutable().path, switchboardExecutable().path],
                                     environment: ["SB_ENDPOINT": kernel.endpoints.broker, "NO_COLOR": ""])
            }
            for (script, program, reason) in [(#""$1" ping > /dev/full"#, "sb", "No space left on device"),
                                               (#""$1" --help > /dev/full"#, "sb", "No space left on device"),
                                               // Given /dev/null read-only at start: not the first socket sb opens.
                                               (#""$1" ping >&-"#, "sb", "Bad file descriptor"),
                                               // The follower learns its reader left without writing (nothing
                                               // under the prefix), and SIGPIPE cannot end it.
                                               (#"trap '' PIPE; "$1" sub /nothing/ | true"#, "sb", "Broken pipe"),
                                               (#""$2" keygen > /dev/full"#, "switchboard", "No space left on device"),
                                               (#""$2" check >&-"#, "switchboard", "Bad file descriptor")] {
                let result = try await shell(script)
                #expect(result.stdout == "status 74\n" && result.stderr == "\(program): cannot write to standard output: \(reason)\n", "\(script): \(result)")
            }
            // Nowhere to say a problem (stderr closed or full): the exit status still tells it.
            for (script, status) in [(#""$2" check --config /nonexistent 2>&-"#, 78), (#""$1" kv get /client/absent 2>/dev/full"#, 1)] {
                let result = try await shell(script)
                #expect(result.stdout == "status \(status)\n" && result.stderr.isEmpty, "\(script): \(result)")
            }
        }
    }

    @Test("colour only on a terminal and never with NO_COLOR; no escape codes in pipes")
    func colour() async throws {
        let bus = try await SBBus.start()
        let piped = try await bus.sb("services")
        #expect(!piped.stdout.contains("\u{1B}") && !piped.stderr.contains("\u{1B}"))
        // A terminal, through script(1): colour; with NO_COLOR set: none.
        func onTerminal(_ noColor: String) async throws -> String {
            let command = "\(sbExecutable().path) services"
            return try await runCommand(URL(fileURLWithPath: "/usr/bin/script"), ["-q", "-e", "-c", command, "/dev/null"],
                                        environment: bus.environment.merging(["NO_COLOR": noColor]) { $1 }).stdout
        }
        #expect(try await onTerminal("").contains("\u{1B}["))
        #expect(try await !onTerminal("1").contains("\u{1B}["))
        await bus.stop()
    }

    @Test("--help has examples for each verb")
    func help() async throws {
        for verb in [["request"], ["subscribe"], ["publish"], ["kv"], ["run"], ["stream"], ["stream", "pub"], ["countries", "deal"], ["places", "open"], ["items"],
                     ["news", "headlines"], ["flights", "route"], ["datasets", "refresh"]] {
            let help = try await runCommand(sbExecutable(), verb + ["--help"])
            #expect(help.status == 0 && help.stdout.contains("Example"), "\(verb)")
        }
        let completion = try await runCommand(sbExecutable(), ["--generate-completion-script", "bash"])
        #expect(completion.status == 0 && completion.stdout.contains("_sb"))
    }
}
