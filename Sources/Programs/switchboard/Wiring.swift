import FetcherService
import Storage
import StoreService
import StreamsService
import Deployment
import SwitchboardConfig

// The configuration file knows no service; here its settings become the services' own
// configurations, over their defaults.

extension StoreConfiguration {
    init(_ settings: StoreSettings) {
        self.init()
        if let path = settings.path { self.path = path }
        if let limit = settings.historyLimit { historyLimit = limit }
        if let bytes = settings.maxSizeBytes { maxSizeBytes = bytes }
        if let seconds = settings.rememberSeconds { replyWindow = .seconds(seconds) }
        postgres = settings.postgres.map(PostgresSettings.init)
    }
}

extension PostgresSettings {
    init(_ given: PostgresSection) {
        self.init(url: given.url)
        if let size = given.poolSize { poolSize = size }
        if let tls = given.tls.flatMap(TLSMode.init(rawValue:)) { self.tls = tls }
        caFile = given.caFile
        if let timeout = given.timeout { operationTimeout = timeout }
    }
}

extension StreamsConfiguration {
    init(_ settings: StreamsSettings) {
        self.init()
        if let path = settings.path { self.path = path }
        if let bytes = settings.maxSizeBytes { maxSizeBytes = bytes }
        if let seconds = settings.rememberSeconds { replyWindow = .seconds(seconds) }
        if let bytes = settings.maxMessageBytes { maxMessageBytes = bytes }
        if let count = settings.maxStreams { maxStreams = count }
        if let count = settings.maxConsumers { maxConsumers = count }
        if let count = settings.clientMaxStreams { clientMaxStreams = count }
        if let bytes = settings.clientMaxBytes { clientMaxBytes = bytes }
        if let count = settings.clientMaxConsumers { clientMaxConsumers = count }
        if let capture = settings.capture { self.capture = capture }
        postgres = settings.postgres.map(PostgresSettings.init)
    }
}

extension FetcherConfiguration {
    init(_ settings: FetcherSettings) {
        self = .defaults
        if let attempts = settings.attempts { self.attempts = attempts }
        for (dataset, given) in settings.sources {
            var source = sources[dataset] ?? Source(url: nil)
            if let url = given.url { source.url = url }
            if let interval = given.refreshInterval { source.refreshInterval = interval }
            if let timeout = given.timeout { source.timeout = timeout }
            if let bytes = given.maxBytes { source.maxBytes = bytes }
            if let headers = given.headers { source.headers = headers }
            sources[dataset] = source
        }
    }
}
