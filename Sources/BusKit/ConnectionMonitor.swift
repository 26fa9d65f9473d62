import Foundation
import ZeroMQ

/// A PAIR socket that receives `socket`'s connect and disconnect events (as
/// ``SocketEvent``): how the client, the workers and subscriptions tell a kernel restart
/// from a quiet kernel. Call before `socket` connects, so no event is missed.
func connectionEvents(of socket: ZMQSocket, in context: ZMQContext) throws -> ZMQSocket {
    let endpoint = "inproc://connection-monitor-\(UUID().uuidString)"
    try socket.monitor(endpoint, events: [.connected, .disconnected])
    let pair = try ZMQSocket(context, .pair)
    try pair.connect(endpoint)
    return pair
}
