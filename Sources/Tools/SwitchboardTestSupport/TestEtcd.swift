public import Foundation
import Etcd
import Synchronization

/// An etcd cluster of its own for a test: `members` etcd processes (Debian's `etcd-server`)
/// with their data in a temporary folder, on free loopback ports, each started as a
/// ``ChildProcess``; ``stop()`` ends every one and removes the folder.
public final class TestEtcd: Sendable {
    public static let executable = URL(fileURLWithPath: "/usr/bin/etcd")
    public static var available: Bool { FileManager.default.isExecutableFile(atPath: executable.path) }

    public let folder: URL
    /// Each member's client URL (`http://127.0.0.1:PORT`, `https://` with TLS), what
    /// ``EtcdClient`` takes.
    public let clientURLs: [String]
    private let peerURLs: [String]
    private let token: String
    private let arguments: [String]
    /// Each member's network namespace (`ip netns`), or nil for this one's loopback.
    private let namespaces: [String?]
    /// Each member's process while it runs.
    private let processes: Mutex<[ChildProcess?]>

    private init(folder: URL, clientURLs: [String], peerURLs: [String], arguments: [String], namespaces: [String?]) {
        self.folder = folder
        self.clientURLs = clientURLs
        self.peerURLs = peerURLs
        self.arguments = arguments
        self.namespaces = namespaces
        token = "test-\(UUID().uuidString)"
        processes = Mutex(Array(repeating: nil, count: clientURLs.count))
    }

    /// What a member serves its clients with over TLS (PEM files): its certificate and key,
    /// and the CA whose certificates it asks of every client.
    public struct ClientTLS: Sendable {
        public var certificateFile: String
        public var keyFile: String
        public var clientCAFile: String
        public init(certificateFile: String, keyFile: String, clientCAFile: String) {
            (self.certificateFile, self.keyFile, self.clientCAFile) = (certificateFile, keyFile, clientCAFile)
        }
    }

    /// Starts a new cluster of `members`, each with etcd's flags and `arguments`, and returns
    /// once every member serves clients: over TLS, asking each client for a certificate, with
    /// `tls`.
    public static func start(members: Int = 1, arguments: [String] = [], tls: ClientTLS? = nil) async throws -> TestEtcd {
        let tlsArguments = tls.map { ["--cert-file", $0.certificateFile, "--key-file", $0.keyFile, "--trusted-ca-file", $0.clientCAFile, "--client-cert-auth"] } ?? []
        return try await start(TestEtcd(folder: try temporaryDirectory("etcd"),
                                        clientURLs: (0..<members).map { _ in "\(tls == nil ? "http" : "https")://127.0.0.1:\(freePort())" },
                                        peerURLs: (0..<members).map { _ in "http://127.0.0.1:\(freePort())" }, arguments: arguments + tlsArguments,
                                        namespaces: Array(repeating: nil, count: members)))
    }

    /// A cluster of one member on each host: a network namespace the test made (`ip netns`)
    /// and the member's address there, on etcd's own ports (2379 for clients, 2380 for peers).
    public static func start(on hosts: [(namespace: String, address: String)], arguments: [String] = []) async throws -> TestEtcd {
        try await start(TestEtcd(folder: try temporaryDirectory("etcd"), clientURLs: hosts.map { "http://\($0.address):2379" },
                                 peerURLs: hosts.map { "http://\($0.address):2380" }, arguments: arguments, namespaces: hosts.map(\.namespace)))
    }

    private static func start(_ cluster: TestEtcd) async throws -> TestEtcd {
        guard available else { throw TestEtcdError(description: "etcd is not installed (Debian's etcd-server package)") }
        let members = cluster.clientURLs.count
        do {
            for member in 0..<members { try cluster.launch(member) }
            for member in 0..<members { try await cluster.waitUntilServing(member) }
        } catch {
            cluster.stop()
            throw error
        }
        return cluster
    }

    /// Kills member `member` at once (SIGKILL, as a crash), keeping its data.
    public func kill(_ member: Int) {
        guard let process = processes.withLock({ processes in processes[member].take() }) else { return }
        process.signal(SIGKILL)
        process.stop(grace: 5)
    }

    /// Starts member `member` again on its data; returns once it serves clients.
    public func restart(_ member: Int) async throws {
        kill(member)
        try launch(member)
        try await waitUntilServing(member)
    }

    /// The member's output so far (etcd's JSON log lines).
    public func log(_ member: Int) -> String { processes.withLock { $0[member] }?.outputSoFar ?? "" }

    /// The keys under `prefix` and their values once `condition` holds of them: read once,
    /// then followed through a watch from that read's revision, so the wait ends at the change
    /// it waits for instead of polling. Fails with ``TimedOut`` after `seconds`.
    @discardableResult
    public func values(under prefix: String, within seconds: Double = 10, _ what: String,
                       until condition: @escaping @Sendable ([String: [UInt8]]) -> Bool) async throws -> [String: [UInt8]] {
        try await stopping(try EtcdClient(endpoints: clientURLs), with: { await $0.close() }) { client in
            try await within(seconds, what) {
                let prefix = Array(prefix.utf8)
                let read = try await client.range(prefix: prefix)
                var values: [String: [UInt8]] = [:]
                for entry in read.keyValues { values[String(decoding: entry.key, as: UTF8.self)] = entry.value }
                if condition(values) { return values }
                for try await update in client.watch(prefix: prefix, from: read.revision + 1) {
                    guard case .events(let events, _) = update else { continue }
                    for event in events {
                        values[String(decoding: event.keyValue.key, as: UTF8.self)] = event.kind == .delete ? nil : event.keyValue.value
                    }
                    if condition(values) { return values }
                }
                throw TimedOut(what: "\(what): the watch ended")
            }
        }
    }

    /// Stops every member and removes the folder.
    public func stop() {
        let running = processes.withLock { processes in
            defer { processes = processes.map { _ in nil } }
            return processes
        }
        for process in running { process?.stop(grace: 5) }
        try? FileManager.default.removeItem(at: folder)
    }

    private func launch(_ member: Int) throws {
        let cluster = peerURLs.enumerated().map { "m\($0.offset)=\($0.element)" }.joined(separator: ",")
        let etcd = [
            "--name", "m\(member)", "--data-dir", folder.appendingPathComponent("m\(member)").path,
            "--listen-client-urls", clientURLs[member], "--advertise-client-urls", clientURLs[member],
            "--listen-peer-urls", peerURLs[member], "--initial-advertise-peer-urls", peerURLs[member],
            "--initial-cluster", cluster, "--initial-cluster-token", token, "--initial-cluster-state", "new",
            "--logger", "zap", "--log-outputs", "stderr",
        ] + arguments
        let process = try namespaces[member].map { try NetworkNamespaces.start(in: $0, Self.executable, etcd, watched: true) }
            ?? ChildProcess(watched: Self.executable, etcd)
        processes.withLock { $0[member] = process }
    }

    /// Waits for the member's log to say it joined a cluster with a leader and serves clients.
    private func waitUntilServing(_ member: Int) async throws {
        guard let process = processes.withLock({ $0[member] }) else { return }
        try await process.waitForOutput(containing: "published local member to cluster", within: 60)
        try await process.waitForOutput(containing: "serving client traffic", within: 60)
    }

    deinit { stop() }
}

public struct TestEtcdError: Error, CustomStringConvertible {
    public let description: String
}
