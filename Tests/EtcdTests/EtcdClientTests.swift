import BusProtocol
import Etcd
import Foundation
import SwitchboardTestSupport
import Testing

private func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

/// Runs `body` with a client of a new etcd cluster of `members`; stops both however it ends.
private func withEtcd(members: Int = 1, arguments: [String] = [], settings: (inout EtcdClient.Settings) -> Void = { _ in },
                      _ body: (TestEtcd, EtcdClient) async throws -> Void) async throws {
    let cluster = try await TestEtcd.start(members: members, arguments: arguments)
    var clientSettings = EtcdClient.Settings(endpoints: cluster.clientURLs)
    settings(&clientSettings)
    let client = try EtcdClient(settings: clientSettings)
    do {
        try await body(cluster, client)
    } catch {
        await client.close()
        cluster.stop()
        throw error
    }
    await client.close()
    cluster.stop()
}

/// Takes updates from `iterator` until `count` events came (progress notifications skipped).
private func events(_ count: Int, from iterator: inout EtcdWatch.AsyncIterator, within seconds: Double = 20) async throws -> [EtcdEvent] {
    var seen: [EtcdEvent] = []
    let deadline = ContinuousClock.now + .seconds(seconds)
    while seen.count < count {
        guard ContinuousClock.now < deadline else { throw TimedOut(what: "\(count) watch events; saw \(seen.count)") }
        switch try await iterator.next() {
        case .events(let batch, _)?: seen += batch
        case .progress?: continue
        case .compacted(let revision)?: throw TimedOut(what: "events, but the watch was compacted at \(revision)")
        case nil: throw TimedOut(what: "events, but the watch ended")
        }
    }
    return seen
}

@Suite("etcd client: keys, transactions, leases and watches against a real etcd", .serialized, .enabled(if: TestEtcd.available))
struct EtcdClientTests {
    @Test("put, range (a key, a prefix, an older revision) and delete; revisions grow by one a write")
    func keys() async throws {
        try await withEtcd { _, etcd in
            let first = try await etcd.put(bytes("/app/a"), bytes("1"))
            let second = try await etcd.put(bytes("/app/b"), [0, 0xFF, 10])
            #expect(second == first + 1)
            let third = try await etcd.put(bytes("/app/a"), bytes("2"))
            try await etcd.put(bytes("/other"), bytes("x"))

            let a = try await etcd.range(bytes("/app/a"))
            #expect(a.keyValues.map(\.valueString) == ["2"] && a.revision == third + 1)
            #expect(a.keyValues.first?.createRevision == first && a.keyValues.first?.modRevision == third && a.keyValues.first?.version == 2)
            let app = try await etcd.range(prefix: bytes("/app/"))
            #expect(app.keyValues.map(\.keyString) == ["/app/a", "/app/b"] && app.count == 2)
            #expect(app.keyValues.last?.value == [0, 0xFF, 10], "bytes, not text, round-trip")
            let before = try await etcd.range(bytes("/app/a"), revision: first)
            #expect(before.keyValues.map(\.valueString) == ["1"])
            let limited = try await etcd.range(bytes("/"), end: EtcdClient.prefixEnd(bytes("/")), limit: 1)
            #expect(limited.keyValues.count == 1 && limited.more && limited.count == 3)

            let deleted = try await etcd.delete(bytes("/app/"), end: EtcdClient.prefixEnd(bytes("/app/")))
            #expect(deleted.deleted == 2 && deleted.revision == third + 2)
            #expect(try await etcd.range(prefix: bytes("/app/")).keyValues.isEmpty)
            #expect(try await etcd.delete(bytes("/app/a")).deleted == 0)
            #expect(EtcdClient.prefixEnd([0x61, 0xFF]) == [0x62] && EtcdClient.prefixEnd([]) == [0])
        }
    }

    @Test("compare-and-set by mod_revision: of eight writers at one revision exactly one wins; the losers read what won")
    func compareAndSet() async throws {
        try await withEtcd { _, etcd in
            let key = bytes("/cas")
            #expect(try await etcd.transaction(when: [.absent(key)], then: [.put(key: key, value: bytes("start"))]).succeeded)
            #expect(try await etcd.transaction(when: [.absent(key)], then: [.put(key: key, value: bytes("again"))]).succeeded == false)
            let revision = try await etcd.range(key).keyValues[0].modRevision
            let outcomes = try await withThrowingTaskGroup(of: (Int, EtcdTransaction).self) { group in
                for writer in 0..<8 {
                    group.addTask {
                        (writer, try await etcd.transaction(when: [EtcdCompare(key: key, .equal, .modRevision(revision))],
                                                            then: [.put(key: key, value: bytes("w\(writer)"))], else: [.range(key: key)]))
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            let winners = outcomes.filter(\.1.succeeded)
            #expect(winners.count == 1)
            let winner = try #require(winners.first)
            #expect(try await etcd.range(key).keyValues.map(\.valueString) == ["w\(winner.0)"])
            for (_, loser) in outcomes where !loser.succeeded {
                #expect(loser.ranges.first?.keyValues.first?.valueString == "w\(winner.0)")
                #expect(loser.ranges.first?.keyValues.first?.modRevision == winner.1.revision)
            }
        }
    }

    @Test("a lease: its keys go when it expires (seen by a watch), a keep-alive renews it, a revoked one is gone")
    func leases() async throws {
        try await withEtcd { _, etcd in
            let lease = try await etcd.grantLease(ttl: 2)
            #expect(lease.ttl == 2 && lease.id != 0)
            let start = try await etcd.put(bytes("/leased/a"), bytes("1"), lease: lease.id)
            #expect(try await etcd.range(bytes("/leased/a")).keyValues.first?.lease == lease.id)
            #expect(try await etcd.keepAlive(lease.id) == 2)
            var watch = etcd.watch(prefix: bytes("/leased/"), from: start + 1).makeAsyncIterator()
            // Etcd checks leases about every half second: the key goes two or three seconds on.
            let expiry = try await events(1, from: &watch, within: 15)
            #expect(expiry.first?.kind == .delete && expiry.first?.keyValue.keyString == "/leased/a")
            #expect(try await etcd.keepAlive(lease.id) == 0, "an expired lease is not renewed")

            let revoked = try await etcd.grantLease(ttl: 60)
            try await etcd.put(bytes("/leased/b"), bytes("2"), lease: revoked.id)
            try await etcd.revoke(revoked.id)
            #expect(try await etcd.range(bytes("/leased/b")).keyValues.isEmpty)
            #expect(try await events(2, from: &watch).map(\.kind) == [.put, .delete])
        }
    }

    @Test("a watch from a revision: every change once, in order; it resumes where it stopped across a restart of the member")
    func watchResumes() async throws {
        try await withEtcd { cluster, etcd in
            let first = try await etcd.put(bytes("/w/0"), bytes("0"))
            for n in 1..<5 { try await etcd.put(bytes("/w/\(n)"), bytes("\(n)")) }
            var watch = etcd.watch(prefix: bytes("/w/"), from: first).makeAsyncIterator()
            let history = try await events(5, from: &watch)
            #expect(history.map(\.keyValue.modRevision) == Array(first..<(first + 5)))
            #expect(history.map(\.keyValue.valueString) == ["0", "1", "2", "3", "4"])

            try await cluster.restart(0)
            var written: [Int64] = []
            for n in 5..<10 { written.append(try await etcd.put(bytes("/w/\(n)"), bytes("\(n)"))) }
            try await etcd.delete(bytes("/w/0"))
            let after = try await events(6, from: &watch)
            #expect(after.prefix(5).map(\.keyValue.modRevision) == written, "no change lost or repeated across the restart")
            #expect(after.last?.kind == .delete && after.last?.keyValue.keyString == "/w/0")
        }
    }

    @Test("compacted history: a read of an older revision is refused as compacted; a watch from one ends with the compaction's revision")
    func compaction() async throws {
        try await withEtcd { _, etcd in
            let first = try await etcd.put(bytes("/c"), bytes("1"))
            try await etcd.put(bytes("/c"), bytes("2"))
            let last = try await etcd.put(bytes("/c"), bytes("3"))
            try await etcd.compact(to: last)
            let error = await #expect(throws: EtcdError.self) { try await etcd.range(bytes("/c"), revision: first) }
            #expect(error?.kind == .compacted && error?.description.contains("compacted") == true, "\(String(describing: error))")
            var watch = etcd.watch(bytes("/c"), from: first).makeAsyncIterator()
            #expect(try await watch.next() == .compacted(revision: last))
            #expect(try await watch.next() == nil)
        }
    }

    @Test("errors name etcd, the operation and the member; a member that cannot be reached is passed over")
    func errors() async throws {
        try await withEtcd { cluster, etcd in
            // Nobody listens on this port: the next endpoint answers.
            let gone = "http://127.0.0.1:\(freePort())"
            let failingOver = try EtcdClient(endpoints: [gone] + cluster.clientURLs)
            #expect(try await failingOver.put(bytes("/k"), bytes("v")) > 0)
            await failingOver.close()

            let nowhere = try EtcdClient(endpoints: [gone])
            let unreachable = await #expect(throws: EtcdError.self) { try await nowhere.range(bytes("/k")) }
            #expect(unreachable?.kind == .unreachable && unreachable?.description.hasPrefix("etcd range /k: no member reachable: \(gone)") == true,
                    "\(String(describing: unreachable))")
            await nowhere.close()

            // Over etcd's request limit (1.5 MiB by default; its gateway takes up to 2 MiB).
            let large = await #expect(throws: EtcdError.self) { try await etcd.put(bytes("/large"), Array(repeating: 7, count: 1_600_000)) }
            #expect(large?.description.contains("etcd put /large at \(cluster.clientURLs[0])") == true
                && large?.description.contains("too large") == true, "\(String(describing: large))")

            #expect(throws: EtcdError.self) { try EtcdClient(endpoints: []) }
            let malformed = #expect(throws: EtcdError.self) { try EtcdClient(endpoints: ["127.0.0.1:2379"]) }
            #expect(malformed?.description.contains("http://HOST:PORT") == true)
        }
    }

    @Test("a client released without close() lets its connections go instead of trapping")
    func releasedWithoutClose() async throws {
        let cluster = try await TestEtcd.start()
        defer { cluster.stop() }
        do {
            let forgotten = try EtcdClient(endpoints: cluster.clientURLs)
            _ = try await forgotten.put(bytes("/forgotten"), bytes("1"))
        }
        // Still running: async-http-client traps when a client it made is released open.
        let client = try EtcdClient(endpoints: cluster.clientURLs)
        #expect(try await client.range(bytes("/forgotten")).keyValues.first?.valueString == "1")
        await client.close()
    }

    @Test("three members, the one the client and a watch talk to killed under writes: writes go on through another, the watch sees every revision once, in order")
    func memberKilled() async throws {
        try await withEtcd(members: 3) { cluster, etcd in
            let start = try await etcd.put(bytes("/load/start"), bytes("0"))
            var watch = etcd.watch(prefix: bytes("/load/"), from: start + 1).makeAsyncIterator()
            var acknowledged: [Int64] = []
            var failures = 0
            for n in 0..<200 {
                if n == 50 { cluster.kill(0) }
                do {
                    acknowledged.append(try await etcd.put(bytes("/load/\(n % 10)"), bytes("\(n)")))
                } catch let error as EtcdError where [.unreachable, .timedOut, .refused(code: 14)].contains(error.kind) {
                    // Cut off mid-request, or the leader went (14, unavailable): it may have
                    // been written; the watch will say.
                    failures += 1
                }
            }
            #expect(failures <= 3, "only writes in flight while a member died or a leader was elected may fail")
            var seen: [Int64] = []
            let deadline = ContinuousClock.now + .seconds(20)
            while seen.last ?? 0 < acknowledged.last ?? 0, ContinuousClock.now < deadline {
                if case .events(let batch, _)? = try await watch.next() { seen += batch.map(\.keyValue.modRevision) }
            }
            #expect(seen == seen.sorted() && Set(seen).count == seen.count, "each revision once, in order")
            #expect(Set(acknowledged).isSubset(of: Set(seen)), "every acknowledged write seen")
            #expect(seen.count >= 200 - failures && seen.count <= 200)
        }
    }

    @Test("over TLS with client certificates: a client with the CA and its certificate is served (writes and a watch); one without a certificate or without the CA is refused; TLS files that do not read are refused when the client is made")
    func tls() async throws {
        let files = try await TestCertificates.make()
        defer { files.remove() }
        let cluster = try await TestEtcd.start(tls: .init(certificateFile: files.path("server.pem"), keyFile: files.path("server.key"),
                                                          clientCAFile: files.path("ca.pem")))
        defer { cluster.stop() }
        #expect(cluster.clientURLs.allSatisfy { $0.hasPrefix("https://") })
        func client(ca: Bool = true, certificate: Bool = true) throws -> EtcdClient {
            var settings = EtcdClient.Settings(endpoints: cluster.clientURLs)
            if ca { settings.caFile = files.path("ca.pem") }
            if certificate { (settings.certificateFile, settings.keyFile) = (files.path("client.pem"), files.path("client.key")) }
            return try EtcdClient(settings: settings)
        }

        // A key file named `.key`, as etcd's own examples name them, holding PEM.
        let etcd = try client()
        let revision = try await etcd.put(bytes("/tls/a"), bytes("1"))
        var watch = etcd.watch(prefix: bytes("/tls/"), from: revision).makeAsyncIterator()
        try await etcd.put(bytes("/tls/b"), bytes("2"))
        #expect(try await events(2, from: &watch).map(\.keyValue.keyString) == ["/tls/a", "/tls/b"])
        #expect(try await etcd.range(prefix: bytes("/tls/")).keyValues.map(\.valueString) == ["1", "2"])
        await etcd.close()

        // Refused, and told what the TLS setup lacks.
        for (what, stranger, cause) in [("no certificate of its own", try client(certificate: false), "asks its clients for a certificate"),
                                        ("no CA to trust the member's", try client(ca: false, certificate: false), "not signed by a CA this client trusts")] {
            let refused = await #expect(throws: EtcdError.self, "\(what)") { try await stranger.range(bytes("/tls/a")) }
            #expect(refused?.description.contains("range /tls/a") == true && refused?.description.contains(cause) == true,
                    "\(what): \(String(describing: refused))")
            await stranger.close()
        }

        // Each file is read as the client is made (NIOSSL would read a CA file only at each
        // connection, with an error that names no file).
        for (ca, certificate, key, named) in [("ca.pem", "client.pem", "nowhere.key", "nowhere.key cannot be read"),
                                              ("nowhere.pem", nil, nil, "nowhere.pem cannot be read"),
                                              ("client.key", nil, nil, "client.key is not a CA certificate in PEM")] {
            var missing = EtcdClient.Settings(endpoints: cluster.clientURLs)
            (missing.caFile, missing.certificateFile, missing.keyFile) = (files.path(ca), certificate.map(files.path), key.map(files.path))
            let unreadable = #expect(throws: EtcdError.self) { try EtcdClient(settings: missing) }
            #expect(unreadable?.kind == .configuration && unreadable?.description.contains(named) == true, "\(String(describing: unreadable))")
        }
    }

    @Test("with authentication on: a client with the user's password is served, also once its token expired; one without is refused")
    func authentication() async throws {
        // Tokens that expire after a second unused.
        try await withEtcd(arguments: ["--auth-token-ttl", "1"]) { cluster, etcd in
            let etcdctl = URL(fileURLWithPath: "/usr/bin/etcdctl")
            let environment = ["ETCDCTL_API": "3"]
            let endpoint = ["--endpoints", cluster.clientURLs[0]]
            for arguments in [["user", "add", "root:s3cret-root"], ["user", "add", "app:s3cret-app"], ["role", "add", "app"],
                              ["role", "grant-permission", "app", "readwrite", "/app/", "--prefix=true"], ["user", "grant-role", "app", "app"],
                              ["auth", "enable"]] {
                let result = try await runCommand(etcdctl, endpoint + arguments, environment: environment)
                #expect(result.status == 0, "\(result)")
            }
            var settings = EtcdClient.Settings(endpoints: cluster.clientURLs)
            (settings.username, settings.password) = ("app", "s3cret-app")
            let app = try EtcdClient(settings: settings)
            #expect(try await app.put(bytes("/app/x"), bytes("1")) > 0)
            var watch = app.watch(prefix: bytes("/app/"), from: 1).makeAsyncIterator()
            #expect(try await events(1, from: &watch).first?.keyValue.keyString == "/app/x")
            // Past the token's life (time, which no event marks): the client asks for a new one.
            try await Task.sleep(for: .seconds(2.5))
            #expect(try await app.put(bytes("/app/y"), bytes("2")) > 0)
            #expect(try await events(1, from: &watch).first?.keyValue.keyString == "/app/y")
            let outside = await #expect(throws: EtcdError.self) { try await app.put(bytes("/other"), bytes("1")) }
            #expect(outside?.description.contains("permission denied") == true, "\(String(describing: outside))")
            await app.close()
            let anonymous = await #expect(throws: EtcdError.self) { try await etcd.range(bytes("/app/x")) }
            #expect(anonymous?.kind == .refused(code: 3) || anonymous?.kind == .refused(code: 16) || anonymous?.kind == .refused(code: 7),
                    "\(String(describing: anonymous))")
            settings.password = "wrong"
            let wrong = try EtcdClient(settings: settings)
            let refused = await #expect(throws: EtcdError.self) { try await wrong.range(bytes("/app/x")) }
            #expect(refused?.description.contains("authenticate as app") == true, "\(String(describing: refused))")
            await wrong.close()
        }
    }
}
