import ArgumentParser
import Contracts
import Foundation
import Logging
import ServiceLifecycle
import Telemetry

/// `sb`: the Switchboard client. It talks to the kernel (7/MDP requests, 12/CHP state) and
/// links BusKit only, not the services.
@main
struct SB: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sb",
        abstract: "Talk to a Switchboard bus: requests, state subscriptions, scripts, and a verb for each app.",
        discussion: """
            Generic verbs: request (req), subscribe (sub), publish (pub), run, services, describe, stats, ping, bench. Operations: workers, drain, restart, reload. Streams: stream. App verbs: countries, places, items, news, flights, datasets.

            Every verb takes --endpoint (SB_ENDPOINT, default tcp://127.0.0.1:5555), --state-endpoint (SB_STATE_ENDPOINT) and --timeout (SB_TIMEOUT, default 5s); for a kernel with CURVE on, --server-key (SB_SERVER_KEY) and --key-file (SB_KEY_FILE). App verbs print tables, or JSON with --json. Data goes to stdout, diagnostics to stderr. Colour only on a terminal, never with NO_COLOR set.

            Exit status: 0 success, 1 the service answered an error, 64 usage (bad flags or JSON), 69 no such service or no kernel, 75 timed out, 78 a configuration refused (sb reload).

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
        subcommands: [Request.self, Subscribe.self, Publish.self, KV.self, Run.self, Services.self, Describe.self, Stats.self, Ping.self, Bench.self,
                      Workers.self, Drain.self, Restart.self, Reload.self, Stream.self,
                      Countries.self, Places.self, Items.self, News.self, Flights.self, Datasets.self]
    )

    /// A Z85 key may begin with '-' ("-=s!e…"), which the parser would take for a flag:
    /// `--server-key KEY` becomes `--server-key=KEY` before parsing.
    static func main() async {
        // With OTEL_EXPORTER_OTLP_ENDPOINT set, each request is a span exported to it; the
        // exporter runs beside the verb and flushes once it is done.
        let exporters: [any Service]
        do {
            exporters = try Telemetry.bootstrap(TelemetrySettings(), serviceName: "sb")
        } catch {
            FileHandle.standardError.write(Data("sb: telemetry (OTEL_* variables): \(error)\n".utf8))
            Foundation.exit(ExitStatus.usage)
        }
        // Swift would quietly turn invalid UTF-8 in an argument into U+FFFD and send that.
        for index in 1..<Int(CommandLine.argc) {
            if let raw = CommandLine.unsafeArgv[index], String(validatingCString: raw) == nil {
                FileHandle.standardError.write(Data("Error: argument \(index) is not valid UTF-8\n".utf8))
                Foundation.exit(ExitStatus.usage)
            }
        }
        var arguments = Array(CommandLine.arguments.dropFirst())
        if let index = arguments.firstIndex(of: "--server-key"), index + 1 < arguments.count {
            arguments[index...index + 1] = ["--server-key=\(arguments[index + 1])"]
        }
        let verb = connectionOptionsAfterVerb(arguments)
        guard !exporters.isEmpty else { return await main(verb) }
        // `main` would exit on a failure before the spans are sent: the verb runs here beside
        // the exporter, which is then stopped gracefully (it sends what it holds), and the
        // process exits with the verb's outcome.
        let group = ServiceGroup(services: exporters, gracefulShutdownSignals: [], logger: Logger(label: "sb.telemetry"))
        var failure: (any Error)?
        await withTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try? await group.run() }
            do {
                var command = try parseAsRoot(verb)
                if var verb = command as? any AsyncParsableCommand { try await verb.run() } else { try command.run() }
            } catch {
                failure = error
            }
            await group.triggerGracefulShutdown()
        }
        if let failure { exit(withError: failure) }
    }

    /// Options every verb takes, as in `sb --endpoint tcp://host:5555 services`: moved
    /// after the verb, where the parser looks for them.
    static func connectionOptionsAfterVerb(_ arguments: [String]) -> [String] {
        let valued: Set = ["--endpoint", "--state-endpoint", "--timeout", "--server-key", "--key-file", "--key-dir"]
        var leading: [String] = [], index = 0
        while index < arguments.count {
            let argument = arguments[index]
            let name = String(argument.prefix { $0 != "=" })
            guard valued.contains(name) || argument == "--json" else { break }
            leading.append(argument)
            if !argument.contains("="), argument != "--json", index + 1 < arguments.count {
                leading.append(arguments[index + 1])
                index += 1
            }
            index += 1
        }
        guard !leading.isEmpty, index < arguments.count else { return arguments }
        // Past the verb and its sub-verbs (`news saved`), where the options are defined.
        var end = index, commands = configuration.subcommands
        while end < arguments.count, let command = commands.first(where: {
            $0._commandName == arguments[end] || $0.configuration.aliases.contains(arguments[end])
        }) {
            commands = command.configuration.subcommands
            end += 1
            if commands.isEmpty { break }
        }
        guard end > index else { return arguments }
        return Array(arguments[index..<end]) + leading + arguments[end...]
    }
}
