import BusKit
import BusProtocol
import Contracts
import Foundation
import SwitchboardTestSupport
import Testing

@Suite("switchboard up for operators: rolling restarts under load, drains, reloads", .serialized)
struct RollingRestartTests {
    @Test("sb restart under sb bench load: every service replaced with 0 failed and 0 re-sent; sb drain; SIGHUP and sb reload change the log level and refuse a broken file")
    func rollingRestart() async throws {
        let folder = try temporaryDirectory("rolling")
        let (config, broker) = try writeDeploymentConfig(in: folder)
        let up = try ChildProcess(switchboardExecutable(), ["up", "--config", config.path])
        defer { up.stop(grace: 15) }
        try await up.waitForOutput(containing: "Stop with Ctrl-C", within: 120)
        let old = bannerPids(up.outputSoFar)
        let sbOptions = ["--endpoint", broker, "--key-dir", busKeyFolder(in: folder).path]
        @Sendable func sb(_ arguments: String..., seconds: Double = 60) async throws -> CommandResult {
            try await runCommand(sbExecutable(), arguments + sbOptions, seconds: seconds)
        }
        let bus = try await BusClient(brokers: [broker], timeout: .seconds(10), curve: try busKeyFolder(in: folder).clientKeys())
        defer { Task { await bus.close() } }

        // Load on echo (pipelined, two clients) and on search (which asks the store too),
        // while every service is replaced.
        async let echoLoad = sb("bench", "--clients", "2", "--window", "8", "--duration", "6s", "--warmup", "0", "--json")
        async let searchLoad = sb("bench", "request", "search", "countries.search", #"{"query":"par","limit":3}"#,
                                  "--window", "4", "--duration", "6s", "--warmup", "0", "--json")
        try await eventually(10, "the load arrived") {
            let stats = try await bus.call(KernelAPI.stats)
            return (stats.services["echo"]?.requests ?? 0) > 100 && (stats.services["search"]?.requests ?? 0) > 10
        }
        let restart = try await sb("restart", "--json", seconds: 120)
        let restarted = try #require(try jsonLines(restart.stdout).first?["restarted"]?.arrayValue, "\(restart)")
        #expect(restart.status == 0 && restarted.compactMap { $0["name"]?.stringValue } == ["echo", "store", "streams", "fetcher", "search", "pricing", "gateway"])
        for entry in restarted {
            let name = entry["name"]?.stringValue ?? ""
            #expect(entry["oldPid"]?.intValue == Int64(old[name] ?? 0) && entry["newPid"]?.intValue != entry["oldPid"]?.intValue, "\(name)")
            #expect(!isAlive(old[name] ?? 0), "the old \(name) left")
        }
        for (what, load) in [("echo", try await echoLoad), ("search", try await searchLoad)] {
            let report = try jsonLines(load.stdout).first
            #expect(load.status == 0 && report?["failed"] == 0 && (report?["requests"]?.intValue ?? 0) > 0, "\(what): \(load)")
        }
        let stats = try await bus.call(KernelAPI.stats)
        for (name, figures) in stats.services {
            #expect(figures.redispatched == 0 && figures.outcomeUnknown == 0 && figures.unavailable == 0, "\(name): \(figures)")
        }
        #expect(try await bus.call(KernelAPI.servicesList).services.first { $0.name == "search" }?.workers == 2)

        // sb drain: the process answers what it holds and leaves; up leaves it down until
        // sb restart names it.
        let drained = try await sb("drain", "echo")
        #expect(drained.status == 0 && drained.stdout.contains("draining 1 worker connection of echo in 1 process"), "\(drained)")
        try await up.waitForOutput(containing: "drained and left")
        #expect(try await sb("services").stdout.contains("echo: drained and stopped"))
        let started = try await sb("restart", "echo")
        #expect(started.status == 0 && started.stdout.hasPrefix("started echo (it was not running): pid "), "\(started)")
        #expect(try await bus.request(service: "echo", method: "echo", params: ["back": true])["back"] == true)
        #expect(try await sb("restart", "kernel").stderr.contains("the kernel is not restarted in place"))

        // Reload: a broken file is refused, naming the key (SIGHUP: logged; sb reload: exit 78).
        let text = try String(contentsOf: config, encoding: .utf8)
        try (text + "\nlimits_typo: 1\n").write(to: config, atomically: true, encoding: .utf8)
        up.signal(SIGHUP)
        try await up.waitForOutput(containing: "reload (SIGHUP) refused; the running configuration stays")
        #expect(up.outputSoFar.contains("limits_typo"))
        let refused = try await sb("reload")
        #expect(refused.status == 78 && refused.stderr.contains("limits_typo"), "\(refused)")
        // A good file: the log level changes in every process (info lines stop).
        try text.replacingOccurrences(of: "log_level: info", with: "log_level: warning").write(to: config, atomically: true, encoding: .utf8)
        let reloaded = try await sb("reload", "--json")
        let applied = try jsonLines(reloaded.stdout).first?["applied"]
        #expect(reloaded.status == 0 && applied == ["log_level"], "\(reloaded)")
        let before = up.outputSoFar.utf8.count
        #expect(try await sb("restart", "echo").status == 0)
        let after = String(decoding: up.outputSoFar.utf8.dropFirst(before), as: UTF8.self)
        #expect(!after.contains(" info ") && !after.contains(" notice "), "\(after)")

        up.signal(SIGTERM)
        #expect(await up.exit(within: 60))
        #expect(up.terminationStatus == 0)
    }
}
