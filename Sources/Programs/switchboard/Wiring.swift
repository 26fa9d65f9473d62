import Contracts
import FetcherService
import Foundation
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

extension ConfigFile {
    /// Makes the folder of each SQLite file `services` keep (the store's and the streams
    /// service's, unless on PostgreSQL) and checks no folder stands where the file should be:
    /// a place a service can never open its database in is refused at the start, naming its
    /// key, rather than answered -32007 at every request while the bus says it is up.
    func prepareDatabaseFolders(for services: [String]) throws(ConfigError) {
        var files: [(key: String, path: String)] = []
        if services.contains(StoreAPI.service) {
            let store = StoreConfiguration(self.store)
            if store.postgres == nil { files.append(("store.path", store.path)) }
        }
        if services.contains(StreamsAPI.service) {
            let streams = StreamsConfiguration(self.streams)
            if streams.postgres == nil { files.append(("streams.path", streams.path)) }
        }
        for file in files {
            do throws(StorageFailure) {
                try SQLiteWriter.checkPlace(for: file.path)
            } catch {
                let variable = ConfigFile.variable(for: file.key)
                throw ConfigError(path: file.key, problem: error.detail, variable: ProcessInfo.processInfo.environment[variable] == nil ? nil : variable)
            }
        }
    }
}

extension PostgresSettings {
    init(_ given: PostgresSection) {
        self.init(url: given.url)
        if let size = given.poolSize { poolSize = size }
        if let tls = given.tls.flatMap(TLSMode.init(rawValue:)) { self.tls = tls }
        caFile = given.caFile
        if let timeout = given.timeout { operationTimeout = timeout }
        operationTimeoutKey = given.timeoutKey
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
        if let count = settings.maxAckPending { maxAckPending = count }
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
