@_exported public import Frames

/// The Majordomo Protocol, both versions on one broker socket: 7/MDP (MDP/0.1, one REPLY
/// per request) and 18/MDP (MDP/0.2, zero or more PARTIAL replies and one FINAL), frames
/// exactly as in the RFCs. 0.2 drops 0.1's empty first frame and numbers the worker's
/// commands differently; each message says its version in its header frame.
///
/// Messages are shown as the application sees them. On the broker's ROUTER socket
/// every message starts with one more frame, the peer's routing id; the broker-side
/// decoder and encoders take and give that frame explicitly.
public enum MDP {
    /// The client sub-protocol header, MDP/Client v0.1.
    public static let clientHeader = "MDPC01"
    /// The worker sub-protocol header, MDP/Worker v0.1.
    public static let workerHeader = "MDPW01"
    /// The 18/MDP headers, MDP/Client and MDP/Worker v0.2.
    public static let clientHeader02 = "MDPC02"
    public static let workerHeader02 = "MDPW02"

    /// Which Majordomo a peer speaks: 7/MDP (0.1) or 18/MDP (0.2, replies in parts).
    public enum Version: Sendable, Equatable, CustomStringConvertible {
        case v01, v02
        public var description: String { self == .v01 ? "MDP/0.1" : "MDP/0.2" }
    }

    /// 18/MDP's worker command codes (0.1's are ``Command``).
    enum WorkerCommand02: UInt8 {
        case ready = 0x01, request = 0x02, partial = 0x03, final = 0x04, heartbeat = 0x05, disconnect = 0x06
    }

    /// 18/MDP's client command codes; `cancel` is the Switchboard client extension
    /// (docs/PROTOCOL.md, "Cancel").
    enum ClientCommand02: UInt8 {
        case request = 0x01, partial = 0x02, final = 0x03, cancel = 0x04
    }

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
    /// A request for `all:SERVICE` goes to every worker of SERVICE (a Switchboard extension,
    /// docs/PROTOCOL.md "A request to every worker"); no worker may register such a name.
    public static let everyWorkerPrefix = "all:"

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
/// `window`, `callers`, `errors` and `drain` are the Switchboard worker extension
/// (docs/PROTOCOL.md): a plain 7/MDP worker never sends them, and encoding the defaults gives
/// plain MDP frames.
public enum WorkerToBroker: Sendable, Equatable {
    /// READY; `window` (1 or more) says the worker speaks the extension and takes that many
    /// requests in flight on this connection; nil: a plain 7/MDP worker (one at a time).
    /// `callers` (with a window only): each REQUEST is to carry who sent it
    /// (``MDP/callerPart``). `cell` (with a window only): the worker is another cell's kernel
    /// offering its own workers of the service (docs/CELLS.md), served only when this kernel
    /// has none of its own, and never handed a request another cell sent here.
    case ready(service: String, window: Int? = nil, callers: Bool = false, cell: String? = nil)
    /// The last (0.1: only) reply to a request: 7/MDP's REPLY, 18/MDP's FINAL. `body`: the
    /// frames after the empty one, in the message they arrived in when decoded.
    case reply(client: Frame, body: ArraySlice<Frame>)
    /// 18/MDP's PARTIAL: one more part of the reply; the request stays in flight.
    case partial(client: Frame, body: ArraySlice<Frame>)
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
    /// HEARTBEAT `stop=1` and the client frame of a request in flight (extension workers
    /// only): nobody reads that request's parts any more; end it with its FINAL now.
    case stop(client: Frame)
    case disconnect
}

/// What arrives on the broker's ROUTER socket.
public enum BrokerInbound: Sendable, Equatable {
    /// A client's REQUEST: `client` is its routing id; `body` the frames after the service
    /// name, in the message they arrived in (the broker passes them on without copying).
    case request(client: Frame, service: String, body: ArraySlice<Frame>, version: MDP.Version = .v01)
    /// A worker command: `worker` is its routing id.
    case worker(Frame, WorkerToBroker, version: MDP.Version = .v01)
    /// A client's CANCEL (18/MDP, the client extension): it no longer wants the answer to
    /// the REQUEST it sent with this service and body.
    case cancel(client: Frame, service: String, body: ArraySlice<Frame>)
}

/// A reply as a client receives it: 7/MDP's REPLY and 18/MDP's FINAL are final, an 18/MDP
/// PARTIAL is not (more follows).
public struct ClientReply: Sendable, Equatable {
    public var service: String
    public var body: [Frame]
    public var isFinal: Bool
    public init(service: String, body: [Frame], isFinal: Bool = true) {
        self.service = service
        self.body = body
        self.isFinal = isFinal
    }
}

extension MDP {
    private static let empty = Frame()
    private static let clientHeaderFrame = Frame(clientHeader)
    private static let workerHeaderFrame = Frame(workerHeader)
    private static let clientHeader02Frame = Frame(clientHeader02)
    private static let workerHeader02Frame = Frame(workerHeader02)
    private static let commandFrames: [Frame] = (0...6).map { Frame([UInt8($0)]) }
    private static let drainFrame = Frame("drain=1")
    private static let stopFrame = Frame("stop=1")
    private static let callersFrame = Frame("callers=1")
    private static let cellPrefix = "cell="

    /// Whether `name` may name a cell: 1 to 63 letters, digits, `.`, `_` or `-`.
    public static func isValidCellName(_ name: String) -> Bool {
        (1...63).contains(name.utf8.count) && name.utf8.allSatisfy { byte in
            (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte) || byte == 0x2E || byte == 0x5F || byte == 0x2D
        }
    }
    public static let cellNameRule = "1 to 63 letters, digits, '.', '_' or '-'"

    /// Where a REQUEST to a worker whose READY said `callers=1` carries who sent it: the
    /// body's first frame, before the request's own (the worker extension). It holds the
    /// sender's CURVE user id as the kernel authenticated it and ranks it now (`client:KEY`,
    /// `operator:KEY`, `worker:KEY`), empty when nobody can be told apart (no CURVE).
    public static let callerPart = 0

    // MARK: Encoders

    /// A client's REQUEST, for a DEALER socket: `["", "MDPC01", service, body…]`, or in 0.2
    /// `["MDPC02", 0x01, service, body…]`.
    public static func request(service: String, body: [Frame], version: Version = .v01) -> Message {
        // One array, made at its size (a literal joined to the body made two).
        var frames: [Frame] = []
        frames.reserveCapacity(3 + body.count)
        switch version {
        case .v01:
            frames.append(empty)
            frames.append(clientHeaderFrame)
        case .v02:
            frames.append(clientHeader02Frame)
            frames.append(commandFrames[Int(ClientCommand02.request.rawValue)])
        }
        frames.append(Frame(service))
        frames.append(contentsOf: body)
        return Message(frames)
    }

    /// A client's CANCEL of `request` (the client extension), for a DEALER socket: the 0.2
    /// REQUEST's frames as ``request(service:body:version:)`` made them, its command 0x04
    /// (`["MDPC02", 0x04, service, body…]`); nil for a 0.1 one, which cannot be cancelled.
    public static func cancel(of request: Message) -> Message? {
        guard request.count >= 4, request[0] == clientHeader02Frame, request[1] == commandFrames[Int(ClientCommand02.request.rawValue)] else { return nil }
        var frames = request.frames
        frames[1] = commandFrames[Int(ClientCommand02.cancel.rawValue)]
        return Message(frames)
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
        reply(to: client, serviceFrame: serviceFrame, body: body, version: .v01)
    }

    /// A reply to a client of either version: 0.1's REPLY (always final), or 0.2's FINAL or
    /// PARTIAL `[client, "MDPC02", 0x03 or 0x02, service, body…]`.
    public static func reply(to client: Frame, serviceFrame: Frame, body: ArraySlice<Frame>, version: Version, final: Bool = true) -> Message {
        var frames: [Frame] = []
        frames.reserveCapacity(4 + body.count)
        BrokerReply(to: client, serviceFrame: serviceFrame, body: body, version: version, final: final).appendFrames(to: &frames)
        return Message(frames)
    }

    /// A reply to a client as the broker writes it into its outbox: the body is a slice of
    /// the message it arrived in, sent on uncopied.
    public struct BrokerReply: MessageEncoding {
        public var client: Frame
        public var serviceFrame: Frame
        public var body: ArraySlice<Frame>
        public var version: Version
        public var final: Bool

        public init(to client: Frame, serviceFrame: Frame, body: ArraySlice<Frame>, version: Version, final: Bool = true) {
            (self.client, self.serviceFrame, self.body, self.version, self.final) = (client, serviceFrame, body, version, final)
        }

        public func appendFrames(to frames: inout [Frame]) {
            frames.append(client)
            switch version {
            case .v01:
                precondition(final, "7/MDP has no partial replies")
                frames.append(empty)
                frames.append(clientHeaderFrame)
            case .v02:
                let command = final ? ClientCommand02.final : ClientCommand02.partial
                frames.append(clientHeader02Frame)
                frames.append(commandFrames[Int(command.rawValue)])
            }
            frames.append(serviceFrame)
            frames.append(contentsOf: body)
        }
    }

    /// A worker command, for the worker's DEALER socket.
    public static func encode(_ command: WorkerToBroker, version: Version = .v01) -> Message {
        switch command {
        case .ready(let service, let window, let callers, let cell):
            var extras: [Frame] = []
            if window != nil, callers { extras.append(callersFrame) }
            if window != nil, let cell { extras.append(Frame(cellPrefix + cell)) }
            return workerMessage(to: nil, .ready, version, Frame(service), window.map { Frame("window=\($0)") }, body: extras[...])
        case .reply(let client, let body):
            return workerMessage(to: nil, .final, version, client, empty, body: body)
        case .partial(let client, let body):
            return workerMessage(to: nil, .partial, version, client, empty, body: body)
        case .heartbeat(let errors):
            return workerMessage(to: nil, .heartbeat, version, errors.map { Frame("errors=\($0)") })
        case .drain:
            return workerMessage(to: nil, .heartbeat, version, drainFrame)
        case .disconnect:
            return workerMessage(to: nil, .disconnect, version)
        }
    }

    /// A broker command to `worker`, for the broker's ROUTER socket, in the worker's version.
    public static func encode(_ command: BrokerToWorker, to worker: Frame, version: Version = .v01) -> Message {
        switch command {
        case .request(let client, let body): request(to: worker, client: client, body: body[...], version: version)
        case .heartbeat: workerMessage(to: worker, .heartbeat, version)
        case .drain: workerMessage(to: worker, .heartbeat, version, drainFrame)
        case .stop(let client): workerMessage(to: worker, .heartbeat, version, stopFrame, client)
        case .disconnect: workerMessage(to: worker, .disconnect, version)
        }
    }

    /// A REQUEST to `worker` for the broker's ROUTER: `[worker, "", "MDPW01", 0x02, client, "", body…]`,
    /// or in 0.2 `[worker, "MDPW02", 0x02, client, "", body…]`.
    public static func request(to worker: Frame, client: Frame, body: ArraySlice<Frame>, version: Version = .v01) -> Message {
        workerMessage(to: worker, .request, version, client, empty, body: body)
    }

    /// The same REQUEST's frames up to its body, appended to `frames` (for an encoding that
    /// appends the body from where the request keeps it: see ``MessageEncoding``).
    public static func appendRequestHead(to worker: Frame, client: Frame, version: Version = .v01, into frames: inout [Frame]) {
        appendWorkerMessage(to: worker, .request, version, client, empty, body: [], into: &frames)
    }

    /// A worker-protocol message in one array sized once (see ``appendWorkerMessage``).
    private static func workerMessage(to worker: Frame?, _ verb: WorkerVerb, _ version: Version, _ first: Frame? = nil,
                                      _ second: Frame? = nil, body: ArraySlice<Frame> = []) -> Message {
        var frames: [Frame] = []
        frames.reserveCapacity(6 + body.count)
        appendWorkerMessage(to: worker, verb, version, first, second, body: body, into: &frames)
        return Message(frames)
    }

    /// A worker-protocol message's frames: the routing id (on the broker's side), the
    /// version's head (0.1: `""`, `MDPW01`; 0.2: `MDPW02`), the command's code in that
    /// version, up to two frames after it, then `body`.
    private static func appendWorkerMessage(to worker: Frame?, _ verb: WorkerVerb, _ version: Version, _ first: Frame?,
                                            _ second: Frame?, body: ArraySlice<Frame>, into frames: inout [Frame]) {
        guard let code = verb.code(in: version) else { preconditionFailure("\(version) has no \(verb)") }
        if let worker { frames.append(worker) }
        if version == .v01 { frames.append(empty) }
        frames.append(version == .v01 ? workerHeaderFrame : workerHeader02Frame)
        frames.append(commandFrames[Int(code)])
        if let first { frames.append(first) }
        if let second { frames.append(second) }
        frames.append(contentsOf: body)
    }

    // MARK: Decoders

    /// Decodes a message read from the broker's ROUTER socket (routing id first).
    public static func decodeAtBroker(_ message: Message) throws(ProtocolError) -> BrokerInbound {
        try decodeAtBroker(parts: message.frames)
    }

    /// The same, read where the socket received it: headers compared in place, frames made
    /// only of the routing ids and the body, which the broker keeps.
    /// The body is a slice of an array the parts reuse when it was not kept.
    public static func decodeAtBroker(_ parts: ReceivedParts) throws(ProtocolError) -> BrokerInbound {
        try decodeAtBroker(parts: parts)
    }

    private static func decodeAtBroker(parts frames: some MessageParts) throws(ProtocolError) -> BrokerInbound {
        let count = frames.count
        guard count >= 3 else { throw ProtocolError("MDP", "message has \(count) frames, expected at least 3") }
        if frames.isEmpty(1) {
            if frames.part(2, equals: clientHeaderFrame) {
                guard count >= 5 else { throw ProtocolError("MDP", "client REQUEST has \(count - 1) frames, expected at least 4") }
                let service = try serviceName(frames, 3, "client REQUEST")
                return .request(client: frames.frame(0), service: service, body: frames.frames(from: 4))
            }
            guard frames.part(2, equals: workerHeaderFrame) else { throw ProtocolError("MDP", "unknown protocol header \(frames.frame(2))") }
            guard count >= 4 else { throw ProtocolError("MDP", "worker message has no command frame") }
            return .worker(frames.frame(0), try workerCommand(frames, at: 3, .v01))
        }
        if frames.part(1, equals: clientHeader02Frame) {
            // REQUEST first: it is the one on every request's path.
            let cancels = !frames.part(2, equals: commandFrames[Int(ClientCommand02.request.rawValue)])
            guard !cancels || frames.part(2, equals: commandFrames[Int(ClientCommand02.cancel.rawValue)]) else {
                throw ProtocolError("MDP", "a client may only send REQUEST (0x01) or CANCEL (0x04), got \(frames.frame(2))")
            }
            let name = cancels ? "client CANCEL" : "client REQUEST"
            guard count >= 5 else { throw ProtocolError("MDP", "\(name) has \(count - 1) frames, expected at least 4") }
            let service = try serviceName(frames, 3, name)
            return cancels ? .cancel(client: frames.frame(0), service: service, body: frames.frames(from: 4))
                : .request(client: frames.frame(0), service: service, body: frames.frames(from: 4), version: .v02)
        }
        guard frames.part(1, equals: workerHeader02Frame) else {
            throw ProtocolError("MDP", "frame 1 must be empty (7/MDP) or MDPC02 or MDPW02 (18/MDP), got \(frames.frame(1))")
        }
        return .worker(frames.frame(0), try workerCommand(frames, at: 2, .v02), version: .v02)
    }

    /// A worker's command whose command frame is `frames[at]`: the two versions differ in
    /// what comes before it (0.1's empty frame) and in the codes, not in what follows.
    /// Frame counts in errors are those after the routing id.
    private static func workerCommand(_ frames: some MessageParts, at index: Int, _ version: Version) throws(ProtocolError) -> WorkerToBroker {
        let before = index - 1  // frames before the command, after the routing id
        let after = frames.count - index - 1  // frames after the command
        func count(_ name: String, _ expected: String) -> ProtocolError {
            ProtocolError("MDP", "worker \(name) has \(frames.count - 1) frames, expected \(expected)")
        }
        let verb = try workerVerb(frames, at: index, version)
        switch verb {
        case .ready:
            guard (1...4).contains(after) else {
                throw count("READY", "\(before + 2) (or \(before + 3) with a window, one more each for callers=1 and cell=NAME)")
            }
            let service = try serviceName(frames, index + 1, "worker READY")
            let window = after >= 2 ? try extensionValue(frames.frame(index + 2), "window", in: 1...maxWindow) : nil
            // After the window: callers=1, then cell=NAME, each at most once, in that order.
            var callers = false, cell: String?
            for extra in stride(from: index + 3, to: index + 1 + after, by: 1) {
                if !callers, cell == nil, frames.part(extra, equals: callersFrame) {
                    callers = true
                } else if cell == nil, let text = frames.frame(extra).string, text.hasPrefix(cellPrefix),
                          isValidCellName(String(text.dropFirst(cellPrefix.count))) {
                    cell = String(text.dropFirst(cellPrefix.count))
                } else {
                    throw ProtocolError("MDP", "worker READY's frames after the window must be callers=1, then cell=NAME (\(cellNameRule)), got \(frames.frame(extra))")
                }
            }
            return .ready(service: service, window: window, callers: callers, cell: cell)
        case .partial, .final:
            let name = verb == .partial ? "PARTIAL" : version == .v01 ? "REPLY" : "FINAL"
            guard after >= 3 else { throw count(name, "at least \(before + 4)") }
            guard frames.isEmpty(index + 2) else { throw ProtocolError("MDP", "worker \(name) frame \(index + 1) must be empty") }
            let client = frames.frame(index + 1), body = frames.frames(from: index + 3)
            return verb == .partial ? .partial(client: client, body: body) : .reply(client: client, body: body)
        case .heartbeat:
            guard after <= 1 else { throw count("HEARTBEAT", "\(before + 1) (or \(before + 2) with an error count or drain=1)") }
            if after == 1, frames.part(index + 1, equals: drainFrame) { return .drain }
            return .heartbeat(errors: after == 1 ? try extensionValue(frames.frame(index + 1), "errors", in: 0...Int.max) : nil)
        case .disconnect:
            guard after == 0 else { throw count("DISCONNECT", "\(before + 1)") }
            return .disconnect
        case .request:
            throw ProtocolError("MDP", "a worker may not send REQUEST")
        }
    }

    /// A worker-protocol command, whichever version numbered it.
    enum WorkerVerb: CaseIterable, CustomStringConvertible {
        case ready, request, partial, final, heartbeat, disconnect
        var description: String {
            switch self {
            case .ready: "READY"; case .request: "REQUEST"; case .partial: "PARTIAL"; case .final: "FINAL"
            case .heartbeat: "HEARTBEAT"; case .disconnect: "DISCONNECT"
            }
        }

        /// The verb whose code in `version` is `code` (``code(in:)`` read backwards), nil for
        /// none. A switch, not a search of `allCases`: it runs for every message a worker
        /// sends, and a search builds the array of cases each time.
        init?(code: UInt8, in version: Version) {
            switch version {
            case .v01:
                switch Command(rawValue: code) {
                case .ready: self = .ready
                case .request: self = .request
                case .reply: self = .final
                case .heartbeat: self = .heartbeat
                case .disconnect: self = .disconnect
                case nil: return nil
                }
            case .v02:
                switch WorkerCommand02(rawValue: code) {
                case .ready: self = .ready
                case .request: self = .request
                case .partial: self = .partial
                case .final: self = .final
                case .heartbeat: self = .heartbeat
                case .disconnect: self = .disconnect
                case nil: return nil
                }
            }
        }

        /// Its code in `version` (7/MDP has no PARTIAL; its REPLY is the FINAL).
        func code(in version: Version) -> UInt8? {
            switch (self, version) {
            case (.ready, .v01): Command.ready.rawValue
            case (.request, .v01): Command.request.rawValue
            case (.partial, .v01): nil
            case (.final, .v01): Command.reply.rawValue
            case (.heartbeat, .v01): Command.heartbeat.rawValue
            case (.disconnect, .v01): Command.disconnect.rawValue
            case (.ready, .v02): WorkerCommand02.ready.rawValue
            case (.request, .v02): WorkerCommand02.request.rawValue
            case (.partial, .v02): WorkerCommand02.partial.rawValue
            case (.final, .v02): WorkerCommand02.final.rawValue
            case (.heartbeat, .v02): WorkerCommand02.heartbeat.rawValue
            case (.disconnect, .v02): WorkerCommand02.disconnect.rawValue
            }
        }
    }

    /// The command whose one-byte code is part `index` of `frames`.
    private static func workerVerb(_ frames: some MessageParts, at index: Int, _ version: Version) throws(ProtocolError) -> WorkerVerb {
        guard let code = frames.commandCode(index), let verb = WorkerVerb(code: code, in: version) else {
            throw ProtocolError("MDP", "unknown worker command \(frames.frame(index))")
        }
        return verb
    }

    /// Decodes a message a worker's DEALER socket received from the broker (either version).
    public static func decodeAtWorker(_ message: Message) throws(ProtocolError) -> BrokerToWorker {
        let frames = message.frames
        guard frames.count >= 2 else { throw ProtocolError("MDP", "message has \(frames.count) frames, expected at least 2") }
        let index: Int, version: Version
        if frames[0] == workerHeader02Frame {
            (index, version) = (1, .v02)
        } else {
            guard frames.count >= 3 else { throw ProtocolError("MDP", "message has \(frames.count) frames, expected at least 3") }
            guard frames[0].isEmpty else { throw ProtocolError("MDP", "frame 0 must be empty") }
            guard frames[1] == workerHeaderFrame else { throw ProtocolError("MDP", "expected header MDPW01, got \(frames[1])") }
            (index, version) = (2, .v01)
        }
        let after = frames.count - index - 1
        switch try workerVerb(frames, at: index, version) {
        case .request:
            guard after >= 3 else { throw ProtocolError("MDP", "broker REQUEST has \(frames.count) frames, expected at least \(index + 4)") }
            guard frames[index + 2].isEmpty else { throw ProtocolError("MDP", "broker REQUEST frame \(index + 2) must be empty") }
            return .request(client: frames[index + 1], body: Array(frames[(index + 3)...]))
        case .heartbeat:
            if after == 1, frames[index + 1] == drainFrame { return .drain }
            if after == 2, frames[index + 1] == stopFrame { return .stop(client: frames[index + 2]) }
            guard after == 0 else {
                throw ProtocolError("MDP", "broker HEARTBEAT has \(frames.count) frames, expected \(index + 1) (or \(index + 2) with drain=1, \(index + 3) with stop=1 and a client)")
            }
            return .heartbeat
        case .disconnect:
            guard after == 0 else { throw ProtocolError("MDP", "broker DISCONNECT has \(frames.count) frames, expected \(index + 1)") }
            return .disconnect
        case let verb:
            throw ProtocolError("MDP", "a broker may not send \(verb)")
        }
    }

    /// Decodes a reply a client's DEALER socket received: 7/MDP's REPLY, or 18/MDP's
    /// PARTIAL or FINAL.
    public static func decodeAtClient(_ message: Message) throws(ProtocolError) -> ClientReply {
        let frames = message.frames
        let isFinal = try replyIsFinal(frames)
        return ClientReply(service: String(decoding: frames[clientReplyService].bytes, as: UTF8.self),
                           body: Array(frames[clientReplyBody...]), isFinal: isFinal)
    }

    /// The same reply read where the socket received it (a client reads a JSON-RPC reply's
    /// one body part in place): whether it is the last of its request's; its service is part
    /// ``clientReplyService``, its body the parts from ``clientReplyBody`` on.
    public static func clientReplyIsFinal(_ parts: ReceivedParts) throws(ProtocolError) -> Bool {
        try replyIsFinal(parts)
    }

    /// Where a reply's service and body lie, in either version.
    public static let clientReplyService = 2, clientReplyBody = 3

    private static func replyIsFinal(_ frames: some MessageParts) throws(ProtocolError) -> Bool {
        if frames.count > 0, frames.part(0, equals: clientHeader02Frame) {
            guard frames.count >= 4 else { throw ProtocolError("MDP", "client PARTIAL or FINAL has \(frames.count) frames, expected at least 4") }
            let command = frames.commandCode(1).flatMap(ClientCommand02.init(rawValue:))
            guard let command, command != .request else { throw ProtocolError("MDP", "expected PARTIAL (0x02) or FINAL (0x03), got \(frames.frame(1))") }
            return command == .final
        }
        guard frames.count >= 4 else { throw ProtocolError("MDP", "client REPLY has \(frames.count) frames, expected at least 4") }
        guard frames.isEmpty(0) else { throw ProtocolError("MDP", "frame 0 must be empty") }
        guard frames.part(1, equals: clientHeaderFrame) else { throw ProtocolError("MDP", "expected header MDPC01, got \(frames.frame(1))") }
        // The service frame echoes the request's, whatever it held: a broker answers a
        // request for an unusable name too.
        return true
    }

    /// The number in an extension frame `NAME=DIGITS`.
    private static func extensionValue(_ frame: Frame, _ name: String, in range: ClosedRange<Int>) throws(ProtocolError) -> Int {
        guard let text = frame.string, text.hasPrefix(name + "="), let value = Int(text.dropFirst(name.count + 1)),
              range.contains(value) else {
            throw ProtocolError("MDP", "expected \(name)=N with N in \(range.lowerBound)...\(range.upperBound), got \(frame)")
        }
        return value
    }

    private static func serviceName(_ frames: some MessageParts, _ index: Int, _ context: String) throws(ProtocolError) -> String {
        // Checked on the bytes, then read as ASCII: no UTF-8 validation per request.
        let name: String? = frames.withPart(index) { raw in
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
