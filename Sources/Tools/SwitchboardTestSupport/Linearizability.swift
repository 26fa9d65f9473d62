import Foundation
import Synchronization
import ZeroMQ

/// One operation on a versioned register (a state key: its value and the sequence number of
/// its last change), as a client saw it: what it asked, what it was answered, and when it
/// asked and was answered. Checked by ``isLinearizable(_:)``.
public struct RegisterOperation: Sendable, CustomStringConvertible {
    public enum Call: Sendable, Equatable {
        case read
        case write(String)
        /// Compare-and-set: write the value only if the register is at `expected` (0: absent).
        case compareAndSet(expected: UInt64, String)
    }

    public enum Answer: Sendable, Equatable {
        /// What a read found (nil value: absent, at sequence 0).
        case read(String?, sequence: UInt64)
        /// A write or compare-and-set made, with the register's new sequence.
        case written(sequence: UInt64)
        /// A compare-and-set refused: the register was at `sequence`.
        case conflict(sequence: UInt64)
        /// No answer, or one that does not say whether it was made (a time-out, an outcome
        /// unknown): it may have taken effect at any time after it was asked.
        case unknown
    }

    public var client: Int
    public var call: Call
    public var answer: Answer
    /// Nanoseconds on one monotonic clock.
    public var called: UInt64
    public var answered: UInt64

    public init(client: Int, call: Call, answer: Answer, called: UInt64, answered: UInt64) {
        (self.client, self.call, self.answer, self.called, self.answered) = (client, call, answer, called, answered)
    }

    public var description: String { "client \(client): \(call) -> \(answer) [\(called)...\(answered)]" }
}

/// Clients' operations, recorded from several tasks.
public final class RegisterHistory: Sendable {
    private let operations = Mutex<[RegisterOperation]>([])
    public init() {}

    public func record(_ operation: RegisterOperation) { operations.withLock { $0.append(operation) } }
    public var all: [RegisterOperation] { operations.withLock { $0 } }
}

/// One client's way to the register under test: the answer to each call (``RegisterOperation/Answer/unknown``
/// when none came, or one that does not say whether the call took effect).
public protocol RegisterClient: Sendable {
    func perform(_ call: RegisterOperation.Call) async -> RegisterOperation.Answer
    func close() async
}

/// `clients` clients at once, each making `operations` calls one after another (a read, a
/// write, a compare-and-set at the sequence it last knew, in turn) on a register of its own
/// connection (`connect`), each recorded with when it was asked and answered. `before` runs
/// before each call (a test cuts or kills something there).
public func registerWorkload(clients: Int, operations: Int,
                             connect: @escaping @Sendable (_ client: Int) async throws -> any RegisterClient,
                             before: @escaping @Sendable (_ client: Int, _ n: Int) async throws -> Void = { _, _ in }) async throws -> [RegisterOperation] {
    let history = RegisterHistory()
    try await withThrowingTaskGroup(of: Void.self) { group in
        for client in 0..<clients {
            group.addTask {
                let register = try await connect(client)
                // The register's sequence as this client last knew it: what its compare-and-sets expect.
                var known: UInt64 = 0
                for n in 0..<operations {
                    try await before(client, n)
                    let value = "\(client)-\(n)"
                    let call: RegisterOperation.Call = switch n % 3 {
                    case 0: .read
                    case 1: .write(value)
                    default: .compareAndSet(expected: known, value)
                    }
                    let called = monotonicNanoseconds()
                    let answer = await register.perform(call)
                    history.record(RegisterOperation(client: client, call: call, answer: answer, called: called, answered: monotonicNanoseconds()))
                    switch (call, answer) {
                    case (.read, .read(_, let sequence)), (_, .written(let sequence)), (.compareAndSet, .conflict(let sequence)): known = sequence
                    default: break
                    }
                }
                await register.close()
            }
        }
        try await group.waitForAll()
    }
    return history.all
}

/// Whether `history` is linearizable for a register with compare-and-set (Wing and Gong's
/// search, with Lowe's memo of states already tried): some order of the operations that
/// keeps every operation answered before another was asked before it, in which each
/// answer is what the register gives at that point. An operation with an unknown answer
/// may appear anywhere after it was asked, or not at all; the sequence it would have made
/// is then unknown until a read says it.
public func isLinearizable(_ history: [RegisterOperation]) -> Bool {
    struct State: Hashable {
        var value: String?
        /// Nil: written by an operation whose answer was lost, its sequence not read yet;
        /// it is then above `above`, since every change numbers above the one before.
        var sequence: UInt64?
        var above: UInt64 = 0

        /// The sequence after an operation whose answer was lost changed the register.
        var unknownNext: State { State(value: value, sequence: nil, above: sequence ?? above) }
        /// Whether the register can be at `sequence` now.
        func canBe(at sequence: UInt64) -> Bool { self.sequence.map { $0 == sequence } ?? (sequence > above) }
        /// Whether a change can be numbered `sequence` now.
        func canChange(to sequence: UInt64) -> Bool { sequence > (self.sequence ?? above) }
    }
    let operations = history.sorted { $0.called < $1.called }
    let count = operations.count
    let never = UInt64.max
    let returns = operations.map { $0.answer == .unknown ? never : $0.answered }

    /// The register after `operation` from `state`, nil when its answer is impossible there.
    func step(_ state: State, _ operation: RegisterOperation) -> State? {
        switch (operation.call, operation.answer) {
        case (.read, .read(let value, let sequence)):
            guard state.value == value, state.canBe(at: sequence) else { return nil }
            return State(value: value, sequence: sequence)
        case (.read, _):
            return state
        case (.write(let value), .written(let sequence)):
            guard state.canChange(to: sequence) else { return nil }
            return State(value: value, sequence: sequence)
        case (.write(let value), _):
            var next = state.unknownNext
            next.value = value
            return next
        case (.compareAndSet(let expected, let value), .written(let sequence)):
            guard state.canBe(at: expected), state.canChange(to: sequence) else { return nil }
            return State(value: value, sequence: sequence)
        case (.compareAndSet(let expected, _), .conflict(let sequence)):
            guard sequence != expected, state.canBe(at: sequence) else { return nil }
            return State(value: state.value, sequence: sequence)
        case (.compareAndSet(let expected, let value), _):
            // Made only if the register was at `expected`: placed here, it was (or nothing changed).
            guard state.canBe(at: expected) else { return state }
            var next = state.unknownNext
            next.value = value
            return next
        }
    }

    struct Visit: Hashable {
        var done: [UInt64]
        var state: State
    }
    var visited = Set<Visit>()
    var done = [UInt64](repeating: 0, count: (count + 63) / 64)
    func isDone(_ index: Int) -> Bool { done[index / 64] & (1 << UInt64(index % 64)) != 0 }
    func flip(_ index: Int) { done[index / 64] ^= 1 << UInt64(index % 64) }

    func search(_ state: State, remaining: Int) -> Bool {
        // Every answered operation placed: those with unknown answers may not have happened.
        if (0..<count).allSatisfy({ isDone($0) || returns[$0] == never }) { return true }
        guard visited.insert(Visit(done: done, state: state)).inserted else { return false }
        // The next to take effect is one asked before every operation not yet placed was answered.
        var earliestReturn = never
        for index in 0..<count where !isDone(index) { earliestReturn = min(earliestReturn, returns[index]) }
        for index in 0..<count where !isDone(index) && operations[index].called < earliestReturn {
            guard let next = step(state, operations[index]) else { continue }
            flip(index)
            if search(next, remaining: remaining - 1) { return true }
            flip(index)
        }
        return false
    }
    return search(State(value: nil, sequence: 0), remaining: count)
}
