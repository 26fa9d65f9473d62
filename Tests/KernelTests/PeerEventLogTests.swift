@testable import Kernel
import SwitchboardTestSupport
import Testing
import ZeroMQ

@Suite("The lines peers cause, bounded in the kernel's log")
struct PeerEventLogTests {
    @Test("each line at most ten times in ten seconds, by its message; then one line says how many were left out, and the next ten are written")
    func bounded() {
        let lines = LogLines()
        let clock = ManualClock()
        let log = PeerEventLog(logger: lines.logger("test"), clock: clock)
        for index in 0..<25 { log.warning("refused an unknown CURVE key", metadata: ["key": "\(index)"]) }
        log.info("disconnecting peer")
        #expect(lines.lines.value.filter { $0.contains("refused an unknown CURVE key") }.count == 10)
        #expect(lines.lines.value.contains { $0.contains("disconnecting peer") }, "another message has its own count")
        clock.advance(.seconds(9))
        log.flush()
        #expect(lines.lines.value.count == 11, "nothing said before the interval is over")
        clock.advance(.seconds(1))
        log.flush()
        #expect(lines.lines.value.last?.hasPrefix(#"warning 15 more lines like "refused an unknown CURVE key" were left out in 10 s"#) == true,
                "\(lines.text)")
        log.warning("refused an unknown CURVE key", metadata: ["key": "new"])
        #expect(lines.lines.value.last?.contains("key=new") == true, "a new interval writes again")
    }

    @Test("an interval over when the next line comes says what it left out first, without waiting for the flush")
    func leftOutSaidByTheNextLine() {
        let lines = LogLines()
        let clock = ManualClock()
        let log = PeerEventLog(logger: lines.logger("test"), clock: clock)
        for _ in 0..<12 { log.info("disconnecting peer") }
        clock.advance(.seconds(11))
        log.info("disconnecting peer", metadata: ["reason": "later"])
        #expect(lines.lines.value.suffix(2) == [#"info 2 more lines like "disconnecting peer" were left out in 10 s leftOut=2"#, "info disconnecting peer reason=later"],
                "\(lines.text)")
    }
}
