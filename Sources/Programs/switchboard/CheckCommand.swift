import ArgumentParser
import Deployment
import Foundation
import Telemetry

struct CheckCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check",
        abstract: "Check a configuration file and the SWITCHBOARD_* variables without running anything.",
        discussion: """
            Exit status 0 and what the file sets up, or 78 and the first problem, naming its key, as \
            every other command would refuse it at its start. Files it names for values of its own \
            (a key file, a token file) are read; what the pieces open as they start (the key folder, \
            TLS files, databases, ports) is not, as such a file may be meant for another machine's. \
            With --cell, the file is read as switchboard up --cell reads it.

            Examples:
              switchboard check
              switchboard check --config /etc/switchboard/switchboard.yaml
              switchboard check --cell a --config Config/cells/cell-a.yaml
            """
    )

    @OptionGroup var configFile: ConfigFileOption
    @OptionGroup var cell: CellOption

    func run() throws {
        cell.apply()
        let file = try configFile.load()
        try configFile.checked { try file.security.checkKeysGivenByHand() }
        if file.telemetry.isOn() { try configFile.checked { try TelemetrySettings.checkEnvironment() } }
        print("\(configFile.path ?? "the defaults (no configuration file)"): fine")
        let kernel = file.kernel
        var state = "state in memory"
        if let etcd = kernel.stateEtcd { state = "state on etcd \(etcd.endpoints.joined(separator: ","))" }
        if let pair = file.pair { state += ", pair \(pair.configuration.role) with \(pair.peerBroker)" }
        if let cell = kernel.cell { state += ", cell \(cell.name)" }
        print("  kernel     \(kernel.brokerEndpoint), \(state)")
        let services = ConfigFile.serviceNames.compactMap { name in
            file.services[name].flatMap { $0.enabled ? "\(name) \($0.workers)" : nil }
        }
        print("  services   \(services.isEmpty ? "none" : services.joined(separator: ", ")) (workers)")
        print("  gateway    \(file.gateway.enabled ? "http://\(file.gateway.host):\(file.gateway.port)" : "off")")
        print("  telemetry  \(file.telemetry.endpoint ?? (file.telemetry.isOn() ? "from OTEL_EXPORTER_OTLP_*" : "off"))")
    }
}
