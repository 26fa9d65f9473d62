import BusProtocol
import Foundation
import GRDB
import Logging
import Storage
import Synchronization
import SwitchboardTestSupport
import Testing

/// Owns a group commit whose first batch waits until the test lets it go, and tells what
/// happens: each item submitted (told in the actor's turn that hands it to the group, so what
/// the test asks of the actor next runs once it waits there), each batch written. Each item's
/// outcome is ten times it, except 3's, which is refused.
private actor Batches {
    enum Event: Equatable {
        case submitted(Int)
        case writing([Int])
    }

    let group: GroupCommit<Int, Int>
    let events: AsyncStream<Event>
    private let tell: AsyncStream<Event>.Continuation
    private var firstHeld: CheckedContinuation<Void, Never>?
    private var batches = 0

    struct Refused: Error {}

    init(maxBatch: Int = .max) {
        group = GroupCommit(maxBatch: maxBatch)
        (events, tell) = AsyncStream.makeStream()
    }

    func submit(_ item: Int) async throws -> Int {
        tell.yield(.submitted(item))
        return try await group.submit(item) { batch in await self.write(batch) }
    }

    private func write(_ batch: [Int]) async -> [Result<Int, any Error>] {
        batches += 1
        tell.yield(.writing(batch))
        if batches == 1 { await withCheckedContinuation { firstHeld = $0 } }
        return batch.map { $0 == 3 ? .failure(Refused()) : .success($0 * 10) }
    }

    func letFirstGo() {
        firstHeld?.resume()
        firstHeld = nil
    }
}

@Suite("group commit: what comes while a batch is written is written together next")
struct GroupCommitTests {
    @Test("alone, an item is written at once in a batch of its own; what comes meanwhile waits and is the next batch, in the order it came, each answered its own outcome")
    func batches() async throws {
        let batches = Batches()
        var events = batches.events.makeAsyncIterator()
        let first = Task { try await batches.submit(1) }
        #expect(await events.next() == .submitted(1))
        #expect(await events.next() == .writing([1]))
        var later: [Task<Int, any Error>] = []
        for item in 2...5 {
            later.append(Task { try await batches.submit(item) })
            #expect(await events.next() == .submitted(item))
        }
        await batches.letFirstGo()
        #expect(await events.next() == .writing([2, 3, 4, 5]))
        #expect(try await first.value == 10)
        #expect(try await later[0].value == 20)
        await #expect(throws: Batches.Refused.self) { try await later[1].value }
        #expect(try await later[2].value == 40)
        #expect(try await later[3].value == 50)
        #expect(try await batches.submit(6) == 60)
        #expect(await events.next() == .submitted(6))
        #expect(await events.next() == .writing([6]))
    }

    @Test("a batch takes at most its bound; what waits beyond it is the next batch")
    func bounded() async throws {
        let batches = Batches(maxBatch: 2)
        var events = batches.events.makeAsyncIterator()
        let first = Task { try await batches.submit(1) }
        #expect(await events.next() == .submitted(1))
        #expect(await events.next() == .writing([1]))
        var later: [Task<Int, any Error>] = []
        for item in [2, 4, 5, 6, 7] {
            later.append(Task { try await batches.submit(item) })
            #expect(await events.next() == .submitted(item))
        }
        await batches.letFirstGo()
        #expect(await events.next() == .writing([2, 4]))
        #expect(await events.next() == .writing([5, 6]))
        #expect(await events.next() == .writing([7]))
        #expect(try await first.value == 10)
        for (task, item) in zip(later, [2, 4, 5, 6, 7]) { #expect(try await task.value == item * 10) }
    }
}

/// The indexes a batch was asked to do.
private final class Asked: Sendable {
    let indexes = Mutex<[Int]>([])
}

/// A durable service's database of one table, `things`, on SQLite or on PostgreSQL.
private struct ThingsDatabase {
    let database: ServiceDatabase
    let parts: [Task<Void, any Error>]
    let folder: URL
    let postgres: TestPostgres?

    static func start(onPostgres: Bool, replyWindow: Duration) async throws -> ThingsDatabase {
        let folder = try temporaryDirectory("batch-writes")
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(sql: "CREATE TABLE things (name TEXT PRIMARY KEY)")
            try SQLiteWriter.createRepliesTable(db)
        }
        let schema = DatabaseSchema(sqlite: migrator, postgres: ["CREATE TABLE things (name TEXT PRIMARY KEY);" + PostgresWriter.repliesTable],
                                    postgresSchema: "things", postgresLock: 1)
        let server = onPostgres ? try await TestPostgres.start() : nil
        let database = ServiceDatabase(path: folder.appendingPathComponent("things.sqlite").path, label: "things", maxSizeBytes: nil,
                                       postgres: server.map { PostgresSettings(url: $0.url(), poolSize: 2, tls: .disable) }, schema: schema,
                                       replyWindow: replyWindow, logger: Logger(label: "test"))
        let parts = database.parts.map { part in Task { try await part.run() } }
        await database.waitUntilReady()
        return ThingsDatabase(database: database, parts: parts, folder: folder, postgres: server)
    }

    /// Runs `body` on a new database and stops it (its connections ended) however `body` ends.
    static func with(onPostgres: Bool, replyWindow: Duration = .seconds(600), _ body: (ThingsDatabase) async throws -> Void) async throws {
        try await stopping(try await start(onPostgres: onPostgres, replyWindow: replyWindow), with: { await $0.stop() }, body)
    }

    func stop() async {
        for part in parts {
            part.cancel()
            _ = await part.result
        }
        postgres?.stop()
        try? FileManager.default.removeItem(at: folder)
    }

    /// Adds each of `names` (the request named as `requests` name them), in one batch:
    /// "refused" is refused, and with `failing`, the batch fails as a whole once it has added
    /// them (as a database error would fail it). `asked`: the indexes the batch was asked to do.
    func add(_ names: [String], requests: [String?], failing: Bool = false, asked: Asked? = nil) async throws -> [Result<JSONValue, JSONRPCError>] {
        try await database.write(requests: requests) { db, todo in
            asked?.indexes.withLock { $0 = todo }
            let outcomes = try todo.map { index -> Result<JSONValue, JSONRPCError> in
                guard names[index] != "refused" else { return .failure(JSONRPCError.invalidParams(field: "name", "refused")) }
                try db.execute("INSERT INTO things (name) VALUES (?)", [names[index]])
                return .success(.string(names[index]))
            }
            if failing { throw CancellationError() }
            return outcomes
        }
    }

    var things: [String] {
        get async throws { try await database.read { db in try db.texts("SELECT name FROM things ORDER BY name", []) } }
    }

    /// The requests whose results the database remembers.
    var rememberedRequests: [String] {
        get async throws { try await database.read { db in try db.texts("SELECT request FROM replies ORDER BY request", []) } }
    }
}

@Suite("writes for several requests in one transaction (a service's batch)")
struct BatchWriteTests {
    static var engines: [Bool] { TestPostgres.available ? [false, true] : [false] }

    @Test("each request answered in order; a request written before gets its result, one named twice is done once, a refusal writes nothing and is not remembered",
          arguments: engines)
    func batch(onPostgres: Bool) async throws {
        try await ThingsDatabase.with(onPostgres: onPostgres) { things in
            #expect(try await things.database.write(request: "r0") { db in
                try db.execute("INSERT INTO things (name) VALUES (?)", ["zero"])
                return .string("zero")
            } == .string("zero"))
            let asked = Asked()
            let outcomes = try await things.add(["one", "refused", "again", "two", "other"], requests: ["r1", "r2", "r1", nil, "r0"], asked: asked)
            #expect(asked.indexes.withLock { $0 } == [0, 1, 3], "the repeated request and the one written before are not done")
            #expect(try outcomes[0].get() == .string("one"))
            #expect(outcomes[1].failure?.code == JSONRPCError.invalidParamsCode)
            #expect(try outcomes[2].get() == .string("one"), "the same request as the first: its outcome")
            #expect(try outcomes[3].get() == .string("two"))
            #expect(try outcomes[4].get() == .string("zero"), "written before: its result then")
            #expect(try await things.things == ["one", "two", "zero"])
            // Sent again alone: r1 answers what the batch did; r2, refused, is done now.
            #expect(try await things.database.write(request: "r1") { _ in .string("once more") } == .string("one"))
            #expect(try await things.add(["three"], requests: ["r2"])[0].get() == .string("three"))
            #expect(try await things.things == ["one", "three", "two", "zero"])
        }
    }

    @Test("a result is forgotten once its reply window (remember_seconds) has passed: the next write deletes it, so the table holds about a window of them",
          arguments: engines)
    func repliesForgotten(onPostgres: Bool) async throws {
        try await ThingsDatabase.with(onPostgres: onPostgres, replyWindow: .seconds(1)) { things in
            _ = try await things.add(["a"], requests: ["r1"])
            #expect(try await things.rememberedRequests == ["r1"])
            // Past the window: time, which no event marks.
            try await Task.sleep(for: .milliseconds(1_500))
            _ = try await things.add(["b"], requests: ["r2"])
            #expect(try await things.rememberedRequests == ["r2"])
            #expect(try await things.things == ["a", "b"])
        }
    }

    @Test("a batch that fails as a whole throws, and leaves nothing written and nothing remembered", arguments: engines)
    func failingBatch(onPostgres: Bool) async throws {
        try await ThingsDatabase.with(onPostgres: onPostgres) { things in
            await #expect(throws: (any Error).self) { try await things.add(["a", "b"], requests: ["r1", nil], failing: true) }
            #expect(try await things.things == [])
            let again = try await things.add(["c", "d"], requests: ["r1", nil])
            #expect(try again[0].get() == .string("c") && again[1].get() == .string("d"))
            #expect(try await things.things == ["c", "d"])
        }
    }
}

extension Result {
    fileprivate var failure: Failure? {
        if case .failure(let error) = self { error } else { nil }
    }
}
