import ArgumentParser
import BusProtocol
import Foundation
import DequeModule
import Kernel
import ZeroMQ

/// The kernel's socket layer with nothing on top: a 7/MDP forwarder and a CHP republisher
/// on a ``SocketLoop``, reading and sending ``Frame``s through ``SocketRegistration`` with the
/// kernel's codecs and socket options, and none of its work (no fair queue, heartbeats,
/// stats, state, history or quotas). Measured with the same C programs as the kernel, in a
/// process of its own as the kernel is, it is the floor the kernel's figures stand on: what
/// the kernel does above it costs the difference (docs/PERFORMANCE.md).
struct SocketLayerFloorCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "socket-floor",
        abstract: "The kernel's socket layer alone, for `kernel` to measure; runs until its standard input ends.",
        shouldDisplay: false
    )

    @Option(help: "Endpoint for 7/MDP clients and workers.")
    var broker: String
    @Option(help: "Endpoint for CHP KVSETs.")
    var collector: String
    @Option(help: "Endpoint for CHP subscribers.")
    var publisher: String

    func run() async throws {
        let loop = try SocketLoop(context: ZMQContext(), name: "floor")
        try await loop.run { [broker, collector, publisher] in
            let configuration = KernelConfiguration()
            let router = try ZMQSocket(loop.context, .router)
            // As the kernel's ROUTER: a full peer's messages are dropped rather than waited for.
            try router.set(.routerMandatory, true)
            try router.set(.sendHighWaterMark, Int32(clamping: configuration.peerBacklog))
            try router.set(.receiveHighWaterMark, 0)
            try router.bind(broker)
            let subscriber = try ZMQSocket(loop.context, .sub)
            try subscriber.subscribe("")
            try subscriber.bind(collector)
            let xpub = try ZMQSocket(loop.context, .xpub)
            try xpub.set(.xpubVerbose, true)
            try xpub.set(.sendHighWaterMark, Int32(clamping: configuration.subscriberBacklog))
            try xpub.bind(publisher)
            MDPForwarder.serve(router, on: loop)
            CHPRepublisher.serve(from: subscriber, to: xpub, on: loop)
        }
        // The benchmark holds the other end of standard input: it ends when the benchmark does.
        _ = await Task.detached { FileHandle.standardInput.readDataToEndOfFile() }.value
        await loop.shutdown()
    }
}

/// Requests to the one worker that said READY, as many at once as its window (the rest wait,
/// as the C 7/MDP broker's do), replies to their clients: read where the socket holds them and
/// written to an ``Outbox`` sent after each batch read, as the kernel's broker does.
/// Loop-confined.
private final class MDPForwarder {
    /// A request waiting: its body held as the broker holds it (a one-frame body alone, so the
    /// array it arrived in is read into again).
    private struct Waiting {
        let client: Frame
        let onlyFrame: Frame?
        let frames: ArraySlice<Frame>
    }
    /// A waiting request as it goes to the worker, written as the broker writes it.
    private struct RequestToWorker: MessageEncoding {
        let worker: Frame
        let request: Waiting

        func appendFrames(to frames: inout [Frame]) {
            MDP.appendRequestHead(to: worker, client: request.client, into: &frames)
            if let only = request.onlyFrame { frames.append(only) } else { frames.append(contentsOf: request.frames) }
        }
    }
    private var worker: (identity: Frame, service: Frame)?
    private var credits = 0
    /// A queue, as the broker's: under 8 clients' load it never empties (an array read from an
    /// index and cleared only once emptied grew without end, and the floor paid its copies).
    private var waiting: Deque<Waiting> = []
    private var outbox = Outbox()

    static func serve(_ socket: ZMQSocket, on loop: SocketLoop) {
        let forwarder = MDPForwarder()
        let router = loop.register(readingParts: socket) { [forwarder] in forwarder.handle($0) }
        router.dropsWhenPeerFull = true
        router.afterReading = { [forwarder, unowned router] in
            while let batch = forwarder.outbox.takeBatch() {
                batch.forEach { router.send(frames: $0) }
                forwarder.outbox.reuse(batch)
            }
        }
    }

    private func handle(_ parts: ReceivedParts) {
        switch try? MDP.decodeAtBroker(parts) {
        case .request(let client, _, let body, _)?:
            waiting.append(body.count == 1 ? Waiting(client: client, onlyFrame: body.first, frames: [])
                                           : Waiting(client: client, onlyFrame: nil, frames: body))
        case .worker(let identity, .ready(let service, let window, _, _), _)?:
            worker = (identity, Frame(service))
            credits = window ?? 1
        case .worker(_, .reply(let client, let body), _)?:
            guard let worker else { return }
            credits += 1
            outbox.send(MDP.BrokerReply(to: client, serviceFrame: worker.service, body: body, version: .v01))
        default:
            return
        }
        dispatch()
    }

    private func dispatch() {
        guard let worker else { return }
        while credits > 0, let request = waiting.popFirst() {
            outbox.send(RequestToWorker(worker: worker.identity, request: request))
            credits -= 1
        }
    }
}

/// Each KVSET published as a KVPUB with the next sequence number, read where the socket holds
/// it and written to an ``Outbox`` sent after each batch read, as the kernel's state server
/// does; subscriptions read and let go. Loop-confined.
private final class CHPRepublisher {
    private var sequence: UInt64 = 0
    private var outbox = Outbox()

    static func serve(from collector: ZMQSocket, to publisher: ZMQSocket, on loop: SocketLoop) {
        let republisher = CHPRepublisher()
        let publisher = loop.register(publisher) { _ in }
        let collector = loop.register(readingParts: collector) { [republisher] in republisher.handle($0) }
        collector.afterReading = { [republisher] in
            while let batch = republisher.outbox.takeBatch() {
                batch.forEach { publisher.send(frames: $0) }
                republisher.outbox.reuse(batch)
            }
        }
    }

    private func handle(_ parts: ReceivedParts) {
        do { _ = try CHP.checkKVSet(parts) } catch { return }
        sequence += 1
        outbox.send(CHP.KVPub(key: parts.frame(0), sequence: sequence, uuid: parts.frame(2), properties: parts.frame(3), value: parts.frame(4)))
    }
}
