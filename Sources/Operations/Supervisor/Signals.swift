public import Dispatch
#if canImport(Glibc)
import Glibc
#endif

/// Signals handled by the program instead of their default action.
public enum Signals {
    /// From now on SIGINT and SIGTERM call `handler` with the signal's number (on a
    /// dispatch queue) instead of ending the process: what a process that started others
    /// does, so it can stop them first. Keep the sources; cancel them to stop.
    public static func forward(_ handler: @escaping @Sendable (Int32) -> Void) -> [any DispatchSourceSignal] {
        handle([SIGINT, SIGTERM], handler)
    }

    /// From now on each of `numbers` calls `handler` (on a dispatch queue) instead of its
    /// default action (SIGHUP's and SIGUSR2's is to end the process).
    public static func handle(_ numbers: [Int32], _ handler: @escaping @Sendable (Int32) -> Void) -> [any DispatchSourceSignal] {
        numbers.map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { handler(number) }
            source.resume()
            return source
        }
    }
}
