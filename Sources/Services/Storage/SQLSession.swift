import Foundation
package import GRDB

/// A value as SQL statements take and give them, on either engine.
package enum SQLValue: Sendable, Equatable {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob([UInt8])
}

/// Values that become ``SQLValue``s as arguments.
package protocol SQLArgument {
    var sqlValue: SQLValue { get }
}

extension Int: SQLArgument { package var sqlValue: SQLValue { .integer(Int64(self)) } }
extension Double: SQLArgument { package var sqlValue: SQLValue { .real(self) } }
extension String: SQLArgument { package var sqlValue: SQLValue { .text(self) } }
extension [UInt8]: SQLArgument { package var sqlValue: SQLValue { .blob(self) } }
extension SQLValue: SQLArgument { package var sqlValue: SQLValue { self } }
extension Optional: SQLArgument where Wrapped: SQLArgument {
    package var sqlValue: SQLValue { self?.sqlValue ?? .null }
}

/// A row a query answered: its columns' names and values, in the query's order.
package struct SQLRow: Sendable {
    package let columns: [String]
    package let values: [SQLValue]

    package init(columns: [String], values: [SQLValue]) { (self.columns, self.values) = (columns, values) }

    /// The value of `column`, as the database answered it.
    package func value(_ column: String) throws -> SQLValue {
        guard let index = columns.firstIndex(of: column) else { throw SQLRowError(column: column, problem: "is not in the row") }
        return values[index]
    }

    package func int(_ column: String) throws -> Int {
        switch try value(column) {
        case .integer(let value): return Int(value)
        case .real(let value): if let exact = Int(exactly: value) { return exact }
        default: break
        }
        throw SQLRowError(column: column, problem: "is not an integer")
    }

    package func optionalInt(_ column: String) throws -> Int? {
        if case .null = try value(column) { return nil }
        return try int(column)
    }

    package func double(_ column: String) throws -> Double {
        switch try value(column) {
        case .real(let value): return value
        case .integer(let value): return Double(value)
        default: throw SQLRowError(column: column, problem: "is not a number")
        }
    }

    package func optionalDouble(_ column: String) throws -> Double? {
        if case .null = try value(column) { return nil }
        return try double(column)
    }

    package func text(_ column: String) throws -> String {
        guard case .text(let value) = try value(column) else { throw SQLRowError(column: column, problem: "is not text") }
        return value
    }

    package func optionalText(_ column: String) throws -> String? {
        if case .null = try value(column) { return nil }
        return try text(column)
    }

    package func blob(_ column: String) throws -> [UInt8] {
        switch try value(column) {
        case .blob(let value): return value
        case .text(let value): return Array(value.utf8)
        default: throw SQLRowError(column: column, problem: "is not bytes")
        }
    }

    /// True for any integer but 0 (SQLite answers a condition as 0 or 1, PostgreSQL as a boolean).
    package func bool(_ column: String) throws -> Bool { try int(column) != 0 }
}

package struct SQLRowError: Error, CustomStringConvertible {
    let column: String
    let problem: String
    package var description: String { "column \(column) \(problem)" }
}

/// Placeholders for statements that take several rows (or several values) at once.
package enum SQLRows {
    /// `(?, ?), (?, ?)` for 2 rows of 2 columns: for `VALUES`, or `IN` with one row.
    package static func placeholders(rows: Int, columns: Int) -> String {
        let row = "(" + Array(repeating: "?", count: columns).joined(separator: ", ") + ")"
        return Array(repeating: row, count: rows).joined(separator: ", ")
    }
}

/// One transaction on a database, as the code that runs in it sees it: statements with `?`
/// for each argument, in SQL both engines run. A service's database code is written once
/// against this, and runs in SQLite's transactions (GRDB's `Database`) and PostgreSQL's
/// (``PostgresSession``).
package protocol SQLSession {
    /// Runs a statement; answers the rows it changed.
    @discardableResult
    func execute(_ sql: String, _ arguments: [any SQLArgument]) throws -> Int
    /// Runs a query; answers its rows.
    func rows(_ sql: String, _ arguments: [any SQLArgument]) throws -> [SQLRow]
    /// What to append to a `SELECT` of rows of `table` (its name or alias in the query) the
    /// transaction will change, so that writers on other connections wait for this one
    /// (" FOR UPDATE OF table" on PostgreSQL; SQLite has one writer at a time already).
    func lockingRead(of table: String) -> String
    /// Makes the transaction's writers one at a time across every connection, until it ends,
    /// for changes no row lock covers (PostgreSQL's advisory lock `key`).
    func lockAll(_ key: Int64) throws
    /// Waits for the transaction holding ``lockAll(_:)`` with `key`, and keeps the next one
    /// out until this one ends, beside others doing the same: for reads that must see the
    /// changes that lock guards either all made or none begun (PostgreSQL's shared advisory
    /// lock `key`).
    func shareLock(_ key: Int64) throws
}

extension SQLSession {
    /// The first row, if any.
    package func row(_ sql: String, _ arguments: [any SQLArgument] = []) throws -> SQLRow? {
        try rows(sql, arguments).first
    }

    /// The first column of the first row as an integer, nil when there is no row or it is NULL.
    package func int(_ sql: String, _ arguments: [any SQLArgument] = []) throws -> Int? {
        guard let row = try rows(sql, arguments).first, let column = row.columns.first else { return nil }
        return try row.optionalInt(column)
    }

    /// The first column of every row, as text.
    package func texts(_ sql: String, _ arguments: [any SQLArgument] = []) throws -> [String] {
        try rows(sql, arguments).map { row in
            guard let column = row.columns.first else { throw SQLRowError(column: "1", problem: "is not in the row") }
            return try row.text(column)
        }
    }
}

/// Each statement is prepared once per connection and kept (GRDB's statement cache): a
/// service's SQL is a fixed set of single statements.
extension Database: SQLSession {
    @discardableResult
    package func execute(_ sql: String, _ arguments: [any SQLArgument]) throws -> Int {
        try cachedStatement(sql: sql).execute(arguments: Self.arguments(arguments))
        return changesCount
    }

    package func rows(_ sql: String, _ arguments: [any SQLArgument]) throws -> [SQLRow] {
        try Row.fetchAll(cachedStatement(sql: sql), arguments: Self.arguments(arguments)).map { row in
            SQLRow(columns: Array(row.columnNames), values: row.databaseValues.map { value in
                switch value.storage {
                case .null: .null
                case .int64(let value): .integer(value)
                case .double(let value): .real(value)
                case .string(let value): .text(value)
                case .blob(let value): .blob(Array(value))
                }
            })
        }
    }

    package func lockingRead(of table: String) -> String { "" }

    package func lockAll(_ key: Int64) throws {}

    package func shareLock(_ key: Int64) throws {}

    private static func arguments(_ arguments: [any SQLArgument]) -> StatementArguments {
        StatementArguments(arguments.map { argument -> DatabaseValue in
            switch argument.sqlValue {
            case .null: .null
            case .integer(let value): value.databaseValue
            case .real(let value): value.databaseValue
            case .text(let value): value.databaseValue
            case .blob(let value): Data(value).databaseValue
            }
        })
    }
}
