import BusProtocol
import Contracts
import Foundation
import StoreService
import Synchronization
import SwitchboardTestSupport
import Testing

/// A `psql` session held open on a test's server: what a test sends runs at once, and the
/// session's transaction stays open until the test commits it.
private final class PsqlSession: Sendable {
    private let process: Process
    private let input: FileHandle
    private let output = Printed()

    private final class Printed: Sendable {
        let text = Mutex("")
    }

    init(_ server: TestPostgres) throws {
        process = Process()
        process.executableURL = TestPostgres.binaries!.appendingPathComponent("psql")
        process.arguments = ["-h", "127.0.0.1", "-p", String(server.port), "-U", TestPostgres.user, "-d", "postgres",
                             "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]
        process.environment = ["PGPASSWORD": TestPostgres.password, "PATH": "/usr/bin:/bin"]
        let stdin = Pipe(), stdout = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = stdout
        input = stdin.fileHandleForWriting
        stdout.fileHandleForReading.readabilityHandler = { [output] handle in
            let text = String(decoding: handle.availableData, as: UTF8.self)
            output.text.withLock { $0 += text }
        }
        try process.run()
    }

    func send(_ sql: String) {
        input.write(Data((sql + "\n").utf8))
    }

    var printed: String { output.text.withLock { $0 } }

    func stop() {
        try? input.close()
        if process.isRunning { process.terminate() }
        process.waitUntilExit()
    }
}

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

        // Another session holds the lock every history writer takes, so both stores find no
        // reply for the request and then wait at that lock.
        let holder = try PsqlSession(server)
        defer { holder.stop() }
        holder.send("BEGIN; LOCK TABLE history IN SHARE ROW EXCLUSIVE MODE; SELECT 'locked';")
        try await eventually(10, "the session holds the lock") { holder.printed.contains("locked") }
        let request = try body("twice", id: 7, client: "c2")
        async let one = tables[0].answer(body: request, on: stores[0])
        async let two = tables[1].answer(body: request, on: stores[1])
        let watcher = try PsqlSession(server)
        defer { watcher.stop() }
        let asked = Atomic(0)
        try await eventually(10, "both stores wait at the history's lock") {
            // Each question numbered, so an answer is read once the one asked before came back.
            let question = asked.add(1, ordering: .relaxed).newValue
            watcher.send("SELECT 'waiting ' || \(question) || ' ' || count(*) FROM pg_locks WHERE NOT granted AND relation = 'history'::regclass;")
            return watcher.printed.contains(" 2\n")
        }
        holder.send("COMMIT; SELECT 'released';")
        let answers = await [one, two]
        let replies = answers.map { String(decoding: $0.reply, as: UTF8.self) }
        #expect(answers.allSatisfy { $0.errors == 0 }, "\(replies)")
        #expect(replies[0] == replies[1], "the same request, the same answer: \(replies)")
        // Once in the history, after "before" (the second store's own add was rolled back).
        let list = await tables[1].answer(body: JSONRPCRequest(id: .number(8), method: StoreAPI.historyList.name, paramsText: nil).jsonBytes, on: stores[1])
        let entries = try JSONRPC.parseResponses(list.reply).first?.outcome.get()["entries"]?.arrayValue?.compactMap { $0["text"]?.stringValue }
        #expect(entries == ["twice", "before"], "\(String(decoding: list.reply, as: UTF8.self))")
        watcher.send("SELECT 'replies ' || count(*) FROM replies;")
        try await eventually(10, "one reply kept for the request, beside the first write's") { watcher.printed.contains("replies 2") }
        for work in works { await work.stop() }
    }
}
