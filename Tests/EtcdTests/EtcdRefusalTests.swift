import BusProtocol
import Etcd
@testable import Kernel
import Testing
import ZeroMQ

/// A compare-and-set etcd refused names the revision etcd found the key at; it is answered
/// only once the kernel's copy holds that change, so no read from the copy that follows the
/// answer shows an older one.
@Suite("a compare-and-set etcd refused: answered once the copy holds what etcd found")
struct EtcdRefusalTests {
    func link() throws -> EtcdStateLink {
        EtcdStateLink(client: try EtcdClient(endpoints: ["http://127.0.0.1:9"]), prefix: Array("/s".utf8), electionKey: Array("/s.active".utf8), lease: 1, leaseSeconds: 10,
                      granted: .now, elected: 1)
    }

    func refused(_ key: String) -> (EtcdStateLink.Pending, JSONRPCError) {
        (EtcdStateLink.Pending(write: DurableWrite(key: Frame(key), value: Frame("v"), ttl: nil, expected: 1_000, uuid: Frame(), owner: nil, kernelOwn: false),
                               done: nil),
         JSONRPCError(code: JSONRPCError.conflictCode, message: "conflict"))
    }

    @Test("at once when the copy holds the change; else when the watch applies it (a later change of the key too); a key gone, at its deletion")
    func waitsForTheCopy() throws {
        let link = try link(), key = Array("/s/k".utf8)
        let (pending, refusal) = refused("/k")
        link.refuse(pending, refusal, key: key, at: 7, held: 7)
        #expect(link.refusals.isEmpty, "the copy holds revision 7: answered at once")

        link.refuse(pending, refusal, key: key, at: 9, held: 7)
        #expect(link.refusals[key]?.count == 1, "the copy is at 7, etcd at 9: it waits")
        link.applied(Array("/s/other".utf8), revision: 9, sequence: 9_000)
        link.applied(key, revision: 8, sequence: 8_000)
        #expect(link.refusals[key]?.count == 1, "another key's change, or an older one of this key, does not answer it")
        link.applied(key, revision: 10, sequence: 10_000)
        #expect(link.refusals.isEmpty, "a change of the key at or after 9 answers it")

        link.refuse(pending, refusal, key: key, at: 0, held: 7)
        #expect(link.refusals[key]?.count == 1, "gone in etcd, held in the copy: it waits")
        link.applied(key, revision: 11, sequence: 11_000)
        #expect(link.refusals.isEmpty, "the deletion answers it")

        link.refuse(pending, refusal, key: key, at: 12, held: 7)
        link.failAll(JSONRPCError(code: JSONRPCError.notActiveCode, message: "stopping"))
        #expect(link.refusals.isEmpty, "a link that ends answers every refusal waiting")
    }
}
