import Contracts
import CoreMetrics
public import Foundation
public import Logging
import OTel
public import ServiceLifecycle
public import SwitchboardConfig

/// `telemetry:`: OpenTelemetry export of the bus's spans, and the kernel's figures as metrics,
/// over OTLP/HTTP (protobuf). Off unless an endpoint is given, here or in the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) variable; the other `OTEL_*` variables swift-otel
/// reads apply too, and win over this section.
public struct TelemetrySettings: Sendable, Equatable {
    /// The collector's OTLP/HTTP base URL (`http://127.0.0.1:4318`); spans go to `/v1/traces`.
    public var endpoint: String?
    /// The share of new traces recorded, 0 to 1; a request's own trace decides for it.
    public var sampling = 1.0
    /// Resource attributes added to every span and metric (`deployment.environment: production`).
    public var resource: [String: String] = [:]
    /// For an https:// endpoint: the CA that signed the collector's certificate (else the
    /// system's roots), and this process's certificate and key for a collector that asks for one.
    public var caFile: String?
    public var certificateFile: String?
    public var keyFile: String?

    public init() {}

    public static let schema = ConfigSchema.values(["endpoint", "sampling", "resource", "ca_file", "cert_file", "key_file"])

    public init(reading telemetry: ConfigSection) throws(ConfigError) {
        if let endpoint = try telemetry.text("endpoint", Self.expectedEndpoint) {
            guard Self.isEndpoint(endpoint) else { throw telemetry.refuse("endpoint", expected: Self.expectedEndpoint) }
            self.endpoint = endpoint
        }
        (caFile, certificateFile, keyFile) = try telemetry.clientTLSFiles()
        // OTLP/HTTP takes TLS from the endpoint's scheme alone: files beside an http:// one
        // would be ignored in silence.
        if let endpoint, !endpoint.hasPrefix("https://"), let key = ["ca_file", "cert_file"].first(where: telemetry.has) {
            throw ConfigError(path: telemetry.path(key), problem: "applies to an https:// \(telemetry.path("endpoint")) only")
        }
        if let value = telemetry.values["sampling"] {
            guard let ratio = (value as? Double) ?? (value as? Int).map(Double.init), (0...1).contains(ratio) else {
                throw telemetry.refuse("sampling", expected: "a number from 0 to 1")
            }
            sampling = ratio
        }
        if let value = telemetry.values["resource"] {
            let mapping = try ConfigSection.mapping(value, telemetry.path("resource"))
            for (key, value) in mapping {
                guard let text = (value as? String) ?? (value as? Int).map(String.init) ?? (value as? Double).map({ "\($0)" }) ?? (value as? Bool).map({ "\($0)" }) else {
                    throw ConfigError(path: telemetry.path("resource.\(key)"), problem: "expected a string, number or true/false")
                }
                resource[key] = text
            }
        }
    }

    private static let expectedEndpoint = "an http:// or https:// URL such as http://127.0.0.1:4318"

    private static func isEndpoint(_ text: String) -> Bool {
        guard let url = URL(string: text) else { return false }
        return ["http", "https"].contains(url.scheme ?? "") && url.host != nil
    }

    /// The standard variables that name where spans go, either of which turns telemetry on;
    /// with the metrics' own, those that name where to export, which swift-otel takes over
    /// the configuration's endpoint.
    static let tracesEndpointVariables = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    static let endpointVariables = tracesEndpointVariables + ["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"]

    /// An endpoint variable that is not a URL is refused as a bad `endpoint` is: exported to,
    /// it would fail at every export with a message that names neither (`127.0.0.1:4318`,
    /// without its scheme, is the usual slip).
    public static func checkEnvironment(_ environment: [String: String] = ProcessInfo.processInfo.environment) throws(ConfigError) {
        for name in endpointVariables {
            guard let value = environment[name], !value.isEmpty, !isEndpoint(value) else { continue }
            throw ConfigError(path: name, problem: "expected \(expectedEndpoint), got \(ConfigSection.describe(value))")
        }
    }

    /// Whether telemetry is exported: an endpoint here or in the environment.
    public func isOn(environment: [String: String] = ProcessInfo.processInfo.environment) -> Bool {
        endpoint != nil || Self.tracesEndpointVariables.contains { !(environment[$0] ?? "").isEmpty }
    }
}

/// Starts a process's tracing: with telemetry on, an OpenTelemetry tracer whose exporter
/// runs as a service of the process's group (put it first: a group stops in reverse order,
/// so the exporter flushes the spans of the parts that stopped before it); otherwise the
/// trace context alone (``BusTracing/bootstrap()``).
public enum Telemetry {
    /// Bootstraps the process's instrumentation (once per process) and returns the exporters'
    /// services, none when telemetry is off. `serviceName` names the process in the traces
    /// and metrics (`switchboard-store`, `sb`); `metrics` also exports what the process
    /// records through swift-metrics (the kernel's figures). `diagnostics` logs what goes
    /// wrong exporting (a collector that cannot be reached), in the process's own log format;
    /// without it, text on stderr.
    public static func bootstrap(_ settings: TelemetrySettings, serviceName: String, metrics: Bool = false, diagnostics: Logger? = nil,
                                 environment: [String: String] = ProcessInfo.processInfo.environment) throws -> [any Service] {
        guard settings.isOn(environment: environment) else {
            BusTracing.bootstrap()
            return []
        }
        try TelemetrySettings.checkEnvironment(environment)
        var configuration = OTel.Configuration.default
        configuration.serviceName = serviceName
        // The build's version unless the deployment's resource names one of its own.
        configuration.resourceAttributes = settings.resource.merging(["service.version": SwitchboardVersion.current]) { named, _ in named }
        if let diagnostics { configuration.diagnosticLogger = .custom(diagnostics) }
        configuration.diagnosticLogLevel = .warning
        configuration.metrics.enabled = metrics
        configuration.metrics.exporter = .otlp
        configuration.metrics.otlpExporter.protocol = .httpProtobuf
        configuration.logs.enabled = false
        configuration.traces.enabled = true
        configuration.traces.exporter = .otlp
        configuration.traces.otlpExporter.protocol = .httpProtobuf
        if let endpoint = settings.endpoint {
            // The base URL's signal paths, as OTEL_EXPORTER_OTLP_ENDPOINT's are made.
            let base = endpoint.hasSuffix("/") ? endpoint : endpoint + "/"
            configuration.traces.otlpExporter.endpoint = base + "v1/traces"
            configuration.metrics.otlpExporter.endpoint = base + "v1/metrics"
        }
        for signal in [\OTel.Configuration.traces.otlpExporter, \.metrics.otlpExporter] {
            configuration[keyPath: signal].certificateFilePath = settings.caFile
            configuration[keyPath: signal].clientCertificateFilePath = settings.certificateFile
            configuration[keyPath: signal].clientKeyFilePath = settings.keyFile
        }
        configuration.traces.sampler = .parentBasedTraceIDRatio(ratio: settings.sampling) ?? .parentBasedAlwaysOn
        // Spans reach the collector within a second of ending, not the default five.
        configuration.traces.batchSpanProcessor.scheduleDelay = .seconds(1)
        // A collector that is down or slow holds up a process's exit (the last export, at
        // graceful shutdown) by a few seconds at most, not the default half minute: within
        // what `switchboard up` allows a piece to stop, and what `sb` should take to exit.
        // The HTTP request's own deadline comes first: a request that reaches its deadline
        // fails with the last reason a connection could not be made (refused, a certificate
        // not trusted), where one cut short by the export's limit says only that it timed out.
        let exportLimit = Duration.seconds(2)
        let requestLimit = Duration.milliseconds(1500)
        configuration.traces.batchSpanProcessor.exportTimeout = exportLimit
        configuration.traces.otlpExporter.timeout = requestLimit
        configuration.metrics.exportTimeout = exportLimit
        configuration.metrics.otlpExporter.timeout = requestLimit
        // Every exporter is made before the tracer is bootstrapped: an exporter's HTTP client
        // takes the process's tracer when it is made, and one made after would trace its own
        // exports, each a span for the next export to send.
        let tracing = try OTel.makeTracingBackend(configuration: configuration)
        let metering = metrics ? try OTel.makeMetricsBackend(configuration: configuration) : nil
        BusTracing.bootstrap(spansWith: tracing.factory)
        guard let metering else { return [tracing.service] }
        MetricsSystem.bootstrap(metering.factory)
        return [tracing.service, metering.service]
    }
}
