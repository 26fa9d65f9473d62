import BusKit
import BusProtocol
import ZeroMQ
import Catalog
import Contracts
import Foundation
import Supervisor
import SwitchboardTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// The kills of one run, in order.
struct ChaosLog {
    struct Kill {
        /// Seconds into the run.
        let at: Double
        let piece: String
        let pid: Int32
        /// Seconds until the piece served again; nil if it did not within a minute.
        let recoveredAfter: Double?
        /// Of a kill not recovered from: what the last look found missing.
        var stillMissing: String? = nil
        /// Of a pair's active kernel: whether a request was asked after the kill, and seconds
        /// from the kill to the first one answered (nil: none within 30 s).
        var failoverAsked = false
        var failoverAfter: Double? = nil
        /// Replaced the rolling way (`sb restart`), not killed.
        var rolling = false
    }
    var kills: [Kill] = []
}

/// Kills a process of the bus (SIGKILL) at seeded random intervals and waits until `up`
/// has restarted it and it serves again before the next one. The victim "database" is the
/// soak's PostgreSQL server: stopped at once, as a crash would, and started again. A victim
/// "restart SERVICE" is not killed but replaced the rolling way, as `sb restart` does: the
/// old process drains and leaves in order, closing its database behind the new one.
struct Chaos {
    /// Dealt from at each kill in a seeded order, each entry once before any again, so as many
    /// kills as there are entries kill every piece: by default the kernel and the busiest
    /// services twice, and the services with a database once more the rolling way.
    var victims = ["kernel", "kernel", "store", "store", "search", "search", "fetcher", "pricing", "echo", "gateway", "streams",
                   "restart store", "restart streams"]
    static let rollingRestart = "restart "
    /// Clients with the operator's key, for the supervisors' rolling restarts: at this bus's
    /// kernel, and at the other cell's (each `up` restarts only the services it runs).
    var supervisors: [BusClient] = []
    /// What is left of the victims' current round.
    private var deck: [String] = []
    /// The streams service's PostgreSQL server (the victim "database").
    var database: TestPostgres?
    /// Of a bus in two cells: the other cell's `up` (its pieces are victims too; its kernel is
    /// "kernel b") and the etcd of their directory (the victim "etcd": its one member killed
    /// and started again).
    var otherCell: (processes: BusProcesses, etcd: TestEtcd?)?
    /// A request each service answers, to see it serving again.
    static let probes = [Call(EchoAPI.echo, [:]), Call(StoreAPI.historyList, .init()), Call(FetcherAPI.datasetsList),
                         Call(SearchAPI.sourcesList, .init()), Call(PricingAPI.dealsToday, .init()), Call(StreamsAPI.streamList)]

    var random: SeededGenerator
    let processes: BusProcesses
    let probe: BusClient
    let services: [String]
    /// Where the gateway listens: serving again means accepting connections there.
    let gatewayPort: Int
    let started: Date
    var log = ChaosLog()

    init(seed: UInt64, processes: BusProcesses, probe: BusClient, services: [String], gatewayPort: Int, started: Date) {
        random = SeededGenerator(seed: seed ^ 0xC4A0_5C4A_05C4_A05C)
        self.processes = processes
        self.probe = probe
        self.services = services
        self.gatewayPort = gatewayPort
        self.started = started
    }

    mutating func run(until end: Date, killEvery interval: ClosedRange<Double>) async {
        while true {
            let wait = Double.random(in: interval, using: &random)
            if deck.isEmpty { deck = victims.shuffled(using: &random) }
            let victim = deck.removeLast()
            guard Date().addingTimeInterval(wait) < end else { return }
            try? await Task.sleep(for: .milliseconds(Int(wait * 1000)))
            if victim == "database", let database {
                await crashAndRestart(database, since: started)
                continue
            }
            if victim == "etcd", let etcd = otherCell?.etcd {
                await killAndRestart(etcd, since: started)
                continue
            }
            if victim.hasPrefix(Self.rollingRestart) {
                await restartRolling(String(victim.dropFirst(Self.rollingRestart.count)))
                continue
            }
            guard let pid = pid(of: victim) else { continue }
            kill(pid, SIGKILL)
            let killedAt = Date()
            let missing = await missingAfter(60) { await notServing(victim, replacing: pid) }
            record(victim, pid: pid, killedAt: killedAt, missing: missing)
        }
    }

    /// Logs a kill and says how it went: serving again, or what was still missing a minute on.
    private mutating func record(_ piece: String, pid: Int32, killedAt: Date, missing: String?, problem: String? = nil, rolling: Bool = false) {
        var kill = ChaosLog.Kill(at: killedAt.timeIntervalSince(started), piece: rolling ? "\(piece) (rolling restart)" : piece, pid: pid,
                                 recoveredAfter: missing == nil ? Date().timeIntervalSince(killedAt) : nil)
        kill.stillMissing = missing
        kill.rolling = rolling
        log.kills.append(kill)
        let outcome = missing.map { "NOT back within 60 s: \($0)" } ?? String(format: "serving again after %.1f s", kill.recoveredAfter ?? 0)
        let what = (rolling ? "restarted " : "killed ") + piece + (pid == 0 ? "" : " (pid \(pid))") + (rolling ? " the rolling way" : "")
        say(String(format: "%6.1f s  %@%@: %@", kill.at, what, problem.map { ", restart failed: \($0)" } ?? "", outcome))
    }

    /// Asks the supervisor of the `up` that runs `service` to replace it the rolling way (as
    /// `sb restart` does), and waits until a new process serves. The requests meanwhile must
    /// fare as in any outage, and every write the old process acknowledged must outlive it.
    private mutating func restartRolling(_ service: String) async {
        let ownBus = processes.pieces()[service] != nil
        guard let pid = pid(of: service), supervisors.indices.contains(ownBus ? 0 : 1) else { return }
        let supervisor = supervisors[ownBus ? 0 : 1]
        let startedAt = Date()
        var problem: String?
        do throws(BusError) {
            _ = try await supervisor.call(SupervisorAPI.restart, .init(services: [service]), timeout: .seconds(120))
        } catch { problem = "\(error)" }
        let missing = await missingAfter(60) { await notServing(service, replacing: pid) }
        record(service, pid: pid, killedAt: startedAt, missing: missing, problem: problem, rolling: true)
    }

    /// Stops the database at once (PostgreSQL's immediate shutdown: what it acknowledged is in its
    /// log, nothing else is flushed), starts it again, and waits until the streams service
    /// answers through it again.
    private mutating func crashAndRestart(_ database: TestPostgres, since started: Date) async {
        let pid = database.pid ?? 0
        let killedAt = Date()
        var problem: String?
        do { try await database.restart() } catch { problem = "\(error)" }
        let missing = await missingAfter(60) { await notAnswering("streams") }
        record("database", pid: pid, killedAt: killedAt, missing: missing, problem: problem)
    }

    /// The current pid of `victim`: this bus's piece of that name, or the other cell's
    /// (its kernel is "kernel b").
    private func pid(of victim: String) -> Int32? {
        if victim == "kernel b" { return otherCell?.processes.pieces()["kernel"] }
        return processes.pieces()[victim] ?? otherCell?.processes.pieces()[victim]
    }

    /// Kills the directory's etcd (SIGKILL), starts it again, and waits until every service
    /// answers: the cells' connections do not need etcd, their records are written again.
    private mutating func killAndRestart(_ etcd: TestEtcd, since started: Date) async {
        let killedAt = Date()
        etcd.kill(0)
        var problem: String?
        do { try await etcd.restart(0) } catch { problem = "\(error)" }
        let missing = await missingAfter(60) { [probe, services] in await unserved(probe, services) }
        record("etcd", pid: 0, killedAt: killedAt, missing: missing, problem: problem)
    }

    /// What keeps the bus from serving through a new process of `piece` (nil: it does).
    private func notServing(_ piece: String, replacing old: Int32) async -> String? {
        guard let pid = pid(of: piece) else { return "no process of \(piece) runs" }
        guard pid != old else { return "the killed process (pid \(old)) is still listed" }
        switch piece {
        case "kernel b":
            // Served through cell a: every service of cell b offered to it again, and answering.
            if let missing = await unserved(probe, services) { return missing }
            return await notAnswering(SearchAPI.service)
        case "gateway":
            return Supervisor.acceptsConnections(host: "127.0.0.1", port: gatewayPort) ? nil : "nothing accepts connections at port \(gatewayPort)"
        case "kernel":
            let pong: KernelAPI.Pong
            do throws(BusError) { pong = try await probe.call(KernelAPI.ping) } catch { return "ping was not answered: \(error)" }
            guard pong.pid == Int(pid) else { return "ping was answered by pid \(pong.pid), not the new kernel's \(pid)" }
            return await unserved(probe, services)
        default:
            if let missing = await unserved(probe, [piece]) { return missing }
            return await notAnswering(piece)
        }
    }

    /// What keeps `service`'s probe request from being answered (nil: it was).
    private func notAnswering(_ service: String) async -> String? {
        guard let call = Self.probes.first(where: { $0.service == service }) else { return "no probe request of \(service)" }
        do throws(BusError) { _ = try await call.send(probe) } catch { return "\(call.label) was not answered: \(error)" }
        return nil
    }
}

/// With a kernel pair: kills (SIGKILL) the active kernel at seeded random intervals, times
/// the failover (from the kill to the first request answered), and waits until `up` has
/// restarted the killed kernel and it holds the state again as the passive one, or, with
/// the state in etcd (`standbyLogs`, each bus's log), waits for the election again.
struct PairChaos {
    var random: SeededGenerator
    let buses: [BusProcesses]
    let kernels: [KernelPorts]
    let curve: CurveClientKeys?
    let started: Date
    let standbyLogs: [URL]?
    var log = ChaosLog()

    init(seed: UInt64, buses: [BusProcesses], kernels: [KernelPorts], curve: CurveClientKeys?, started: Date, standbyLogs: [URL]? = nil) {
        random = SeededGenerator(seed: seed ^ 0xB157_A2B1_57A2_B157)
        (self.buses, self.kernels, self.curve, self.started, self.standbyLogs) = (buses, kernels, curve, started, standbyLogs)
    }

    /// What a kernel waiting on etcd logs once it hears the active one: ready to take over.
    static let standbyReady = "the kernel holding the election answers at its broker"

    /// How many times the buses' logs say a kernel stood by, ready.
    func timesReady() -> Int {
        (standbyLogs ?? []).reduce(0) { count, log in
            count + ((try? String(contentsOf: log, encoding: .utf8)).map { $0.components(separatedBy: Self.standbyReady).count - 1 } ?? 0)
        }
    }

    mutating func run(until end: Date, killEvery interval: ClosedRange<Double>) async {
        guard let client = try? await BusClient(brokers: kernels.map(\.broker), timeout: .seconds(30), curve: curve),
              let alone = try? await kernels.asyncMap({ try await BusClient(brokers: [$0.broker], timeout: .seconds(1), curve: curve) })
        else { return say("cannot connect to the kernels") }
        defer { Task { for probe in alone + [client] { await probe.close() } } }
        var round = 0
        while true {
            let wait = Double.random(in: interval, using: &random)
            guard Date().addingTimeInterval(wait) < end else { return }
            try? await Task.sleep(for: .milliseconds(Int(wait * 1000)))
            let active: Int
            if standbyLogs != nil {
                // Only the kernel holding the election binds its endpoints; the other waits.
                let pongs = await alone.asyncMap { try? await $0.call(KernelAPI.ping) }
                guard let serving = pongs.firstIndex(where: { $0 != nil }), pongs[1 - serving] == nil, timesReady() > 0 else { continue }
                active = serving
            } else {
                let states = await alone.asyncMap { try? await $0.call(KernelAPI.ping).pair }
                guard let serving = states.firstIndex(where: { $0?.state == "active" }),
                      states[1 - serving]?.state == "passive", states[1 - serving]?.synced == true else { continue }
                active = serving
            }
            guard let pid = buses[active].pieces()["kernel"] else { continue }
            round += 1
            let readyBefore = timesReady()
            kill(pid, SIGKILL)
            let killedAt = Date()
            // Until a request is answered: one refused on the way (no worker registered with
            // the new kernel yet: -32001) is part of the failover, and asked again.
            var failover: Double?, refused = 0
            while failover == nil, Date().timeIntervalSince(killedAt) < 30 {
                if (try? await client.call(EchoAPI.echo, ["failover": .int(Int64(round))], timeout: .seconds(30))) != nil {
                    failover = Date().timeIntervalSince(killedAt)
                } else {
                    refused += 1
                    try? await Task.sleep(for: .milliseconds(50))
                }
            }
            let recovered = await waitUntil(60) {
                // The restarted kernel stands by, or won the election back and the other does.
                if standbyLogs != nil { return timesReady() > readyBefore }
                guard let pong = try? await alone[active].call(KernelAPI.ping) else { return false }
                return pong.pid != Int(pid) && pong.pair?.state == "passive" && pong.pair?.synced == true
            }
            let role = ["primary", "backup"][active], standby = standbyLogs == nil ? "the passive one" : "the one waiting for the election"
            var kill = ChaosLog.Kill(at: killedAt.timeIntervalSince(started), piece: "kernel (\(role), active)", pid: pid,
                                     recoveredAfter: recovered ? Date().timeIntervalSince(killedAt) : nil)
            kill.failoverAsked = true
            kill.failoverAfter = failover
            log.kills.append(kill)
            say(String(format: "%6.1f s  killed the active kernel, the %@'s (pid %d): %@; %@", killedAt.timeIntervalSince(started), role, pid,
                       failover.map { String(format: "a request answered by the other after %.3f s", $0) + (refused > 0 ? " (\(refused) refused before)" : "") }
                           ?? "NO request answered within 30 s",
                       recovered ? String(format: "back as %@ after %.1f s", standby, Date().timeIntervalSince(killedAt)) : "NOT back within 60 s"))
        }
    }
}

extension Array {
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var results: [T] = []
        for element in self { results.append(try await transform(element)) }
        return results
    }
}
