import Foundation
import Testing
import ZeroMQ

/// Thrown when a bounded wait in a test runs out.
struct TimedOut: Error, CustomStringConvertible {
    let what: String
    var description: String { "timed out: \(what)" }
}

/// Runs `body`, failing with ``TimedOut`` if it takes longer than `seconds`.
func within<T: Sendable>(
    _ seconds: Double, _ what: String = "operation",
    _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    try await withThrowingTaskGroup(of: T.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: .seconds(seconds))
            throw TimedOut(what: what)
        }
        defer { group.cancelAll() }
        return try await group.next()!
    }
}

/// A fresh temporary directory, for ipc:// endpoints and files.
func temporaryDirectory() throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("sb-test-\(UUID().uuidString.prefix(8))")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

/// A unique inproc:// endpoint.
func inprocEndpoint(_ label: String = "t") -> String { "inproc://\(label)-\(UUID().uuidString)" }

/// Sets a receive timeout so a blocking receive in a test can never hang.
func bounded(_ socket: ZMQSocket, milliseconds: Int32 = 5_000) throws -> ZMQSocket {
    try socket.set(.receiveTimeout, milliseconds)
    try socket.set(.sendTimeout, milliseconds)
    return socket
}
