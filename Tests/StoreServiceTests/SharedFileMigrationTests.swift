import Foundation
import GRDB
import Storage
import SwitchboardTestSupport
import Testing

/// A kernel pair's two `switchboard up`s start a store and a streams service each on one
/// SQLite file: each process migrates it as it opens it, and the first start has both at once.
@Suite("SQLite: processes that open one new file at once all migrate it")
struct SharedFileMigrationTests {
    /// Two openers of each new file, started together, as two processes' services are; each
    /// has its own descriptors and connections, as another process would.
    @Test("two openers of a new file at once both open it, its schema made once")
    func openersAtOnce() async throws {
        let folder = try temporaryDirectory("shared-migration")
        defer { try? FileManager.default.removeItem(at: folder) }
        // Each round a new file: the race is at a file's first migration only.
        for round in 0..<20 {
            let path = folder.appendingPathComponent("shared-\(round).sqlite").path
            let openers = (0..<2).map { index in
                Task.detached { () -> Result<[String], any Error> in
                    let migrator = Self.migrator()
                    return Result {
                        let pool = try SQLiteWriter.open(path: path, label: "opener \(index)", maxSizeBytes: nil, migrator: migrator)
                        return try pool.read { try migrator.appliedIdentifiers($0) }.sorted()
                    }
                }
            }
            for opener in openers {
                let applied = try await opener.value.get()
                #expect(applied == ["v1", "v2", "v3", "v4"], "round \(round)")
            }
        }
    }

    /// Several migrations, each making a table and an index: a second opener that reads what
    /// was applied while the first makes them would make them again.
    static func migrator() -> DatabaseMigrator {
        var migrator = DatabaseMigrator()
        for version in 1...4 {
            migrator.registerMigration("v\(version)") { db in
                try db.execute(sql: "CREATE TABLE t\(version) (id INTEGER PRIMARY KEY, value TEXT)")
                try db.execute(sql: "CREATE INDEX t\(version)_value ON t\(version) (value)")
            }
        }
        return migrator
    }
}
