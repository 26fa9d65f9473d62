import Synchronization

/// How many bus calls each caller (an address) has in flight through `POST /rpc`, held under
/// `gateway.max_calls_per_address`. Every web caller's request goes out on the gateway's one
/// bus client, and the kernel serves that client's requests in the order they came: without
/// a bound, one address sending thousands at once would make everyone else's calls wait
/// behind its own.
///
/// An address is tracked only while it has calls in flight, so what this holds is bounded by
/// the calls themselves.
final class CallsPerAddress: Sendable {
    /// 0: no bound.
    let limit: Int
    private let inFlight = Mutex<[String: Int]>([:])

    init(limit: Int) {
        self.limit = limit
    }

    /// `calls` more for `caller`, if they fit under the limit with those it has in flight;
    /// nil if they do not.
    func take(_ calls: Int, for caller: String) -> Taken? {
        let fits = limit <= 0 || inFlight.withLock { inFlight in
            let now = inFlight[caller, default: 0]
            guard now + calls <= limit else { return false }
            inFlight[caller] = now + calls
            return true
        }
        return fits ? Taken(calls: limit > 0 ? calls : 0, caller: caller, ledger: self) : nil
    }

    /// The calls `caller` has in flight now.
    func inFlight(for caller: String) -> Int { inFlight.withLock { $0[caller, default: 0] } }

    /// Addresses with calls in flight now.
    var callers: Int { inFlight.withLock { $0.count } }

    private func giveBack(_ calls: Int, for caller: String) {
        guard calls > 0 else { return }
        inFlight.withLock { inFlight in
            let left = inFlight[caller, default: 0] - calls
            inFlight[caller] = left > 0 ? left : nil
        }
    }

    /// Calls taken for a caller: given back by ``end()`` once they are answered (or failed,
    /// or the caller left), and at the latest when this is let go, so that no path (a
    /// response body never written) can keep an address's share taken.
    final class Taken: Sendable {
        let calls: Int
        let caller: String
        private let ledger: CallsPerAddress
        private let ended = Atomic(false)

        fileprivate init(calls: Int, caller: String, ledger: CallsPerAddress) {
            self.calls = calls
            self.caller = caller
            self.ledger = ledger
        }

        func end() {
            guard !ended.exchange(true, ordering: .relaxed) else { return }
            ledger.giveBack(calls, for: caller)
        }

        deinit { end() }
    }
}
