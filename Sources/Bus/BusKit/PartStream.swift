public import BusProtocol
import Contracts
import Synchronization
import ZeroMQ

/// A reply in parts (18/MDP), as it comes: iterate it for the parts, then ``end()`` gives the
/// result that closed the stream. A stream that ends early throws the reason when the
/// iteration reaches it (`-32014` with `data.parts` when the worker died or the kernel
/// dropped parts for this reader, or any error the service answered), never a silent end.
///
/// Cancelling the task that iterates, or dropping the stream unfinished, ends the request:
/// the kernel is sent a CANCEL, which stops the worker at its next part (docs/PROTOCOL.md),
/// and parts already on their way are dropped as they arrive. A reader that falls
/// `bufferSize` parts, or `bufferBytes` bytes of them, behind ends the stream with `-32014`
/// (`reason: "reader_behind"`) rather than hold more, and cancels it the same way.
///
/// ```swift
/// let groups = bus.stream(SearchAPI.itemsGroupedStream, .init(order: .natural))
/// for try await group in groups { print(group.listId, group.count) }
/// let summary = try await groups.end()        // total, dropped: the result less its parts
/// ```
public struct PartStream<Part: Decodable & Sendable, End: Decodable & Sendable>: AsyncSequence, Sendable {
    public typealias Element = Part
    let handle: PartStreamHandle
    var state: PartStreamState { handle.state }

    public struct AsyncIterator: AsyncIteratorProtocol, Sendable {
        let handle: PartStreamHandle
        public mutating func next() async throws -> Part? {
            let state = handle.state
            let received: (part: JSONValue, bytes: Int)?
            do {
                received = try await state.buffer.next()
            } catch is CancellationError {
                handle.cancel()
                throw CancellationError()
            }
            guard let (raw, bytes) = received else { return nil }
            state.bufferedBytes.subtract(bytes, ordering: .relaxed)
            do { return try decodeResult(Part.self, raw) } catch {
                handle.cancel()
                throw BusError.remote(service: state.service, error as? JSONRPCError ?? .internalError("\(error)"))
            }
        }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(handle: handle) }

    /// The result that ended the stream, once it came (parts not yet read are skipped).
    public func end() async throws(BusError) -> End {
        do {
            while try await state.buffer.next() != nil {}
        } catch let error as BusError {
            throw error
        } catch {
            handle.cancel()
            throw .cancelled(service: state.service, method: state.method)
        }
        guard let result = state.ending.withLock({ $0 }) else { throw .closed }
        let value = try result.get()
        do { return try decodeResult(End.self, value) } catch { throw .remote(service: state.service, error as? JSONRPCError ?? .internalError("\(error)")) }
    }

    /// Parts received and not yet read.
    public var buffered: Int { state.buffer.count }
}

/// The parts waiting to be read and the result that ended the stream: filled by the client's
/// core on its loop thread, read by the stream's reader.
final class PartStreamState: Sendable {
    let service: String
    let method: String
    /// Each part with the bytes it came in, counted in ``bufferedBytes`` until it is read.
    let buffer: BoundedBuffer<(part: JSONValue, bytes: Int)>
    let bufferedBytes = Atomic<Int>(0)
    let maxBufferedBytes: Int
    let ending = Mutex<Result<JSONValue, BusError>?>(nil)

    init(service: String, method: String, bufferSize: Int, bufferBytes: Int) {
        self.service = service
        self.method = method
        buffer = BoundedBuffer(capacity: bufferSize, whenFull: .refuse)
        maxBufferedBytes = bufferBytes
    }

    /// A part came, in `bytes`: false when the reader is too far behind to take it.
    func received(_ part: JSONValue, bytes: Int) -> Bool {
        guard bufferedBytes.load(ordering: .relaxed) + bytes <= maxBufferedBytes, buffer.push((part, bytes)) != .refused else { return false }
        bufferedBytes.add(bytes, ordering: .relaxed)
        return true
    }

    /// The stream ended: with its result, or with why it ended early.
    func ended(_ outcome: Result<JSONValue, BusError>) {
        ending.withLock { $0 = $0 ?? outcome }
        switch outcome {
        case .success: buffer.finish()
        case .failure(let error): buffer.finish(throwing: error)
        }
    }
}

/// The reader's hold on a stream: when the last reader lets go before the end, the request
/// ends on the client's side. (The core holds the state, not this, so dropping it is seen.)
final class PartStreamHandle: Sendable {
    let state: PartStreamState
    private let cancelRequest: @Sendable () -> Void

    init(state: PartStreamState, cancelRequest: @escaping @Sendable () -> Void) {
        self.state = state
        self.cancelRequest = cancelRequest
    }

    func cancel() {
        if state.ending.withLock({ $0 == nil }) { cancelRequest() }
    }

    deinit { cancel() }
}

/// One part of a request to every worker (``BusClient/gather(_:_:timeout:)``).
public enum GatherEvent<Result: Decodable & Sendable>: Decodable, Sendable {
    /// First: the workers the request went to, one answer expected from each; then the
    /// workers each other cell that offers the service asked, as it says.
    case asked(workers: [String])
    /// One worker's answer: its result, or the error it answered.
    case answer(worker: String, Swift.Result<Result, JSONRPCError>)

    private enum Keys: String, CodingKey { case workers, worker, result, error }
    private enum ErrorKeys: String, CodingKey { case code, message, data }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: Keys.self)
        if let workers = try container.decodeIfPresent([String].self, forKey: .workers) {
            self = .asked(workers: workers)
            return
        }
        let worker = try container.decode(String.self, forKey: .worker)
        if container.contains(.error) {
            let error = try container.nestedContainer(keyedBy: ErrorKeys.self, forKey: .error)
            self = .answer(worker: worker, .failure(JSONRPCError(code: try error.decode(Int.self, forKey: .code), message: try error.decode(String.self, forKey: .message),
                                                                 data: try error.decodeIfPresent(JSONValue.self, forKey: .data))))
        } else {
            self = .answer(worker: worker, .success(try container.decode(Result.self, forKey: .result)))
        }
    }
}

/// How a request to every worker ended: answers expected and received, and each worker that
/// did not answer, with why (`died`, `drained`, `timed_out`; `unavailable`: another cell
/// that offered the service asked none of its workers).
public struct GatherSummary: Codable, Sendable, Equatable {
    public struct Missing: Codable, Sendable, Equatable {
        public var worker: String
        public var reason: String
        /// The cell whose worker (or whose kernel, for `unavailable`) it was, when not the client's.
        public var cell: String?
        public init(worker: String, reason: String, cell: String? = nil) { (self.worker, self.reason, self.cell) = (worker, reason, cell) }
    }
    public var expected: Int
    public var answered: Int
    public var missing: [Missing]
    public init(expected: Int, answered: Int, missing: [Missing]) { (self.expected, self.answered, self.missing) = (expected, answered, missing) }
}
