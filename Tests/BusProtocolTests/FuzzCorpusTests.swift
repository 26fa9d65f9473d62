import BusProtocol
import Foundation
import FuzzTargets
import Testing
import ZeroMQ

/// The fuzzers' seed corpus and the inputs that once crashed a decoder, replayed through
/// the same targets `switchboard-fuzz` fuzzes (Scripts/fuzz): each must run without a crash.
@Suite("Fuzz corpus: seeds and regressions replayed through every fuzz target")
struct FuzzCorpusTests {
    static let folder = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fuzz")

    static func files(_ kind: String, _ target: FuzzTarget) -> [URL] {
        let url = folder.appendingPathComponent(kind).appendingPathComponent(target.rawValue)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: url.path)) ?? []
        return names.sorted().map { url.appendingPathComponent($0) }
    }

    @Test("the committed seeds are the ones the encoders make today", arguments: FuzzTarget.allCases)
    func seedsAreCurrent(target: FuzzTarget) throws {
        let committed = try Self.files("corpus", target).map { Array(try Data(contentsOf: $0)) }
        #expect(!committed.isEmpty)
        #expect(committed == target.seeds,
                "regenerate with: swift run switchboard-fuzz --target=\(target.rawValue) --write-seeds=Tests/Fuzz/corpus/\(target.rawValue)")
    }

    @Test("every seed and every past crash runs through its target", arguments: FuzzTarget.allCases)
    func replay(target: FuzzTarget) throws {
        for file in Self.files("corpus", target) + Self.files("regressions", target) {
            target.run(Array(try Data(contentsOf: file)))
        }
    }

    @Test("the frame layout of fuzz inputs round-trips")
    func frameLayout() {
        let message = MDP.request(service: "search", body: [Frame("{}")])
        #expect(FuzzFrames.message(from: FuzzFrames.bytes(of: message)) == message)
        #expect(FuzzFrames.message(from: []).count == 1)
        #expect(FuzzFrames.message(from: [11, 200, 1]).count == 2)
    }

    @Test("the MDP and CHP seeds are messages their decoders accept")
    func seedsDecode() {
        let mdp = FuzzTarget.mdp.seeds.map(FuzzFrames.message(from:))
        let accepted = mdp.filter { message in
            (try? MDP.decodeAtBroker(message)) != nil || (try? MDP.decodeAtWorker(message)) != nil || (try? MDP.decodeAtClient(message)) != nil
        }
        #expect(accepted.count == 9)
        let chp = FuzzTarget.chp.seeds.map(FuzzFrames.message(from:))
        let decoded = chp.filter { message in
            (try? CHP.decodeSnapshotRequest(message)) != nil || (try? CHP.decodeSnapshotReply(message)) != nil
                || (try? CHP.decodeUpdate(message)) != nil
        }
        #expect(decoded.count == chp.count)
    }
}
