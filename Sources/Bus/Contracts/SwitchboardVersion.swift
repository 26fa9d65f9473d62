/// The version of this build of Switchboard: what `sb --version` and `switchboard --version`
/// print, what the kernel's `ping` answers (so an operator can tell which build a kernel on
/// another machine runs) and what the processes' telemetry names as `service.version`.
/// Raised with every release; docs/PROTOCOL.md says in which order to upgrade the pieces
/// when a release changes what crosses the wire.
public enum SwitchboardVersion {
    public static let current = "0.1.0"
}
