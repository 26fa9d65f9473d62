internal import CZeroMQ
import BusProtocol
import DequeModule
import ZeroMQ

/// A 7/MDP forwarder on the kernel's ``SocketLoop`` that moves libzmq's messages as the C
/// 7/MDP broker does (`zmq_msg_move` out of the received parts, `zmq_msg_send` after each batch)
/// and makes no ``Frame`` of any part: what the socket loop costs without the frame model
/// (`switchboard-bench socket-floor --move-messages`; `switchboard-bench kernel` measures it
/// beside the kernel's socket layer, docs/BENCHMARKS.md, issue 33). One worker (the last to
/// say READY in 7/MDP), as many requests at once as its window; the rest wait, their parts
/// held as libzmq's messages. Loop-confined; its state unchecked for exclusivity, as the
/// broker's is.
final class MessageMover {
    /// Messages owned here: initialised, each closed or sent exactly once. A message is moved
    /// between these arrays bitwise, as `zmq_msg_move` moves it, the place it left never used again.
    @exclusivity(unchecked) private var waitingParts: Deque<zmq_msg_t> = []
    /// How many of `waitingParts` each waiting request has (its client, the empty frame, its body).
    @exclusivity(unchecked) private var waitingCounts: Deque<Int> = []
    /// Parts to send after the batch, and whether each has more parts after it.
    @exclusivity(unchecked) private var outgoing: [zmq_msg_t] = []
    @exclusivity(unchecked) private var outgoingMore: [Bool] = []
    @exclusivity(unchecked) private var workerIdentity: [UInt8] = []
    @exclusivity(unchecked) private var service: [UInt8] = []
    @exclusivity(unchecked) private var credits = 0
    private let socket: ZMQSocket

    /// The 7/MDP frames it reads and writes, from the codec's own constants.
    private static let clientHeader = Frame(MDP.clientHeader), workerHeader = Frame(MDP.workerHeader)
    private static let requestCommand = Frame([MDP.Command.request.rawValue])

    private init(socket: ZMQSocket) { self.socket = socket }

    deinit {
        for index in waitingParts.indices { zmq_msg_close(&waitingParts[index]) }
        for index in outgoing.indices { zmq_msg_close(&outgoing[index]) }
    }

    static func serve(_ socket: ZMQSocket, on loop: SocketLoop) {
        let mover = MessageMover(socket: socket)
        let router = loop.register(readingParts: socket) { [mover] in mover.handle($0) }
        router.afterReading = { [mover] in mover.flush() }
    }

    private func handle(_ received: ReceivedParts) {
        // The loop's parts are always libzmq's: known by their type (a compare), not cast per message.
        guard type(of: received) == ZMQReceivedParts.self, received.count >= 4 else { return }
        let parts = unsafeDowncast(received, to: ZMQReceivedParts.self)
        if parts.part(2, equals: Self.clientHeader) {
            // [client][empty][MDPC01][service][body...]: the client, the empty frame and the body wait.
            guard parts.count >= 5 else { return }
            take(parts.slot(0))
            take(parts.slot(1))
            for index in 4..<parts.count { take(parts.slot(index)) }
            waitingCounts.append(parts.count - 2)
        } else if parts.part(2, equals: Self.workerHeader), parts[3].count == 1 {
            switch MDP.Command(rawValue: parts[3][0]) {
            case .ready:
                guard case .worker(let identity, .ready(let name, let window), _)? = try? MDP.decodeAtBroker(parts) else { return }
                workerIdentity = identity.bytes
                service = Array(name.utf8)
                credits = window ?? 1
            case .reply:
                // [worker][empty][MDPW01][REPLY][client][empty][body...] to [client][empty][MDPC01][service][body...].
                guard parts.count >= 7 else { return }
                credits += 1
                send(moving: parts.slot(4), more: true)
                send(moving: parts.slot(5), more: true)
                send(Self.clientHeader, more: true)
                service.withUnsafeBytes { send(copying: $0, more: true) }
                for index in 6..<parts.count { send(moving: parts.slot(index), more: index < parts.count - 1) }
            default:
                return
            }
        } else {
            return
        }
        dispatch()
    }

    /// Requests to the worker while its window has room: [worker][empty][MDPW01][REQUEST] and the request's parts.
    private func dispatch() {
        guard !workerIdentity.isEmpty else { return }
        while credits > 0, let count = waitingCounts.popFirst() {
            credits -= 1
            workerIdentity.withUnsafeBytes { send(copying: $0, more: true) }
            send(Frame(), more: true)
            send(Self.workerHeader, more: true)
            send(Self.requestCommand, more: true)
            for index in 0..<count {
                var part = waitingParts.removeFirst()
                send(moving: &part, more: index < count - 1)
            }
        }
    }

    /// `part`'s message, moved out of it (`part` is left empty).
    private static func moved(_ part: UnsafeMutablePointer<zmq_msg_t>) -> zmq_msg_t {
        var moved = zmq_msg_t()
        zmq_msg_init(&moved)
        zmq_msg_move(&moved, part)
        return moved
    }

    private func take(_ part: UnsafeMutablePointer<zmq_msg_t>) {
        waitingParts.append(Self.moved(part))
    }

    private func send(moving part: UnsafeMutablePointer<zmq_msg_t>, more: Bool) {
        outgoing.append(Self.moved(part))
        outgoingMore.append(more)
    }

    private func send(copying bytes: UnsafeRawBufferPointer, more: Bool) {
        var message = zmq_msg_t()
        zmq_msg_init_size(&message, bytes.count)
        if !bytes.isEmpty { zmq_msg_data(&message).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
        outgoing.append(message)
        outgoingMore.append(more)
    }

    private func send(_ frame: Frame, more: Bool) {
        frame.withUnsafeBytes { send(copying: $0, more: more) }
    }

    /// Sends what the batch wrote. A message whose first part libzmq refuses (its peer gone or
    /// full: the kernel's ROUTER options) is dropped whole, its other parts closed unsent.
    private func flush() {
        guard !outgoing.isEmpty, let handle = try? socket.raw("zmq_msg_send") else { return }
        var dropping = false
        outgoing.withUnsafeMutableBufferPointer { messages in
            for index in messages.indices {
                let more = outgoingMore[index]
                if dropping || zmq_msg_send(&messages[index], handle, (more ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) == -1 {
                    zmq_msg_close(&messages[index])
                    dropping = more
                } else {
                    dropping = false
                }
            }
        }
        outgoing.removeAll(keepingCapacity: true)
        outgoingMore.removeAll(keepingCapacity: true)
    }
}
