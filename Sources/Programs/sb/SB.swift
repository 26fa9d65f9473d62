import ArgumentParser
import CommandWords
import Contracts
import Foundation
import Logging
import ServiceLifecycle
import StandardStreams
import Synchronization
import Telemetry

/// `sb`: the Switchboard client. It talks to the kernel (7/MDP requests, 12/CHP state) and
/// links BusKit only, not the services.
@main
struct SB: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sb",
        abstract: "Talk to a Switchboard bus: requests, state subscriptions, scripts, and a verb for each app.",
        discussion: """
            Generic verbs: request (req), subscribe (sub), publish (pub), kv, run, services, describe, stats, ping, bench. Operations: workers, drain, restart, reload. Streams: stream. App verbs: countries, places, items, news, flights, datasets.

            Every verb takes --endpoint (SB_ENDPOINT, default tcp://127.0.0.1:5555), --state-endpoint (SB_STATE_ENDPOINT) and --timeout (SB_TIMEOUT, default 5s); for a kernel with CURVE on, --server-key (SB_SERVER_KEY) and --key-file (SB_KEY_FILE). App verbs print tables, or JSON with --json. Data goes to stdout, diagnostics to stderr. Colour only on a terminal, never with NO_COLOR set.

            Exit status: 0 success, 1 the service answered an error, 64 usage (bad flags or JSON), 69 no such service or no kernel, 74 its output could not be written (a full disk, a closed stdout), 75 timed out, 78 a configuration refused (sb reload), 130 interrupted (Ctrl-C: what the verb asked is cancelled first, so a worker streaming to it stops).

            Examples:
              sb services
              sb describe pricing
              sb countries par
              sb places open "12.9716, 77.5946"
              sb news sources --select bbc-news reuters && sb news headlines
              sb flights route --select 3 14
              sb sub /pricing/ --count 2
              sb stream pub orders.new '{"id": 7}'
              sb run script.jsonl --parallel 4

            Shell completions: sb --generate-completion-script bash (or zsh, fish).
            """,
        version: SwitchboardVersion.current,
        subcommands: [Request.self, Subscribe.self, Publish.self, KV.self, Run.self, Services.self, Describe.self, Stats.self, Ping.self, Bench.self,
                      Workers.self, Drain.self, Restart.self, Reload.self, Stream.self,
                      Countries.self, Places.self, Items.self, News.self, Flights.self, Datasets.self]
    )

    /// A Z85 key may begin with '-' ("-=s!e…"), which the parser would take for a flag:
    /// `--server-key KEY` becomes `--server-key=KEY` before parsing.
    static func main() async {
        StandardStreams.guardAtStart()
        // With OTEL_EXPORTER_OTLP_ENDPOINT set, each request is a span exported to it; the
        // exporter runs beside the verb and flushes once it is done.
        let exporters: [any Service]
        do {
            exporters = try Telemetry.bootstrap(TelemetrySettings(), serviceName: "sb")
        } catch {
            Output.diagnostic("telemetry (OTEL_* variables): \(error)")
            Foundation.exit(ExitStatus.usage)
        }
        // Swift would quietly turn invalid UTF-8 in an argument into U+FFFD and send that.
        for index in 1..<Int(CommandLine.argc) {
            if let raw = CommandLine.unsafeArgv[index], String(validatingCString: raw) == nil {
                StandardStreams.writeError("Error: argument \(index) is not valid UTF-8\n")
                Foundation.exit(ExitStatus.usage)
            }
        }
        var arguments = Array(CommandLine.arguments.dropFirst())
        if let index = arguments.firstIndex(of: "--server-key"), index + 1 < arguments.count {
            arguments[index...index + 1] = ["--server-key=\(arguments[index + 1])"]
        }
        let verb = connectionOptionsAfterVerb(arguments)
        // With an exporter, the verb runs beside it, which is then stopped gracefully (it
        // sends the spans it holds) before the process exits with the verb's outcome.
        let exporting = exporters.isEmpty ? nil : ServiceGroup(services: exporters, gracefulShutdownSignals: [], logger: Logger(label: "sb.telemetry"))
        var failure: (any Error)?
        await withTaskGroup(of: Void.self) { tasks in
            if let exporting { tasks.addTask { try? await exporting.run() } }
            failure = await runUntilInterrupted(verb)
            await exporting?.triggerGracefulShutdown()
        }
        if let mistake = failure as? VerbUsageError {
            // As the parser tells a usage mistake, with the verb's usage, not sb's.
            let usage = usageString(for: mistake.verb)
            let verb = usage.split(separator: " ").prefix { !$0.hasPrefix("[") && !$0.hasPrefix("<") }.joined(separator: " ")
            StandardStreams.writeError("Error: \(mistake.error)\nUsage: \(usage)\n  See '\(verb) --help' for more information.\n")
            Foundation.exit(ExitStatus.usage)
        }
        if let failure {
            if exitCode(for: failure) == .validationFailure, let (group, refusal) = unknownVerb(arguments) {
                StandardStreams.writeError(CommandWords.refusalText(group: group, refusal))
                Foundation.exit(ExitStatus.usage)
            }
            if let hint = negativeValueHint(failure, verb) {
                StandardStreams.writeError(fullMessage(for: failure) + "\n" + hint + "\n")
                Foundation.exit(ExitStatus.usage)
            }
            exit(withError: failure)
        }
    }

    /// The parser takes any word beginning with '-' for an option, a negative number too
    /// (`sb kv put /n -5`: "Missing expected argument"); when it refused one so, a line that
    /// says how to give it. sb has no option that begins with a digit.
    static func negativeValueHint(_ failure: any Error, _ arguments: [String]) -> String? {
        let message = fullMessage(for: failure)
        guard exitCode(for: failure) == .validationFailure,
              let value = arguments.prefix(while: { $0 != "--" }).first(where: isNegativeNumber),
              message.contains("Unknown option '\(value)'") || message.contains("Missing value for") || message.contains("Missing expected argument")
        else { return nil }
        return "Note: sb took '\(value)' for an option; give such a value after -- (sb kv put KEY -- \(value)) or joined to its option (--NAME=\(value))."
    }

    /// Whether a word is a negative number ("-5", "-.5", "-33.86,"), never one of sb's options.
    static func isNegativeNumber(_ word: String) -> Bool {
        word.hasPrefix("-") && (word.dropFirst().first.map { $0.isNumber || $0 == "." } ?? false)
    }

    /// A usage mistake a verb finds once it runs (a file it cannot read), with the verb.
    struct VerbUsageError: Error {
        let verb: any ParsableCommand.Type
        let error: ValidationError
    }

    /// Parses and runs the verb in a task that Ctrl-C (SIGINT) or SIGTERM cancels: a verb
    /// waiting on the bus then ends as cancelled, its client cancelling what it asked (a reply
    /// in parts under way stops its worker: `sb stream sub` leaves its consumer's messages to
    /// the group's other readers) and closing, and sb exits 128 + the signal. A second signal
    /// exits at once. Returns how the verb failed, if it did.
    static func runUntilInterrupted(_ arguments: [String]) async -> (any Error)? {
        enum Outcome: Sendable { case ended((any Error)?), interrupted(Int32) }
        // A signal handler reaches the verb through a stream its task group reads.
        let (signals, signalled) = AsyncStream.makeStream(of: Int32.self)
        let received = Interrupt()
        let sources = [SIGINT, SIGTERM].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                guard received.first() else { Foundation.exit(128 + number) }
                signalled.yield(number)
            }
            source.resume()
            return source
        }
        defer { for source in sources { source.cancel() } }
        return await withTaskGroup(of: Outcome.self) { group in
            group.addTask {
                do {
                    var command = try parseAsRoot(arguments)
                    do {
                        if var verb = command as? any AsyncParsableCommand { try await verb.run() } else { try command.run() }
                    } catch let mistake as ValidationError {
                        throw VerbUsageError(verb: type(of: command), error: mistake)
                    }
                    return .ended(nil)
                } catch {
                    return .ended(error)
                }
            }
            group.addTask {
                for await number in signals { return .interrupted(number) }
                return .ended(nil)
            }
            let first = await group.next()
            guard case .interrupted(let number)? = first else {
                // The verb ended: so does the wait for a signal.
                signalled.finish()
                _ = await group.next()
                if case .ended(let failure)? = first { return failure }
                return nil
            }
            group.cancelAll()
            _ = await group.next()
            return ExitCode(128 + number)
        }
    }

    /// Whether a signal interrupted the verb already.
    final class Interrupt: Sendable {
        private let received = Atomic<Bool>(false)
        /// True for the first signal only.
        func first() -> Bool { !received.exchange(true, ordering: .relaxed) }
    }

    /// Options every verb takes, as in `sb --endpoint tcp://host:5555 services`: moved
    /// after the verb, where the parser looks for them.
    static func connectionOptionsAfterVerb(_ arguments: [String]) -> [String] {
        let index = verbStart(arguments)
        guard index > 0, index < arguments.count else { return arguments }
        // Past the verb and its sub-verbs (`news saved`), where the options are defined.
        var end = index, commands = configuration.subcommands
        while end < arguments.count, let command = CommandWords.verb(named: arguments[end], among: commands) {
            commands = command.configuration.subcommands
            end += 1
            if commands.isEmpty { break }
        }
        guard end > index else { return arguments }
        return Array(arguments[index..<end]) + arguments[..<index] + arguments[end...]
    }

    /// Where the verb starts: past the connection options (with their values) and `--json`
    /// given before it.
    static func verbStart(_ arguments: [String]) -> Int {
        let valued: Set = ["--endpoint", "--state-endpoint", "--timeout", "--server-key", "--key-file", "--key-dir"]
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            guard valued.contains(String(argument.prefix { $0 != "=" })) || argument == "--json" else { break }
            index += argument.contains("=") || argument == "--json" ? 1 : 2
        }
        return min(index, arguments.count)
    }

    /// Where sb or one of its verbs is given a word that names none of its verbs (`sb kv set`,
    /// `sb stream frob`, connection options before it or not): the verb as typed, and the
    /// refusal (``CommandWords``). A default sub-verb takes such a word as its own (`sb countries
    /// par`) unless it takes none (``TakesNoWord``).
    static func unknownVerb(_ arguments: [String]) -> (group: String, refusal: String)? {
        CommandWords.unknownVerb(arguments, from: verbStart(arguments), root: SB.self, path: "sb") { $0 is any TakesNoWord.Type }
    }
}
