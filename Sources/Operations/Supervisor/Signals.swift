public import Dispatch
#if canImport(Glibc)
import Glibc
#endif

/// SIGINT and SIGTERM handled by the program instead of ending it: what a process that
/// started others does, so it can stop them first.
public enum Signals {
    /// From now on SIGINT and SIGTERM call `handler` with the signal's number (on a
    /// dispatch queue) instead of ending the process. Keep the sources; cancel them to stop.
    public static func forward(_ handler: @escaping @Sendable (Int32) -> Void) -> [any DispatchSourceSignal] {
        [SIGINT, SIGTERM].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { handler(number) }
            source.resume()
            return source
        }
    }
}
