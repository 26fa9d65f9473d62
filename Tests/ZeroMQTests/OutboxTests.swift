import Testing
import ZeroMQ

/// An encoding that writes its frames where the outbox keeps them.
private struct ThreeFrames: MessageEncoding {
    let frames: [Frame]
    func appendFrames(to target: inout [Frame]) { for frame in frames { target.append(frame) } }
}

@Suite("Outbox: messages written between sends, taken in batches")
struct OutboxTests {
    @Test("a batch holds every message written so far, in order; what is written while it is sent is the next batch; its room is reused")
    func batches() {
        var outbox = Outbox()
        #expect(outbox.takeBatch() == nil && outbox.isEmpty)
        outbox.send(Message([Frame("a"), Frame("1")]))
        outbox.send(ThreeFrames(frames: [Frame("b"), Frame("2"), Frame("3")]))
        var sent: [[Frame]] = []
        let first = outbox.takeBatch()
        #expect(outbox.isEmpty, "taking a batch empties the outbox")
        first?.forEach { frames in
            sent.append(Array(frames))
            // A failed send makes the broker write again while its batch goes out.
            if frames.first == Frame("a") { outbox.send(Message([Frame("c")])) }
        }
        #expect(sent == [[Frame("a"), Frame("1")], [Frame("b"), Frame("2"), Frame("3")]])
        // Not given back while the outbox holds the next batch: that one keeps its own arrays.
        outbox.reuse(first!)
        #expect(outbox.take().map(\.frames) == [[Frame("c")]])
        #expect(outbox.isEmpty)

        outbox.send(Message([Frame("d")]))
        let second = outbox.takeBatch()!
        outbox.reuse(second)
        #expect(outbox.isEmpty, "a batch given back is emptied")
        outbox.send(Message([Frame("e")]))
        #expect(outbox.take().map(\.frames) == [[Frame("e")]])
    }
}
