import ArgumentParser
import BusKit
import BusProtocol
import Foundation

struct Run: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Run a script of requests, one JSON line each, and print the answers as JSON lines in order.",
        discussion: """
            Each line is {"service": ..., "method": ..., "params": ...} (params optional); blank lines and lines starting with # are skipped. Each answer is {"line", "service", "method", "result"} or {"line", ..., "error": {"code", "message", "data"?}}. Without --continue-on-error the script stops at the first failure (requests already sent are still answered). The exit status is 0 when every request succeeded, else that of the first failure (1 a service error or a bad line, 69 unavailable, 75 timed out).

            Examples:
              sb run requests.jsonl
              echo '{"service":"search","method":"countries.search"}' | sb run -
              sb run big.jsonl --parallel 8 --continue-on-error > answers.jsonl
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @Argument(help: "The script (default or '-': standard input).") var file: String?
    @Option(parsing: .unconditional, help: "Requests in flight at once.") var parallel = 1
    @Flag(help: "Go on after a failed request.") var continueOnError = false

    func validate() throws {
        guard parallel >= 1 else { throw ValidationError("--parallel must be 1 or more") }
    }

    /// One line of the script: a request, or why it is not one.
    enum Step: Sendable {
        case request(line: Int, service: String, method: String, params: JSONValue?)
        case invalid(line: Int, error: JSONRPCError)
    }

    func readSteps() throws -> [Step] {
        let data: Data
        if let file, file != "-" {
            data = try fileContents(file, for: "the script")
        } else {
            data = Data(try StandardInput.read(atMost: .max))
        }
        var steps: [Step] = []
        for (index, rawBytes) in data.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false).enumerated() {
            let number = index + 1
            // Not repaired into U+FFFD: a line that is not UTF-8 is not JSON.
            guard let rawLine = String(validating: rawBytes, as: UTF8.self) else {
                steps.append(.invalid(line: number, error: JSONRPCError.parseError("line \(number) is not valid UTF-8")))
                continue
            }
            let line = rawLine.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") { continue }
            guard let value = try? JSONValue(parsing: Array(line.utf8)) else {
                steps.append(.invalid(line: number, error: JSONRPCError.parseError("line \(number) is not valid JSON")))
                continue
            }
            guard let service = value["service"]?.stringValue, let method = value["method"]?.stringValue else {
                steps.append(.invalid(line: number, error: JSONRPCError.invalidRequest("line \(number) needs \"service\" and \"method\" strings")))
                continue
            }
            steps.append(.request(line: number, service: service, method: method, params: value["params"]))
        }
        return steps
    }

    func run() async throws {
        let steps = try readSteps()
        let client = try await connection.client()
        var firstFailure: Int32?
        var next = 0
        var done = 0
        // Answers are printed in the script's order; up to `parallel` requests are in flight.
        var pending: [Int: (JSONValue, Int32?)] = [:]
        var printed = 0
        await withTaskGroup(of: (Int, JSONValue, Int32?).self) { group in
            func launch() {
                let index = next
                next += 1
                group.addTask { await Self.answer(steps[index], client: client, index: index) }
            }
            while next < steps.count && next < parallel { launch() }
            while let (index, answer, status) = await group.next() {
                pending[index] = (answer, status)
                done += 1
                while let (answer, status) = pending.removeValue(forKey: printed) {
                    Output.line(answer.jsonString)
                    printed += 1
                    if let status, firstFailure == nil { firstFailure = status }
                }
                if steps.count > 20 { Output.progress("\(done)/\(steps.count)") }
                let stopping = firstFailure != nil && !continueOnError
                if !stopping && next < steps.count { launch() }
            }
        }
        Output.endProgress()
        await client.close()
        if let firstFailure { throw ExitCode(firstFailure) }
    }

    static func answer(_ step: Step, client: BusClient, index: Int) async -> (Int, JSONValue, Int32?) {
        switch step {
        case .invalid(let line, let error):
            return (index, ["line": .int(Int64(line)), "error": errorJSON(error)], ExitStatus.serviceError)
        case .request(let line, let service, let method, let params):
            var answer: [String: JSONValue] = ["line": .int(Int64(line)), "service": .string(service), "method": .string(method)]
            do {
                answer["result"] = try await call(client, service, method, params)
                return (index, .object(answer), nil)
            } catch let failure as Failure {
                answer["error"] = errorJSON(failure.error ?? JSONRPCError(code: JSONRPCError.internalErrorCode, message: failure.message))
                return (index, .object(answer), failure.status)
            } catch {
                answer["error"] = errorJSON(JSONRPCError(code: JSONRPCError.internalErrorCode, message: "\(error)"))
                return (index, .object(answer), ExitStatus.serviceError)
            }
        }
    }

    static func errorJSON(_ error: JSONRPCError) -> JSONValue {
        var object: [String: JSONValue] = ["code": .int(Int64(error.code)), "message": .string(error.message)]
        if let data = error.data { object["data"] = data }
        return .object(object)
    }
}
