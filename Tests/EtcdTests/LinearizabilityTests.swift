import BusKit
import BusProtocol
import Contracts
import Etcd
import Foundation
import Kernel
import SwitchboardTestSupport
import Testing
import ZeroMQ

/// The checker itself, on histories whose answer is known.
@Suite("linearizability of a register with compare-and-set: the checker")
struct LinearizabilityCheckerTests {
    func op(_ client: Int, _ call: RegisterOperation.Call, _ answer: RegisterOperation.Answer, _ called: UInt64, _ answered: UInt64) -> RegisterOperation {
        RegisterOperation(client: client, call: call, answer: answer, called: called, answered: answered)
    }

    @Test("linearizable: overlapping operations in either order, a lost answer that did or did not happen")
    func linearizable() {
        #expect(isLinearizable([
            op(0, .write("a"), .written(sequence: 10), 0, 10),
            op(1, .read, .read("a", sequence: 10), 11, 12),
            // Overlapping: the read may see the write or not.
            op(0, .write("b"), .written(sequence: 20), 13, 30),
            op(1, .read, .read("a", sequence: 10), 14, 15),
            op(1, .read, .read("b", sequence: 20), 31, 32),
            op(2, .compareAndSet(expected: 20, "c"), .written(sequence: 30), 33, 40),
            op(1, .compareAndSet(expected: 20, "d"), .conflict(sequence: 30), 41, 42),
        ]))
        // A write whose answer was lost: a later read says it happened, and with which sequence.
        #expect(isLinearizable([
            op(0, .write("a"), .unknown, 0, 5),
            op(1, .read, .read("a", sequence: 7), 6, 8),
            op(1, .compareAndSet(expected: 7, "b"), .written(sequence: 9), 9, 10),
        ]))
        #expect(isLinearizable([op(0, .write("a"), .unknown, 0, 5), op(1, .read, .read(nil, sequence: 0), 6, 8)]))
    }

    @Test("not linearizable: a read of an older value after a write was answered; two compare-and-sets won at one sequence; a sequence that goes back, after a lost write too")
    func notLinearizable() {
        #expect(!isLinearizable([
            op(0, .write("a"), .written(sequence: 10), 0, 1),
            op(0, .write("b"), .written(sequence: 20), 2, 3),
            op(1, .read, .read("a", sequence: 10), 4, 5),
        ]))
        #expect(!isLinearizable([
            op(0, .write("a"), .written(sequence: 10), 0, 1),
            op(1, .compareAndSet(expected: 10, "b"), .written(sequence: 20), 2, 5),
            op(2, .compareAndSet(expected: 10, "c"), .written(sequence: 30), 2, 5),
        ]))
        #expect(!isLinearizable([
            op(0, .write("a"), .written(sequence: 10), 0, 1),
            op(0, .write("b"), .written(sequence: 5), 2, 3),
        ]))
        // A write whose answer was lost numbers above what came before it: no later answer
        // may name an older sequence because of it.
        #expect(!isLinearizable([
            op(0, .write("a"), .written(sequence: 10), 0, 1),
            op(1, .write("b"), .unknown, 2, 3),
            op(1, .compareAndSet(expected: 5, "c"), .conflict(sequence: 7), 4, 5),
        ]))
    }
}

/// A state key through the kernel: `state.get`, `state.publish`, and `state.publish` with a
/// revision for compare-and-set.
struct KernelRegister: RegisterClient {
    let bus: BusClient
    let key: String

    func perform(_ call: RegisterOperation.Call) async -> RegisterOperation.Answer {
        do {
            switch call {
            case .read:
                let entry = try await bus.call(KernelAPI.stateGet, .init(prefix: key)).entries.first { $0.key == key }
                return .read(entry?.value.stringValue, sequence: entry?.sequence ?? 0)
            case .write(let value):
                return .written(sequence: try await bus.publish(key: key, value: .string(value)))
            case .compareAndSet(let expected, let value):
                return .written(sequence: try await bus.publish(key: key, value: .string(value), revision: expected))
            }
        } catch let BusError.remote(_, error) where error.code == JSONRPCError.conflictCode {
            return .conflict(sequence: UInt64(clamping: error.data?["revision"]?.intValue ?? -1))
        } catch {
            // Unanswered (while etcd chose a leader, say): it may or may not have been made.
            return .unknown
        }
    }

    func close() async { await bus.close() }
}

/// A register in memory, whose writes and compare-and-sets are made at once; deliberately
/// broken with `readsOneBehind`: a read answers what it held before its last write (as a
/// replica one change behind would).
actor MemoryRegister {
    let readsOneBehind: Bool
    init(readsOneBehind: Bool) { self.readsOneBehind = readsOneBehind }

    private var current: (value: String?, sequence: UInt64) = (nil, 0)
    private var previous: (value: String?, sequence: UInt64) = (nil, 0)

    func perform(_ call: RegisterOperation.Call) -> RegisterOperation.Answer {
        switch call {
        case .read:
            let read = readsOneBehind ? previous : current
            return .read(read.value, sequence: read.sequence)
        case .write(let value):
            return write(value)
        case .compareAndSet(let expected, let value):
            return expected == current.sequence ? write(value) : .conflict(sequence: current.sequence)
        }
    }

    private func write(_ value: String) -> RegisterOperation.Answer {
        previous = current
        current = (value, current.sequence + 1)
        return .written(sequence: current.sequence)
    }

    struct Client: RegisterClient {
        let register: MemoryRegister
        func perform(_ call: RegisterOperation.Call) async -> RegisterOperation.Answer {
            // A turn for the other clients between calls, as a network would give them.
            await Task.yield()
            return await register.perform(call)
        }
        func close() async {}
    }
}

@Suite("linearizability of a register with compare-and-set: the workload against a register in memory, sound and deliberately broken")
struct BrokenRegisterTests {
    @Test("the workload the kernel on etcd passes: a sound register passes it; one whose reads are a change behind fails it")
    func staleReadsFail() async throws {
        for readsOneBehind in [false, true] {
            let register = MemoryRegister(readsOneBehind: readsOneBehind)
            let operations = try await registerWorkload(clients: 4, operations: 40, connect: { _ in MemoryRegister.Client(register: register) })
            #expect(operations.count == 160)
            #expect(isLinearizable(operations) == !readsOneBehind, "reads one behind: \(readsOneBehind); \(operations.sorted { $0.called < $1.called })")
        }
    }
}

/// The kernel on a three-member etcd: clients' reads, writes and compare-and-sets of one key,
/// the etcd leader killed under them.
@Suite(.serialized, .enabled(if: TestEtcd.available, "needs etcd-server (Scripts/bootstrap --tests installs it)"))
struct EtcdLinearizabilityTests {
    static let key = "/client/register"

    @Test("writes, compare-and-sets and reads of one key by four clients, the etcd leader killed under them: linearizable; every acknowledged write published once, in order")
    func leaderKilledUnderLoad() async throws {
        let cluster = try await TestEtcd.start(members: 3)
        defer { cluster.stop() }
        let kernel = try await EtcdStateTests.kernel(on: cluster)
        let state = kernel.stateEndpoints
        let follower = try await BusClient(brokers: [kernel.endpoints.broker], state: [state])
        let subscription = try await follower.subscribe(prefixes: [Self.key])
        let leader = try await leader(of: cluster), broker = kernel.endpoints.broker
        let operations = try await registerWorkload(clients: 4, operations: 40, connect: { _ in
            KernelRegister(bus: try await BusClient(brokers: [broker], timeout: .seconds(10)), key: Self.key)
        }, before: { client, n in
            if client == 0 && n == 15 { cluster.kill(leader) }
        })
        let unknown = operations.filter { $0.answer == .unknown }.count
        #expect(unknown <= 8, "only operations in flight while etcd chose a leader may go unanswered: \(unknown)")
        #expect(isLinearizable(operations), "\(operations.sorted { $0.called < $1.called })")

        // The subscriber saw every acknowledged write once, in order.
        let acknowledged = Set(operations.compactMap { operation -> UInt64? in
            if case .written(let sequence) = operation.answer { sequence } else { nil }
        })
        let published = try await within(30, "every acknowledged write published") {
            var published: [UInt64] = []
            for try await event in subscription {
                guard case .update(let update) = event, !update.fromSnapshot else { continue }
                published.append(update.sequence)
                if acknowledged.isSubset(of: Set(published)) { break }
            }
            return published
        }
        #expect(acknowledged.isSubset(of: Set(published)))
        #expect(published == published.sorted() && Set(published).count == published.count, "each change once, in order")
        await subscription.cancel()
        await follower.close()
        await kernel.stop()
    }
}
