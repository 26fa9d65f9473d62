import AsyncHTTPClient
import BusProtocol
import NIOCore

/// The changes to a range of keys from a revision on, as they happen (etcd's watch over its
/// JSON gateway: one long POST whose answer is a stream of JSON lines).
///
/// When the connection drops, its member goes or loses etcd's leader (the watch asks for one,
/// as etcd's own client does), or nothing came for ``EtcdClient/Settings/watchSilence``, it
/// connects again (to the next member when one cannot be reached) and resumes from the
/// revision after the last change it delivered, so nothing is delivered twice or skipped. It ends with ``EtcdWatchUpdate/compacted(revision:)``
/// when etcd no longer holds the revisions it must resume from, and throws when etcd refuses
/// the watch or no member answers for ``EtcdClient/Settings/requestTimeout`` in a row.
/// Cancelling the task that iterates it ends it.
public struct EtcdWatch: AsyncSequence, Sendable {
    public typealias Element = EtcdWatchUpdate

    let client: EtcdClient
    let key: [UInt8]
    let end: [UInt8]?
    let start: Int64
    let progressNotify: Bool

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(watch: self, next: start) }

    /// Reads the watch's stream in the caller's task: connecting, reading and connecting
    /// again all happen inside ``next()``, so cancelling the caller ends the watch and
    /// dropping the iterator closes its connection.
    public struct AsyncIterator: AsyncIteratorProtocol {
        let watch: EtcdWatch
        /// The revision to resume from: the one after the last change or progress delivered.
        var next: Int64
        var body: HTTPClientResponse.Body.AsyncIterator?
        var endpoint = ""
        /// Bytes read and not yet a whole line.
        var pending: [UInt8] = []
        var ended = false

        var operation: String { "watch \(EtcdClient.describe(watch.key))" }

        public mutating func next() async throws -> EtcdWatchUpdate? {
            while !ended {
                if Task.isCancelled { return nil }
                if let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                    let line = Array(pending[..<newline])
                    pending.removeSubrange(...newline)
                    if let update = try update(from: line) { return update }
                    continue
                }
                if body == nil { try await connect() }
                let chunk: ByteBuffer?
                do {
                    chunk = try await body?.next()
                } catch {
                    if Task.isCancelled { return nil }
                    body = nil  // The connection dropped: connect again.
                    continue
                }
                guard let chunk else {
                    body = nil  // The member closed the stream: connect again.
                    continue
                }
                // A line is one answer: bounded as a whole answer is.
                guard pending.count + chunk.readableBytes <= EtcdClient.maxAnswerBytes else {
                    throw EtcdError(operation: operation, endpoint: endpoint, kind: .malformedAnswer,
                                    message: "a line of the watch past \(EtcdClient.maxAnswerBytes) bytes")
                }
                pending.append(contentsOf: chunk.readableBytesView)
            }
            return nil
        }

        /// What one line of the stream says: an update to deliver, or nil (the watch was
        /// created); ends the watch when it was compacted.
        mutating func update(from line: [UInt8]) throws(EtcdError) -> EtcdWatchUpdate? {
            guard !line.isEmpty else { return nil }
            let message = try EtcdClient.answer(line, status: 200, operation: operation, endpoint: endpoint)
            guard let result = message["result"] else {
                // A stream's error comes as {"error": {"grpc_code", "message", ...}}.
                if let error = message["error"] {
                    throw EtcdError(operation: operation, endpoint: endpoint, kind: .refused(code: Int(error["grpc_code"]?.intValue ?? 0)),
                                    message: error["message"]?.stringValue ?? "\(error)")
                }
                throw EtcdError(operation: operation, endpoint: endpoint, kind: .malformedAnswer, message: "a line with no result")
            }
            let compactRevision = GatewayJSON.int(result["compact_revision"])
            if compactRevision > 0 {
                ended = true
                body = nil
                return .compacted(revision: compactRevision)
            }
            if result["canceled"]?.boolValue == true {
                throw EtcdError(operation: operation, endpoint: endpoint, kind: .refused(code: 0),
                                message: "the watch was cancelled: \(result["cancel_reason"]?.stringValue ?? "no reason given")")
            }
            if result["created"]?.boolValue == true { return nil }
            let events = (result["events"]?.arrayValue ?? []).map(GatewayJSON.event)
            let revision = GatewayJSON.revision(result)
            // The revision after, wrapping: a revision no etcd reaches (Int64.max) from a member
            // leaves the resume point where it was instead of trapping.
            if let last = events.last {
                next = Swift.max(next, last.keyValue.modRevision &+ 1)
                return .events(events, revision: revision)
            }
            next = Swift.max(next, revision &+ 1)
            return .progress(revision: revision)
        }

        /// Opens the watch from ``next`` on the first member that takes it, trying each in
        /// turn and waiting a little longer after each round; throws once none answered for
        /// the client's request timeout, or when one refuses the watch.
        mutating func connect() async throws {
            let client = watch.client
            var create: [String: JSONValue] = ["key": GatewayJSON.bytes(watch.key), "start_revision": GatewayJSON.int(next)]
            if let end = watch.end { create["range_end"] = GatewayJSON.bytes(end) }
            if watch.progressNotify { create["progress_notify"] = true }
            let since = ContinuousClock.now
            var pause = Duration.milliseconds(50)
            var problems: [String] = []
            pending = []
            while true {
                for (index, endpoint) in client.endpointsToTry() {
                    try Task.checkCancellation()
                    do {
                        var request = try await client.request(endpoint + "/v3/watch", body: ["create_request": .object(create)], endpoint: endpoint)
                        // gRPC metadata through etcd's gateway: a member that has no leader (cut
                        // off from etcd's majority) ends the watch rather than keep it silent.
                        request.headers.add(name: "Grpc-Metadata-hasleader", value: "true")
                        // Open as long as the watch lasts: it ends when the caller stops, the
                        // member goes, or it is silent too long (the read timeout).
                        let response = try await client.watchHTTP.execute(request, deadline: .distantFuture)
                        guard response.status == .ok else {
                            let bytes = try await response.body.collect(upTo: 1 << 20)
                            _ = try EtcdClient.answer(Array(bytes.readableBytesView), status: response.status.code, operation: operation, endpoint: endpoint)
                            throw EtcdError(operation: operation, endpoint: endpoint, kind: .refused(code: 0), message: "HTTP \(response.status.code)")
                        }
                        body = response.body.makeAsyncIterator()
                        self.endpoint = endpoint
                        client.answered(by: index)
                        return
                    } catch let error as EtcdError where error.kind == .refused(code: EtcdError.unauthenticated) && client.settings.username != nil {
                        // The token expired while the watch was away: the next try asks for a new one.
                        client.forgetToken()
                        problems.append("\(endpoint): \(error.message)")
                    } catch let error as EtcdError where error.kind != .unreachable && error.kind != .timedOut {
                        throw error
                    } catch {
                        problems.append("\(endpoint): \(client.describe(error, at: endpoint))")
                    }
                }
                guard ContinuousClock.now - since < client.settings.requestTimeout else {
                    throw EtcdError(operation: operation, endpoint: nil, kind: .unreachable,
                                    message: "no member took the watch within \(client.settings.requestTimeout): \(problems.suffix(3).joined(separator: ", "))")
                }
                try await Task.sleep(for: pause)
                pause = Swift.min(pause * 2, .seconds(1))
            }
        }
    }
}
