import BusKit
import BusProtocol
import Contracts
import Foundation
import Kernel
import Logging
import Storage
import StoreService
import SwitchboardTestSupport
import Testing

/// The store's backends the suite runs against: SQLite always, PostgreSQL where its server
/// is installed (the test command's bootstrap installs it).
enum Backend: String, CaseIterable, CustomTestStringConvertible {
    case sqlite, postgres
    static var available: [Backend] { TestPostgres.available ? allCases : [.sqlite] }
    var testDescription: String { rawValue }
}

/// A kernel, a store hosted in this process on a database in a temporary folder (or on a
/// PostgreSQL server the test started), and a client.
struct StoreBus {
    let kernel: TestKernel
    let store: StoreService
    let host: ServiceHost<StoreService>
    let work: Working
    let client: BusClient
    let publisherClient: BusClient
    let folder: URL
    let backend: Backend
    /// The PostgreSQL server of a `.postgres` bus (stopped with the kernel).
    let postgres: TestPostgres?

    var databasePath: String { store.configuration.path }

    static func start(folder: URL? = nil, kernel: TestKernel? = nil, historyLimit: Int = 100, maxSizeBytes: Int? = nil,
                      connections: Int = 4, backend: Backend = .sqlite, postgres: TestPostgres? = nil, logger: Logger? = nil,
                      configure: (inout StoreConfiguration) -> Void = { _ in }) async throws -> StoreBus {
        let kernel = if let kernel { kernel } else { try await TestKernel.start(fixedPorts: true, fastHeartbeats) }
        let folder = try folder ?? temporaryDirectory("store")
        var server = postgres
        if backend == .postgres, server == nil { server = try await TestPostgres.start() }
        let postgres = backend == .postgres ? server : nil
        var configuration = StoreConfiguration(path: folder.appendingPathComponent("db/store.sqlite").path,
                                               historyLimit: historyLimit, maxSizeBytes: maxSizeBytes,
                                               postgres: postgres.map { PostgresSettings(url: $0.url(), tls: .disable) })
        configure(&configuration)
        let publisherClient = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(2))
        let publisher = StatePublisher(client: publisherClient)
        let store = StoreService(configuration: configuration, logger: logger, publisher: publisher)
        let options = ServiceHost<StoreService>.Options(brokers: [kernel.endpoints.broker], connections: connections,
                                                        heartbeatInterval: kernel.configuration.heartbeatInterval,
                                                        heartbeatLiveness: kernel.configuration.heartbeatLiveness)
        let host = try ServiceHost(service: store, options: options, onReregistered: { await store.republish() })
        // The work keeps the database's connections: it runs before the store can be ready.
        let work = Working(store)
        await work.start()
        await store.waitUntilReady()
        try await host.start()
        let client = try await BusClient(brokers: [kernel.endpoints.broker], timeout: .seconds(5))
        try await kernel.workers("store")
        return StoreBus(kernel: kernel, store: store, host: host, work: work, client: client, publisherClient: publisherClient, folder: folder,
                        backend: backend, postgres: postgres)
    }

    func call(_ method: String, _ params: JSONValue? = nil) async throws(BusError) -> JSONValue {
        try await client.request(service: "store", method: method, params: params)
    }

    /// The JSON-RPC error a call fails with.
    func failure(_ method: String, _ params: JSONValue? = nil) async -> JSONRPCError? {
        do {
            _ = try await call(method, params)
            return nil
        } catch {
            if case .remote(_, let rpc) = error { return rpc }
            Issue.record("expected a JSON-RPC error, got \(error)")
            return nil
        }
    }

    /// Stops the store and the clients; the kernel (and the PostgreSQL server) too unless
    /// `keepKernel` (a restart of the store follows).
    func stop(keepKernel: Bool = false) async {
        await host.stop()
        await work.stop()
        await client.close()
        await publisherClient.close()
        if !keepKernel {
            await kernel.stop()
            postgres?.stop()
        }
    }

    /// Runs `body` on a new bus, and stops it however `body` ends: a failed test leaves no
    /// store registering with a kernel that is gone.
    static func with(historyLimit: Int = 100, maxSizeBytes: Int? = nil, backend: Backend = .sqlite,
                     _ body: (StoreBus) async throws -> Void) async throws {
        try await stopping(try await start(historyLimit: historyLimit, maxSizeBytes: maxSizeBytes, backend: backend),
                           with: { await $0.stop() }, body)
    }

    /// Another store on the same database and kernel (a restart, or a second worker process).
    func another(historyLimit: Int = 100) async throws -> StoreBus {
        try await StoreBus.start(folder: folder, kernel: kernel, historyLimit: historyLimit, backend: backend, postgres: postgres)
    }
}

func texts(_ history: JSONValue) -> [String] {
    history["entries"]?.arrayValue?.compactMap { $0["text"]?.stringValue } ?? []
}

func article(_ url: String, title: String = "A title") -> JSONValue {
    ["article": ["url": .string(url), "title": .string(title), "source": ["id": nil, "name": "Example"]]]
}

@Suite("store: every method through a live kernel")
struct StoreMethodTests {
    @Test("history: most recent first, re-adding moves to the top, trimmed, bounded, cleared", arguments: Backend.available)
    func history(backend: Backend) async throws {
        try await StoreBus.with(historyLimit: 3, backend: backend) { bus async throws in
            _ = try await bus.call("history.add", ["text": "  Amsterdam \n"])
            _ = try await bus.call("history.add", ["text": "Paris"])
            _ = try await bus.call("history.add", ["text": "Mumbai"])
            #expect(texts(try await bus.call("history.list")) == ["Mumbai", "Paris", "Amsterdam"])
            // Re-adding moves it up rather than duplicating it.
            let added = try await bus.call("history.add", ["text": "Amsterdam"])
            #expect(added["text"] == "Amsterdam" && added["count"] == 3)
            #expect(texts(try await bus.call("history.list")) == ["Amsterdam", "Mumbai", "Paris"])
            // Bounded: the oldest goes.
            _ = try await bus.call("history.add", ["text": "12.9716, 77.5946"])
            #expect(texts(try await bus.call("history.list")) == ["12.9716, 77.5946", "Amsterdam", "Mumbai"])
            #expect(texts(try await bus.call("history.list", ["limit": 2])) == ["12.9716, 77.5946", "Amsterdam"])
            // Bad input.
            for bad: JSONValue in [["text": "   "], ["text": ""], ["text": .string(String(repeating: "x", count: 1_001))]] {
                let error = await bus.failure("history.add", bad)
                #expect(error?.code == -32602 && error?.data?["field"] == "text")
            }
            #expect(await bus.failure("history.add", ["text": 5])?.data?["field"] == "text")
            #expect(await bus.failure("history.list", ["limit": 0])?.data?["field"] == "limit")
            // Cleared, and clearing again is harmless (idempotent).
            #expect(try await bus.call("history.clear")["cleared"] == 3)
            #expect(try await bus.call("history.clear")["cleared"] == 0)
            #expect(texts(try await bus.call("history.list")).isEmpty)
        }
    }

    @Test("articles: keyed by URL, most recently saved first, deleting a missing one says so", arguments: Backend.available)
    func articles(backend: Backend) async throws {
        try await StoreBus.with(backend: backend) { bus async throws in
            let first = try await bus.call("articles.save", article("https://example.com/a", title: "First"))
            _ = try await bus.call("articles.save", article("https://example.com/b", title: "Second"))
            // Saving again keeps one copy, refreshed and moved to the top.
            let again = try await bus.call("articles.save", article("https://example.com/a", title: "First, updated"))
            #expect(again["id"] == first["id"])
            let list = try await bus.call("articles.list")
            #expect(list["total"] == 2)
            let saved = list["articles"]?.arrayValue ?? []
            #expect(saved.map { $0["url"]?.stringValue } == ["https://example.com/a", "https://example.com/b"])
            #expect(saved.first?["article"]?["title"] == "First, updated")
            #expect(saved.first?["id"]?.stringValue == ArticleID.of("https://example.com/a"))
            // Paging.
            let page = try await bus.call("articles.list", ["offset": 1, "limit": 1])
            #expect(page["articles"]?.arrayValue?.map { $0["url"]?.stringValue } == ["https://example.com/b"])
            // Delete, then delete again: the second says nothing was there, without failing.
            #expect(try await bus.call("articles.delete", ["url": "https://example.com/b"])["deleted"] == true)
            let missing = try await bus.call("articles.delete", ["url": "https://example.com/b"])
            #expect(missing["deleted"] == false && missing["message"] != nil)
            #expect(try await bus.call("articles.list")["total"] == 1)
            // Bad input.
            #expect(await bus.failure("articles.save", ["article": "https://example.com"])?.data?["field"] == "article")
            #expect(await bus.failure("articles.save", ["article": ["title": "no url"]])?.data?["field"] == "article.url")
            #expect(await bus.failure("articles.save", ["article": ["url": "ftp://x/y"]])?.data?["field"] == "article.url")
            let huge = ["article": ["url": "https://example.com/huge", "content": .string(String(repeating: "x", count: 300_000))]] as JSONValue
            #expect(await bus.failure("articles.save", huge)?.code == -32010)
            #expect(await bus.failure("articles.delete", [:])?.data?["field"] == "url")
        }
    }

    @Test("selections: sources (deduplicated, in order) and the route; nothing selected yet", arguments: Backend.available)
    func selections(backend: Backend) async throws {
        try await StoreBus.with(backend: backend) { bus async throws in
            #expect(try await bus.call("sources.selected")["ids"] == [])
            #expect(try await bus.call("route.selected") == .null)
            let selected = try await bus.call("sources.select", ["ids": ["bbc-news", "cnn", "bbc-news"]])
            #expect(selected["ids"] == ["bbc-news", "cnn"] && selected["selectedAt"]?.stringValue != nil)
            #expect(try await bus.call("sources.selected")["ids"] == ["bbc-news", "cnn"])
            _ = try await bus.call("sources.select", ["ids": []])
            #expect(try await bus.call("sources.selected")["ids"] == [])
            #expect(await bus.failure("sources.select", ["ids": ["ok", " "]])?.data?["field"] == "ids[1]")
            #expect(await bus.failure("sources.select", ["ids": "cnn"])?.data?["field"] == "ids")

            let route = try await bus.call("route.select", ["outboundId": 1, "inboundId": 3])
            #expect(route["outboundId"] == 1 && route["inboundId"] == 3)
            _ = try await bus.call("route.select", ["outboundId": 5])
            let stored = try await bus.call("route.selected")
            // An optional field without a value is absent from a result (its contract type's rule).
            #expect(stored["outboundId"] == 5 && stored["inboundId"] == nil)
            #expect(await bus.failure("route.select", ["inboundId": 2])?.data?["field"] == "outboundId")
            #expect(await bus.failure("route.select", ["outboundId": -1])?.data?["field"] == "outboundId")
        }
    }

    @Test("selections by compare-and-set: of two choosers at one revision exactly one wins, the other gets -32004 with the winner; nothing is overwritten in silence", arguments: Backend.available)
    func selectionRaces(backend: Backend) async throws {
        try await StoreBus.with(backend: backend) { bus async throws in
            #expect(try await bus.call("sources.selected")["revision"] == 0)
            for (method, choices) in [("route.select", [["outboundId": 1, "inboundId": 3], ["outboundId": 2, "inboundId": 4]] as [JSONValue]),
                                      ("sources.select", [["ids": ["cnn"]], ["ids": ["reuters", "bbc-news"]]])] {
                var revision: Int64 = 0
                for round in 0..<10 {
                    var asked: [JSONValue] = []
                    for choice in choices {
                        guard case .object(var fields) = choice else { continue }
                        fields["revision"] = .int(revision)
                        asked.append(.object(fields))
                    }
                    let (one, other) = (asked[0], asked[1])
                    async let first = bus.failure(method, one)
                    async let second = bus.failure(method, other)
                    let refusals = await [first, second]
                    let lost = refusals.compactMap { $0 }
                    #expect(lost.count == 1 && lost.first?.code == -32004, "\(method) round \(round): \(refusals)")
                    // The loser is told what won: the other choice, at the next revision.
                    let winner = refusals[0] == nil ? choices[0] : choices[1]
                    let current = lost.first?.data?["current"]
                    #expect(current?["revision"] == .int(revision + 1) && lost.first?.data?["revision"] == .int(revision + 1), "\(lost)")
                    #expect(current?["ids"] == winner["ids"] && current?["outboundId"] == winner["outboundId"], "\(method): \(current ?? .null)")
                    revision += 1
                }
                // A write without a revision replaces whatever is there.
                #expect(try await bus.call(method, choices[0])["revision"] == .int(revision + 1))
            }
            #expect(try await bus.call("route.selected")["revision"] == 11)
        }
    }

    @Test("snapshots: multi-megabyte bodies, a late put never replaces a newer copy, a missing one is null", arguments: Backend.available)
    func snapshots(backend: Backend) async throws {
        try await StoreBus.with(backend: backend) { bus async throws in
            let body = "[" + (0..<200_000).map { "{\"id\":\($0),\"name\":\"Item \($0)\"}" }.joined(separator: ",") + "]"
            #expect(body.utf8.count > 5_000_000)
            let put = try await bus.call("snapshots.put", ["name": "items", "body": .string(body), "version": "v2",
                                                           "origin": "remote", "fetchedAt": "2026-11-21T10:00:00Z"])
            #expect(put["stored"] == true)
            // A retried put of an older copy (fetched earlier) does not replace it.
            let late = try await bus.call("snapshots.put", ["name": "items", "body": "[]", "version": "v1",
                                                            "origin": "remote", "fetchedAt": "2026-11-21T09:00:00.000Z"])
            #expect(late["stored"] == false && late["version"] == "v2")
            let got = try await bus.call("snapshots.get", ["name": "items"])
            #expect(got["version"] == "v2" && got["origin"] == "remote" && got["fetchedAt"] == "2026-11-21T10:00:00.000Z")
            #expect(got["body"]?.stringValue == body)
            let list = try await bus.call("snapshots.list")
            #expect(list.arrayValue?.first?["name"] == "items" && list.arrayValue?.first?["size"] == .int(Int64(body.utf8.count)))

            #expect(try await bus.call("snapshots.get", ["name": "flights"]) == .null, "no copy kept is no error")
            #expect(await bus.failure("snapshots.put", ["name": "Bad Name", "body": "", "version": "v", "origin": "remote",
                                                        "fetchedAt": "2026-11-21T10:00:00Z"])?.data?["field"] == "name")
            #expect(await bus.failure("snapshots.put", ["name": "items", "body": "", "version": "v", "origin": "somewhere",
                                                        "fetchedAt": "2026-11-21T10:00:00Z"])?.data?["field"] == "origin")
            #expect(await bus.failure("snapshots.put", ["name": "items", "body": "", "version": "v", "origin": "remote",
                                                        "fetchedAt": "yesterday"])?.data?["field"] == "fetchedAt")
        }
    }

    @Test("every write is idempotent: the same request twice has the effect of one", arguments: Backend.available)
    func idempotent(backend: Backend) async throws {
        try await StoreBus.with(backend: backend) { bus async throws in
            for _ in 0..<2 {
                _ = try await bus.call("history.add", ["text": "Paris"])
                _ = try await bus.call("articles.save", article("https://example.com/a"))
                _ = try await bus.call("sources.select", ["ids": ["cnn"]])
                _ = try await bus.call("route.select", ["outboundId": 1, "inboundId": 3])
                _ = try await bus.call("articles.delete", ["url": "https://example.com/gone"])
            }
            #expect(texts(try await bus.call("history.list")) == ["Paris"])
            #expect(try await bus.call("articles.list")["total"] == 1)
            #expect(try await bus.call("sources.selected")["ids"] == ["cnn"])
            #expect(try await bus.call("route.selected")["outboundId"] == 1)
        }
    }
}

extension StoreMethodTests {
    /// Sends `method` as client `client`'s request `id`, as a client re-sending it would.
    private func send(_ bus: StoreBus, _ method: String, _ params: JSONValue, id: Int64, client: String = "re-sender") async throws -> JSONValue {
        let body = JSONRPCRequest(id: .number(id), method: method, params: params, client: client).jsonBytes
        let reply = try await bus.client.call(service: "store", body: [Frame(body)])
        return try #require(try JSONRPC.parseResponses(reply[0].bytes).first).outcome.get()
    }

    @Test("a write sent again is answered with its first result and written once, also after the store restarts", arguments: Backend.available)
    func writtenOnce(backend: Backend) async throws {
        let bus = try await StoreBus.start(backend: backend)
        let saved = try await send(bus, "articles.save", article("https://example.com/once"), id: 1)
        #expect(saved["created"] == true)
        #expect(try await send(bus, "articles.save", article("https://example.com/once"), id: 1) == saved)
        // A new request saving it again is a second save.
        #expect(try await send(bus, "articles.save", article("https://example.com/once"), id: 2)["created"] == false)
        _ = try await send(bus, "history.add", ["text": "Paris"], id: 3)
        _ = try await send(bus, "history.add", ["text": "Rome"], id: 4)
        _ = try await send(bus, "history.add", ["text": "Paris"], id: 3)  // run again, Paris would move to the top
        #expect(texts(try await bus.call("history.list")) == ["Rome", "Paris"])
        await bus.stop(keepKernel: true)

        let again = try await bus.another()
        #expect(try await send(again, "articles.save", article("https://example.com/once"), id: 1) == saved)
        #expect(try await send(again, "history.add", ["text": "Paris"], id: 3)["count"] == 1)
        #expect(texts(try await again.call("history.list")) == ["Rome", "Paris"])
        await again.stop()
    }
}

@Suite("store: durability, publication and failures")
struct StoreDurabilityTests {
    @Test("everything is still there after the store restarts", arguments: Backend.available)
    func restart(backend: Backend) async throws {
        let first = try await StoreBus.start(backend: backend)
        _ = try await first.call("history.add", ["text": "Paris"])
        _ = try await first.call("history.add", ["text": "Rome"])
        _ = try await first.call("articles.save", article("https://example.com/a"))
        _ = try await first.call("sources.select", ["ids": ["cnn", "bbc-news"]])
        _ = try await first.call("route.select", ["outboundId": 2, "inboundId": 4])
        _ = try await first.call("snapshots.put", ["name": "flights", "body": "{}", "version": "x", "origin": "remote",
                                                   "fetchedAt": "2026-11-21T10:00:00Z"])
        await first.stop(keepKernel: true)

        let second = try await first.another()
        #expect(texts(try await second.call("history.list")) == ["Rome", "Paris"])
        #expect(try await second.call("articles.list")["total"] == 1)
        #expect(try await second.call("sources.selected")["ids"] == ["cnn", "bbc-news"])
        #expect(try await second.call("route.selected")["inboundId"] == 4)
        #expect(try await second.call("snapshots.get", ["name": "flights"])["version"] == "x")
        await second.stop()
    }

    @Test("each change is published on its CHP key; a delete publishes an empty value; a kernel restart republishes every key, more than a batch holds", arguments: Backend.available)
    func publication(backend: Backend) async throws {
        var bus = try await StoreBus.start(backend: backend)
        let subscription = try await Subscription.open(snapshot: bus.kernel.endpoints.snapshot, publisher: bus.kernel.endpoints.publisher,
                                                       prefixes: ["/store/"], silenceTimeout: .seconds(2))
        let saved = try await bus.call("articles.save", article("https://example.com/a"))
        let key = "/store/articles/\(saved["id"]?.stringValue ?? "?")"
        _ = try await bus.call("history.add", ["text": "Paris"])
        _ = try await bus.call("sources.select", ["ids": ["cnn"]])
        _ = try await bus.call("articles.delete", ["url": "https://example.com/a"])

        // Collect until the article's deletion and the other keys have been seen.
        let seen = try await within(10, "store updates") { () -> [String: JSONValue?] in
            var seen: [String: JSONValue?] = [:]
            while let event = try await subscription.next() {
                guard let update = event.update else { continue }
                seen[update.key] = update.json
                if seen[key] != nil, seen[key]! == nil, seen["/store/history"] != nil, seen["/store/sources/selected"] != nil {
                    break
                }
            }
            return seen
        }
        #expect(texts(seen["/store/history"]!!) == ["Paris"])
        #expect(seen["/store/sources/selected"]!!["ids"] == ["cnn"])

        // More articles than one batch to the kernel may carry (kernel.max_batch_items, 100),
        // saved in one call of the client's batch (which sends them as several).
        let many = 120
        let saves = await bus.client.batch(service: "store", (0..<many).map { ("articles.save", article("https://example.com/many/\($0)").jsonBytes) })
        #expect(saves.filter { (try? $0.get())?["created"] == true }.count == many)

        // The kernel restarts: the store registers again and republishes its keys.
        await bus.kernel.stop()
        let restarted = try await bus.kernel.restarted()
        bus = StoreBus(kernel: restarted, store: bus.store, host: bus.host, work: bus.work, client: bus.client,
                       publisherClient: bus.publisherClient, folder: bus.folder, backend: bus.backend, postgres: bus.postgres)
        try await restarted.state("/store/", within: 15, "state republished to the new kernel") { state in
            state["/store/history"] != nil && state["/store/sources/selected"] != nil
                && state.keys.filter { $0.hasPrefix("/store/articles/") }.count == many
        }
        await subscription.cancel()
        await bus.stop()
    }

    @Test("the publishing lock held by another process (one stopped while it held it): the store logs that it cannot publish yet, naming the lock, and publishes once it is let go",
          arguments: Backend.available)
    func publishingLockHeld(backend: Backend) async throws {
        let logs = LogLines()
        let bus = try await StoreBus.start(backend: backend, logger: logs.logger("store")) { $0.publishingWait = .milliseconds(300) }
        // What a store process that took the lock and was stopped leaves behind.
        let letGo: @Sendable () -> Void
        let lockName: String
        if backend == .sqlite {
            let file = bus.databasePath + ".publishing"
            lockName = "the lock \(file)"
            let descriptor = open(file, O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
            #expect(flock(descriptor, LOCK_EX) == 0)
            letGo = { flock(descriptor, LOCK_UN); close(descriptor) }
        } else {
            lockName = "the advisory lock 7214022"
            let holder = try #require(bus.postgres).session()
            holder.send("SELECT 'held' FROM pg_advisory_lock(7214022);\n")
            try await holder.waitForOutput(containing: "held", within: 20)
            letGo = { holder.stop() }
        }
        _ = try await bus.call("history.add", ["text": "Lisbon"])
        try await logs.waitFor("cannot publish changes yet", within: 20, "the store says it cannot publish")
        #expect(logs.text.contains("another process has held \(lockName) for"), "\(logs.text)")
        letGo()
        _ = try await bus.kernel.state("/store/", within: 20, "the history published once the lock is let go") { state in
            state["/store/history"].map(texts) == ["Lisbon"]
        }
        await bus.stop()
    }

    @Test("two store workers on one database and many clients writing at once: nothing lost, each client's order kept", arguments: Backend.available)
    func concurrentWriters(backend: Backend) async throws {
        try await StoreBus.with(historyLimit: 1_000, backend: backend) { bus async throws in
            // A second store instance (its own SQLite connections, as a second process would
            // have) on the same file, registered as another worker of `store`.
            let second = try await bus.another(historyLimit: 1_000)
            let clients = 8, writes = 40
            try await withThrowingTaskGroup(of: Void.self) { group in
                for c in 0..<clients {
                    group.addTask {
                        let client = try await BusClient(brokers: [bus.kernel.endpoints.broker])
                        for w in 0..<writes {
                            _ = try await client.request(service: "store", method: "history.add", params: ["text": .string("c\(c)-w\(w)")])
                            _ = try await client.request(service: "store", method: "articles.save",
                                                         params: article("https://example.com/\(c)/\(w)"))
                        }
                        await client.close()
                    }
                }
                try await group.waitForAll()
            }
            let history = texts(try await bus.call("history.list", ["limit": 1_000]))
            #expect(history.count == clients * writes)
            // Most recent first: each client's own writes appear newest to oldest.
            for c in 0..<clients {
                let mine = history.filter { $0.hasPrefix("c\(c)-") }
                #expect(mine == (0..<writes).reversed().map { "c\(c)-w\($0)" })
            }
            #expect(try await second.call("articles.list")["total"] == .int(Int64(clients * writes)))
            // What the two stores published ends as the database holds it: neither published an
            // older history over a newer one.
            try await bus.kernel.state("/store/history", "the published history is the stored one") { state in
                state["/store/history"].map(texts) == history
            }
            await second.stop(keepKernel: true)
        }
    }

    @Test("a database path that cannot be opened: one sentence with the path and the system's reason, no error dump")
    func unopenablePath() async throws {
        let folder = try temporaryDirectory("store")
        // Where the database's folder should be, a file.
        try Data("not a folder".utf8).write(to: folder.appendingPathComponent("db"))
        let bus = try await StoreBus.start(folder: folder)
        let error = await bus.failure("history.list")
        #expect(error?.code == -32007 && error?.data?["reason"] == "cannot-open", "\(String(describing: error))")
        let message = error?.message ?? ""
        #expect(message.contains("cannot create the folder \(folder.appendingPathComponent("db").path): File exists") && message.contains("store.sqlite"), "\(message)")
        #expect(!message.contains("Domain") && !message.contains("UserInfo") && !message.contains("\n"), "\(message)")
        await bus.stop()

        // Where the database file should be, a folder: SQLite says only "unable to open".
        let other = try temporaryDirectory("store")
        try FileManager.default.createDirectory(at: other.appendingPathComponent("db/store.sqlite"), withIntermediateDirectories: true)
        let folderBus = try await StoreBus.start(folder: other)
        let folderError = await folderBus.failure("history.list")
        #expect(folderError?.data?["reason"] == "cannot-open" && folderError?.message.contains("cannot be opened: it is a folder") == true,
                "\(String(describing: folderError))")
        await folderBus.stop()
    }

    @Test("a database that is not a database: a clear error on every call, and the service keeps answering")
    func corrupt() async throws {
        let folder = try temporaryDirectory("store")
        let path = folder.appendingPathComponent("db/store.sqlite")
        try FileManager.default.createDirectory(at: path.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data(repeating: 0x5A, count: 8_192).write(to: path)
        let bus = try await StoreBus.start(folder: folder)
        for method in ["history.list", "sources.selected"] {
            let error = await bus.failure(method)
            #expect(error?.code == -32007)
            #expect(error?.data?["reason"] == "corrupt")
            #expect(error?.message.contains(path.path) == true)
        }
        let write = await bus.failure("history.add", ["text": "Paris"])
        #expect(write?.data?["reason"] == "corrupt")
        // Still registered and answering (the errors above came from it).
        #expect(try await bus.client.hasWorkers("store"))
        await bus.stop()
    }

    @Test("a full database: writes beyond it fail with 'full', earlier ones stay, reads go on")
    func full() async throws {
        try await StoreBus.with(maxSizeBytes: 128 * 1024) { bus async throws in
            var acknowledged: [String] = []
            var failure: JSONRPCError?
            for index in 0..<200 {
                let url = "https://example.com/\(index)"
                do {
                    let params: JSONValue = ["article": ["url": .string(url), "content": .string(String(repeating: "x", count: 4_000))]]
                    _ = try await bus.call("articles.save", params)
                    acknowledged.append(url)
                } catch {
                    if case .remote(_, let rpc)? = error as? BusError { failure = rpc }
                    break
                }
            }
            #expect(failure?.code == -32007 && failure?.data?["reason"] == "full", "\(String(describing: failure))")
            #expect(!acknowledged.isEmpty)
            let list = try await bus.call("articles.list", ["limit": 1_000])
            let stored = Set(list["articles"]?.arrayValue?.compactMap { $0["url"]?.stringValue } ?? [])
            #expect(stored == Set(acknowledged))
            // Deleting frees room; writing works again.
            _ = try await bus.call("articles.delete", ["url": .string(acknowledged[0])])
            _ = try await bus.call("history.add", ["text": "still works"])
        }
    }

    @Test("a read-only database file: writes get a clear error; reads go on")
    func readOnly() async throws {
        let first = try await StoreBus.start()
        _ = try await first.call("history.add", ["text": "Paris"])
        await first.stop(keepKernel: true)
        let path = first.databasePath
        // Root ignores permission bits, so as root the file is made immutable instead.
        guard try ReadOnlyFile.make(path) else {
            await first.kernel.stop()
            return
        }
        defer { ReadOnlyFile.undo(path) }
        let bus = try await StoreBus.start(folder: first.folder, kernel: first.kernel)
        let error = await bus.failure("history.add", ["text": "Rome"])
        #expect(error?.code == -32007)
        #expect(error?.data?["reason"] == "read-only", "\(String(describing: error))")
        #expect(error?.message.contains("read-only") == true)
        #expect(texts(try await bus.call("history.list")) == ["Paris"])
        await bus.stop()
    }
}

/// Makes a file read-only even for root: `chattr +i` as root, permission bits otherwise.
enum ReadOnlyFile {
    static func make(_ path: String) throws -> Bool {
        if getuid() != 0 {
            try FileManager.default.setAttributes([.posixPermissions: 0o444], ofItemAtPath: path)
            return true
        }
        if run("/usr/bin/chattr", ["+i", path]) { return true }
        print("skipped: cannot make \(path) immutable (chattr +i failed); the read-only case needs it when running as root")
        return false
    }

    static func undo(_ path: String) {
        if getuid() == 0 { _ = run("/usr/bin/chattr", ["-i", path]) }
        try? FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: path)
    }

    private static func run(_ tool: String, _ arguments: [String]) -> Bool {
        guard FileManager.default.isExecutableFile(atPath: tool) else { return false }
        return (try? runBriefly(tool, arguments))?.status == 0
    }
}
