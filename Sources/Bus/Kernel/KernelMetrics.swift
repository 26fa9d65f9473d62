import CoreMetrics
import Contracts

/// The figures of `kernel stats` as swift-metrics instruments, for the metrics backend the
/// process bootstrapped (OpenTelemetry's, with telemetry on). Sampled once a second from the
/// same ``Kernel/statistics()`` that answers `stats`: a counter advances by what changed
/// since the last sample, a gauge takes the value. Nothing is sampled without a backend.
final class KernelMetrics {
    /// Whether a metrics backend is bootstrapped (otherwise there is no one to tell).
    static var isExporting: Bool { !(MetricsSystem.factory is NOOPMetricsHandler) }

    private var counters: [String: (counter: Counter, last: Int)] = [:]
    private var gauges: [String: Gauge] = [:]
    /// The instruments written in this sample: the others belong to services the kernel has
    /// forgotten and are destroyed, so names from the wire (bounded at any one time by
    /// `kernel.max_services`) do not pile up here or in the backend over time.
    private var touched: Set<String> = []

    func record(_ stats: KernelAPI.Stats) {
        touched.removeAll(keepingCapacity: true)
        defer { forgetUntouched() }
        for (name, service) in stats.services {
            let dimensions = [("service", name)]
            count("switchboard.requests", service.requests, dimensions)
            count("switchboard.replies", service.replies, dimensions)
            count("switchboard.errors", service.errors, dimensions)
            count("switchboard.unavailable", service.unavailable, dimensions)
            count("switchboard.redispatched", service.redispatched, dimensions)
            count("switchboard.outcome_unknown", service.outcomeUnknown, dimensions)
            count("switchboard.handler_died", service.handlerDied, dimensions)
            level("switchboard.queue_depth", Double(service.queued), dimensions)
            level("switchboard.workers", Double(service.workers), dimensions)
            level("switchboard.latency.mean_us", service.meanLatencyMicroseconds, dimensions)
            if let p50 = service.p50LatencyMicroseconds { level("switchboard.latency.p50_us", Double(p50), dimensions) }
            if let p99 = service.p99LatencyMicroseconds { level("switchboard.latency.p99_us", Double(p99), dimensions) }
        }
        count("switchboard.protocol_errors", stats.protocolErrors)
        count("switchboard.dropped_replies", stats.droppedReplies)
        count("switchboard.broken_streams", stats.brokenStreams)
        count("switchboard.cancelled_requests", stats.cancelledRequests ?? 0)
        level("switchboard.gathered_bytes", Double(stats.gatheredBytes))
        level("switchboard.streams_in_progress", Double(stats.streamsInProgress ?? 0))
        level("switchboard.gathers_in_progress", Double(stats.gathersInProgress ?? 0))
        count("switchboard.refused_connections", stats.security.refusedConnections)
        count("switchboard.refused_registrations", stats.security.refusedRegistrations)
        count("switchboard.refused_requests", stats.security.refusedRequests)
        count("switchboard.state.refused", stats.state.refusedForbidden, [("reason", "forbidden")])
        count("switchboard.state.refused", stats.state.refusedOverLimit, [("reason", "limit")])
        level("switchboard.queued_bytes", Double(stats.queuedBytes))
        level("switchboard.state.keys", Double(stats.state.keys))
        level("switchboard.state.bytes", Double(stats.state.bytes))
        level("switchboard.state.sequence", Double(stats.state.sequence))
        level("switchboard.uptime_seconds", stats.uptimeSeconds)
        count("switchboard.refused_for_open_files", stats.refusedForOpenFiles ?? 0)
        if let open = stats.openFiles, let limit = stats.maxOpenFiles {
            level("switchboard.open_files", Double(open))
            level("switchboard.max_open_files", Double(limit))
        }
    }

    private func forgetUntouched() {
        for (key, entry) in counters where !touched.contains(key) {
            entry.counter.destroy()
            counters[key] = nil
        }
        for (key, gauge) in gauges where !touched.contains(key) {
            gauge.destroy()
            gauges[key] = nil
        }
    }

    private func count(_ label: String, _ total: Int, _ dimensions: [(String, String)] = []) {
        let key = Self.key(label, dimensions)
        touched.insert(key)
        let (counter, last) = counters[key] ?? (Counter(label: label, dimensions: dimensions), 0)
        // A total only grows; a smaller one is a fresh start (the kernel restarted its count).
        let delta = total >= last ? total - last : total
        if delta > 0 { counter.increment(by: delta) }
        counters[key] = (counter, total)
    }

    private func level(_ label: String, _ value: Double, _ dimensions: [(String, String)] = []) {
        let key = Self.key(label, dimensions)
        touched.insert(key)
        let gauge = gauges[key] ?? Gauge(label: label, dimensions: dimensions)
        gauges[key] = gauge
        gauge.record(value)
    }

    private static func key(_ label: String, _ dimensions: [(String, String)]) -> String {
        ([label] + dimensions.map { "\($0.0)=\($0.1)" }).joined(separator: "|")
    }
}
