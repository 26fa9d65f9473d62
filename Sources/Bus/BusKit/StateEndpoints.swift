import SwitchboardConfig

/// The kernel's three CHP endpoints (12/CHP), as `sb --state-endpoint` and
/// `switchboard serve --state` take them: `tcp://HOST:PORT` is the snapshot endpoint with
/// the publisher and collector on the next two ports (the kernel's defaults: 5556, 5557,
/// 5558), or all three are given comma-separated.
public struct StateEndpoints: Sendable, Equatable {
    public var snapshot: String
    public var publisher: String
    public var collector: String

    public init(snapshot: String, publisher: String, collector: String) {
        self.snapshot = snapshot
        self.publisher = publisher
        self.collector = collector
    }

    /// Parses `tcp://HOST:PORT` or `SNAPSHOT,PUBLISHER,COLLECTOR` (each a TCP or IPC endpoint,
    /// ``ConfigSection/isEndpoint(_:schemes:)``); nil for anything else.
    public init?(_ text: String) {
        let parts = ConfigSection.commaSeparated(text)
        if parts.count == 3 {
            guard parts.allSatisfy({ ConfigSection.isEndpoint($0, schemes: ["tcp://", "ipc://"]) }) else { return nil }
            self.init(snapshot: parts[0], publisher: parts[1], collector: parts[2])
            return
        }
        guard parts.count == 1, let (host, port) = Self.tcpHostPort(parts[0]) else { return nil }
        self.init(snapshot: "tcp://\(host):\(port)", publisher: "tcp://\(host):\(port + 1)", collector: "tcp://\(host):\(port + 2)")
    }

    /// The default next to a broker at `tcp://HOST:PORT`: the snapshot on PORT + 1.
    public init?(followingBroker broker: String) {
        guard let (host, port) = Self.tcpHostPort(broker) else { return nil }
        self.init("tcp://\(host):\(port + 1)")
    }

    static func tcpHostPort(_ endpoint: String) -> (String, Int)? {
        guard endpoint.hasPrefix("tcp://"), let colon = endpoint.lastIndex(of: ":") else { return nil }
        let host = endpoint[endpoint.index(endpoint.startIndex, offsetBy: 6)..<colon]
        guard let port = Int(endpoint[endpoint.index(after: colon)...]), (1...65_533).contains(port), !host.isEmpty else { return nil }
        return (String(host), port)
    }
}
