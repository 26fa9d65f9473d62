import Foundation
import Testing
import ZeroMQ
@_exported import SwitchboardTestSupport

/// A unique inproc:// endpoint.
func inprocEndpoint(_ label: String = "t") -> String { "inproc://\(label)-\(UUID().uuidString)" }

/// Sets a receive timeout so a blocking receive in a test can never hang.
func bounded(_ socket: ZMQSocket, milliseconds: Int32 = 5_000) throws -> ZMQSocket {
    try socket.set(.receiveTimeout, milliseconds)
    try socket.set(.sendTimeout, milliseconds)
    return socket
}
