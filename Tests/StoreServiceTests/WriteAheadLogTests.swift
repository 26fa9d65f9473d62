import Foundation
import GRDB
import Logging
import Storage
import SwitchboardTestSupport
import Testing

/// The disk a service's SQLite file holds: its write-ahead log does not keep the size of the
/// largest transaction it ever took.
@Suite("SQLite: the write-ahead log shrinks back after a large transaction")
struct WriteAheadLogTests {
    @Test("a transaction larger than the limit leaves a -wal file of at most the limit once the next write has run")
    func shrinksBack() throws {
        let folder = try temporaryDirectory("write-ahead-log")
        defer { try? FileManager.default.removeItem(at: folder) }
        let path = folder.appendingPathComponent("things.sqlite").path
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in try db.execute(sql: "CREATE TABLE things (id INTEGER PRIMARY KEY, body BLOB)") }
        let pool = try SQLiteWriter.open(path: path, label: "things", maxSizeBytes: nil, migrator: migrator)
        let large = 3 * SQLiteWriter.writeAheadLogLimit
        // One transaction, as a purge of a large stream or a batch of large messages is.
        try pool.write { db in
            for _ in 0..<(large / 1_000_000) { try db.execute(sql: "INSERT INTO things (body) VALUES (randomblob(1000000))") }
        }
        #expect(try walSize(path) > large)
        // SQLite checkpoints after that commit; the next write starts the log again from its
        // beginning, and cuts the file back then.
        try pool.write { db in try db.execute(sql: "DELETE FROM things") }
        try pool.write { db in try db.execute(sql: "INSERT INTO things (body) VALUES (x'00')") }
        #expect(try walSize(path) <= SQLiteWriter.writeAheadLogLimit)
        #expect(try pool.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM things") } == 1)
    }

    @Test("giving back free pages while a read holds an older snapshot neither holds the writes until the busy timeout nor fails; once the read ends, the next one cuts the file")
    func givingBackDoesNotWaitForReads() async throws {
        let folder = try temporaryDirectory("give-back")
        defer { try? FileManager.default.removeItem(at: folder) }
        let path = folder.appendingPathComponent("things.sqlite").path
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try SQLiteWriter.createRepliesTable(db)
            try db.execute(sql: "CREATE TABLE things (id INTEGER PRIMARY KEY, body BLOB)")
        }
        let writer = SQLiteWriter(path: path, label: "things", maxSizeBytes: nil, migrator: migrator, replyWindow: .seconds(600),
                                  logger: Logger(label: "give-back"))
        _ = try await writer.write(request: nil) { db in
            for _ in 0..<8 { try db.execute(sql: "INSERT INTO things (body) VALUES (randomblob(1000000))") }
            return .null
        }
        _ = try await writer.write(request: nil) { db in try db.execute(sql: "DELETE FROM things"); return .null }
        // A read of another connection, on a thread of its own, its snapshot from before the
        // pages are given back, held until the first give-back has ended.
        let reader = try DatabaseQueue(path: path, configuration: { var config = Configuration(); config.readonly = true; return config }())
        let (readStarted, firstGiveBackEnded, readEnded) = (DispatchSemaphore(value: 0), DispatchSemaphore(value: 0), DispatchSemaphore(value: 0))
        Thread {
            try? reader.read { db in
                _ = try Int.fetchOne(db, sql: "SELECT count(*) FROM things")
                readStarted.signal()
                _ = firstGiveBackEnded.wait(timeout: .now() + 60)
            }
            readEnded.signal()
        }.start()
        try #require(readStarted.wait(timeout: .now() + 30) == .success)
        try await writer.giveBackFreePages()
        #expect(try fileSize(path) > 4_000_000, "the read's snapshot still needs the file's pages")
        firstGiveBackEnded.signal()
        try #require(readEnded.wait(timeout: .now() + 30) == .success)
        try await writer.giveBackFreePages()
        #expect(try fileSize(path) + walSize(path) < 1_000_000)
    }

    private func fileSize(_ path: String) throws -> Int {
        try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int ?? 0
    }

    private func walSize(_ path: String) throws -> Int {
        try FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? Int ?? 0
    }
}
