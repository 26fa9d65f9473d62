import Logging
import ZeroMQ

/// The kernel's ZeroMQ Authentication Protocol handler (RFC 27/ZAP) for CURVE.
///
/// libzmq asks it, over `inproc://zeromq.zap.01` in the kernel's context, about every
/// connection to a CURVE-secured kernel socket. A peer is admitted only if its public key
/// is on an allow-list; its user id ("worker:KEY" or "client:KEY", an operator's key too)
/// then travels with each of its messages, which is how the broker refuses a READY from a
/// client key and what only operators may ask from anyone else (``Peer``).
final class ZAPHandler {
    static let endpoint = "inproc://zeromq.zap.01"
    static let workerPrefix = "worker:"
    static let clientPrefix = "client:"
    /// The ZAP domain of the pair endpoint, where only the kernel's own key is admitted.
    static let pairDomain = "switchboard-pair"

    /// The allow-lists may change while it serves (``KernelParts/reconfigure(_:)``).
    var security: KernelSecurity
    /// Its refusals: one per connection attempt, bounded in the log.
    let peerLog: PeerEventLog
    private(set) var refused = 0
    /// Replies for the handler's socket: taken after each request.
    var outbox = Outbox()

    /// The kernel's public key: the pair's peer holds the same key pair.
    private let ownPublicKey: String?

    init(security: KernelSecurity, logger: Logger) {
        self.security = security
        peerLog = PeerEventLog(logger: logger)
        ownPublicKey = try? CurveKeyPair.publicKey(forSecretKey: security.secretKey)
    }

    func handle(_ request: Message) {
        if let reply = answer(request) { outbox.send(reply) }
    }

    /// The reply to one request as a ROUTER receives it: [peer, empty, version, id,
    /// domain, address, identity, mechanism, credentials...].
    func answer(_ request: Message) -> Message? {
        guard request.count >= 8, request[1].isEmpty else { return nil }
        let envelope = Array(request.frames[0...1])
        let requestID = request[3]
        func reply(_ status: String, _ text: String, user: String = "") -> Message {
            Message(envelope + [Frame("1.0"), requestID, Frame(status), Frame(text), Frame(user), Frame()])
        }
        guard request[2].string == "1.0" else { return reply("400", "unsupported ZAP version") }
        let address = request[5].string ?? "?"
        guard request[7].string == "CURVE", request.count >= 9, request[8].count == 32, let key = Z85.encode(request[8].bytes) else {
            refused += 1
            peerLog.warning("refused a connection without a CURVE key", metadata: ["address": "\(address)"])
            return reply("400", "CURVE required")
        }
        if request[4].string == Self.pairDomain {
            if key == ownPublicKey { return reply("200", "OK", user: "kernel:" + key) }
            refused += 1
            peerLog.warning("refused a key on the pair endpoint: only the kernel's own key may connect there", metadata: ["address": "\(address)", "key": "\(key)"])
            return reply("400", "key not allowed")
        }
        // The kernel's own key elsewhere: the pair's peer asking whether this kernel still
        // serves (an 8/MMI question, as a client).
        if security.workerKeys.contains(key) || security.serviceKeys[key] != nil { return reply("200", "OK", user: Self.workerPrefix + key) }
        if key == ownPublicKey { return reply("200", "OK", user: Self.clientPrefix + key) }
        if security.clientKeys.contains(key) || security.operatorKeys.contains(key) { return reply("200", "OK", user: Self.clientPrefix + key) }
        refused += 1
        peerLog.warning("refused an unknown CURVE key", metadata: ["address": "\(address)", "key": "\(key)"])
        return reply("400", "key not allowed")
    }
}
