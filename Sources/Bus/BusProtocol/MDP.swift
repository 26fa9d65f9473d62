@_exported public import Frames

/// 7/MDP, the Majordomo Protocol (MDP/0.1): frames exactly as in the RFC.
///
/// Messages are shown as the application sees them. On the broker's ROUTER socket
/// every message starts with one more frame, the peer's routing id; the broker-side
/// decoder and encoders take and give that frame explicitly.
public enum MDP {
    /// The client sub-protocol header, MDP/Client v0.1.
    public static let clientHeader = "MDPC01"
    /// The worker sub-protocol header, MDP/Worker v0.1.
    public static let workerHeader = "MDPW01"

    /// Worker sub-protocol command codes (frame 2).
    public enum Command: UInt8, Sendable, CustomStringConvertible {
        case ready = 0x01, request = 0x02, reply = 0x03, heartbeat = 0x04, disconnect = 0x05

        public var description: String {
            switch self {
            case .ready: "READY"; case .request: "REQUEST"; case .reply: "REPLY"
            case .heartbeat: "HEARTBEAT"; case .disconnect: "DISCONNECT"
            }
        }
    }

    /// The largest message part a Switchboard kernel accepts unless configured otherwise
    /// (`kernel.max_message_size`, 64 MiB); libzmq drops a peer that sends a bigger one.
    public static let defaultMaxMessageSize = 64 * 1024 * 1024

    /// The most requests a worker may hold in flight on one connection (extension).
    public static let maxWindow = 4_096

    /// The longest service name accepted.
    public static let maxServiceNameLength = 255

    /// What a usable service name is, for error messages.
    public static let serviceNameRule = "1 to \(maxServiceNameLength) printable ASCII characters"

    /// Whether `name` is a usable service name: 1 to 255 printable ASCII characters.
    public static func isValidServiceName(_ name: String) -> Bool {
        isValidServiceName(name.utf8)
    }

    private static func isValidServiceName(_ bytes: some Collection<UInt8>) -> Bool {
        !bytes.isEmpty && bytes.count <= maxServiceNameLength && bytes.allSatisfy { $0 >= 0x21 && $0 <= 0x7E }
    }
}

/// A command a worker sends to the broker.
///
/// `window`, `errors` and `drain` are the Switchboard worker extension (docs/PROTOCOL.md):
/// a plain 7/MDP worker never sends them, and encoding the defaults gives plain MDP frames.
public enum WorkerToBroker: Sendable, Equatable {
    /// READY; `window` (1 or more) says the worker speaks the extension and takes that many
    /// requests in flight on this connection; nil: a plain 7/MDP worker (one at a time).
    case ready(service: String, window: Int? = nil)
    /// `body`: the frames after the empty one, in the message they arrived in when decoded.
    case reply(client: Frame, body: ArraySlice<Frame>)
    /// HEARTBEAT; `errors`: how many replies on this connection were JSON-RPC errors.
    case heartbeat(errors: Int? = nil)
    /// HEARTBEAT `drain=1`: send no more requests; DISCONNECT follows once those in
    /// flight are answered.
    case drain
    case disconnect
}

/// A command the broker sends to a worker.
public enum BrokerToWorker: Sendable, Equatable {
    case request(client: Frame, body: [Frame])
    case heartbeat
    /// HEARTBEAT `drain=1` (extension workers only): no request follows on this connection;
    /// answer those in flight, then DISCONNECT and leave.
    case drain
    case disconnect
}

/// What arrives on the broker's ROUTER socket.
public enum BrokerInbound: Sendable, Equatable {
    /// A client's REQUEST: `client` is its routing id; `body` the frames after the service
    /// name, in the message they arrived in (the broker passes them on without copying).
    case request(client: Frame, service: String, body: ArraySlice<Frame>)
    /// A worker command: `worker` is its routing id.
    case worker(Frame, WorkerToBroker)
}

/// A REPLY as a client receives it.
public struct ClientReply: Sendable, Equatable {
    public var service: String
    public var body: [Frame]
    public init(service: String, body: [Frame]) {
        self.service = service
        self.body = body
    }
}

extension MDP {
    private static let empty = Frame()
    private static let clientHeaderFrame = Frame(clientHeader)
    private static let workerHeaderFrame = Frame(workerHeader)
    private static let commandFrames: [Frame] = (0...5).map { Frame([UInt8($0)]) }
    private static let drainFrame = Frame("drain=1")

    // MARK: Encoders

    /// A client's REQUEST, for a DEALER socket: `["", "MDPC01", service, body…]`.
    public static func request(service: String, body: [Frame]) -> Message {
        Message([empty, clientHeaderFrame, Frame(service)] + body)
    }

    /// A REPLY to a client, for the broker's ROUTER: `[client, "", "MDPC01", service, body…]`.
    public static func reply(to client: Frame, service: String, body: [Frame]) -> Message {
        reply(to: client, serviceFrame: Frame(service), body: body)
    }

    /// The same with the service frame as the client sent it (even one that is no usable name).
    public static func reply(to client: Frame, serviceFrame: Frame, body: [Frame]) -> Message {
        reply(to: client, serviceFrame: serviceFrame, body: body[...])
    }

    /// The same with the body as a slice of the message it arrived in.
    public static func reply(to client: Frame, serviceFrame: Frame, body: ArraySlice<Frame>) -> Message {
        message((client, empty, clientHeaderFrame, serviceFrame), nil, body)
    }

    /// `head`'s frames, then `body`'s, in one array sized once (appending a body to an array
    /// literal would allocate twice); `head` is a tuple's worth of frames, not an array.
    private static func message(_ head: (Frame, Frame, Frame, Frame), _ more: (Frame, Frame)?,
                                _ body: ArraySlice<Frame>) -> Message {
        var frames: [Frame] = []
        frames.reserveCapacity(6 + body.count)
        frames.append(head.0)
        frames.append(head.1)
        frames.append(head.2)
        frames.append(head.3)
        if let more {
            frames.append(more.0)
            frames.append(more.1)
        }
        frames.append(contentsOf: body)
        return Message(frames)
    }

    /// A worker command, for the worker's DEALER socket.
    public static func encode(_ command: WorkerToBroker) -> Message {
        switch command {
        case .ready(let service, let window):
            let ready: Message = [empty, workerHeaderFrame, commandFrames[1], Frame(service)]
            return window.map { ready + [Frame("window=\($0)")] } ?? ready
        case .reply(let client, let body):
            return Message([empty, workerHeaderFrame, commandFrames[3], client, empty] + body)
        case .heartbeat(let errors):
            let heartbeat: Message = [empty, workerHeaderFrame, commandFrames[4]]
            return errors.map { heartbeat + [Frame("errors=\($0)")] } ?? heartbeat
        case .drain:
            return [empty, workerHeaderFrame, commandFrames[4], drainFrame]
        case .disconnect:
            return [empty, workerHeaderFrame, commandFrames[5]]
        }
    }

    /// A broker command to `worker`, for the broker's ROUTER socket.
    public static func encode(_ command: BrokerToWorker, to worker: Frame) -> Message {
        switch command {
        case .request(let client, let body):
            return request(to: worker, client: client, body: body[...])
        case .heartbeat:
            return [worker, empty, workerHeaderFrame, commandFrames[4]]
        case .drain:
            return [worker, empty, workerHeaderFrame, commandFrames[4], drainFrame]
        case .disconnect:
            return [worker, empty, workerHeaderFrame, commandFrames[5]]
        }
    }

    /// A REQUEST to `worker` for the broker's ROUTER: `[worker, "", "MDPW01", 0x02, client, "", body…]`.
    public static func request(to worker: Frame, client: Frame, body: ArraySlice<Frame>) -> Message {
        message((worker, empty, workerHeaderFrame, commandFrames[2]), (client, empty), body)
    }

    // MARK: Decoders

    /// Decodes a message read from the broker's ROUTER socket (routing id first).
    public static func decodeAtBroker(_ message: Message) throws(ProtocolError) -> BrokerInbound {
        let frames = message.frames
        guard frames.count >= 3 else { throw ProtocolError("MDP", "message has \(frames.count) frames, expected at least 3") }
        let sender = frames[0]
        guard frames[1].isEmpty else { throw ProtocolError("MDP", "frame 1 must be empty (got \(frames[1].count) bytes)") }
        let header = frames[2]
        if header.equals(clientHeader) {
            guard frames.count >= 5 else { throw ProtocolError("MDP", "client REQUEST has \(frames.count - 1) frames, expected at least 4") }
            let service = try serviceName(frames[3], "client REQUEST")
            return .request(client: sender, service: service, body: frames[4...])
        }
        guard header.equals(workerHeader) else {
            throw ProtocolError("MDP", "unknown protocol header \(header)")
        }
        guard frames.count >= 4 else { throw ProtocolError("MDP", "worker message has no command frame") }
        let command = try workerCommand(frames[3])
        switch command {
        case .ready:
            guard frames.count == 5 || frames.count == 6 else {
                throw ProtocolError("MDP", "worker READY has \(frames.count - 1) frames, expected 4 (or 5 with a window)")
            }
            let service = try serviceName(frames[4], "worker READY")
            let window = frames.count == 6 ? try extensionValue(frames[5], "window", in: 1...maxWindow) : nil
            return .worker(sender, .ready(service: service, window: window))
        case .reply:
            guard frames.count >= 7 else { throw ProtocolError("MDP", "worker REPLY has \(frames.count - 1) frames, expected at least 6") }
            guard frames[5].isEmpty else { throw ProtocolError("MDP", "worker REPLY frame 4 must be empty") }
            return .worker(sender, .reply(client: frames[4], body: frames[6...]))
        case .heartbeat:
            guard frames.count == 4 || frames.count == 5 else {
                throw ProtocolError("MDP", "worker HEARTBEAT has \(frames.count - 1) frames, expected 3 (or 4 with an error count or drain=1)")
            }
            if frames.count == 5, frames[4] == drainFrame { return .worker(sender, .drain) }
            let errors = frames.count == 5 ? try extensionValue(frames[4], "errors", in: 0...Int.max) : nil
            return .worker(sender, .heartbeat(errors: errors))
        case .disconnect:
            guard frames.count == 4 else { throw ProtocolError("MDP", "worker DISCONNECT has \(frames.count - 1) frames, expected 3") }
            return .worker(sender, .disconnect)
        case .request:
            throw ProtocolError("MDP", "a worker may not send REQUEST")
        }
    }

    /// Decodes a message a worker's DEALER socket received from the broker.
    public static func decodeAtWorker(_ message: Message) throws(ProtocolError) -> BrokerToWorker {
        let frames = message.frames
        guard frames.count >= 3 else { throw ProtocolError("MDP", "message has \(frames.count) frames, expected at least 3") }
        guard frames[0].isEmpty else { throw ProtocolError("MDP", "frame 0 must be empty") }
        guard frames[1].equals(workerHeader) else { throw ProtocolError("MDP", "expected header MDPW01, got \(frames[1])") }
        switch try workerCommand(frames[2]) {
        case .request:
            guard frames.count >= 6 else { throw ProtocolError("MDP", "broker REQUEST has \(frames.count) frames, expected at least 6") }
            guard frames[4].isEmpty else { throw ProtocolError("MDP", "broker REQUEST frame 4 must be empty") }
            return .request(client: frames[3], body: Array(frames[5...]))
        case .heartbeat:
            if frames.count == 4, frames[3] == drainFrame { return .drain }
            guard frames.count == 3 else { throw ProtocolError("MDP", "broker HEARTBEAT has \(frames.count) frames, expected 3 (or 4 with drain=1)") }
            return .heartbeat
        case .disconnect:
            guard frames.count == 3 else { throw ProtocolError("MDP", "broker DISCONNECT has \(frames.count) frames, expected 3") }
            return .disconnect
        case .ready, .reply:
            throw ProtocolError("MDP", "a broker may not send \(try workerCommand(frames[2]))")
        }
    }

    /// Decodes a REPLY a client's DEALER socket received.
    public static func decodeAtClient(_ message: Message) throws(ProtocolError) -> ClientReply {
        let frames = message.frames
        guard frames.count >= 4 else { throw ProtocolError("MDP", "client REPLY has \(frames.count) frames, expected at least 4") }
        guard frames[0].isEmpty else { throw ProtocolError("MDP", "frame 0 must be empty") }
        guard frames[1].equals(clientHeader) else { throw ProtocolError("MDP", "expected header MDPC01, got \(frames[1])") }
        // The service frame echoes the request's, whatever it held: a broker answers a
        // request for an unusable name too.
        return ClientReply(service: String(decoding: frames[2].bytes, as: UTF8.self), body: Array(frames[3...]))
    }

    private static func workerCommand(_ frame: Frame) throws(ProtocolError) -> Command {
        guard frame.count == 1, let command = frame.withUnsafeBytes({ Command(rawValue: $0[0]) }) else {
            throw ProtocolError("MDP", "unknown worker command \(frame)")
        }
        return command
    }

    /// The number in an extension frame `NAME=DIGITS`.
    private static func extensionValue(_ frame: Frame, _ name: String, in range: ClosedRange<Int>) throws(ProtocolError) -> Int {
        guard let text = frame.string, text.hasPrefix(name + "="), let value = Int(text.dropFirst(name.count + 1)),
              range.contains(value) else {
            throw ProtocolError("MDP", "expected \(name)=N with N in \(range.lowerBound)...\(range.upperBound), got \(frame)")
        }
        return value
    }

    private static func serviceName(_ frame: Frame, _ context: String) throws(ProtocolError) -> String {
        // Checked on the bytes, then read as ASCII: no UTF-8 validation per request.
        let name: String? = frame.withUnsafeBytes { raw in
            isValidServiceName(raw) ? String(decoding: raw, as: UTF8.self) : nil
        }
        guard let name else { throw ProtocolError("MDP", "\(context): service name must be \(serviceNameRule)") }
        return name
    }
}

/// 8/MMI, the Majordomo Management Interface: services named `mmi.*` are the broker's.
public enum MMI {
    /// Whether `service` is in the broker's own namespace.
    public static func isManagement(_ service: String) -> Bool { service.hasPrefix("mmi.") }

    /// The one MMI service: whether a worker serves the service named in the body.
    public static let serviceQuery = "mmi.service"

    /// The answer to an MMI request: "200" (a worker is registered for the service named in
    /// the body), "404" (none is), or "501" for any other `mmi.*` service.
    public static func answer(service: String, body: [Frame], isRegistered: (String) -> Bool) -> String {
        guard service == serviceQuery else { return "501" }
        guard let name = body.first?.string else { return "404" }
        return isRegistered(name) ? "200" : "404"
    }
}
