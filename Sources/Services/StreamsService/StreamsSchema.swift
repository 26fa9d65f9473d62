import GRDB
import Storage

/// The streams service's schema, in SQLite (the file is opened by ``SQLiteWriter``) and in
/// PostgreSQL (``PostgresWriter``): the same tables and columns, each in the engine's types.
///
/// A stream's counters (`messages`, `bytes`, `first_seq`, `last_seq`) are kept in its row and
/// changed with every message added or removed, so its limits are checked without scanning
/// its messages. A consumer's `next_seq` is the first sequence it never handed out; what it
/// handed out and has not had acknowledged is in `pending`, with the deadline after which
/// it is handed out again.
enum StreamsSchema {
    static var schema: DatabaseSchema {
        DatabaseSchema(sqlite: migrator, postgres: postgresMigrations, postgresSchema: postgresSchema, postgresLock: postgresMigrationLock)
    }

    /// One migration per version. Never edit a shipped migration: add one.
    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(sql: """
                CREATE TABLE streams (
                    name TEXT PRIMARY KEY,
                    retention TEXT NOT NULL,
                    max_messages INTEGER NOT NULL,
                    max_bytes INTEGER NOT NULL,
                    max_age REAL,
                    duplicate_window REAL NOT NULL,
                    dead_letters TEXT,
                    messages INTEGER NOT NULL DEFAULT 0,
                    bytes INTEGER NOT NULL DEFAULT 0,
                    first_seq INTEGER NOT NULL DEFAULT 1,
                    last_seq INTEGER NOT NULL DEFAULT 0,
                    created_at REAL NOT NULL
                );
                CREATE TABLE subjects (
                    prefix TEXT PRIMARY KEY,
                    stream TEXT NOT NULL
                );
                CREATE TABLE messages (
                    stream TEXT NOT NULL,
                    seq INTEGER NOT NULL,
                    subject TEXT NOT NULL,
                    data BLOB NOT NULL,
                    published_at REAL NOT NULL,
                    dead_letter TEXT,
                    PRIMARY KEY (stream, seq)
                ) WITHOUT ROWID;
                CREATE TABLE message_ids (
                    stream TEXT NOT NULL,
                    id TEXT NOT NULL,
                    seq INTEGER NOT NULL,
                    published_at REAL NOT NULL,
                    PRIMARY KEY (stream, id)
                ) WITHOUT ROWID;
                CREATE INDEX message_ids_by_time ON message_ids(stream, published_at);
                CREATE TABLE consumers (
                    stream TEXT NOT NULL,
                    name TEXT NOT NULL,
                    config TEXT NOT NULL,
                    filter TEXT,
                    ack_wait REAL NOT NULL,
                    max_deliver INTEGER NOT NULL,
                    next_seq INTEGER NOT NULL,
                    delivered INTEGER NOT NULL DEFAULT 0,
                    redelivered INTEGER NOT NULL DEFAULT 0,
                    acknowledged INTEGER NOT NULL DEFAULT 0,
                    dead_lettered INTEGER NOT NULL DEFAULT 0,
                    terminated INTEGER NOT NULL DEFAULT 0,
                    missed INTEGER NOT NULL DEFAULT 0,
                    missed_told INTEGER NOT NULL DEFAULT 0,
                    created_at REAL NOT NULL,
                    PRIMARY KEY (stream, name)
                ) WITHOUT ROWID;
                CREATE TABLE pending (
                    stream TEXT NOT NULL,
                    consumer TEXT NOT NULL,
                    seq INTEGER NOT NULL,
                    deliveries INTEGER NOT NULL,
                    deadline REAL NOT NULL,
                    PRIMARY KEY (stream, consumer, seq)
                ) WITHOUT ROWID;
                CREATE INDEX pending_by_message ON pending(stream, seq);
                """)
            try SQLiteWriter.createRepliesTable(db)
        }
        migrator.registerMigration("v2") { db in
            try db.execute(sql: captureColumns(integer: "INTEGER"))
        }
        migrator.registerMigration("v3") { db in
            try db.execute(sql: ownerColumns)
        }
        migrator.registerMigration("v4") { db in
            try db.execute(sql: maxAckPendingColumn(integer: "INTEGER"))
        }
        migrator.registerMigration("v5") { db in
            try db.execute(sql: deletedStreamsTable)
        }
        migrator.registerMigration("v6") { db in
            try db.execute(sql: idsColumn(integer: "INTEGER"))
        }
        return migrator
    }

    /// PostgreSQL's, one per version. Never edit a shipped migration: add one.
    static let postgresMigrations: [String] = [
        """
        CREATE TABLE streams (
            name TEXT PRIMARY KEY, retention TEXT NOT NULL, max_messages BIGINT NOT NULL, max_bytes BIGINT NOT NULL,
            max_age DOUBLE PRECISION, duplicate_window DOUBLE PRECISION NOT NULL, dead_letters TEXT,
            messages BIGINT NOT NULL DEFAULT 0, bytes BIGINT NOT NULL DEFAULT 0, first_seq BIGINT NOT NULL DEFAULT 1,
            last_seq BIGINT NOT NULL DEFAULT 0, created_at DOUBLE PRECISION NOT NULL);
        CREATE TABLE subjects (prefix TEXT PRIMARY KEY, stream TEXT NOT NULL);
        CREATE TABLE messages (
            stream TEXT NOT NULL, seq BIGINT NOT NULL, subject TEXT NOT NULL, data BYTEA NOT NULL,
            published_at DOUBLE PRECISION NOT NULL, dead_letter TEXT, PRIMARY KEY (stream, seq));
        CREATE TABLE message_ids (
            stream TEXT NOT NULL, id TEXT NOT NULL, seq BIGINT NOT NULL, published_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (stream, id));
        CREATE INDEX message_ids_by_time ON message_ids(stream, published_at);
        CREATE TABLE consumers (
            stream TEXT NOT NULL, name TEXT NOT NULL, config TEXT NOT NULL, filter TEXT, ack_wait DOUBLE PRECISION NOT NULL,
            max_deliver BIGINT NOT NULL, next_seq BIGINT NOT NULL, delivered BIGINT NOT NULL DEFAULT 0,
            redelivered BIGINT NOT NULL DEFAULT 0, acknowledged BIGINT NOT NULL DEFAULT 0, dead_lettered BIGINT NOT NULL DEFAULT 0,
            terminated BIGINT NOT NULL DEFAULT 0, missed BIGINT NOT NULL DEFAULT 0, missed_told BIGINT NOT NULL DEFAULT 0,
            created_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (stream, name));
        CREATE TABLE pending (
            stream TEXT NOT NULL, consumer TEXT NOT NULL, seq BIGINT NOT NULL, deliveries BIGINT NOT NULL,
            deadline DOUBLE PRECISION NOT NULL, PRIMARY KEY (stream, consumer, seq));
        CREATE INDEX pending_by_message ON pending(stream, seq);
        """ + PostgresWriter.repliesTable,
        captureColumns(integer: "BIGINT"),
        ownerColumns,
        maxAckPendingColumn(integer: "BIGINT"),
        deletedStreamsTable,
        idsColumn(integer: "BIGINT"),
    ]

    /// v2: a stream that captures the kernel's state (`capture_state` 1) keeps the state's
    /// sequence of the last change it holds (`captured_seq`), so a change is kept once however
    /// many processes capture it, and counts the times changes could not all be had.
    private static func captureColumns(integer: String) -> String {
        """
        ALTER TABLE streams ADD COLUMN capture_state \(integer) NOT NULL DEFAULT 0;
        ALTER TABLE streams ADD COLUMN captured_seq \(integer) NOT NULL DEFAULT 0;
        ALTER TABLE streams ADD COLUMN capture_gaps \(integer) NOT NULL DEFAULT 0;
        """
    }

    /// v3: the CURVE key that added each stream and consumer (NULL: added without CURVE, or
    /// by the service itself), which the rights to delete them and the per-key quotas read.
    private static let ownerColumns = """
        ALTER TABLE streams ADD COLUMN owner TEXT;
        ALTER TABLE consumers ADD COLUMN owner TEXT;
        CREATE INDEX consumers_by_owner ON consumers(owner);
        """

    /// v4: the most messages a consumer has pending at once (NULL: no limit).
    private static func maxAckPendingColumn(integer: String) -> String {
        "ALTER TABLE consumers ADD COLUMN max_ack_pending \(integer);"
    }

    /// v5: the streams deleted whose messages, ids and pending deliveries are still being
    /// removed, a transaction at a time (``StreamsDatabase/removeDeleted(_:_:atMost:after:)``).
    private static let deletedStreamsTable = "CREATE TABLE deleted_streams (name TEXT PRIMARY KEY);"

    /// v6: how many publishers' ids each stream remembers, kept with every id remembered and
    /// forgotten as `messages` is, so a publish knows without counting whether the stream
    /// remembers more than its `max_messages` (``StreamsDatabase/forgetIDs(_:_:removingAtMost:now:)``).
    private static func idsColumn(integer: String) -> String {
        """
        ALTER TABLE streams ADD COLUMN ids \(integer) NOT NULL DEFAULT 0;
        UPDATE streams SET ids = (SELECT COUNT(*) FROM message_ids WHERE message_ids.stream = streams.name);
        """
    }

    /// The PostgreSQL schema (namespace) the tables are in, and the lock migrating takes.
    static let postgresSchema = "switchboard_streams"
    static let postgresMigrationLock: Int64 = 7_214_030
}
