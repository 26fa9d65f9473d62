import ArgumentParser
import BusKit
import BusProtocol
import Catalog
import Contracts
import Foundation
import Synchronization
import Supervisor
import SwitchboardTestSupport
import ZeroMQ
#if canImport(Glibc)
import Glibc
#endif

/// Soak and chaos: the whole bus under `switchboard up`, many clients over every app's
/// requests and subscriptions, and services and the kernel killed at random meanwhile.
@main
struct Soak: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "switchboard-soak",
        abstract: "Drive the whole bus under load while killing its processes at random; report what was lost.",
        discussion: """
            Starts `switchboard up` on free loopback ports with the bundled datasets, then for
            --duration seconds runs --clients request loops, --subscribers subscriptions and a
            writer of acknowledged state, and kills (SIGKILL) a process of the bus every
            --kill-min to --kill-max seconds, in a seeded order that kills every piece once
            before any again; the services with a database are also replaced the rolling
            way, as `sb restart` does. The last part of the run has no kills, so the bus
            settles. Exits 0 when nothing was lost, duplicated or missing; 1 otherwise.
            The same --seed gives the same requests and the same kill schedule.
            """)

    @Option(help: "Seconds of load.") var duration: Double = 600
    @Option(help: "Seed of the request mix and the kill schedule (default: random, printed).") var seed: UInt64?
    @Option(help: "Concurrent request loops, each with its own connection.") var clients = 16
    @Option(help: "Subscriptions following the writer's key.") var subscribers = 4
    @Option(help: "Shortest wait between two kills, in seconds.") var killMin: Double = 4
    @Option(help: "Longest wait between two kills, in seconds.") var killMax: Double = 10
    @Option(help: "Each request's timeout, in seconds; a request not answered by then is lost.") var timeout: Double = 30
    @Option(help: "The switchboard executable (default: the one beside this program).") var switchboard: String?
    @Flag(help: "Run a kernel pair (two `switchboard up`s, primary and backup, sharing the store's database) and kill the active kernel at each kill; prints the failover times.")
    var pair = false
    @Flag(help: "With --pair: the two kernels keep the state in an etcd the soak starts on loopback (and stops), and etcd's election, not a pair link, says which one serves: the other waits, and takes over when the active one is killed.")
    var etcd = false
    @Flag(help: "Run the store on a PostgreSQL server the soak starts on loopback (and stops), instead of SQLite.")
    var postgres = false
    @Flag(help: "Aim at the streams service: run it on a PostgreSQL server the soak starts on loopback (and stops), with three publishers and a group of three readers on its stream, and kill the streams service, its database (its PostgreSQL server stopped at once, as a crash would, and started again) and the kernel (with --postgres, the store too).")
    var streams = false
    @Flag(help: "No kills: instead a hostile client (huge ttl, amplifying batches, a subscriber and SSE streams that never read, slow requests, replies in parts nobody reads), one case after another, beside the ordinary load; a bystander with a client key of its own must be answered within 10 s throughout, its latency measured in each case; once the hostile client has left the memory of the kernel, the gateway and the echo worker must come back within 1.5x of their start, with no process restarted. Needs --duration of at least 80.")
    var hostile = false
    @Flag(help: "Run one bus in two cells (docs/CELLS.md; two `switchboard up`s on an etcd the soak starts, which keeps their directory and their one state): cell a has echo and the gateway and every client, cell b the store, the fetcher, search, pricing and the streams, so every request but echo's crosses, and the subscribers follow cell b's kernel; the kills hit both cells' kernels and pieces and etcd.")
    var cells = false
    @Flag(help: "Keep the working folder (configuration, database, logs).") var keep = false

    func run() async throws {
        let seed = self.seed ?? UInt64.random(in: 1...999_999)
        let executable = switchboard ?? URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
            .appendingPathComponent("switchboard").path
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw ValidationError("no switchboard executable at \(executable); build it or pass --switchboard")
        }
        guard killMin > 0, killMax >= killMin, duration > 0, clients > 0 else {
            throw ValidationError("--duration, --clients and --kill-min must be positive and --kill-max at least --kill-min")
        }
        guard !hostile || (duration >= 80 && !pair) else {
            throw ValidationError("--hostile needs --duration of at least 80 (its cases, one after another) and no --pair")
        }
        guard !etcd || pair else { throw ValidationError("--etcd is for a kernel pair: add --pair") }
        guard !cells || !(pair || hostile || streams) else { throw ValidationError("--cells is two cells with kills: not with --pair, --hostile or --streams") }
        let folder = try temporaryDirectory("switchboard-soak")
        // Removed below once the soak passed (unless --keep); a failed one keeps its logs.
        keepTemporaryDirectory(folder)
        // The state's etcd, or the cells' directory: one member of the soak's own, when asked for.
        let stateEtcd = etcd || cells ? try await TestEtcd.start() : nil
        defer { stateEtcd?.stop() }
        if let stateEtcd { say("\(cells ? "the cells' directory" : "the state") in etcd at \(stateEtcd.clientURLs.joined(separator: ","))") }
        let configurations = try writeSoakConfiguration(in: folder, pair: pair || cells, linked: !(etcd || cells))
        guard !streams || !(pair || hostile) else { throw ValidationError("--streams is for one bus with kills: not with --pair or --hostile") }
        // The databases of the store (--postgres) and the streams service (--streams): the
        // configuration's SQLite files, or a PostgreSQL server of the soak's own for each (the
        // chaos kills the streams service's alone).
        let storeDatabase = postgres ? try await TestPostgres.start() : nil
        defer { storeDatabase?.stop() }
        let streamsDatabase = streams ? try await TestPostgres.start() : nil
        defer { streamsDatabase?.stop() }
        if let storeDatabase { say("the store on PostgreSQL at 127.0.0.1:\(storeDatabase.port)") }
        if let streamsDatabase { say("the streams service on PostgreSQL at 127.0.0.1:\(streamsDatabase.port)") }
        let kernels = configurations.map { KernelPorts(ports: $0.ports) }
        if hostile {
            // The hostile client has a client key of its own, as another user would: the
            // kernel shares a service's places among keys. So has the bystander, whose
            // figures say what the hostile client costs a user it has nothing to do with
            // (the ordinary load's key is shared by many loops, and its queue is theirs).
            let keys = busKeyFolder(in: folder)
            try FileManager.default.createDirectory(at: keys.clientsFolder, withIntermediateDirectories: true)
            for name in ["hostile", "bystander"] {
                try KeyFolder.write(try CurveKeyPair.generate(), to: keys.clientsFolder.appendingPathComponent(name).path)
            }
        }
        say("seed \(seed), \(Int(duration)) s, \(clients) clients, \(subscribers) subscribers"
            + (hostile ? ", a hostile client instead of kills" : ", a kill every \(killMin)-\(killMax) s")
            + (pair ? ", a kernel pair: each kill is the active kernel's" : ""))
        say("replay with --seed \(seed)\(pair ? " --pair" : "")\(etcd ? " --etcd" : "")\(postgres ? " --postgres" : "")\(streams ? " --streams" : "")\(cells ? " --cells" : ""); working folder \(folder.path); ports \(configurations.flatMap(\.ports).map(String.init).joined(separator: ", "))")

        var buses: [(up: ChildProcess, processes: BusProcesses, log: URL)] = []
        for (index, configuration) in configurations.enumerated() {
            let log = folder.appendingPathComponent(configurations.count == 1 ? "up.log" : busNames[index].replacingOccurrences(of: " ", with: "-") + ".log")
            _ = FileManager.default.createFile(atPath: log.path, contents: nil)
            var environment: [String: String] = [:]
            for (section, database) in [("STORE", storeDatabase), ("STREAMS", streamsDatabase)] {
                guard let database else { continue }
                environment.merge(["SWITCHBOARD_\(section)_BACKEND": "postgres", "SWITCHBOARD_\(section)_URL": database.url(), "SWITCHBOARD_\(section)_TLS": "disable"]) { $1 }
            }
            if cells, let stateEtcd {
                environment["SWITCHBOARD_KERNEL_CELL_NAME"] = ["a", "b"][index]
                environment["SWITCHBOARD_KERNEL_CELL_ETCD_ENDPOINTS"] = "[\(stateEtcd.clientURLs.joined(separator: ","))]"
                environment["SWITCHBOARD_KERNEL_CELL_ETCD_LEASE_SECONDS"] = "2"
                // One state for both cells, in the same etcd (docs/CELLS.md, "One state"), on
                // the default lease: a killed kernel's successor takes its election at once
                // (the old key names its own broker), and a lease of a few seconds would end a
                // kernel that a loaded machine keeps from renewing it in time.
                environment["SWITCHBOARD_KERNEL_STATE_BACKEND"] = "etcd"
                environment["SWITCHBOARD_KERNEL_STATE_ETCD_ENDPOINTS"] = "[\(stateEtcd.clientURLs.joined(separator: ","))]"
                for service in index == 0 ? Self.cellB : Self.cellA { environment["SWITCHBOARD_SERVICES_\(service.uppercased())_ENABLED"] = "false" }
            } else if let stateEtcd {
                environment["SWITCHBOARD_KERNEL_STATE_BACKEND"] = "etcd"
                environment["SWITCHBOARD_KERNEL_STATE_ETCD_ENDPOINTS"] = "[\(stateEtcd.clientURLs.joined(separator: ","))]"
                // The chaos knows a kernel stands by from its notice.
                environment["SWITCHBOARD_LOG_LEVEL"] = "notice"
            }
            if hostile {
                // A gateway history that the ordinary load fills during the quiet case, so the
                // memory check after the hostile client compares like with like.
                environment["SWITCHBOARD_GATEWAY_HISTORY"] = "2000"
                environment["SWITCHBOARD_GATEWAY_HISTORY_BYTES"] = "2097152"
            }
            // `up` watches its stdin, a lifeline only this process writes to (``ChildProcess``): if
            // the soak dies, even by SIGKILL, `up` reads end-of-file and stops the bus in order.
            let up = try ChildProcess(URL(fileURLWithPath: executable), ["up", "--config", configuration.config.path],
                                      environment: environment, log: log)
            buses.append((up, BusProcesses(upPid: up.pid), log))
            // The primary first: it makes the keys both use.
            if (pair || cells) && index == 0 { _ = await waitUntil(30) { (try? busKeyFolder(in: folder).clientKeys()) != nil } }
        }
        // Ctrl-C or SIGTERM (a CI time-out, `timeout`): stop the bus, then end as the signal would.
        let keep = self.keep
        let running = buses
        let signals = Signals.forward { signal in
            say("interrupted by signal \(signal): stopping the bus")
            for bus in running where !bus.processes.stop(bus.up, grace: 30) { say("the bus did not stop within 30 s of SIGTERM: killed") }
            storeDatabase?.stop()
            streamsDatabase?.stop()
            if !keep { try? FileManager.default.removeItem(at: folder) }
            Glibc.exit(128 + signal)
        }
        defer { signals.forEach { $0.cancel() } }
        var report = SoakReport(seed: seed, duration: duration, clients: clients, subscribers: subscribers)
        do {
            report = try await drive(kernels: kernels, keys: busKeyFolder(in: folder), buses: buses.map(\.processes), logs: buses.map(\.log), etcd: stateEtcd,
                                 streamsDatabase: streamsDatabase,
                                 seed: seed, report: report)
        } catch {
            say("\(error)")
            report.problems.append("\(error)")
        }
        // Stop the bus as a user would (SIGTERM to up) and see it end cleanly.
        for bus in buses {
            if !bus.processes.stop(bus.up, grace: 60) { report.problems.append("switchboard up did not stop within 60 s of SIGTERM") }
            report.upExit = bus.up.terminationStatus ?? -1
            if bus.up.terminationStatus != 0 { report.problems.append("switchboard up exited with status \(bus.up.terminationStatus ?? -1)") }
        }
        report.print()
        fflush(nil)
        if !report.passed {
            say("the bus's log: \(buses.map(\.log.path).joined(separator: ", "))")
        } else if !keep {
            try? FileManager.default.removeItem(at: folder)
        }
        if !report.passed { throw ExitCode(1) }
    }

    /// What the two buses of --pair or --cells are called in the logs and the report.
    var busNames: [String] { cells ? ["cell a", "cell b"] : ["primary", "backup"] }

    /// With --cells: the services of each cell (the gateway runs in both).
    static let cellA = [EchoAPI.service], cellB = [StoreAPI.service, FetcherAPI.service, SearchAPI.service, PricingAPI.service, StreamsAPI.service]

    private func drive(kernels: [KernelPorts], keys: KeyFolder, buses: [BusProcesses], logs: [URL], etcd stateEtcd: TestEtcd?, streamsDatabase: TestPostgres?, seed: UInt64,
                       report: SoakReport) async throws -> SoakReport {
        // Of two cells, every client is cell a's.
        let clientKernels = cells ? [kernels[0]] : kernels
        let brokers = clientKernels.map(\.broker), states = clientKernels.map(\.state)
        var report = report
        // `up` runs with CURVE on and makes the keys when it starts: the soak's clients use
        // the local client's key, as sb does.
        guard await waitUntil(30, { (try? keys.clientKeys()) != nil }), let curve = try keys.clientKeys() else {
            throw SoakFailure("switchboard up made no client key in \(keys.path) within 30 s")
        }
        let probe = try await BusClient(brokers: brokers, timeout: .seconds(2), curve: curve, state: states)
        let services = [EchoAPI.service, StoreAPI.service, FetcherAPI.service, SearchAPI.service, PricingAPI.service, StreamsAPI.service]
        if let missing = await missingAfter(180, { await unserved(probe, services) }) {
            throw SoakFailure("the bus did not come up within 180 s: \(missing)")
        }
        // `up` starts the gateway once every service has registered: the bus is up when it
        // listens too (every piece is then there to measure and to kill). A bus whose kernel
        // waits for the state's election in etcd has no services registered until it serves.
        guard await waitUntil(60, {
            let listening = zip(buses, kernels).map { bus, kernel in
                bus.pieces()["gateway"] != nil && Supervisor.acceptsConnections(host: "127.0.0.1", port: kernel.gatewayPort)
            }
            return etcd ? listening.contains(true) : !listening.contains(false)
        }) else {
            throw SoakFailure("the gateway did not listen within 60 s of the services registering")
        }
        // The catalog is loaded once search and pricing answer from it.
        guard await waitUntil(120, {
            guard (try? await probe.call(PricingAPI.routeCheapest)) != nil else { return false }
            return (try? await probe.call(SearchAPI.flightsList, .init())) != nil
        }) else { throw SoakFailure("the datasets did not load within 120 s") }
        report.memoryAtStart = memory(buses, second: busNames[1])
        for (index, processes) in buses.enumerated() {
            say("the bus is up\(buses.count > 1 ? " (\(busNames[index]))" : ""): \(processes.pieces().merging(["up": processes.upPid]) { $1 }.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))")
        }

        let started = Date()
        let loadEnds = started.addingTimeInterval(duration)
        // No kills in the last part, so the bus settles before the checks.
        let chaosEnds = started.addingTimeInterval(duration - min(20, duration / 4))
        let tally = Tally()
        let check = SubscriberCheck()
        let timeout = Duration.milliseconds(Int(self.timeout * 1000))
        var busClients: [BusClient] = []
        for _ in 0..<clients { busClients.append(try await BusClient(brokers: brokers, timeout: timeout, curve: curve, state: states)) }
        // Each subscriber leaves every few seconds and comes back with the sequence it had
        // reached: it must get exactly the ticks it missed (the check counts any gap).
        // Of two cells, they follow cell b's kernel while every tick is written through cell
        // a's: each crosses the one state.
        let kernelStates = (cells ? [kernels[1].state] : states).map { ($0.snapshot, $0.publisher) }
        let following = Following()
        var readers: [Task<Void, Never>] = []
        for index in 0..<subscribers {
            let first = try await Subscription.open(kernels: kernelStates, prefixes: ["/client/soak/"], silenceTimeout: .seconds(3), curve: curve)
            following.subscriptions.withLock { $0[index] = first }
            readers.append(Task {
                var generator = SeededGenerator(seed: seed &+ UInt64(index) &* 7_919)
                var subscription = first, position: UInt64 = 0
                func take(_ event: SubscriptionEvent) {
                    check.note(event.update.map { "update \($0.sequence): \($0.json.map { "\($0)" } ?? "deleted")" } ?? "\(event)", subscriber: index)
                    switch event {
                    case .update(let update):
                        check.saw(update, subscriber: index)
                        position = max(position, update.sequence)
                    case .synced(let sequence), .resynced(let sequence, _):
                        position = max(position, sequence)
                    case .reset:
                        check.counts.withLock { $0.resets += 1 }
                    case .missed:
                        break
                    }
                }
                while !following.loadOver.withLock({ $0 }) {
                    let leaves = Date().addingTimeInterval(Double.random(in: 3...8, using: &generator))
                    while Date() < leaves, !following.loadOver.withLock({ $0 }), let event = try? await subscription.next() { take(event) }
                    if following.loadOver.withLock({ $0 }) { break }
                    let resyncs = await subscription.resyncCount()
                    check.counts.withLock { $0.resyncs[index, default: 0] += resyncs }
                    await subscription.cancel()
                    check.note("left; resuming after sequence \(position)", subscriber: index)
                    // Tried again until it opens (bounded): the reader must end holding an
                    // open subscription, or it could not see the last tick.
                    var next: Subscription?
                    for _ in 0..<50 where next == nil {
                        do {
                            next = try await Subscription.open(kernels: kernelStates, prefixes: ["/client/soak/"], since: position,
                                                               silenceTimeout: .seconds(3), curve: curve)
                        } catch {
                            check.note("could not resume: \(error)", subscriber: index)
                            try? await Task.sleep(for: .milliseconds(200))
                        }
                    }
                    guard let next else { break }
                    check.counts.withLock { $0.resumes += 1 }
                    subscription = next
                    following.subscriptions.withLock { $0[index] = next }
                }
                // The load is over: read on until the soak ends the subscription.
                while let event = try? await subscription.next() { take(event) }
                let resyncs = await subscription.resyncCount()
                check.counts.withLock { $0.resyncs[index, default: 0] += resyncs }
            })
        }
        let loops = busClients.enumerated().map { index, client in
            Task {
                var mix = RequestMix(seed: seed, client: index)
                while Date() < loadEnds {
                    let call = mix.next()
                    let outcome: Result<JSONValue, BusError>
                    do throws(BusError) {
                        outcome = .success(try await call.send(client))
                    } catch {
                        outcome = .failure(error)
                    }
                    tally.record(call, outcome)
                }
            }
        }
        let writerClient = try await BusClient(brokers: brokers, timeout: timeout, curve: curve, state: states)
        // The writer writes each tick with compare-and-set at the revision its last write made:
        // a write whose answer was lost is found applied (its revision moved the key on) or
        // not, and none is applied twice.
        let writer = Task { () -> TickWriter in
            var ticks = TickWriter()
            while Date() < loadEnds {
                await ticks.write(writerClient)
                try? await Task.sleep(for: .milliseconds(20))
            }
            return ticks
        }
        // Replies in parts and requests to every worker, one after the other, beside the load.
        let partsCheck = PartsCheck()
        let partsClient = try await BusClient(brokers: brokers, timeout: timeout, curve: curve, state: states)
        let partsLoop = Task {
            var round = 0
            while Date() < loadEnds {
                round += 1
                if round % 4 == 0 { await partsCheck.gather(partsClient) } else { await partsCheck.stream(partsClient) }
                try? await Task.sleep(for: .milliseconds(20))
            }
        }
        // Publishers and a consumer group of readers on one stream (one and two; three and
        // three with --streams), each with its own connection.
        let streams = StreamsCheck()
        let (publishers, streamReaderCount) = self.streams ? (3, 3) : (1, 2)
        var streamClients: [BusClient] = []
        for _ in 0..<(publishers + streamReaderCount) {
            streamClients.append(try await BusClient(brokers: brokers, timeout: timeout, curve: curve, state: states))
        }
        guard await streams.prepare(streamClients[0]) else { throw SoakFailure("the streams service did not take the soak's stream within 60 s") }
        let streamPublishers = streamClients.prefix(publishers).enumerated().map { index, client in
            Task { await streams.publish(client, publisher: index, until: loadEnds) }
        }
        // The last reader has its messages pushed; the others fetch them.
        let streamReaderClients = Array(streamClients.dropFirst(publishers))
        let streamReaders = streamReaderClients.enumerated().map { index, client in
            Task { index == streamReaderClients.count - 1 ? await streams.readPushed(client) : await streams.read(client) }
        }
        // The cases take all but the last 20 s, in which the bus gives its memory back beside the ordinary load.
        let memoryAtStart = report.memoryAtStart, phases = duration - 20
        let hostileRun = hostile ? Task {
            try await Self.runHostile(keys: keys, kernel: kernels[0], bus: buses[0], started: started, seconds: phases, memoryAtStart: memoryAtStart)
        } : nil
        // The supervisors' rolling restarts are asked with the operator's key (as `sb restart`
        // is), of each bus's own kernel: a supervisor is not offered across cells.
        let operatorKeys = try keys.operatorKeys()
        let supervisors = try await kernels.asyncMap { try await BusClient(brokers: [$0.broker], timeout: .seconds(120), curve: operatorKeys) }
        let chaos = Task { () -> ChaosLog in
            if hostile { return ChaosLog() }
            if cells {
                var chaos = Chaos(seed: seed, processes: buses[0], probe: probe, services: services, gatewayPort: kernels[0].gatewayPort, started: started)
                chaos.otherCell = (buses[1], stateEtcd)
                chaos.supervisors = supervisors
                chaos.victims = ["kernel", "kernel b", "kernel b", "store", "store", "search", "fetcher", "pricing", "echo", "gateway", "streams", "etcd",
                                 "restart store", "restart streams"]
                await chaos.run(until: chaosEnds, killEvery: killMin...killMax)
                return chaos.log
            }
            if buses.count > 1 {
                var chaos = PairChaos(seed: seed, buses: buses, kernels: kernels, curve: curve, started: started, standbyLogs: etcd ? logs : nil)
                await chaos.run(until: chaosEnds, killEvery: killMin...killMax)
                return chaos.log
            }
            var chaos = Chaos(seed: seed, processes: buses[0], probe: probe, services: services, gatewayPort: kernels[0].gatewayPort, started: started)
            chaos.supervisors = supervisors
            if self.streams {
                chaos.victims = ["streams", "streams", "kernel", "database", "restart streams"] + (postgres ? ["store"] : [])
                chaos.database = streamsDatabase
            }
            await chaos.run(until: chaosEnds, killEvery: killMin...killMax)
            return chaos.log
        }

        let chaosLog = await chaos.value
        for supervisor in supervisors { await supervisor.close() }
        if let hostileRun {
            let outcome = try await hostileRun.value
            report.hostile = outcome.figures
            report.problems += outcome.problems
        }
        for loop in loops { await loop.value }
        await partsLoop.value
        // The group works through what was published (a message whose reader's answer was
        // lost comes back after its ack wait).
        for publisher in streamPublishers { await publisher.value }
        _ = await waitUntil(30) { streams.allDone }
        streams.stopReading()
        for reader in streamReaders { await reader.value }
        streams.finish()
        report.streams = streams.counts.withLock { $0 }
        report.parts = partsCheck.counts.withLock { $0 }
        let ticks = await writer.value
        let last = ticks.acknowledged
        report.elapsed = Date().timeIntervalSince(started)
        report.chaos = chaosLog
        report.ticksWritten = ticks.writes
        report.ticks = ticks
        // The key is at the revision of the last acknowledged compare-and-set: none was lost
        // or applied twice across the kills.
        if let revision = ticks.revision, let now = try? await writerClient.call(KernelAPI.stateGet, .init(prefix: TickWriter.key, limit: 1)),
           now.entries.first?.sequence != revision {
            report.problems.append("the tick key is at revision \(now.entries.first.map { "\($0.sequence)" } ?? "none"), not \(revision), the last one acknowledged")
        }

        // Every subscriber must end on the last acknowledged tick.
        following.loadOver.withLock { $0 = true }
        let converged = await waitUntil(30) {
            check.counts.withLock { counts in
                (0..<subscribers).allSatisfy { counts.lastSeen[$0].map { $0.epoch == last.epoch && $0.n == last.n } ?? false }
            }
        }
        for subscription in following.subscriptions.withLock({ Array($0.values) }) { await subscription.cancel() }
        for reader in readers { await reader.value }
        report.subscriberCounts = check.counts.withLock { $0 }
        let stale = converged ? [] : check.counts.withLock { counts in
            (0..<subscribers).filter { counts.lastSeen[$0].map { $0.epoch != last.epoch || $0.n != last.n } ?? true }
        }
        report.staleSubscribers = stale.count
        for index in stale {
            let had = report.subscriberCounts.lastSeen[index].map { "tick \($0.n) of epoch \($0.epoch)" } ?? "no tick"
            report.staleNotes.append("subscriber \(index) had \(had), not tick \(last.n) of epoch \(last.epoch) (sequence \(ticks.revision.map { "\($0)" } ?? "unknown")); its last events: "
                                     + (report.subscriberCounts.recent[index] ?? []).joined(separator: "; "))
        }

        var resent = 0, duplicates = 0, late = 0
        for client in busClients + [writerClient, partsClient] + streamClients {
            let counters = await client.counters()
            resent += counters.resent
            duplicates += counters.duplicateReplies
            late += counters.lateReplies
            await client.close()
        }
        report.requests = tally.counts.withLock { $0 }
        report.resent = resent
        report.duplicated = duplicates
        report.lateReplies = late

        // Every acknowledged store write must be in the store.
        report.missingWrites = try await missingArticles(report.requests.acknowledgedWrites, probe: probe)
        report.memoryAtEnd = memory(buses, second: busNames[1])
        await probe.close()
        return report
    }

    /// How long the bus has, once the hostile client left, to give its memory back, and to
    /// within what multiple of its memory at start.
    static let memoryReturnLimit = 30.0
    static let memoryReturnFactor = 1.5

    /// Whether every measured process is back within ``memoryReturnFactor`` of its start.
    private static func memoryIsBack(_ now: [String: Double], from start: [String: Double]) -> Bool {
        HostileClient.measured.allSatisfy { name in
            guard let before = start[name], let size = now[name] else { return false }
            return size <= before * memoryReturnFactor
        }
    }

    /// The hostile client's cases one after another (a bystander timing each, which must be
    /// answered throughout), then up to 30 s without it: the memory of the kernel, the gateway
    /// and the echo worker must be back within 1.5x of their start (the worker's never 256 MB
    /// above it), and no process restarted.
    private static func runHostile(keys: KeyFolder, kernel: KernelPorts, bus: BusProcesses, started: Date,
                                   seconds: Double, memoryAtStart: [String: Double]) async throws -> (figures: HostileFigures, problems: [String]) {
        var problems: [String] = []
        let context = try ZMQContext()
        let hostileKeys = try keys.connectingKeys(as: "clients/hostile")
        let client = try await BusClient(brokers: [kernel.broker], context: context, timeout: .seconds(30), curve: hostileKeys, state: [kernel.state])
        let bystanderClient = try await BusClient(brokers: [kernel.broker], timeout: .seconds(10), curve: try keys.connectingKeys(as: "clients/bystander"),
                                                  state: [kernel.state])
        let hostile = HostileClient(client: client, context: context, kernel: kernel, curve: hostileKeys, gatewayToken: keys.gatewayToken())
        let bystander = Bystander()
        let pids = bus.pieces()
        // Where the kernel and the gateway start from: measured at the end of the quiet
        // case, once the ordinary load has run a while (the gateway's history and the code
        // each path touches are in by then), with both running.
        var memoryAtStart = memoryAtStart
        // The quiet case runs twice as long as the others: the baseline is taken at its end.
        let shares = HostileClient.Case.allCases.map { $0 == .quiet ? 2.0 : 1.0 }
        let phase = seconds / shares.reduce(0, +)
        let leaves = started.addingTimeInterval(seconds)
        let timing = Task { await bystander.run(bystanderClient, until: leaves) }
        var peak: [String: Double] = [:]
        for (index, hostileCase) in HostileClient.Case.allCases.enumerated() {
            bystander.current.withLock { $0 = hostileCase }
            say("hostile: \(hostileCase.rawValue)")
            let ends = started.addingTimeInterval(phase * shares[...index].reduce(0, +))
            let sampling = Task {
                var highest: [String: Double] = [:]
                while Date() < ends {
                    for (name, size) in bus.memory() where HostileClient.measured.contains(name) { highest[name] = max(highest[name] ?? 0, size) }
                    try? await Task.sleep(for: .milliseconds(250))
                }
                return highest
            }
            do {
                try await hostile.run(hostileCase, until: ends)
            } catch {
                problems.append("the hostile client's \(hostileCase) failed: \(error)")
            }
            peak.merge(await sampling.value) { max($0, $1) }
            if hostileCase == .quiet {
                memoryAtStart = bus.memory()
                for _ in 0..<100 where HostileClient.measured.contains(where: { memoryAtStart[$0] == nil }) {
                    try await Task.sleep(for: .milliseconds(100))
                    memoryAtStart = bus.memory()
                }
            }
        }
        await timing.value
        await client.close()
        await bystanderClient.close()
        say("hostile: left; up to \(Int(Self.memoryReturnLimit)) s for the bus to give memory back")
        // Memory is only seen by sampling it: each measured process is sampled until all are
        // back within their bound, or the limit has passed (then the last sample is judged).
        let left = Date()
        var after = bus.memory()
        while !Self.memoryIsBack(after, from: memoryAtStart), Date().timeIntervalSince(left) < Self.memoryReturnLimit {
            try await Task.sleep(for: .milliseconds(500))
            after = bus.memory()
        }
        let figures = HostileFigures(bystander: bystander.figures.withLock { $0 }, accepted: hostile.accepted.load(ordering: .relaxed),
                                     memoryAtStart: memoryAtStart, peak: peak, memoryAfter: after,
                                     secondsToGiveBack: Date().timeIntervalSince(left))
        for name in HostileClient.measured {
            guard let start = memoryAtStart[name], let now = after[name] else {
                problems.append("no \(name) process to measure (at start: \(memoryAtStart[name] == nil ? "none" : "found"), after: \(after[name] == nil ? "none" : "found"))")
                continue
            }
            if now > start * Self.memoryReturnFactor {
                problems.append(String(format: "%@ holds %.0f MB %.0f s after the hostile client left, over %.1fx its %.0f MB at start",
                                       name, now, Self.memoryReturnLimit, Self.memoryReturnFactor, start))
            }
            // What a worker's outgoing parts may hold is bounded (its socket's queue, then its
            // part outbox): streams nobody reads never grow it far past its start.
            if name == EchoAPI.service, let highest = peak[name], highest > start + 256 {
                problems.append(String(format: "%@ reached %.0f MB during the hostile run, over 256 MB above its %.0f MB at start", name, highest, start))
            }
        }
        for (name, pid) in pids where bus.pieces()[name] != pid {
            problems.append("\(name) was restarted during the hostile run (pid \(pid) is gone)")
        }
        if figures.accepted > 0 { problems.append("\(figures.accepted) hostile ttl writes were taken instead of refused") }
        // Whatever the hostile client does, a client beside it is answered (within 10 s).
        for hostileCase in HostileClient.Case.allCases {
            guard let failed = figures.bystander[hostileCase], failed.failures > 0 else { continue }
            problems.append("\(failed.failures) of the bystander's requests failed during \"\(hostileCase.rawValue)\", the first: \(failed.firstFailure ?? "?")")
        }
        return (figures, problems)
    }

    private func missingArticles(_ acknowledged: [String], probe: BusClient) async throws -> Int {
        var stored = Set<String>()
        var offset = 0
        while true {
            let page = try await probe.call(StoreAPI.articlesList, .init(offset: offset, limit: 1_000), timeout: .seconds(30))
            stored.formUnion(page.articles.map(\.url))
            offset += page.articles.count
            if page.articles.isEmpty || offset >= page.total { break }
        }
        return Set(acknowledged).subtracting(stored).count
    }
}

/// Resident memory of each bus's pieces (the second bus's marked with its name: `second`).
private func memory(_ buses: [BusProcesses], second: String) -> [String: Double] {
    var sizes: [String: Double] = [:]
    for (index, bus) in buses.enumerated() {
        for (name, size) in bus.memory() { sizes[index == 0 ? name : "\(name) (\(second))"] = size }
    }
    return sizes
}

/// One kernel's endpoints as the soak's configuration placed them (and its side's gateway).
struct KernelPorts {
    let broker: String
    let state: StateEndpoints
    let gatewayPort: Int
    init(ports: [Int]) {
        broker = "tcp://127.0.0.1:\(ports[0])"
        state = StateEndpoints(snapshot: "tcp://127.0.0.1:\(ports[1])", publisher: "tcp://127.0.0.1:\(ports[2])", collector: "tcp://127.0.0.1:\(ports[3])")
        gatewayPort = ports[4]
    }
}

/// Writes a progress line at once (print's buffer would hold it when the output is a file).
func say(_ line: String) {
    FileHandle.standardOutput.write(Data(("soak: " + line + "\n").utf8))
}

/// What keeps `services` from all being served, as the probe's kernel lists them (nil: each
/// has a worker, or another cell offers it).
func unserved(_ probe: BusClient, _ services: [String]) async -> String? {
    let list: KernelAPI.ServiceList
    do throws(BusError) { list = try await probe.call(KernelAPI.servicesList) } catch { return "services.list was not answered: \(error)" }
    let served = Set(list.services.filter { $0.workers > 0 || $0.cells != nil }.map(\.name))
    let missing = services.filter { !served.contains($0) }
    return missing.isEmpty ? nil : "the kernel lists no worker of " + missing.joined(separator: ", ")
}

/// Looks with `look` every 100 ms for up to `seconds`, until it finds nothing missing: what
/// the last look found missing, or nil once nothing was.
func missingAfter(_ seconds: Double, _ look: () async -> String?) async -> String? {
    var missing: String?
    _ = await waitUntil(seconds) {
        missing = await look()
        return missing == nil
    }
    return missing
}

/// Polls `condition` every 100 ms for up to `seconds`.
func waitUntil(_ seconds: Double, _ condition: () async -> Bool) async -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if await condition() { return true }
        try? await Task.sleep(for: .milliseconds(100))
    }
    return await condition()
}

struct SoakFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
