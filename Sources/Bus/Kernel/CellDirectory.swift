import BusProtocol
import Etcd
import Foundation
import Logging
import Synchronization
import ZeroMQ

/// The directory of the cells of a bus, in etcd (docs/CELLS.md): each cell's kernel keeps one
/// record at `PREFIX/NAME` under a lease of its own (its broker, its CURVE key, its services
/// and how many workers each has here), and follows every record under the prefix. A kernel
/// that is gone leaves the directory when its lease runs out; one that comes back writes its
/// record again.
final class CellDirectory: Sendable {
    let client: EtcdClient
    let cell: CellConfiguration
    /// The record's broker and key: fixed for the kernel's life.
    let broker: String
    let curveKey: String?
    let instance: String
    /// Where every record is (`PREFIX/`), and this cell's (`PREFIX/NAME`).
    let prefix: [UInt8], key: [UInt8]
    /// The lease the record is under now (0: none yet).
    let lease = Mutex<Int64>(0)
    /// Rung when this cell's services changed: the record is written again.
    let changed: AsyncStream<Void>.Continuation
    /// The changes rung, read by the one task that writes the record again.
    let changes: AsyncStream<Void>

    init(cell: CellConfiguration, broker: String, curveKey: String?, instance: String) throws {
        client = try EtcdClient(settings: EtcdClient.Settings(cell.etcd))
        self.cell = cell
        self.broker = broker
        self.curveKey = curveKey
        self.instance = instance
        prefix = Array((cell.etcd.prefix + "/").utf8)
        key = Self.key(of: cell)
        (changes, changed) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// Where `cell`'s record is: `PREFIX/NAME`.
    static func key(of cell: CellConfiguration) -> [UInt8] { Array((cell.etcd.prefix + "/" + cell.name).utf8) }

    /// This cell's record: where its broker is, its key, its services and their workers here.
    func record(services: [(name: String, workers: Int)]) -> [UInt8] {
        var counts: [String: JSONValue] = [:]
        for (name, workers) in services { counts[name] = .int(Int64(workers)) }
        var record: [String: JSONValue] = ["broker": .string(broker), "instance": .string(instance), "services": .object(counts)]
        if let curveKey { record["key"] = .string(curveKey) }
        return JSONValue.object(record).jsonBytes
    }

    /// The other cell whose record is at `key`: nil for this cell's own, and for a key under
    /// the prefix that no cell could have written (its name not a cell's name).
    func cell(at key: [UInt8]) -> String? {
        key == self.key ? nil : Self.cell(at: key, under: prefix)
    }

    /// The cell whose record is at `key` in a directory at `prefix` (`PREFIX/`).
    static func cell(at key: [UInt8], under prefix: [UInt8]) -> String? {
        guard key.starts(with: prefix) else { return nil }
        let name = String(decoding: key.dropFirst(prefix.count), as: UTF8.self)
        return MDP.isValidCellName(name) ? name : nil
    }

    /// Other cells followed at most. Each is a connection for every service with a worker
    /// here, so records that somebody else wrote under the prefix (anyone etcd lets write
    /// there) cannot make a kernel open connections without end.
    static let mostCells = 128

    /// The records followed: all of them, or the first ``mostCells`` by name; and how many
    /// were left out.
    static func followed<Record>(_ records: [String: Record]) -> (records: [String: Record], leftOut: Int) {
        guard records.count > mostCells else { return (records, 0) }
        let kept = Set(records.keys.sorted().prefix(mostCells))
        return (records.filter { kept.contains($0.key) }, records.count - mostCells)
    }

    /// The cell a record names, and its workers of each service: nil when it is not one
    /// (written by someone else).
    static func peer(_ value: [UInt8]) -> (peer: CellLinks.Peer, workers: [String: Int])? {
        guard let record = try? JSONValue(parsing: value), let broker = record["broker"]?.stringValue else { return nil }
        var workers: [String: Int] = [:]
        if case .object(let services)? = record["services"] {
            for (name, count) in services { if let count = count.intValue, count > 0 { workers[name] = Int(clamping: count) } }
        }
        return (CellLinks.Peer(broker: broker, key: record["key"]?.stringValue), workers)
    }

    /// etcd let the record's lease go (it was out of reach that long): a new one is granted.
    struct LeaseRanOut: Error, CustomStringConvertible {
        var description: String { "the cell's lease in etcd ran out" }
    }
}

extension Kernel {
    /// Where the other cells reach this kernel's broker: `kernel.cell.advertise`, else the
    /// endpoint it bound, which must name a host they can reach.
    static func advertised(_ cell: CellConfiguration, bound broker: String) throws -> String {
        if let advertise = cell.advertise { return advertise }
        // The rule the state's election names its holder's broker by.
        guard let advertised = ElectionValue.advertised(broker) else {
            throw KernelRefusal("kernel.cell: the broker is bound at \(broker), which other cells cannot connect to: set kernel.cell.advertise to tcp://HOST:PORT")
        }
        return advertised
    }

    /// A cell whose state is in memory has one kernel (with the state in etcd a second one
    /// waits for the cell's election instead): a record of the cell in the directory whose
    /// broker does not refuse a connection means another kernel serves it, and this one is
    /// refused rather than take turns with it in the directory. A record naming a broker
    /// where nothing listens is a kernel that ended (this one's earlier run among them): its
    /// lease runs out. With etcd out of reach the kernel starts, as it would without a
    /// directory to follow.
    func refuseSecondKernel(of cell: CellConfiguration) async throws {
        var settings = EtcdClient.Settings(cell.etcd)
        settings.requestTimeout = .seconds(2)
        let client = try EtcdClient(settings: settings)
        let key = CellDirectory.key(of: cell)
        let record: CellLinks.Peer?
        do {
            record = try await client.range(key).keyValues.first.flatMap { CellDirectory.peer($0.value)?.peer }
        } catch {
            logger.warning("cannot read the cells' directory: starting without knowing whether another kernel serves this cell", metadata: ["error": "\(error)"])
            record = nil
        }
        await client.close()
        guard let record, await !Self.refusesConnection(record.broker) else { return }
        throw KernelRefusal("kernel.cell: cell \(cell.name) already has a kernel, at \(record.broker) (its record \(String(decoding: key, as: UTF8.self)) in etcd is alive). "
                       + "A cell whose state is in memory has one kernel: give this one another cell name, or keep the state in etcd "
                       + "(kernel.state.backend: etcd), where a second kernel of a cell waits to take over (docs/CELLS.md)")
    }

    /// Joins the directory: writes this cell's record and follows the others', until
    /// ``leaveCells(_:)``.
    func joinCells(_ directory: CellDirectory) {
        cellWork = Task {
            await withDiscardingTaskGroup { group in
                group.addTask { await self.keepCellRecord(directory) }
                group.addTask { await self.rewriteCellRecord(directory) }
                group.addTask { await self.followCells(directory) }
            }
        }
    }

    /// Leaves the directory (the kernel stops): the record goes at once rather than when its
    /// lease runs out, so the other cells stop sending here.
    func leaveCells(_ directory: CellDirectory) async {
        cellWork?.cancel()
        await cellWork?.value
        cellWork = nil
        _ = try? await directory.client.delete(directory.key)
        await directory.client.close()
    }

    /// Writes the record under a lease and keeps the lease alive; under a new lease when the
    /// old one ran out (etcd was out of reach that long).
    private func keepCellRecord(_ directory: CellDirectory) async {
        let seconds = directory.cell.etcd.leaseSeconds
        while !Task.isCancelled {
            do {
                let lease = try await directory.client.grantLease(ttl: Int64(seconds)).id
                directory.lease.withLock { $0 = lease }
                _ = try await directory.client.put(directory.key, directory.record(services: cellServices()), lease: lease)
                // A rewrite for a change made meanwhile may have landed first: written once
                // more, by the task that makes every rewrite, so the last write is the latest.
                directory.changed.yield()
                logger.info("this cell is in the directory", metadata: ["cell": "\(directory.cell.name)", "broker": "\(directory.broker)"])
                while !Task.isCancelled {
                    try await Task.sleep(for: .seconds(seconds) / 3)
                    guard try await directory.client.keepAlive(lease) > 0 else { throw CellDirectory.LeaseRanOut() }
                }
            } catch {
                guard !Task.isCancelled else { return }
                logger.warning("cannot keep this cell's record in the directory: trying again", metadata: ["error": "\(error)"])
                try? await Task.sleep(for: .seconds(1))
            }
        }
    }

    /// Writes the record again each time this cell's services change. A write that fails
    /// (etcd out of reach, the lease gone) is made by ``keepCellRecord(_:)`` once it has a
    /// lease again, with the services as they are then.
    private func rewriteCellRecord(_ directory: CellDirectory) async {
        for await _ in directory.changes {
            let lease = directory.lease.withLock { $0 }
            guard lease != 0 else { continue }
            _ = try? await directory.client.put(directory.key, directory.record(services: cellServices()), lease: lease)
        }
    }

    /// Reads the directory, then follows it; the other cells go to the links.
    private func followCells(_ directory: CellDirectory) async {
        while !Task.isCancelled {
            do {
                // Each record read once, as it comes: the others' by name.
                let range = try await directory.client.range(prefix: directory.prefix)
                var records: [String: (peer: CellLinks.Peer, workers: [String: Int])] = [:]
                for entry in range.keyValues { if let name = directory.cell(at: entry.key) { records[name] = CellDirectory.peer(entry.value) } }
                cellsChanged(records)
                for try await update in directory.client.watch(prefix: directory.prefix, from: range.revision + 1) {
                    guard case .events(let events, _) = update else {
                        if case .compacted = update { break }
                        continue
                    }
                    for event in events {
                        guard let name = directory.cell(at: event.keyValue.key) else { continue }
                        records[name] = event.kind == .delete ? nil : CellDirectory.peer(event.keyValue.value)
                    }
                    cellsChanged(records)
                }
            } catch {
                guard !Task.isCancelled else { return }
                logger.warning("cannot follow the cells' directory: trying again", metadata: ["error": "\(error)"])
                try? await Task.sleep(for: .seconds(1))
            }
        }
    }

    /// The services this cell offers the others, with their workers here.
    private func cellServices() -> [(name: String, workers: Int)] { parts?.workersOfferedToCells ?? [] }

    /// The directory changed: the links follow the cells, the broker their workers' counts.
    private func cellsChanged(_ all: [String: (peer: CellLinks.Peer, workers: [String: Int])]) {
        guard let parts, let cells = parts.cells else { return }
        let (records, leftOut) = CellDirectory.followed(all)
        if leftOut > 0 {
            logger.warning("more cells in the directory than a kernel follows: the first by name are followed, the rest left out",
                           metadata: ["cells": "\(all.count)", "followed": "\(CellDirectory.mostCells)", "leftOut": "\(leftOut)"])
        }
        parts.broker.cellWorkers = records.mapValues(\.workers)
        cells.peersChanged(records.mapValues(\.peer), services: parts.offeredToCells, now: clock.now)
        parts.flush()
    }
}
