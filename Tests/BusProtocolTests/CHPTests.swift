import Testing
import ZeroMQ
@testable import BusProtocol

@Suite("12/CHP codec")
struct CHPTests {
    @Test("ICANHAZ?, KVSYNC and KTHXBAI as the RFC says")
    func snapshot() throws {
        #expect(CHP.icanhaz(subtree: "/catalog/") == ["ICANHAZ?", "/catalog/"])
        let client = Frame("sub-1")
        #expect(try CHP.decodeSnapshotRequest(Message([client] + CHP.icanhaz(subtree: "").frames)) == (client, "", nil, false))
        let entry = KVEntry(key: "/catalog/countries", sequence: 258, value: "{\"n\":1}")
        let sync = CHP.kvsync(entry, to: client)
        #expect(sync.count == 6)
        #expect(sync[2].bytes == [0, 0, 0, 0, 0, 0, 1, 2])
        #expect(try CHP.decodeSnapshotReply(Message(Array(sync.frames.dropFirst()))) == .entry(entry))
        let done = CHP.kthxbai(sequence: 9, subtree: "/catalog/", to: client)
        #expect(done[1] == "KTHXBAI")
        #expect(try CHP.decodeSnapshotReply(Message(Array(done.frames.dropFirst()))) == .done(sequence: 9, subtree: "/catalog/", since: nil))
    }

    @Test("A resume: ICANHAZ? with the sequence the client is at, a KTHXBAI that says since (extensions plain CHP peers never see)")
    func resume() throws {
        let client = Frame("sub-1")
        let asked = CHP.icanhaz(subtree: "/client/", since: 258)
        #expect(asked.count == 3)
        #expect(asked[2].bytes == [0, 0, 0, 0, 0, 0, 1, 2])
        #expect(try CHP.decodeSnapshotRequest(Message([client] + asked.frames)) == (client, "/client/", 258, false))
        let changesOnly = CHP.icanhaz(subtree: "/client/", since: 258, changesOnly: true)
        #expect(changesOnly.count == 4 && changesOnly[3] == "changes-only")
        #expect(try CHP.decodeSnapshotRequest(Message([client] + changesOnly.frames)) == (client, "/client/", 258, true))
        let done = CHP.kthxbai(sequence: 300, subtree: "/client/", since: 258, to: client)
        #expect(done[4] == "since=258\n")
        #expect(try CHP.decodeSnapshotReply(Message(Array(done.frames.dropFirst()))) == .done(sequence: 300, subtree: "/client/", since: 258))
        #expect(throws: ProtocolError.self) { try CHP.decodeSnapshotRequest(["c", "ICANHAZ?", "/", "short"]) }
        #expect(throws: ProtocolError.self) { try CHP.decodeSnapshotRequest(["c", "ICANHAZ?", "/", Frame(CHP.sequenceFrame(1).bytes), "more"]) }
        #expect(throws: ProtocolError.self) {
            try CHP.decodeSnapshotReply(["KTHXBAI", CHP.sequenceFrame(1), Frame(), "since=soon\n", "/"])
        }
    }

    @Test("KVPUB and KVSET carry UUID and properties; HUGZ is recognised")
    func updates() throws {
        let uuid = (0..<16).map { UInt8($0) }
        let entry = KVEntry(key: "/client/x", sequence: 7, uuid: uuid, properties: [("ttl", "30"), ("origin", "cli")], value: "1")
        let message = CHP.kv(entry)
        #expect(message[3].string == "ttl=30\norigin=cli\n")
        #expect(try CHP.decodeUpdate(message) == .entry(entry))
        #expect(try CHP.decodeKVSet(message) == entry)
        #expect(try CHP.decodeKVSet(message).ttl == 30)
        // As the kernel's collector reads it: the same check, in place.
        #expect(try CHP.checkKVSet(PartsReader().read(message))?.seconds == 30)
        #expect(try CHP.decodeUpdate(CHP.hugz()) == .hugz(published: [:]))
        #expect(try CHP.decodeUpdate(CHP.hugz(published: ["/store/": 7, "": 9])) == .hugz(published: ["/store/": 7, "": 9]))
        #expect(CHP.hugz(published: ["/a/": 1])[4].string == #"{"published":{"/a/":1}}"#)
        #expect(throws: ProtocolError.self) { try CHP.decodeUpdate([Frame("HUGZ"), CHP.sequenceFrame(0), Frame(), Frame(), Frame("{\"published\":{\"/a/\":-1}}")]) }
        #expect(CHP.hugz().count == 5)
        let delete = KVEntry(key: "/client/x", value: Frame())
        #expect(try CHP.decodeKVSet(CHP.kv(delete)).isDelete)
    }

    @Test("malformed CHP commands give typed errors", arguments: [
        (["/k", Frame([0, 0, 0, 0, 0, 0, 0, 1]), "", ""] as Message, "expected 5"),
        (["/k", Frame([0, 1]), "", "", "v"], "sequence has 2 bytes"),
        (["", Frame([0, 0, 0, 0, 0, 0, 0, 1]), "", "", "v"], "key must be non-empty"),
        (["/k", Frame([0, 0, 0, 0, 0, 0, 0, 1]), "short-uuid", "", "v"], "UUID has 10 bytes"),
        (["/k", Frame([0, 0, 0, 0, 0, 0, 0, 1]), "", "no-equals-sign", "v"], "not name=value"),
        (["HUGZ", Frame([0, 0, 0, 0, 0, 0, 0, 0]), "", "", "v"], "reserved key"),
    ] as [(Message, String)])
    func malformedKVSet(message: Message, problem: String) throws {
        let error = #expect(throws: ProtocolError.self) { try CHP.decodeKVSet(message) }
        #expect(error?.problem.contains(problem) == true, "\(error?.problem ?? "-") should mention \(problem)")
        let parts = try PartsReader().read(message)
        #expect(throws: try #require(error)) { try CHP.checkKVSet(parts) }
    }

    @Test("ICANHAZ? with a bad subtree or shape is refused")
    func badSnapshotRequest() {
        #expect(throws: ProtocolError.self) { try CHP.decodeSnapshotRequest(["c", "ICANHAZ?", "catalog"]) }
        #expect(throws: ProtocolError.self) { try CHP.decodeSnapshotRequest(["c", "ICANHAZ?"]) }
        #expect(throws: ProtocolError.self) { try CHP.decodeSnapshotRequest(["c", "GIMME", "/"]) }
        #expect(CHP.isValidSubtree("/a/b/"))
        #expect(!CHP.isValidSubtree("/a/b"))
    }

    @Test("a ttl that is not a number is ignored, not fatal")
    func ttl() {
        #expect(KVEntry(key: "/k", properties: [("ttl", "soon")], value: "v").ttl == nil)
        #expect(KVEntry(key: "/k", properties: [("ttl", "-1")], value: "v").ttl == nil)
        #expect(KVEntry(key: "/k", properties: [("ttl", "0.5")], value: "v").ttl == 0.5)
    }
}
