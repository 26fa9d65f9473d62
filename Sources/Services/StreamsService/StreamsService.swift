public import BusKit
import BusProtocol
public import Contracts
import Foundation
public import Logging
public import ServiceLifecycle
import Storage

/// The `streams` service: durable streams of messages and the consumers that work through
/// them (``StreamsAPI``), in a SQLite file or a PostgreSQL database (``ServiceDatabase``): a
/// publish is answered once it is durable; a re-sent request with the result it had.
///
/// Several readers fetching from one consumer share its messages: a fetch hands each out to
/// one reader and keeps it pending until that reader acknowledges it or its ack deadline
/// passes. Times come from `now` (Unix seconds), which tests move by hand.
public actor StreamsService: BusService, ServiceWork {
    public static let name = StreamsAPI.service
    typealias API = StreamsAPI

    public nonisolated let configuration: StreamsConfiguration
    nonisolated let logger: Logger
    private let storage: ServiceDatabase
    private let now: @Sendable () -> Double
    /// The kernel whose state the capturing streams keep (``captureState(_:)``); nil: none is.
    private let client: BusClient?
    /// The capturing streams a child task of ``captureState(_:)`` follows, as it follows them;
    /// those found deleted or made again, whose followers are to end.
    var following: [String: StreamsDatabase.Capture] = [:]
    var stale: Set<String> = []
    /// On PostgreSQL (``gathered(_:in:alone:batch:)``), publishes that come while others are
    /// being written wait, and are written together: one transaction, each stream's row locked
    /// once, for all of them.
    private let publishes = GroupCommit<StreamsDatabase.Publication, API.Published>(maxBatch: StreamsDatabase.publicationsPerTransaction)
    /// Fetches and settlements likewise: one transaction for what came meanwhile, those of one
    /// consumer and kind in the same statements (``StreamsDatabase/write(_:_:mostPending:removingAtMost:now:)``).
    private let consumerWrites = GroupCommit<StreamsDatabase.ConsumerWrite, JSONValue>(maxBatch: StreamsDatabase.consumerWritesPerTransaction)
    /// Who waits for what in this process (``waitForWake(_:upTo:)``).
    private var waiting: [Wait: [UInt64: CheckedContinuation<Void, Never>]] = [:]
    private var nextWaiter: UInt64 = 0
    /// Its host drains (``draining()``): no fetch waits any more.
    private var isDraining = false
    /// Reads that wait now (``StreamsConfiguration/mostWaitingReads``), and how many began to.
    private var waitingReads = 0
    private var waitsBegun = Rounds()

    /// How often a waiting fetch looks again on its own (for other processes' publishes and
    /// ack deadlines that pass).
    static let lookAgain: Duration = .milliseconds(250)
    /// Bytes of data a fetch hands out when its reader says nothing, and what `consumer.next`
    /// gathers for a reader who asked without parts (always one message when one is ready).
    static let defaultFetchBytes = 1_048_576

    /// `client` reaches the kernel whose state streams may capture (none without it).
    public init(configuration: StreamsConfiguration, logger: Logger? = nil, client: BusClient? = nil, now: (@Sendable () -> Double)? = nil) {
        self.configuration = configuration
        self.now = now ?? { Date().timeIntervalSince1970 }
        self.client = client
        self.logger = logger ?? Logger(label: "switchboard.streams")
        storage = ServiceDatabase(path: configuration.path, label: "streams", maxSizeBytes: configuration.maxSizeBytes, postgres: configuration.postgres,
                                  schema: StreamsSchema.schema, replyWindow: configuration.replyWindow, logger: self.logger)
    }

    /// The service's work beside its requests: keeping the kernel's state in the streams that
    /// capture it, removing the messages of the streams deleted and those that reached their
    /// age in streams nobody uses, and giving back to the disk the room of the messages
    /// deleted and purged.
    public func work() async {
        await waitUntilReady()
        await withDiscardingTaskGroup { group in
            if let client { group.addTask { await self.captureState(client) } }
            group.addTask { await self.giveBackRoomWhenAsked() }
            group.addTask { await self.removeExpiredWhenDue() }
        }
    }

    /// Returns once the database can serve (on PostgreSQL, once it answers and its schema is
    /// in place); the host registers the service after this.
    public func waitUntilReady() async {
        await storage.waitUntilReady()
    }

    /// The parts of the process the database needs (PostgreSQL's connections): listed before
    /// the host, they run before the service can be ready and stop after its requests.
    public nonisolated var requiredParts: [any Service] { storage.parts }

    /// Every state-changing method writes named by its request (``write(request:_:)``).
    public nonisolated func makeReplyMemory() -> any ReplyMemory { RepliesCheckedByWrites() }

    public nonisolated func methods(_ table: inout MethodTable<StreamsService>) {
        table.on(API.streamAdd) { service, params in try await service.addStream(params) }
        table.on(API.streamUpdate) { service, params in try await service.updateStream(params) }
        table.on(API.streamInfo) { service, params in try await service.read { db in try StreamsDatabase.info(db, try StreamsDatabase.stream(db, params.name)) } }
        table.on(API.streamList) { service, _ in try await service.read { db in try StreamsDatabase.list(db) } }
        table.on(API.metrics) { service, _ in
            try await service.read { db in KernelAPI.Metrics(contentType: "text/plain; version=0.0.4", text: try StreamsDatabase.metrics(db)) }
        }
        table.on(API.streamMessages) { service, params in try await service.readMessages(params) }
        table.on(API.streamDelete) { service, params in
            let caller = CallerIdentity.current
            let removed = try await service.write { db, _ in try StreamsDatabase.deleteStream(db, params.name, by: caller) }
            await service.wakeAll(.streams)
            await service.giveBackRoom()
            return removed
        }
        table.on(API.streamPurge) { service, params in try await service.purge(params) }
        table.on(API.publish) { service, params in try await service.publish(params) }
        table.on(API.consumerAdd) { service, params in try await service.addConsumer(params) }
        table.on(API.consumerUpdate) { service, params in
            guard params.filter != nil || params.ackWait != nil || params.maxDeliver != nil || params.maxAckPending != nil else {
                throw JSONRPCError.invalidParams(field: "params", "give at least one setting to change: filter, ackWait, maxDeliver or maxAckPending")
            }
            if let filter = params.filter, !filter.isEmpty { try Check.subject(filter, field: "filter") }
            try service.checkPendingLimit(params.maxAckPending)
            let caller = CallerIdentity.current
            return try await service.write { db, _ in try StreamsDatabase.updateConsumer(db, params, by: caller) }
        }
        table.on(API.consumerInfo) { service, params in
            try await service.read { db in try StreamsDatabase.info(db, try StreamsDatabase.consumer(db, stream: params.stream, name: params.name)) }
        }
        table.on(API.consumerList) { service, params in try await service.read { db in try StreamsDatabase.consumers(db, stream: params.stream) } }
        table.on(API.consumerDelete) { service, params in
            let caller = CallerIdentity.current
            return try await service.write { db, _ in try StreamsDatabase.deleteConsumer(db, stream: params.stream, name: params.name, by: caller) }
        }
        table.on(API.fetch) { service, params in
            try await service.fetch(params.stream, params.consumer, batch: params.batch ?? 1, maxBytes: params.maxBytes ?? Self.defaultFetchBytes,
                                    waitingUntil: .now + .seconds(params.wait ?? 0), request: RequestKey.current?.description)
        }
        table.onStream(API.next) { service, params, parts in try await service.next(params, parts) }
        table.on(API.ack) { service, params in try await service.settle(params.stream, params.consumer, params.sequences, .ack) }
        table.on(API.nak) { service, params in try await service.settle(params.stream, params.consumer, params.sequences, .nak(delay: params.delay ?? 0)) }
        table.on(API.progress) { service, params in try await service.settle(params.stream, params.consumer, params.sequences, .progress) }
        table.on(API.term) { service, params in try await service.settle(params.stream, params.consumer, params.sequences, .term) }
    }

    // MARK: Streams

    func addStream(_ asked: API.StreamConfig) async throws -> API.StreamInfo {
        try Check.name(asked.name, field: "name")
        let subjects = try Check.subjects(asked.subjects)
        if asked.captureState == true, let other = subjects.first(where: { !$0.hasPrefix("/") }) {
            throw JSONRPCError.invalidParams(field: "subjects", "\(other) is not a prefix of the state's keys, which start with '/'")
        }
        let settings = StreamsDatabase.Settings(name: asked.name, subjects: subjects, retention: asked.retention ?? .limits,
                                                maxMessages: asked.maxMessages ?? configuration.defaultMaxMessages,
                                                maxBytes: asked.maxBytes ?? configuration.defaultMaxBytes, maxAge: asked.maxAge.flatMap(StreamsDatabase.ageLimit),
                                                duplicateWindow: asked.duplicateWindow ?? configuration.defaultDuplicateWindow,
                                                captureState: asked.captureState ?? false)
        if let answer = try await answered(API.StreamInfo.self) { return answer }
        // A stream of this name deleted a moment ago: what is left of its rows goes first, as
        // the new stream's sequences start again from 1; a transaction at a time, as the
        // service's own removal goes, however many millions are left. Looked for in a read:
        // an add of a name never deleted takes no turn among the writes for it.
        let deleted = try await read(StreamsDatabase.deletedStreams)
        for name in [settings.name, API.deadLetters(of: settings.name)] where deleted.contains(name) { try await removeDeleted(name) }
        let (most, caller, quota) = (configuration.maxStreams, CallerIdentity.current, configuration.clientQuota)
        let added = try await write { db, now in try StreamsDatabase.addStream(db, settings, atMost: most, by: caller, quota: quota, now: now) }
        if settings.captureState { wakeAll(.streams) }
        return added
    }

    func updateStream(_ asked: API.StreamSettings) async throws -> API.StreamInfo {
        guard asked.subjects != nil || asked.maxMessages != nil || asked.maxBytes != nil || asked.maxAge != nil || asked.duplicateWindow != nil else {
            throw JSONRPCError.invalidParams(field: "params", "give at least one setting to change: subjects, maxMessages, maxBytes, maxAge or duplicateWindow")
        }
        var asked = asked
        asked.subjects = try asked.subjects.map(Check.subjects)
        if let answer = try await answered(API.StreamInfo.self) { return answer }
        let (caller, quota) = (CallerIdentity.current, configuration.clientQuota)
        let limitsGiven = asked.maxMessages != nil || asked.maxBytes != nil || asked.maxAge != nil
        if limitsGiven {
            let removals: [StreamsDatabase.Removal] = try await write(request: nil) { [asked] db, now in
                try StreamsDatabase.updateAllButLowered(db, asked, by: caller, quota: quota, now: now)
            }
            _ = try await removeInSteps(removals)
        }
        let most = configuration.removedPerTransaction
        let updated: API.StreamInfo = try await write { [asked] db, now in
            try StreamsDatabase.updateStream(db, asked, by: caller, quota: quota, removingAtMost: most, now: now)
        }
        // Limits lowered remove what is past them, as a purge does: its room is given back.
        if limitsGiven { giveBackRoom() }
        return updated
    }

    /// Deletes the messages as ``StreamsDatabase/purged(_:_:by:)`` says, a transaction at a time.
    func purge(_ asked: API.Purge) async throws -> API.Removed {
        if let subject = asked.subject { try Check.subject(subject, field: "subject") }
        if let answer = try await answered(API.Removed.self) { return answer }
        let caller = CallerIdentity.current
        let removals: [StreamsDatabase.Removal] = try await write(request: nil) { db, _ in try StreamsDatabase.purged(db, asked, by: caller) }
        let removed = try await removeInSteps(removals)
        giveBackRoom()
        return try await write { _, _ in API.Removed(messages: removed) }
    }

    /// Removes what `removals` take, ``StreamsConfiguration/removedPerTransaction`` messages a
    /// transaction, the oldest first: other writes go on between them however many go, and
    /// none holds PostgreSQL's statements past their timeout. Returns how many went. Stopped
    /// between two (its process stopped), the oldest are gone and the rest stay: the same
    /// request sent again removes them.
    private func removeInSteps(_ removals: [StreamsDatabase.Removal]) async throws -> Int {
        let most = configuration.removedPerTransaction
        var removed = 0
        for removal in removals {
            var left: StreamsDatabase.Removal? = removal
            while let removal = left {
                let step: StreamsDatabase.RemovalStep = try await write(request: nil) { db, _ in try StreamsDatabase.removeSome(db, removal, atMost: most) }
                removed += step.removed
                left = step.left
            }
        }
        return removed
    }

    /// The answer given to the request being answered when it was sent before (none: nil): a
    /// write of several transactions, sent again once done, answers as it did instead of
    /// doing it again on what came since.
    private func answered<Answer: Decodable>(_ type: Answer.Type, request: String? = RequestKey.current?.description) async throws -> Answer? {
        guard let request, let remembered = try await storage.remembered(request) else { return nil }
        return try decodeResult(type, try JSONValue(parsing: remembered))
    }

    func readMessages(_ asked: API.ReadMessages) async throws -> API.Messages {
        guard asked.from == nil || asked.last == nil else { throw JSONRPCError.invalidParams(field: "last", "give from or last, not both") }
        if let filter = asked.filter { try Check.subject(filter, field: "filter") }
        let max = asked.max ?? asked.last ?? 100
        return try await read { db in try StreamsDatabase.messages(db, asked, max: max, maxBytes: Self.defaultFetchBytes) }
    }

    func publish(_ message: API.Publish) async throws -> API.Published {
        try Check.subject(message.subject, field: "subject")
        if let id = message.id, !(1...256).contains(id.utf8.count) { throw JSONRPCError.invalidParams(field: "id", "must be 1 to 256 bytes") }
        let data = message.data.jsonBytes
        guard data.count <= configuration.maxMessageBytes else {
            throw JSONRPCError(code: JSONRPCError.tooLargeCode,
                               message: "Too large: the message's data is \(data.count) bytes, over the service's max_message_bytes (\(configuration.maxMessageBytes))",
                               data: ["limit": .int(Int64(configuration.maxMessageBytes)), "bytes": .int(Int64(data.count))])
        }
        let publication = StreamsDatabase.Publication(subject: message.subject, data: data, id: message.id, request: RequestKey.current?.description)
        let published = try await gathered(publication, in: publishes, alone: { await self.writeAlone($0) }, batch: { await self.write($0) })
        if !published.duplicate { wakeAll(.message) }
        return published
    }

    // MARK: Consumers

    /// Refuses a consumer's `maxAckPending` over the service's most (`streams.max_ack_pending`).
    nonisolated func checkPendingLimit(_ asked: Int?) throws {
        guard let asked, asked > configuration.maxAckPending else { return }
        throw JSONRPCError(code: JSONRPCError.tooLargeCode,
                           message: "Too large: maxAckPending \(asked) is over the service's streams.max_ack_pending (\(configuration.maxAckPending)); leave it out (or 0) for that most",
                           data: ["limit": .int(Int64(configuration.maxAckPending)), "setting": "streams.max_ack_pending"])
    }

    func addConsumer(_ asked: API.ConsumerConfig) async throws -> API.ConsumerInfo {
        try Check.name(asked.name, field: "name")
        if let filter = asked.filter { try Check.subject(filter, field: "filter") }
        let starts = [asked.deliver != nil, asked.startSequence != nil, asked.startTime != nil].filter { $0 }.count
        guard starts <= 1 else { throw JSONRPCError.invalidParams(field: "deliver", "give at most one of deliver, startSequence and startTime") }
        if let time = asked.startTime, Timestamp.parse(time) == nil {
            throw JSONRPCError.invalidParams(field: "startTime", "must be an ISO 8601 time, such as 2026-11-28T09:30:00Z")
        }
        // 0 most pending is the service's, as if left out: the same consumer added again either way.
        try checkPendingLimit(asked.maxAckPending)
        var asked = asked
        asked.maxAckPending = asked.maxAckPending.flatMap(StreamsDatabase.pendingLimit)
        let config = try JSONValue(encoding: asked)
        let ackWait = asked.ackWait ?? configuration.defaultAckWait, maxDeliver = asked.maxDeliver ?? configuration.defaultMaxDeliver
        let (most, caller, quota) = (configuration.maxConsumers, CallerIdentity.current, configuration.clientQuota)
        return try await write { [asked] db, now in
            try StreamsDatabase.addConsumer(db, asked, config: config, ackWait: ackWait, maxDeliver: maxDeliver, atMost: most, by: caller, quota: quota, now: now)
        }
    }

    /// Hands out what is ready; with `wait`, looks again (at each publish in this process, and
    /// every ``lookAgain`` seconds) until something is, the wait is over, `wanted` says the
    /// messages are no longer (their reader left), or the host drains. Only the last look is
    /// a write (remembered for `request`, when named): the earlier ones only read. The wait is
    /// real time (`now` is the messages' time, which tests move by hand). A fetch that waits
    /// counts among the waiting reads while it does (refused past their most); `counted`: its
    /// caller, a `consumer.next`, already does.
    func fetch(_ stream: String, _ consumer: String, batch: Int, maxBytes: Int, waitingUntil waitEnds: ContinuousClock.Instant,
               request: String?, counted: Bool = false, while wanted: () -> Bool = { true }) async throws -> API.Fetched {
        // The write answers a fetch sent again with its first answer, but only after the wait:
        // one that would wait is looked up first, and answered at once.
        if ContinuousClock.now < waitEnds, let answer = try await answered(API.Fetched.self, request: request) { return answer }
        // Counted among the waiting reads once it waits (a `consumer.next` is, from its start).
        var waits = counted
        defer { if waits && !counted { endWaitingRead() } }
        while ContinuousClock.now < waitEnds {
            let (mostPending, most) = (configuration.maxAckPending, configuration.removedPerTransaction)
            let ready = try await read { [now] db in
                try StreamsDatabase.ready(db, stream: stream, consumer: consumer, mostPending: mostPending, removingAtMost: most, now: now())
            }
            if ready || Task.isCancelled || !wanted() || isDraining { break }
            if !waits {
                try startWaitingRead()
                waits = true
            }
            await waitForWake(.message, upTo: min(Self.lookAgain, waitEnds - ContinuousClock.now))
        }
        return try await writeWithOthers(.init(stream: stream, consumer: consumer, kind: .fetch(.init(batch: batch, maxBytes: maxBytes)), request: request))
    }

    /// Hands out messages as the consumer has them, each as a part, until `max` or `expires`.
    /// Not named by its request: a reader that asks again after a failover gets what is
    /// ready then, and what the lost stream had handed out comes back after its ack wait.
    /// Asked without parts, the messages are gathered into one reply: it ends once they hold
    /// ``defaultFetchBytes`` of data, as a fetch does, so the reader's `max` cannot grow it.
    func next(_ asked: API.Next, _ parts: Parts<API.Message>) async throws -> API.NextEnd {
        let max = asked.max ?? API.Next.defaultMax
        let ends = ContinuousClock.now + .seconds(asked.expires ?? API.Next.defaultExpires)
        // It holds its place for its whole life, waiting between messages.
        try startWaitingRead()
        defer { endWaitingRead() }
        var count = 0, missed = 0, gathered = 0
        // Until its reader leaves, too: one gone between messages (its client cancelled or hung
        // up) frees this worker's place within a look rather than at `expires`.
        // And until this worker drains: its reader then asks again, of another worker.
        while count < max, ContinuousClock.now < ends, !Task.isCancelled, !isDraining, parts.isRead, parts.areStreamed || gathered < Self.defaultFetchBytes {
            let bytes = parts.areStreamed ? Self.defaultFetchBytes : Self.defaultFetchBytes - gathered
            let fetched = try await fetch(asked.stream, asked.consumer, batch: min(100, max - count), maxBytes: bytes, waitingUntil: ends, request: nil,
                                          counted: true, while: { parts.isRead })
            missed += fetched.missed
            for (index, message) in fetched.messages.enumerated() {
                do {
                    try await parts.send(message)
                } catch {
                    // The reader's stream ended (it left, or stopped reading): what it was not
                    // sent goes to the group's other readers at once, not after the ack wait.
                    _ = try? await settle(asked.stream, asked.consumer, fetched.messages[index...].map(\.sequence), .undelivered, request: nil)
                    throw error
                }
                count += 1
                if !parts.areStreamed { gathered += message.data.jsonBytes.count }
            }
        }
        return API.NextEnd(messages: [], count: count, missed: missed)
    }

    /// `request`: the request the result is kept under (by default the one being answered).
    func settle(_ stream: String, _ consumer: String, _ sequences: [Int], _ outcome: StreamsDatabase.Outcome,
                request: String? = RequestKey.current?.description) async throws -> API.Acknowledged {
        guard (1...API.Sequences.most).contains(sequences.count) else {
            throw JSONRPCError.invalidParams(field: "sequences", "must hold 1 to \(API.Sequences.most) sequences")
        }
        guard sequences.allSatisfy({ $0 >= 1 }) else { throw JSONRPCError.invalidParams(field: "sequences", "must be sequences, 1 or more") }
        return try await writeWithOthers(.init(stream: stream, consumer: consumer, kind: .settle(sequences: sequences, outcome), request: request))
    }

    // MARK: Waiting

    /// Counts a read that waits, or refuses it (`-32001`, to be asked again later) when
    /// ``StreamsConfiguration/mostWaitingReads`` already do: the places they hold are the
    /// host's, which publishes and acknowledgements need too.
    private func startWaitingRead() throws {
        if let most = configuration.mostWaitingReads, waitingReads >= most {
            throw JSONRPCError(code: JSONRPCError.serviceUnavailableCode,
                               message: "Service unavailable: this streams worker has \(most) reads waiting for messages, its most, so that publishes and acknowledgements keep places; ask again later, or give the streams service more places (services.streams.workers or window)",
                               data: ["limit": .int(Int64(most)), "retryAfterSeconds": .int(1)])
        }
        waitingReads += 1
        waitsBegun.ended()
    }

    private func endWaitingRead() { waitingReads -= 1 }

    /// Returns once `times` reads have begun to wait since the service started (each then
    /// holds its place).
    func readsBeganWaiting(_ times: Int) async {
        await withCheckedContinuation { waitsBegun.resume($0, at: times) }
    }

    /// What a task of this process may wait for, woken by what happens in this process (what
    /// other processes do is seen at the waiter's next look).
    enum Wait {
        /// Fetches waiting for a message: woken by a publish (or a captured change).
        case message
        /// The captures' coordinator between its looks, and each follower watching for word
        /// that its stream is gone: woken by a stream added or deleted, and by the coordinator.
        case streams
    }

    /// Waits until woken (``wakeAll(_:)``) or `duration` has passed.
    func waitForWake(_ wait: Wait, upTo duration: Duration) async {
        guard duration > .zero else { return }
        let waiter = nextWaiter
        nextWaiter += 1
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                try? await Task.sleep(for: duration)
                await self.wake(waiter, wait)
            }
            await withCheckedContinuation { waiting[wait, default: [:]][waiter] = $0 }
            group.cancelAll()
        }
    }

    private func wake(_ waiter: UInt64, _ wait: Wait) {
        waiting[wait]?.removeValue(forKey: waiter)?.resume()
    }

    /// Its host drains (a rolling restart, `sb drain`): the fetches and pushes that wait for
    /// a message answer with what they have now, and their readers ask again of the worker
    /// that takes over, rather than hold this one's drain until its timeout.
    public func draining() {
        isDraining = true
        wakeAll(.message)
    }

    func wakeAll(_ wait: Wait) {
        guard let waiters = waiting.removeValue(forKey: wait) else { return }
        for waiter in waiters.values { waiter.resume() }
    }

    // MARK: The database

    /// Asks the service's work to remove the messages of the streams deleted, and to give back
    /// to the disk the room that the messages of a stream deleted, purged or given lower limits
    /// took (``giveBackRoomWhenAsked()``): after the answer, as a large stream's may take
    /// seconds. An operator who does that expects the disk back, where the messages that limits
    /// remove as new ones come make room for them. Asks that come while it runs are done
    /// together after it.
    func giveBackRoom() {
        roomToGiveBack.continuation.yield()
    }

    private let roomToGiveBack = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    /// How many times the room was given back (``roomGivenBack(times:)``).
    private var roomGivenBack = Rounds()

    /// Part of the service's work: gives back the room when the service starts (a process
    /// stopped while it removed a deleted stream's messages leaves the rest to the next), and
    /// each time it is asked.
    private func giveBackRoomWhenAsked() async {
        var asks = roomToGiveBack.stream.makeAsyncIterator()
        repeat {
            await giveBackRoomNow()
            roomGivenBack.ended()
        } while await asks.next() != nil
    }

    /// Removes the deleted streams' messages, a transaction of ``StreamsConfiguration/removedPerTransaction``
    /// rows at a time so that other writes go on between them, then gives back the free pages.
    private func giveBackRoomNow() async {
        do {
            for name in try await read(StreamsDatabase.deletedStreams) { try await removeDeleted(name) }
            try await storage.giveBackFreePages()
        } catch is CancellationError {
            // The service stops: the next start removes the rest.
        } catch {
            logger.warning("could not remove deleted streams' messages, or give the disk back their room: the service's next delete, purge or start tries again",
                           metadata: ["problem": "\(error)"])
        }
    }

    /// Removes the rows of the deleted stream `name` (none: returns at once), a transaction of
    /// ``StreamsConfiguration/removedPerTransaction`` rows at a time so that other writes go
    /// on between them, and none holds PostgreSQL's statements past their timeout. Cancelled,
    /// it throws between two; the rest stay listed for the next removal.
    private func removeDeleted(_ name: String) async throws {
        let most = configuration.removedPerTransaction
        var removed = StreamsDatabase.DeletedRowsRemoved()
        while let next: StreamsDatabase.DeletedRowsRemoved = try await write(request: nil, { [removed] db, _ in
            try StreamsDatabase.removeDeleted(db, name, atMost: most, after: removed)
        }) {
            removed = next
            try Task.checkCancellation()
        }
    }

    /// Returns once the room has been given back `times` times since the service started (the
    /// first when it started).
    func roomGivenBack(times: Int) async {
        guard !roomGivenBack.reached(times) else { return }
        await withCheckedContinuation { roomGivenBack.resume($0, at: times) }
    }

    /// How often the service looks for streams nobody uses whose messages reached their age
    /// (``removeExpiredWhenDue()``), and how late past it a message may be before it does:
    /// a stream in use removes them at each publish and fetch.
    static let lookForExpired: Duration = .seconds(1)
    /// How many times the service looked for them, and removed what it found.
    private var expiredRemoved = Rounds()

    /// Part of the service's work: removes the messages past their age from the streams nobody
    /// published to or fetched from since (those that were removed them then), and forgets the
    /// ids past the duplicate window of those nobody published to with ids, every
    /// ``lookForExpired``, ``StreamsConfiguration/removedPerTransaction`` messages (or ids) a
    /// transaction, so that a stream idle for long holds none past its age (`stream.info`,
    /// `stream.messages`) nor remembers ids past its window, and its next publish or fetch
    /// does not have all of them to remove.
    private func removeExpiredWhenDue() async {
        let (most, late) = (configuration.removedPerTransaction, Double(Self.lookForExpired.components.seconds))
        var failing = false
        while !Task.isCancelled {
            do {
                for expired in try await read({ [now] db in try StreamsDatabase.expired(db, now: now(), by: late) }) {
                    while try await write(request: nil, { db, now in try StreamsDatabase.removeExpired(db, expired, atMost: most, now: now) }) {
                        guard !Task.isCancelled else { return }
                    }
                }
                failing = false
            } catch {
                // Said once for a run of failed looks, which come each second (a database
                // that cannot be reached is said by the storage too).
                if !failing, !Task.isCancelled {
                    logger.warning("could not remove the messages past their age or forget the ids past their window: the service looks again each second", metadata: ["problem": "\(error)"])
                }
                failing = true
            }
            expiredRemoved.ended()
            try? await Task.sleep(for: Self.lookForExpired)
        }
    }

    /// Returns once the service has looked for messages past their age (and removed them) in a
    /// look that began after this was called.
    func lookedForExpired() async {
        let times = expiredRemoved.count + 2
        await withCheckedContinuation { expiredRemoved.resume($0, at: times) }
    }

    /// A write in the next committed batch, named by `request` (by default the request being
    /// answered, so a re-sent one gets this result), decoded as the contract's type.
    func write<Result: Codable & Sendable>(request: String? = RequestKey.current?.description,
                                                   _ body: @escaping @Sendable (StreamsDatabase.Database, Double) throws -> Result) async throws -> Result {
        let now = now
        let result = try await storage.write(request: request) { db in try JSONValue(encoding: try body(db, now())) }
        return try decodeResult(Result.self, result)
    }

    /// A fetch or settlement, named by its request.
    func writeWithOthers<Result: Codable & Sendable>(_ write: StreamsDatabase.ConsumerWrite) async throws -> Result {
        let result = try await gathered(write, in: consumerWrites, alone: { await self.writeAlone($0) }, batch: { await self.write($0) })
        return try decodeResult(Result.self, result)
    }

    func read<Result: Sendable>(_ body: @escaping @Sendable (StreamsDatabase.Database) throws -> Result) async throws -> Result {
        try await storage.read(body)
    }

    // MARK: Writes gathered

    /// `item`, written with those that came while others were being written (`batch`: one
    /// transaction for them) where the database's writer does not gather writes itself
    /// (PostgreSQL's); else `alone`, and the writer gathers it (SQLite's): a second gathering in
    /// front of the writer's would only add a wait.
    private func gathered<Item: Sendable, Outcome: Sendable>(_ item: Item, in group: GroupCommit<Item, Outcome>,
                                                             alone: (Item) async -> Result<Outcome, any Error>,
                                                             batch: ([Item]) async -> [Result<Outcome, any Error>]) async throws -> Outcome {
        guard !storage.gathersWrites else { return try await alone(item).get() }
        return try await group.submit(item, write: batch)
    }

    /// Writes that came together, in one transaction (`together`); alone, or when that fails as
    /// a whole (``ServiceDatabase/write(requests:_:)``), each in its own, side by side.
    private func written<Item: Sendable, Outcome: Sendable>(_ batch: [Item], what: String,
                                                            together: ([Item]) async throws -> [Result<Outcome, JSONRPCError>],
                                                            alone: @escaping @Sendable (Item) async -> Result<Outcome, any Error>) async
        -> [Result<Outcome, any Error>] {
        guard batch.count > 1 else { return [await alone(batch[0])] }
        do {
            return try await together(batch).map { $0.mapError { $0 } }
        } catch {
            logger.notice("\(what) written together failed as a whole: each is written alone", metadata: ["writes": "\(batch.count)", "problem": "\(error)"])
        }
        return await withTaskGroup(of: (Int, Result<Outcome, any Error>).self) { group in
            for (index, item) in batch.enumerated() {
                group.addTask { (index, await alone(item)) }
            }
            var outcomes: [Result<Outcome, any Error>?] = Array(repeating: nil, count: batch.count)
            for await (index, outcome) in group { outcomes[index] = outcome }
            return outcomes.map { $0! }
        }
    }

    /// Publishes that came together, in one transaction.
    func write(_ batch: [StreamsDatabase.Publication]) async -> [Result<API.Published, any Error>] {
        await written(batch, what: "publishes", together: { try await self.writeTogether($0) }, alone: { await self.writeAlone($0) })
    }

    /// `batch` in one transaction (``StreamsDatabase/publish(_:_:removingAtMost:now:)``), each
    /// named by its request; throws when the transaction fails as a whole.
    func writeTogether(_ batch: [StreamsDatabase.Publication]) async throws -> [Result<API.Published, JSONRPCError>] {
        let (now, most) = (now, configuration.removedPerTransaction)
        let outcomes = try await storage.write(requests: batch.map(\.request)) { db, todo in
            try StreamsDatabase.publish(db, todo.map { batch[$0] }, removingAtMost: most, now: now()).map { outcome in
                outcome.flatMap { published in Result { try JSONValue(encoding: published) }.mapError { JSONRPCError.internalError("\($0)") } }
            }
        }
        return outcomes.map { outcome in
            outcome.flatMap { result in Result { try decodeResult(API.Published.self, result) }.mapError { $0 as? JSONRPCError ?? .internalError("\($0)") } }
        }
    }

    /// A publish in a transaction of its own, named by its request as any write is: its outcome.
    private func writeAlone(_ publication: StreamsDatabase.Publication) async -> Result<API.Published, any Error> {
        let most = configuration.removedPerTransaction
        do {
            return .success(try await write(request: publication.request) { db, now in
                try StreamsDatabase.publish(db, [publication], removingAtMost: most, now: now)[0].get()
            })
        } catch {
            return .failure(error)
        }
    }

    /// Fetches and settlements that came together, in one transaction.
    func write(_ batch: [StreamsDatabase.ConsumerWrite]) async -> [Result<JSONValue, any Error>] {
        await written(batch, what: "fetches and settlements", together: { try await self.writeTogether($0) }, alone: { await self.writeAlone($0) })
    }

    /// `batch` in one transaction, each named by its request (``StreamsDatabase/write(_:_:mostPending:removingAtMost:now:)``:
    /// one naming a consumer that is not there refused alone); throws when the transaction fails
    /// as a whole, and nothing is written.
    func writeTogether(_ batch: [StreamsDatabase.ConsumerWrite]) async throws -> [Result<JSONValue, JSONRPCError>] {
        let (now, mostPending, most) = (now, configuration.maxAckPending, configuration.removedPerTransaction)
        return try await storage.write(requests: batch.map(\.request)) { db, todo in
            try StreamsDatabase.write(db, todo.map { batch[$0] }, mostPending: mostPending, removingAtMost: most, now: now())
        }
    }

    /// A fetch or settlement in a transaction of its own, named by its request: its outcome.
    private func writeAlone(_ write: StreamsDatabase.ConsumerWrite) async -> Result<JSONValue, any Error> {
        let (now, mostPending, most) = (now, configuration.maxAckPending, configuration.removedPerTransaction)
        do {
            return .success(try await storage.write(request: write.request) { db in
                try StreamsDatabase.write(db, [write], mostPending: mostPending, removingAtMost: most, now: now())[0].get()
            })
        } catch {
            return .failure(error)
        }
    }
}

/// How many times a loop of the service's work went round, and who waits for a count: what
/// lets a test wait for that work rather than poll for its effect.
private struct Rounds {
    private(set) var count = 0
    private var waiters: [(times: Int, waiter: CheckedContinuation<Void, Never>)] = []

    mutating func ended() {
        count += 1
        let done = waiters.filter { $0.times <= count }
        waiters.removeAll { $0.times <= count }
        for (_, waiter) in done { waiter.resume() }
    }

    func reached(_ times: Int) -> Bool { count >= times }

    /// Resumes `waiter` once `times` rounds have ended.
    mutating func resume(_ waiter: CheckedContinuation<Void, Never>, at times: Int) {
        if reached(times) { waiter.resume() } else { waiters.append((times, waiter)) }
    }
}

/// The shapes of names and subjects, checked before anything is written.
enum Check {
    /// Stream and consumer names: letters, digits, '-' and '_', 1 to 64 of them.
    static func name(_ name: String, field: String) throws {
        guard (1...64).contains(name.utf8.count), name.utf8.allSatisfy({ $0.isASCIILetterOrDigit || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_") }) else {
            throw JSONRPCError.invalidParams(field: field, "must be 1 to 64 letters, digits, '-' or '_'")
        }
    }

    /// A stream's subject prefixes, sorted, each once: 1 to 32 of them, each a subject, none
    /// the start of another (the shorter one holds both).
    static func subjects(_ asked: [String]) throws -> [String] {
        guard (1...32).contains(asked.count) else { throw JSONRPCError.invalidParams(field: "subjects", "must hold 1 to 32 subject prefixes") }
        for subject in asked { try Check.subject(subject, field: "subjects") }
        let subjects = Array(Set(asked)).sorted()
        for (index, prefix) in subjects.enumerated() {
            if let other = subjects[(index + 1)...].first(where: { $0.hasPrefix(prefix) }) {
                throw JSONRPCError.invalidParams(field: "subjects", "\(prefix) and \(other) overlap: give the shorter one only")
            }
        }
        return subjects
    }

    /// Subjects and their prefixes: 1 to 256 bytes of printable characters without spaces.
    static func subject(_ subject: String, field: String) throws {
        guard (1...256).contains(subject.utf8.count), subject.unicodeScalars.allSatisfy({ !$0.properties.isWhitespace && $0.value >= 0x20 && $0.value != 0x7F }) else {
            throw JSONRPCError.invalidParams(field: field, "must be 1 to 256 bytes without spaces or control characters")
        }
    }
}

extension UInt8 {
    fileprivate var isASCIILetterOrDigit: Bool {
        (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(self) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(self)
            || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(self)
    }
}
