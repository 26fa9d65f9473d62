import ArgumentParser
import BusKit
import BusProtocol
import Foundation

struct Run: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Run a script of requests, one JSON line each, and print the answers as JSON lines in order.",
        discussion: """
            Each line is {"service": ..., "method": ..., "params": ...} (params optional); blank lines and lines starting with # are skipped. Each answer is {"line", "service", "method", "result"} or {"line", ..., "error": {"code", "message", "data"?}}. Each request is sent as soon as its line is read, so a script may come from a program still writing it, or be typed. Without --continue-on-error the script stops at the first failure (requests already sent are still answered). The exit status is 0 when every request succeeded, else that of the first failure (1 a service error or a bad line, 69 unavailable, 75 timed out).

            Examples:
              sb run requests.jsonl
              echo '{"service":"search","method":"countries.search"}' | sb run -
              sb run big.jsonl --parallel 8 --continue-on-error > answers.jsonl
              tail -f requests.jsonl | sb run - --continue-on-error
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @Argument(help: "The script (default or '-': standard input).") var file: String?
    @Option(parsing: .unconditional, help: "Requests in flight at once (1 to 10000).") var parallel = 1
    @Flag(help: "Go on after a failed request.") var continueOnError = false

    func validate() throws {
        guard (1...10_000).contains(parallel) else { throw ValidationError("--parallel must be 1 to 10000") }
    }

    /// One line of the script: a request, or why it is not one.
    enum Step: Sendable {
        case request(line: Int, service: String, method: String, params: JSONValue?)
        case invalid(line: Int, error: JSONRPCError)

        /// The step line `number` holds; nil for a blank line or a comment.
        init?(_ bytes: ArraySlice<UInt8>, number: Int) {
            // Not repaired into U+FFFD: a line that is not UTF-8 is not JSON.
            guard let rawLine = String(validating: bytes, as: UTF8.self) else {
                self = .invalid(line: number, error: JSONRPCError.parseError("line \(number) is not valid UTF-8"))
                return
            }
            let line = rawLine.trimmingCharacters(in: .whitespacesAndNewlines)
            if line.isEmpty || line.hasPrefix("#") { return nil }
            guard let value = try? JSONValue(parsing: Array(line.utf8)) else {
                self = .invalid(line: number, error: JSONRPCError.parseError("line \(number) is not valid JSON"))
                return
            }
            guard let service = value["service"]?.stringValue, let method = value["method"]?.stringValue else {
                self = .invalid(line: number, error: JSONRPCError.invalidRequest("line \(number) needs \"service\" and \"method\" strings"))
                return
            }
            self = .request(line: number, service: service, method: method, params: value["params"])
        }
    }

    /// What the run loop waits for: a step read, the script's end, or an answer.
    enum Event: Sendable {
        case step(Step)
        case end(unreadable: String?)
        case answered(index: Int, answer: JSONValue, status: Int32?)
    }

    func run() async throws {
        let source = try ScriptSource(file)
        let client = try await connection.client()
        let (events, post) = AsyncStream.makeStream(of: Event.self)
        // Made empty and then given its room: libdispatch traps when a semaphore is freed
        // below the value it was made with, as this one is when the script stops early.
        let room = DispatchSemaphore(value: 0)
        for _ in 0..<parallel { room.signal() }
        source.read(into: post, room: room)
        var firstFailure: Int32?
        var unreadable: String?
        var (launched, inFlight, answered, printed, ended) = (0, 0, 0, 0, false)
        // Answers are printed in the script's order, each as soon as those before it are.
        var held: [Int: (JSONValue, Int32?)] = [:]
        await withDiscardingTaskGroup { group in
            for await event in events {
                let stopping = firstFailure != nil && !continueOnError
                switch event {
                case .step(let step) where !stopping:
                    let index = launched
                    launched += 1
                    inFlight += 1
                    group.addTask {
                        let (answer, status) = await Self.answer(step, client: client)
                        post.yield(.answered(index: index, answer: answer, status: status))
                    }
                case .step:
                    break
                case .end(let reason):
                    (ended, unreadable) = (true, reason)
                case .answered(let index, let answer, let status):
                    inFlight -= 1
                    answered += 1
                    room.signal()
                    held[index] = (answer, status)
                    while let (answer, status) = held.removeValue(forKey: printed) {
                        Output.line(answer.jsonString)
                        printed += 1
                        if let status, firstFailure == nil { firstFailure = status }
                    }
                    if launched > 20 { Output.progress("\(answered) answered") }
                }
                if inFlight == 0 && (ended || (firstFailure != nil && !continueOnError)) { break }
            }
        }
        Output.endProgress()
        await client.close()
        if let unreadable { throw ValidationError("the script: cannot read \(source.name): \(unreadable)") }
        if let firstFailure { throw ExitCode(firstFailure) }
    }

    static func answer(_ step: Step, client: BusClient) async -> (JSONValue, Int32?) {
        switch step {
        case .invalid(let line, let error):
            return (["line": .int(Int64(line)), "error": errorJSON(error)], ExitStatus.serviceError)
        case .request(let line, let service, let method, let params):
            var answer: [String: JSONValue] = ["line": .int(Int64(line)), "service": .string(service), "method": .string(method)]
            do {
                answer["result"] = try await call(client, service, method, params)
                return (.object(answer), nil)
            } catch let failure as Failure {
                answer["error"] = errorJSON(failure.error ?? JSONRPCError(code: JSONRPCError.internalErrorCode, message: failure.message))
                return (.object(answer), failure.status)
            } catch {
                answer["error"] = errorJSON(JSONRPCError(code: JSONRPCError.internalErrorCode, message: "\(error)"))
                return (.object(answer), ExitStatus.serviceError)
            }
        }
    }

    static func errorJSON(_ error: JSONRPCError) -> JSONValue {
        var object: [String: JSONValue] = ["code": .int(Int64(error.code)), "message": .string(error.message)]
        if let data = error.data { object["data"] = data }
        return .object(object)
    }
}

/// Where a script's lines come from: a file, or standard input (a terminal, another program).
/// They are read as they arrive, on a thread of their own: a read that waits (a person typing,
/// a program still writing) must not hold one of Swift's few cooperative threads, and each
/// request goes out as soon as its line is read, not once the script has ended. A line is read
/// only while fewer than `--parallel` requests are unanswered, so a script of any length, or one
/// that never ends, takes no more memory than the requests in flight.
struct ScriptSource: Sendable {
    let descriptor: Int32
    /// The file, or "standard input", for a message.
    let name: String
    /// A line longer than this could not go in one message: it is answered as an error and
    /// skipped, without being kept.
    static let longestLine = MDP.defaultMaxMessageSize

    init(_ file: String?) throws(ValidationError) {
        if let file, file != "-" {
            (descriptor, name) = (try openForReading(file, for: "the script"), file)
        } else {
            (descriptor, name) = (STDIN_FILENO, "standard input")
            if isatty(STDIN_FILENO) == 1 {
                Output.diagnostic("reading requests from standard input, one JSON line each (end with Ctrl-D)")
            }
        }
    }

    /// Starts the reader: each step is posted once there is room for it (`room` is signalled
    /// as a request is answered), then the end, or why the script could not be read.
    func read(into post: AsyncStream<Run.Event>.Continuation, room: DispatchSemaphore) {
        let descriptor = descriptor
        Thread.detachNewThread {
            var line: [UInt8] = []
            var (number, tooLong) = (0, false)
            func endOfLine() {
                number += 1
                let step = tooLong
                    ? Run.Step.invalid(line: number, error: JSONRPCError.invalidRequest("line \(number) is longer than \(Self.longestLine) bytes, the most one message may carry"))
                    : Run.Step(line[...], number: number)
                (line, tooLong) = ([], false)
                guard let step else { return }
                room.wait()
                post.yield(.step(step))
            }
            var chunk = [UInt8](repeating: 0, count: 64 * 1024)
            while true {
                let count = chunk.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
                if count < 0 && errno == EINTR { continue }
                if count < 0 {
                    post.yield(.end(unreadable: String(cString: strerror(errno))))
                    return
                }
                if count == 0 {
                    if !line.isEmpty || tooLong { endOfLine() }
                    post.yield(.end(unreadable: nil))
                    return
                }
                var start = 0
                while start < count {
                    let newline = chunk[start..<count].firstIndex(of: UInt8(ascii: "\n"))
                    if !tooLong { line += chunk[start..<(newline ?? count)] }
                    if line.count > Self.longestLine { (line, tooLong) = ([], true) }
                    guard let newline else { break }
                    endOfLine()
                    start = newline + 1
                }
            }
        }
    }
}
