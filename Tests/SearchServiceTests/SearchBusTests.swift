import BusKit
import BusProtocol
import Catalog
import Contracts
import FetcherService
import Foundation
import Kernel
@testable import SearchService
import StoreService
import SwitchboardTestSupport
import Testing

/// The search service on a ``DatasetBus`` (kernel, store, fetcher over files), following `/catalog/`.
struct SearchBus {
    let base: DatasetBus
    let search: SearchService
    let searchHost: ServiceHost<SearchService>
    let searchWork: Working
    let catalog: Subscription
    /// The search service's log: a line for each dataset it installs from the fetcher.
    let log: LogLines
    var client: BusClient { base.client }

    static func start() async throws -> SearchBus {
        let base = try await DatasetBus.start()
        let catalog = try await base.catalogSubscription()
        let log = LogLines()
        let search = SearchService(logger: log.logger("switchboard.search"), busTimeout: .seconds(10), client: base.client, catalog: catalog)
        let searchHost = try ServiceHost(service: search, options: DatasetBus.hostOptions(base.kernel, connections: 4))
        try await searchHost.start()
        try await base.waitForWorkers(["search"])
        let searchWork = Working(search)
        await searchWork.start()
        try await base.startFetcher()
        return SearchBus(base: base, search: search, searchHost: searchHost, searchWork: searchWork, catalog: catalog, log: log)
    }

    func request(_ method: String, _ params: JSONValue? = nil) async throws -> JSONValue {
        try await client.request(service: "search", method: method, params: params)
    }

    func error(_ method: String, _ params: JSONValue? = nil) async -> JSONRPCError? {
        await base.error("search", method, params)
    }

    /// Replaces a dataset's file, has the fetcher refresh it, and waits until the search
    /// service has swapped in the index built from it: its log says so once it has, and a
    /// version the service had before (a file put back) is a line more than there were.
    func replace(_ dataset: Dataset, with body: Data) async throws {
        let version = Dataset.version(of: body)
        let installs = { @Sendable (lines: [String]) in
            lines.count { $0.contains("dataset followed") && $0.contains("dataset=\(dataset) ") && $0.contains("version=\(version)") }
        }
        let before = installs(log.lines.value)
        try await base.replace(dataset, with: body)
        _ = try await log.lines.wait(within: 15, "search installed \(dataset) at \(version)") { installs($0) > before }
    }

    func stop() async {
        await searchWork.stop()
        await catalog.cancel()
        await searchHost.stop()
        await base.stop()
    }
}

@Suite("search: through the kernel, with the store and the fetcher", .serialized)
struct SearchBusTests {
    @Test("every method answers through the kernel from the bundled data")
    func everyMethod() async throws {
        let bus = try await SearchBus.start()
        defer { Task { await bus.stop() } }
        #expect(try await bus.request("countries.search", ["query": "par"])["countries"]?.arrayValue?.first?["name"] == "Paraguay")
        #expect(try await bus.request("locations.search")["total"] == 4)
        let whole = try await bus.client.call(SearchAPI.itemsGrouped, .init(order: .natural))
        #expect(whole.total == 320)
        // In parts: the same groups and items, in the same order, each part within one group.
        let parts = bus.client.stream(SearchAPI.itemsGroupedStream, .init(order: .natural))
        var streamed: [SearchAPI.GroupedItems.Group] = []
        for try await part in parts { streamed.append(part) }
        let end = try await parts.end()
        #expect(end.total == 320 && end.dropped == whole.dropped && end.groups.isEmpty)
        let gathered = SearchAPI.itemsGroupedStream.gather(end, streamed)
        #expect(gathered.groups.map(\.listId) == whole.groups.map(\.listId))
        #expect(gathered.groups.map { $0.items.map(\.id) } == whole.groups.map { $0.items.map(\.id) })
        #expect(try await bus.request("sources.list")["sources"]?.arrayValue?.isEmpty == false)
        #expect(try await bus.request("headlines.list")["status"] == "no-sources-selected")
        #expect(try await bus.request("flights.list")["outbound"]?.arrayValue?.count == 6)
        #expect(try await bus.request("airlines.get", ["id": "Ryanair"])["name"] == "Ryanair")
        #expect(try await bus.request("locations.resolve", ["query": "Mumbai"])["nearest"]?["name"] != nil)
        // Bad params cross the bus as -32602 with the field.
        #expect(await bus.error("countries.search", ["limit": "ten"])?.data?["field"] == "limit")
        #expect(await bus.error("locations.resolve", ["query": "12.9716, 277.5946"])?.message.contains("longitude 277.5946 is out of range") == true)
        await bus.stop()
    }

    @Test("every successful resolve is added to the store's history; a failed one is not")
    func resolveRecordsHistory() async throws {
        let bus = try await SearchBus.start()
        defer { Task { await bus.stop() } }
        let resolved = try await bus.request("locations.resolve", ["query": "12.9716,77.5946"])
        #expect(resolved["historyRecorded"] == true)
        _ = try await bus.request("locations.resolve", ["query": "copenhagen"])
        _ = await bus.error("locations.resolve", ["query": "Atlantis"])
        _ = await bus.error("locations.resolve", ["query": "91, 0"])
        let history = try await bus.client.request(service: "store", method: "history.list")
        #expect(history["entries"]?.arrayValue?.compactMap { $0["text"]?.stringValue } == ["copenhagen", "12.9716,77.5946"])
        await bus.stop()
    }

    @Test("news: sources marked as selected, headlines of the selection newest first and paged; two distinct empty states; [Removed] dropped")
    func news() async throws {
        let bus = try await SearchBus.start()
        defer { Task { await bus.stop() } }
        // Headlines with a placeholder for a taken-down article.
        var headlines = try JSONSerialization.jsonObject(with: Dataset.headlines.bundledData()) as! [String: Any]
        var articles = headlines["articles"] as! [[String: Any]]
        articles.append(["source": ["id": "bbc-news", "name": "[Removed]"], "title": "[Removed]", "url": "https://removed.com",
                         "publishedAt": "2099-01-01T00:00:00Z"])
        headlines["articles"] = articles
        try await bus.replace(.headlines, with: JSONSerialization.data(withJSONObject: headlines))

        let empty = try await bus.request("headlines.list")
        #expect(empty["status"] == "no-sources-selected" && empty["total"] == 0)
        _ = try await bus.client.request(service: "store", method: "sources.select", params: ["ids": ["bbc-news", "reuters"]])
        let sources = try await bus.request("sources.list")
        let selected = sources["sources"]?.arrayValue?.filter { $0["selected"] == true }.compactMap { $0["id"]?.stringValue }
        #expect(Set(selected ?? []) == ["bbc-news", "reuters"])
        #expect(sources["sources"]?.arrayValue?.allSatisfy { $0["language"] == "en" } == true)
        let all = try await bus.request("sources.list", ["language": "all"])
        #expect(all["total"]?.intValue ?? 0 > sources["total"]?.intValue ?? 0)

        let first = try await bus.request("headlines.list", ["pageSize": 3])
        #expect(first["status"] == "ok" && first["hasMore"] == true)
        let total = try #require(first["total"]?.intValue)
        var seen: [JSONValue] = []
        var page = 1
        while true {
            let answer = try await bus.request("headlines.list", ["pageSize": 3, "page": .int(Int64(page))])
            seen += answer["articles"]?.arrayValue ?? []
            if answer["hasMore"] != true { break }
            page += 1
        }
        #expect(seen.count == Int(total))
        #expect(seen.allSatisfy { ["bbc-news", "reuters"].contains($0["source"]?["id"]?.stringValue ?? "") && $0["title"] != "[Removed]" })
        let dates = seen.compactMap { $0["publishedAt"]?.stringValue }
        #expect(dates == dates.sorted(by: >))

        let none = try await bus.request("headlines.list", ["sources": ["no-such-source"]])
        #expect(none["status"] == "no-results" && none["unknownSources"] == ["no-such-source"])
        await bus.stop()
    }

    @Test("a catalog change rebuilds the index; queries during it see the old or the new data, never a mix")
    func catalogChange() async throws {
        let bus = try await SearchBus.start()
        defer { Task { await bus.stop() } }
        let bundled = try Dataset.countries.bundledData()
        let small = Data(#"[{"name":"Testland","capital":"Testville","code":"TL","region":"EU"},{"name":"Otherland","capital":"Otherville","code":"OL","region":"AS"}]"#.utf8)
        // Queries run all along; each answer must be wholly one copy or the other.
        let querying = Task {
            var answers = 0
            var problems: [String] = []
            while !Task.isCancelled {
                guard let answer = try? await bus.request("countries.search", ["limit": 1_000]) else { continue }
                let names = Set(answer["countries"]?.arrayValue?.compactMap { $0["name"]?.stringValue } ?? [])
                let total = answer["total"]?.intValue
                if !((total == 249 && names.count == 249 && names.contains("France")) || (total == 2 && names == ["Testland", "Otherland"])) {
                    problems.append("total \(total ?? -1), \(names.count) names")
                }
                answers += 1
            }
            return (answers, problems)
        }
        for _ in 0..<3 {
            try await bus.replace(.countries, with: small)
            #expect(try await bus.request("countries.search", ["query": "testv"])["countries"]?.arrayValue?.first?["match"] == "capital")
            try await bus.replace(.countries, with: bundled)
        }
        querying.cancel()
        let (answers, problems) = await querying.value
        #expect(answers > 0 && problems.isEmpty, "\(problems.prefix(3))")
        let list = try await bus.request("indexes.list").arrayValue ?? []
        #expect(list.first { $0["name"] == "countries" }?["origin"] == "remote")
        await bus.stop()
    }
}
