import BusKit
import BusProtocol
import Contracts
import CRuntimeCounters
import EchoService
import Foundation
import Kernel
import SwitchboardTestSupport
import ZeroMQ

/// `switchboard-costs`: heap allocations, retains, releases and exclusivity checks per
/// message on the hot paths, printed as one JSON object, a member per path
/// (`HotPathCostTests` holds them to bounds; run it on a release build to see what a change
/// to the hot paths saves).
///
/// Counts do not wobble as rates do: each path is driven one message at a time, so no
/// batching changes the count; the kernel's are read on the thread that does its work, and a
/// call's in the client's process and the host's, each a process of its own (`kernel` and
/// `host`, run by this tool as children) so that nothing else allocates while each is counted.
@main
struct Costs {
    /// Each path is counted over `windows` windows of `messages` messages, and the least
    /// window's counts are taken: short windows, so that some fall between the turns of what
    /// else runs (a timer, a busy neighbour's thread) and count the messages alone.
    static let messages = 500
    static let windows = 8

    static func main() async throws {
        rc_install()
        // The kernel and the host of a counted call, each a process of its own (``fullStackSplit()``).
        switch CommandLine.arguments.dropFirst().first {
        case "kernel"?: return try await serveKernel()
        case "host"?: return try await serveHost(broker: CommandLine.arguments[2])
        default: break
        }
        var figures = [
            "kernelRequest": try await kernelRequest(),
            "kernelUpdate": try await kernelUpdate(),
        ]
        (figures["clientCall"], figures["hostCall"]) = try await fullStackSplit()
        let text = figures.sorted { $0.key < $1.key }.map { "\"\($0.key)\":\($0.value.json)" }.joined(separator: ",")
        print("{\(text)}")
    }

    /// What one message cost on average.
    struct PerMessage {
        var allocations, retains, releases, accessChecks: Double

        var json: String {
            String(format: #"{"allocations":%.3f,"retains":%.3f,"releases":%.3f,"accessChecks":%.3f}"#, allocations, retains, releases, accessChecks)
        }

        /// Each count the least of this window's and `other`'s: what contention adds (a
        /// timer's turn, a wake-up more) only ever raises a window's count.
        func least(_ other: PerMessage?) -> PerMessage {
            guard let other else { return self }
            return PerMessage(allocations: min(allocations, other.allocations), retains: min(retains, other.retains),
                              releases: min(releases, other.releases), accessChecks: min(accessChecks, other.accessChecks))
        }
    }

    /// The counts per message between two readings.
    static func perMessage(_ before: rc_counts, _ after: rc_counts, messages: Int = messages) -> PerMessage {
        func each(_ field: KeyPath<rc_counts, UInt64>) -> Double { Double(after[keyPath: field] - before[keyPath: field]) / Double(messages) }
        return PerMessage(allocations: each(\.allocations), retains: each(\.retains), releases: each(\.releases), accessChecks: each(\.accessChecks))
    }

    /// Runs `measure` against a kernel of its own, stopped however it ends.
    static func withKernel(_ measure: (TestKernel) async throws -> PerMessage) async throws -> PerMessage {
        let kernel = try await TestKernel.start()
        var measured = PerMessage(allocations: 0, retains: 0, releases: 0, accessChecks: 0)
        try await stopping(kernel, with: { await $0.stop() }) { measured = try await measure($0) }
        return measured
    }

    /// The counts per message on `kernel`'s loop thread while `send` runs ``messages`` times,
    /// after 200 to warm up: the least of ``windows`` such windows, each count on its own. The loop
    /// also runs its timers (heartbeats, the once-a-second upkeep), as many more of them in a
    /// window as a loaded machine makes it last; the least window is the one they touched
    /// least, so what is counted is the messages'.
    static func perMessage(onLoopOf kernel: TestKernel, _ send: () throws -> Void) async throws -> PerMessage {
        for _ in 0..<200 { try send() }
        var least: PerMessage?
        for _ in 0..<windows {
            let before = try await kernel.kernel.loop.run { rc_this_thread() }
            for _ in 0..<messages { try send() }
            least = perMessage(before, try await kernel.kernel.loop.run { rc_this_thread() }).least(least)
        }
        return least!
    }

    /// A socket that gives up on a receive or a send after 5 s and closes at once.
    static func bounded(_ socket: ZMQSocket) throws -> ZMQSocket {
        try socket.set(.receiveTimeout, Int32(5_000))
        try socket.set(.sendTimeout, Int32(5_000))
        try socket.set(.linger, 0)
        return socket
    }

    /// The kernel's loop thread, per request: a 7/MDP request from a raw client to a raw
    /// worker and its reply back (read, fair queue, dispatch, reply, two sends; libzmq's
    /// messages included).
    static func kernelRequest() async throws -> PerMessage {
        try await withKernel { kernel in
            let context = try ZMQContext()
            let worker = try bounded(ZMQSocket(context, .dealer))
            try worker.connect(kernel.endpoints.broker)
            try worker.send(MDP.encode(.ready(service: "echo")))
            let client = try bounded(ZMQSocket(context, .dealer))
            try client.connect(kernel.endpoints.broker)
            let body = Frame(String(repeating: "x", count: 64))
            func roundTrip() throws {
                try client.send(MDP.request(service: "echo", body: [body]))
                var request: BrokerToWorker
                repeat { request = try MDP.decodeAtWorker(try worker.receive()) } while request == .heartbeat
                guard case .request(let from, let requestBody) = request else { throw TimedOut(what: "a REQUEST") }
                try worker.send(MDP.encode(.reply(client: from, body: requestBody[...])))
                _ = try client.receive()
            }
            return try await perMessage(onLoopOf: kernel, roundTrip)
        }
    }

    /// The kernel's loop thread, per CHP update: a KVSET in, its sequence, the map, the
    /// history and the quota, the update out to a subscriber.
    static func kernelUpdate() async throws -> PerMessage {
        try await withKernel { kernel in
            let context = try ZMQContext()
            let subscriber = try bounded(ZMQSocket(context, .sub))
            try subscriber.subscribe("/client/cost/")
            try subscriber.connect(kernel.endpoints.publisher)
            let publisher = try bounded(ZMQSocket(context, .pub))
            try publisher.connect(kernel.endpoints.collector)
            let value = Frame(String(repeating: "v", count: 64))
            // A subscription takes effect a moment after it is made: publish until one arrives.
            try subscriber.set(.receiveTimeout, Int32(100))
            var arrived = false
            for _ in 0..<100 where !arrived {
                try publisher.send(CHP.kv(KVEntry(key: "/client/cost/first", value: value)))
                arrived = (try? subscriber.receive()) != nil
            }
            guard arrived else { throw TimedOut(what: "the subscription to take effect") }
            try subscriber.set(.receiveTimeout, Int32(5_000))
            var index = 0
            /// One update, published and received (a first update sent twice may come again).
            func update() throws {
                index += 1
                let key = "/client/cost/\(index % 100)"
                try publisher.send(CHP.kv(KVEntry(key: key, value: value)))
                while try subscriber.receive()[0] != Frame(key) {}
            }
            return try await perMessage(onLoopOf: kernel, update)
        }
    }

    // MARK: The full stack, a process each

    /// Per call, each side in a process of its own and counted whole (its Swift code, its
    /// socket thread and libzmq's): the client (this process, `BusClient.call` one at a time)
    /// and the host (`switchboard-costs host`, a `ServiceHost` of the echo service); the kernel
    /// runs in a third (`switchboard-costs kernel`), not counted here.
    static func fullStackSplit() async throws -> (client: PerMessage, host: PerMessage) {
        let me = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        let kernel = try ChildProcess(me, ["kernel"])
        defer { kernel.stop() }
        let broker = try await endpoint(printedBy: kernel)
        let host = try ChildProcess(me, ["host", broker])
        defer { host.stop() }
        try await host.waitForOutput(containing: "hosting\n")
        let client = try await BusClient(brokers: [broker])
        var measured: (client: PerMessage, host: PerMessage)?
        try await stopping(client, with: { await $0.close() }) { client in
            try await eventually(10, "the echo service's workers to register") { try await client.hasWorkers(EchoAPI.service) }
            let params: JSONValue = ["text": .string(String(repeating: "x", count: 64))]
            for _ in 0..<200 { _ = try await client.call(EchoAPI.echo, params) }
            // The least of the windows, as on the kernel's loop: on a loaded machine the
            // processes' threads meet later, and a reply that comes after its caller waits
            // costs a wake-up more.
            for window in 0..<windows {
                let hostBefore = try await counts(of: host, reading: 2 * window + 1)
                let before = rc_process()
                for _ in 0..<messages { _ = try await client.call(EchoAPI.echo, params) }
                let after = rc_process()
                let hostAfter = try await counts(of: host, reading: 2 * window + 2)
                measured = (perMessage(before, after).least(measured?.client), perMessage(hostBefore, hostAfter).least(measured?.host))
            }
        }
        return measured!
    }

    /// `switchboard-costs kernel`: a kernel on free ports, its broker's endpoint printed, until
    /// stdin closes.
    static func serveKernel() async throws {
        let kernel = try await TestKernel.start()
        say("broker \(kernel.endpoints.broker)")
        await untilStdinCloses()
        await kernel.stop()
    }

    /// `switchboard-costs host BROKER`: the echo service hosted on `broker`; prints "hosting"
    /// once it serves, then its process's counts (`reading N allocations retains releases
    /// checks`) for each line on stdin, until stdin closes.
    static func serveHost(broker: String) async throws {
        let options = ServiceHost<EchoService>.Options(brokers: [broker], connections: 2)
        let host = try ServiceHost(service: EchoService(instance: "cost"), options: options)
        try await host.start()
        say("hosting")
        await untilStdinCloses { reading in
            let counts = rc_process()
            say("reading \(reading) \(counts.allocations) \(counts.retains) \(counts.releases) \(counts.accessChecks)")
        }
        await host.stop()
    }

    /// Writes `line` to stdout at once (a parent waits for it).
    static func say(_ line: String) {
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }

    /// Reads stdin off the cooperative pool, calling `eachLine` with each line's number (from
    /// 1), until it closes.
    static func untilStdinCloses(_ eachLine: @escaping @Sendable (Int) -> Void = { _ in }) async {
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            Thread {
                var lines = 0
                while readLine() != nil {
                    lines += 1
                    eachLine(lines)
                }
                done.resume()
            }.start()
        }
    }

    /// The broker endpoint a `switchboard-costs kernel` printed.
    static func endpoint(printedBy kernel: ChildProcess) async throws -> String {
        let output = try await kernel.waitForOutput("the kernel's broker endpoint") { line(startingWith: "broker ", in: $0) != nil }
        return String(line(startingWith: "broker ", in: output)!.dropFirst("broker ".count))
    }

    /// The counts `host` prints for its `number`th reading.
    static func counts(of host: ChildProcess, reading number: Int) async throws -> rc_counts {
        host.send("read\n")
        let prefix = "reading \(number) "
        let output = try await host.waitForOutput("the host's reading \(number)") { line(startingWith: prefix, in: $0) != nil }
        let reading = line(startingWith: prefix, in: output)!
        let numbers = reading.dropFirst(prefix.count).split(separator: " ").compactMap { UInt64($0) }
        guard numbers.count == 4 else { throw TimedOut(what: "four counts in \"\(reading)\"") }
        return rc_counts(allocations: numbers[0], retains: numbers[1], releases: numbers[2], accessChecks: numbers[3])
    }

    /// The first whole line (newline written) of `output` that starts with `prefix`.
    static func line(startingWith prefix: String, in output: String) -> Substring? {
        output.split(separator: "\n", omittingEmptySubsequences: false).dropLast().first { $0.hasPrefix(prefix) }
    }
}
