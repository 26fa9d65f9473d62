import BusProtocol
import Contracts
import Foundation
import Storage
import StoreService
import Synchronization
import SwitchboardTestSupport
import Testing

@Suite("store on PostgreSQL: two store processes given the same request at once",
       .enabled(if: TestPostgres.available, "skipped: no PostgreSQL server installed (the test bootstrap installs it)"))
struct PostgresDuplicateTests {
    private func body(_ text: String, id: Int64, client: String) throws -> [UInt8] {
        JSONRPCRequest(id: .number(id), method: StoreAPI.historyAdd.name, paramsText: JSONValue.object(["text": .string(text)]).jsonBytes,
                       client: client).jsonBytes
    }

    @Test("both looked for the request's reply before either wrote it: the effect happens once, and the one whose reply was written second (refused by the database, 23505) answers with the first one's result")
    func sameRequestInTwoStores() async throws {
        let server = try await TestPostgres.start()
        defer { server.stop() }
        let settings = StoreConfiguration(postgres: PostgresSettings(url: server.url(), tls: .disable))
        // Two store processes on one database, as on two machines: each its own connections and replies.
        let stores = [StoreService(configuration: settings), StoreService(configuration: settings)]
        let works = stores.map { Working($0) }
        for work in works { await work.start() }
        for store in stores { await store.waitUntilReady() }
        let tables = stores.map { MethodTable(of: $0) }
        // The tables exist once a write ran.
        let first = await tables[0].answer(body: try body("before", id: 1, client: "c1"), on: stores[0])
        #expect(first.errors == 0, "\(String(decoding: first.reply, as: UTF8.self))")

        // Another session holds the lock every history writer takes (StoreDatabase's advisory
        // lock of the history, 7214023), so both stores find no reply for the request and then
        // wait at that lock.
        let holder = try server.session()
        defer { holder.stop() }
        holder.send("BEGIN; SELECT pg_advisory_xact_lock(7214023); SELECT 'locked';\n")
        try await holder.waitForOutput(containing: "locked", within: 10)
        let request = try body("twice", id: 7, client: "c2")
        async let one = tables[0].answer(body: request, on: stores[0])
        async let two = tables[1].answer(body: request, on: stores[1])
        let watcher = try server.session()
        defer { watcher.stop() }
        try await server.waitForLockWaiters(2, where: "locktype = 'advisory' AND objid = 7214023", on: watcher)
        holder.send("COMMIT; SELECT 'released';\n")
        let answers = await [one, two]
        let replies = answers.map { String(decoding: $0.reply, as: UTF8.self) }
        #expect(answers.allSatisfy { $0.errors == 0 }, "\(replies)")
        #expect(replies[0] == replies[1], "the same request, the same answer: \(replies)")
        // Once in the history, after "before" (the second store's own add was rolled back).
        let list = await tables[1].answer(body: JSONRPCRequest(id: .number(8), method: StoreAPI.historyList.name, paramsText: nil).jsonBytes, on: stores[1])
        let entries = try JSONRPC.parseResponses(list.reply).first?.outcome.get()["entries"]?.arrayValue?.compactMap { $0["text"]?.stringValue }
        #expect(entries == ["twice", "before"], "\(String(decoding: list.reply, as: UTF8.self))")
        // One reply kept for the request, beside the first write's.
        watcher.send("SELECT 'replies ' || count(*) FROM replies;\n")
        try await watcher.waitForOutput(containing: "replies 2", within: 10)
        for work in works { await work.stop() }
    }
}
