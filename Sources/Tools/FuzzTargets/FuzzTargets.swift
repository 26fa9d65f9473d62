import BusProtocol
import Catalog
import Contracts
import Dispatch
import Kernel
import Logging
import Synchronization
public import ZeroMQ
#if canImport(Glibc)
import Glibc
#endif

/// The decoders that read untrusted input, as fuzz targets: each takes any bytes and must
/// return (a value or an error), never crash or hang. Used by `switchboard-fuzz`
/// (libFuzzer) and by the tests that replay the corpus and the regressions.
public enum FuzzTarget: String, CaseIterable, Sendable {
    case mdp, chp, jsonrpc
    /// The kernel's own methods with any params: huge, negative, fractional and unrepresentable
    /// numbers included (the first byte picks the method, the rest is the params' text).
    case kernel
    case countries, locations, items, sources, headlines, flights, airlines

    /// Runs one input through the decoders of this target.
    public func run(_ bytes: [UInt8]) {
        switch self {
        case .mdp:
            let message = FuzzFrames.message(from: bytes)
            _ = try? MDP.decodeAtBroker(message)
            _ = try? MDP.decodeAtWorker(message)
            _ = try? MDP.decodeAtClient(message)
            if message.count >= 1 { _ = MMI.answer(service: message[0].string ?? "", body: Array(message.frames.dropFirst())) { _ in true } }
        case .chp:
            let message = FuzzFrames.message(from: bytes)
            _ = try? CHP.decodeSnapshotRequest(message)
            _ = try? CHP.decodeSnapshotReply(message)
            _ = try? CHP.decodeUpdate(message)
            _ = try? CHP.decodeKVSet(message)
        case .jsonrpc:
            // A request body as a service reads it, a reply as a client reads it, and the
            // kernel's error reply for a body it could not deliver.
            if case .single(.request(let request)) = JSONRPC.parseRequests(bytes) { _ = request.jsonBytes }
            _ = try? JSONRPC.parseResponses(bytes)
            _ = JSONRPC.errorReply(to: bytes, error: .serviceUnavailable("fuzz", within: 1))
            if let value = try? JSONValue(parsing: bytes) { _ = value.jsonBytes }
        case .kernel:
            guard let selector = bytes.first else { return }
            let method = FuzzKernel.methods[Int(selector) % FuzzKernel.methods.count]
            let body = Array(#"{"jsonrpc":"2.0","id":1,"method":"\#(method)","params":"#.utf8) + bytes.dropFirst() + Array("}".utf8)
            _ = FuzzKernel.answer(body)
        default:
            let dataset = Dataset(rawValue: rawValue)!
            if let decoded = try? dataset.decode(bytes) { _ = try? decoded.content.records(offset: 0, limit: 10) }
        }
    }
}

/// One kernel in this process, started on first use (inproc endpoints only), whose
/// methods the `kernel` target calls on its loop thread and waits for.
enum FuzzKernel {
    static let methods = [KernelAPI.stateSet, KernelAPI.statePublish].map(\.name)
        + [KernelAPI.stateGet.name, KernelAPI.ping.name, KernelAPI.servicesList.name, KernelAPI.stats.name, KernelAPI.metrics.name]

    static let kernel: Kernel = {
        var configuration = KernelConfiguration()
        let name = "fuzz-\(getpid())"
        configuration.brokerEndpoint = "inproc://\(name)-broker"
        configuration.snapshotEndpoint = "inproc://\(name)-snapshot"
        configuration.publisherEndpoint = "inproc://\(name)-publisher"
        configuration.collectorEndpoint = "inproc://\(name)-collector"
        var logger = Logger(label: "fuzz.kernel")
        logger.logLevel = .critical
        let kernel = try! Kernel(configuration: configuration, context: try! ZMQContext(), logger: logger)
        // Started from a task: the fuzzer's thread waits on it (the kernel runs on its own loop thread).
        let started = DispatchSemaphore(value: 0)
        Task {
            _ = try! await kernel.start()
            started.signal()
        }
        started.wait()
        return kernel
    }()

    /// The reply to `body`, answered on the kernel's loop thread.
    static func answer(_ body: [UInt8]) -> [UInt8] {
        let reply = Mutex<[UInt8]>([])
        onLoop(kernel) { kernel in reply.withLock { $0 = kernel.respond(to: body) } }
        return reply.withLock { $0 }
    }

    /// Runs `body` on the kernel's own thread and waits for it (no Swift task involved, so
    /// a caller on a task's thread cannot starve it).
    private static func onLoop(_ kernel: Kernel, _ body: @escaping @Sendable (isolated Kernel) -> Void) {
        let done = DispatchSemaphore(value: 0)
        kernel.loop.execute {
            kernel.assumeIsolated { body($0) }
            done.signal()
        }
        done.wait()
    }
}

/// How a fuzz input becomes a multipart message: a frame count byte, then for each frame
/// but the last a length byte and that many bytes; the last frame takes what remains.
/// Seeds are written in the same layout (``bytes(of:)``).
public enum FuzzFrames {
    public static func message(from bytes: [UInt8]) -> Message {
        guard let count = bytes.first.map({ Int($0 % 12) + 1 }) else { return Message([Frame()]) }
        var frames: [Frame] = []
        var index = 1
        while frames.count < count - 1, index < bytes.count {
            let length = Int(bytes[index])
            index += 1
            let end = min(index + length, bytes.count)
            frames.append(Frame(bytes[index..<end]))
            index = end
        }
        frames.append(Frame(index < bytes.count ? Array(bytes[index...]) : []))
        return Message(frames)
    }

    /// The fuzz input that decodes to `message` (frames but the last must be under 256 bytes).
    public static func bytes(of message: Message) -> [UInt8] {
        var bytes: [UInt8] = [UInt8(message.count - 1)]
        for frame in message.frames.dropLast() {
            precondition(frame.count < 256, "a seed's frames but the last must be under 256 bytes")
            bytes.append(UInt8(frame.count))
            bytes += frame.bytes
        }
        bytes += message.frames.last?.bytes ?? []
        return bytes
    }
}

extension FuzzTarget {
    /// Valid inputs (and a few near misses) made with the real encoders and the bundled
    /// datasets: the seed corpus in `Fuzz/corpus/<target>` is written from these
    /// (`switchboard-fuzz --target=NAME --write-seeds=FOLDER`).
    public var seeds: [[UInt8]] {
        func frames(_ message: Message) -> [UInt8] { FuzzFrames.bytes(of: message) }
        let client = Frame([0x00, 0x6B, 0x8B, 0x45, 0x67])
        let body = Frame(#"{"jsonrpc":"2.0","id":7,"method":"countries.search","params":{"query":"fr"}}"#)
        switch self {
        case .mdp:
            func atBroker(_ message: Message) -> Message { Message([client] + message.frames) }
            func atPeer(_ message: Message) -> Message { Message(Array(message.frames.dropFirst())) }
            return [
                frames(atBroker(MDP.request(service: "search", body: [body]))),
                frames(atBroker(MDP.encode(.ready(service: "search")))),
                frames(atBroker(MDP.encode(.reply(client: client, body: [body])))),
                frames(atBroker(MDP.encode(.heartbeat()))),
                frames(atBroker(MDP.encode(.disconnect))),
                frames(atPeer(MDP.encode(.request(client: client, body: [body]), to: client))),
                frames(atPeer(MDP.encode(.heartbeat, to: client))),
                frames(atPeer(MDP.reply(to: client, service: "search", body: [body]))),
                frames(Message([Frame(MMI.serviceQuery), Frame("search")])),
                frames(atBroker(MDP.request(service: "", body: []))),
                frames(atBroker(MDP.cancel(of: MDP.request(service: "search", body: [body], version: .v02))!)),
            ]
        case .chp:
            let entry = KVEntry(key: "/catalog/countries", sequence: 1_234_567, properties: [("ttl", "30")], value: Frame(#"{"records":250}"#))
            func withoutClient(_ message: Message) -> Message { Message(Array(message.frames.dropFirst())) }
            return [
                frames(Message([client] + CHP.icanhaz(subtree: "/catalog/").frames)),
                frames(withoutClient(CHP.kvsync(entry, to: client))),
                frames(withoutClient(CHP.kthxbai(sequence: 99, subtree: "/catalog/", to: client))),
                frames(CHP.kv(entry)),
                frames(CHP.kv(KVEntry(key: "/client/x", value: Frame()))),
                frames(CHP.hugz()),
            ]
        case .kernel:
            func call(_ method: String, _ params: String) -> [UInt8] {
                [UInt8(FuzzKernel.methods.firstIndex(of: method)!)] + Array(params.utf8)
            }
            return [
                call("state.set", #"{"key":"/client/x","value":{"a":1},"ttl":30}"#),
                call("state.set", #"{"key":"/client/x","value":1,"ttl":1e300}"#),
                call("state.publish", #"{"key":"/client/y","value":"v","ttl":2e10}"#),
                call("state.publish", #"{"key":"/client/y","value":null,"ttl":-1}"#),
                call("state.get", #"{"prefix":"/client/","limit":10000,"after":"/client/x"}"#),
                call("state.get", #"{"prefix":"","limit":9223372036854775807}"#),
                call("ping", "{}"),
                call("stats", "[]"),
            ]
        case .jsonrpc:
            return [
                Array(#"{"jsonrpc":"2.0","id":1,"method":"countries.search","params":{"query":"fr","limit":5}}"#.utf8),
                Array(#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"notify"},{"jsonrpc":"2.0","id":"x","method":"b","params":[1,2]}]"#.utf8),
                Array(#"{"jsonrpc":"2.0","id":1,"result":{"countries":[{"name":"France","match":"name"}],"total":1}}"#.utf8),
                Array(#"{"jsonrpc":"2.0","id":2,"error":{"code":-32602,"message":"Invalid params","data":{"field":"limit"}}}"#.utf8),
                Array(#"[{"jsonrpc":"2.0","id":1,"result":null},{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}]"#.utf8),
                Array(#"{"jsonrpc":"2.0","id":1e400,"method":"\u00e9\ud83d\ude00","params":{"a":[true,false,null,-0.5e-3]}}"#.utf8),
                Array("[]".utf8),
                Array(#"{"jsonrpc":"1.0""#.utf8),
            ]
        default:
            let dataset = Dataset(rawValue: rawValue)!
            guard let data = try? dataset.bundledData(), let value = try? JSONValue(parsing: Array(data)) else { return [] }
            // The bundled file cut down to a few records of each list: every shape the
            // decoder knows, small enough to mutate quickly.
            func trimmed(_ value: JSONValue) -> JSONValue {
                switch value {
                case .array(let items): return .array(items.prefix(3).map(trimmed))
                case .object(let members): return .object(members.mapValues(trimmed))
                default: return value
                }
            }
            return [trimmed(value).jsonBytes, Array(#"{"status":"error","code":"apiKeyInvalid","message":"Your API key is invalid."}"#.utf8), Array("{}".utf8)]
        }
    }
}
