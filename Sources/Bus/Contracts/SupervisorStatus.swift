
/// What `switchboard up` says of each process it runs, in the kernel's state under
/// ``prefix`` (written with the supervisor's own key, read by `sb services` and the
/// gateway's `/readyz`).
public struct SupervisorStatus: Codable, Sendable, Equatable {
    public static let prefix = "/supervisor/pieces/"
    public static func key(_ piece: String) -> String { prefix + piece }

    public enum State: String, Codable, Sendable {
        /// Started (a service counts as up once its workers are registered).
        case running
        /// Exited; started again after `restartInSeconds`.
        case restarting
        /// Exited `restarts` times within the restart window (at least `supervisor.restart_limit`):
        /// still restarted, at the longest back-off, while the other processes keep serving.
        case failing
        /// A kernel drained it (`sb drain`) and it left: down until `sb restart` names it.
        case drained
    }

    public var name: String
    public var state: State
    public var pid: Int?
    /// Restarts within `supervisor.restart_window_seconds`.
    public var restarts: Int
    /// How it last ended ("exited with status 1", "killed by signal 4").
    public var lastExit: String?
    public var restartInSeconds: Double?

    public init(name: String, state: State, pid: Int? = nil, restarts: Int = 0, lastExit: String? = nil, restartInSeconds: Double? = nil) {
        (self.name, self.state, self.pid, self.restarts, self.lastExit, self.restartInSeconds) = (name, state, pid, restarts, lastExit, restartInSeconds)
    }

    /// In words, for `sb services`.
    public var summary: String {
        switch state {
        case .running: return "running" + (pid.map { " (pid \($0))" } ?? "")
        case .drained: return "drained and stopped (sb restart \(name) starts it again)"
        case .restarting, .failing:
            let next = restartInSeconds.map { " in \($0 < 1 ? String(format: "%.1f", $0) : String(Int($0.rounded()))) s" } ?? ""
            return "\(state == .failing ? "failing, " : "")restarting\(next) (\(restarts) exits lately\(lastExit.map { "; last \($0)" } ?? ""))"
        }
    }
}
