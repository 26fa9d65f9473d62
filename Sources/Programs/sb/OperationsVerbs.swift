import ArgumentParser
import BusKit
import BusProtocol
import Contracts
import Foundation

struct Workers: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "workers",
        abstract: "List the worker connections the kernel holds: their id, process, window, requests in flight, and whether they drain.",
        discussion: """
            A ServiceHost's connection id is HOST:PID:RANDOM/INDEX/GENERATION; the part before the first / is its process (what sb drain --worker takes).

            Examples:
              sb workers
              sb workers search --json
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "Only this service's workers.") var service: String?

    func run() async throws {
        try await withActiveKernel(connection, printing: false) { client in
            let answer = try await call(client, KernelAPI.workersList, .init(service: service))
            if let service, answer.value.workers.isEmpty {
                // None: a service with no worker now, or a name the kernel does not know.
                _ = try servicesAsked([service], known: try await call(client, KernelAPI.servicesList).value.services.map(\.name))
            }
            if output.json { return Output.json(answer.json, compact: true) }
            Output.table(["SERVICE", "WORKER", "WINDOW", "IN FLIGHT", "DRAINING"], answer.value.workers.map { worker in
                [worker.service, worker.id, "\(worker.window)", "\(worker.inFlight)", worker.draining ? Output.styled("yes", .red) : "no"]
            })
        }
    }
}

struct Drain: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "drain",
        abstract: "Drain a service's workers: they take no new requests (the kernel sends them elsewhere), answer those they hold, then leave.",
        discussion: """
            A Switchboard worker process whose connection is drained drains all its connections and exits (status 0); under switchboard up it stays down until sb restart SERVICE. A plain 7/MDP worker is sent DISCONNECT once it holds nothing. Requests for a service with no worker left wait in the kernel's queue (kernel.queue_timeout_ms) for one. Sent with the operator's key (KEYS/operator.key, which switchboard up makes); the kernel refuses any other key (-32011).

            Examples:
              sb drain search                                 every search worker
              sb drain search --worker web1:4242:9f3c2a1b     one process (see sb workers)
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The service.") var service: String
    @Option(help: "Only this worker: a connection id, or a process (the id's part before the first /).") var worker: String?

    func run() async throws {
        try await withActiveKernel(connection, printing: false, asOperator: true) { client in
            let answer = try await call(client, KernelAPI.workersDrain, .init(service: service, worker: worker))
            if output.json { return Output.json(answer.json, compact: true) }
            let processes = Set(answer.value.workers.map(\.process))
            Output.line("draining \(answer.value.workers.count) worker connection\(answer.value.workers.count == 1 ? "" : "s") of \(service) in \(processes.count) process\(processes.count == 1 ? "" : "es"): \(processes.sorted().joined(separator: ", "))")
        }
    }
}

struct Restart: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "restart",
        abstract: "Replace the processes of switchboard up's services one at a time, without a failed or re-sent request.",
        discussion: """
            For each service, up starts a new process, waits until its workers are registered beside the old ones, then tells the old process to drain: it takes no new requests, answers those it holds, and leaves. The gateway, which cannot share its port, is stopped and then started. The kernel is not restarted this way. SIGUSR2 to switchboard up restarts every service the same way. This waits for the whole restart (--timeout applies to each service, at least 2 minutes). Sent with the operator's key (KEYS/operator.key, which switchboard up makes); the kernel refuses any other key (-32011).

            Examples:
              sb restart                  every service, then the gateway
              sb restart search pricing
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The services, in order (default: all that up runs).") var services: [String] = []

    func run() async throws {
        try await withActiveKernel(connection, printing: false, asOperator: true) { client in
            try await requireSupervisor(client)
            let timeout = max(try connection.requestTimeout, .seconds(120)) * max(services.count, 6)
            let answer = try await call(client, SupervisorAPI.restart, .init(services: services.isEmpty ? nil : services), timeout: timeout)
            if output.json { return Output.json(answer.json, compact: true) }
            for entry in answer.value.restarted {
                // A service drained and stopped had no process to replace: it is started.
                Output.line(entry.oldPid.map { "restarted \(entry.name): pid \($0) -> \(entry.newPid)" } ?? "started \(entry.name) (it was not running): pid \(entry.newPid)")
            }
        }
    }
}

struct Reload: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reload",
        abstract: "Make switchboard up read its configuration again and apply what can change live.",
        discussion: """
            Live: log levels, worker counts (that service is restarted the rolling way), gateway.tokens, the kernel's allowed keys (security.client_keys, worker_keys, operator_keys, and the key folder's clients/*.pub and operators/*.pub: each file added, removed or changed is named; a key removed is refused from its next connection on, and on the connections it holds its requests are answered -32011 and a worker with it is told to go) and its limits (queue_timeout_ms, max_queued, max_queued_bytes, max_services, client_share_percent, max_deliveries, no_retry, state_max_*, client_state_max_*). Anything else changed is listed as needing a restart. A file that does not read is refused and the running configuration stays: the message names the key, exit status 78. SIGHUP to switchboard up does the same. Sent with the operator's key (KEYS/operator.key, which switchboard up makes); the kernel refuses any other key (-32011).
            Example:
              sb reload
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        try await withActiveKernel(connection, printing: false, asOperator: true) { client in
            try await requireSupervisor(client)
            let answer: Answer<SupervisorAPI.Reloaded>
            do {
                answer = try await call(client, SupervisorAPI.reload, timeout: max(try connection.requestTimeout, .seconds(600)))
            } catch let failure as Failure where failure.error?.code == JSONRPCError.invalidConfigurationCode {
                throw Failure(status: ExitStatus.configuration, message: failure.message, error: failure.error)
            }
            if output.json { return Output.json(answer.json, compact: true) }
            let report = answer.value
            if report.applied.isEmpty && report.needsRestart.isEmpty {
                return Output.line("\(report.file ?? "the configuration"): nothing changed")
            }
            if !report.applied.isEmpty { Output.line("applied: \(report.applied.joined(separator: ", "))") }
            if !report.restarted.isEmpty { Output.line("restarted (rolling): \(report.restarted.joined(separator: ", "))") }
            if !report.needsRestart.isEmpty { Output.line(Output.styled("needs a restart of switchboard up: \(report.needsRestart.joined(separator: ", "))", .red)) }
        }
    }
}

/// `restart` and `reload` are `switchboard up`'s: without it there is nobody to ask.
private func requireSupervisor(_ client: BusClient) async throws {
    guard try await client.hasWorkers(SupervisorAPI.service) else {
        throw Failure(status: ExitStatus.unavailable, message: "no switchboard up supervises this bus (no 'supervisor' service is registered): restart its processes yourself (SIGTERM drains a service), and send each SIGHUP to reload")
    }
}
