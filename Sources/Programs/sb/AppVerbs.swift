import ArgumentParser
import BusKit
import BusProtocol
import Contracts
import Foundation

// One verb per app, over the search, pricing, store and fetcher services. Each prints a
// table (or lines) for people and, with --json, the service's answer as one JSON line.

/// Runs a verb: the answer of `body` printed as it came with --json, else shown by `show`
/// from its contract's type. `asOperator`: the verb's --as-operator flag (nil: it has none).
func appVerb<Value>(_ connection: ConnectionOptions, _ output: OutputOptions, asOperator: Bool? = nil, _ body: (BusClient) async throws -> Answer<Value>,
                    show: (Value) -> Void) async throws {
    try await withClient(connection, asOperator: asOperator ?? false) { client in
        let answer: Answer<Value>
        do {
            answer = try await body(client)
        } catch let failure as Failure where asOperator == false && failure.error?.code == JSONRPCError.forbiddenCode {
            // A verb with --as-operator, refused for this client's key: the operator's may.
            throw Failure(status: failure.status,
                          message: failure.message + "\nNote: --as-operator sends it with the operator's key (operator.key in the key folder), which may.",
                          error: failure.error)
        }
        if output.json { Output.json(answer.json, compact: true) } else { show(answer.value) }
    }
}

// MARK: countries

struct Countries: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "countries",
        abstract: "The countries app: search countries, and its deals.",
        subcommands: [CountrySearch.self, CountryDeal.self],
        defaultSubcommand: CountrySearch.self
    )
}

struct CountrySearch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "search",
        abstract: "Countries whose name or capital matches (case and accents ignored), best matches first.",
        discussion: """
            Examples:
              sb countries                  every country, by name
              sb countries par              Paraguay, then France (Paris), ...
              sb countries --region EU --limit 10
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "Part of a name or capital; a two-letter code also matches.") var query: String?
    @Option(help: "A continent code (EU, AS, ...) or region name.") var region: String?
    @Option(parsing: .unconditional, help: "Countries shown (1 to 1000).") var limit = 250
    @Option(parsing: .unconditional, help: "Countries skipped first.") var offset = 0

    func validate() throws {
        try checkRange(limit, flag: "limit", field: "limit", of: SearchAPI.Countries.self)
        try checkRange(offset, flag: "offset", field: "offset", of: SearchAPI.Countries.self)
    }

    func run() async throws {
        let params = SearchAPI.Countries(query: query, region: region, offset: offset, limit: limit)
        try await appVerb(connection, output, { try await call($0, SearchAPI.countriesSearch, params) }) { answer in
            Output.table(["NAME", "CAPITAL", "CODE", "REGION", "CURRENCY"], answer.countries.map(\.country).map { country in
                [country.name, country.capital ?? "", country.code, country.regionName ?? country.region ?? "", country.currency?.code ?? ""]
            })
            Output.line(Output.styled("\(answer.countries.count) of \(answer.total)", .dim))
        }
    }
}

struct CountryDeal: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "deal",
        abstract: "The Deal of the Day! and a Rollback Deal (a random country at a discount).",
        discussion: """
            Examples:
              sb countries deal
              sb countries deal --seed 42       the same Rollback Deal every time
              sb countries deal --date 2026-12-24
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Option(parsing: .unconditional, help: "The Rollback Deal's seed (the same seed, the same deal).") var seed: Int64?
    @Option(help: "The day of the Deal of the Day (YYYY-MM-DD; default today, UTC).") var date: String?

    func run() async throws {
        try await appVerb(connection, output, { client in
            let today = try await call(client, PricingAPI.dealsToday, PricingAPI.Today(date: date))
            let rollback = try await call(client, PricingAPI.dealsRollback, PricingAPI.Rollback(seed: seed))
            return Answer(json: ["today": today.json, "rollback": rollback.json], value: (today: today.value, rollback: rollback.value))
        }) { deals in
            for deal in [deals.today, deals.rollback] {
                Output.line(Output.styled(deal.title, .bold) + "  " + deal.country.name + " (\(deal.country.code))" + "  -\(deal.discountPercent)%")
                Output.line("  " + deal.message)
            }
            Output.line(Output.styled("seed \(deals.rollback.seed.map(String.init) ?? "") (sb countries deal --seed N gives it again)", .dim))
        }
    }
}

// MARK: places

struct Places: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "places",
        abstract: "The places app: known places, opening one in Wikipedia, the search history.",
        subcommands: [PlaceSearch.self, PlaceOpen.self, PlaceHistory.self],
        defaultSubcommand: PlaceSearch.self
    )

    /// The query a place verb was given, as the words the parser left over, so that a
    /// coordinate south or west (-33.86) needs no `--` before it; nil when there are none.
    /// A word such as `--lanch` is still refused as the option sb does not know; a `--`
    /// (which every other verb needs before such a value) is taken as meant: what follows it
    /// is text, whatever it looks like.
    static func query(_ words: [String]) throws(ValidationError) -> String? {
        let options = words.prefix { $0 != "--" }
        if let option = options.first(where: { $0.hasPrefix("-") && !SB.isNegativeNumber($0) }) {
            throw ValidationError("Unknown option '\(option)'")
        }
        let text = options + words.drop { $0 != "--" }.dropFirst()
        return text.isEmpty ? nil : text.joined(separator: " ")
    }
}

struct PlaceSearch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "search",
        abstract: "Known places by name, or by distance from 'latitude, longitude'.",
        discussion: """
            Examples:
              sb places
              sb places amst
              sb places "40.4, -3.7"
              sb places -33.86, 151.21
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(parsing: .allUnrecognized, help: ArgumentHelp("A place name or coordinates.", valueName: "query")) var words: [String] = []

    func run() async throws {
        let query = try Places.query(words)
        try await appVerb(connection, output, { try await call($0, SearchAPI.locationsSearch, SearchAPI.Locations(query: query)) }) { answer in
            let byDistance = answer.kind == "coordinates"
            Output.table(["PLACE", "LATITUDE", "LONGITUDE"] + (byDistance ? ["KM"] : []), answer.places.map { place in
                [place.label, Output.number(place.latitude), Output.number(place.longitude)] + (byDistance ? [place.distanceKm.map(Output.number) ?? ""] : [])
            })
        }
    }
}

struct PlaceOpen: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "open",
        abstract: "Resolve a place (name or coordinates) and print its Wikipedia Places link; adds it to the history.",
        discussion: """
            Examples:
              sb places open Amsterdam
              sb places open "12.9716, 77.5946"
              sb places open 52.3547498,4.8339215 --launch     hands the link to xdg-open
              sb places open -33.86, 151.21
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(parsing: .allUnrecognized, help: ArgumentHelp("A place name or 'latitude, longitude'.", valueName: "query")) var words: [String] = []
    @Flag(help: "Open the link with xdg-open when it is installed.") var launch = false

    func validate() throws {
        guard try Places.query(words) != nil else { throw ValidationError("Missing expected argument '<query>'") }
    }

    func run() async throws {
        let query = try Places.query(words) ?? ""
        try await withClient(connection) { client in
            let answer = try await call(client, SearchAPI.locationsResolve, SearchAPI.Resolve(query: query))
            let place = answer.value
            if output.json {
                Output.json(answer.json, compact: true)
            } else {
                // A named place with its coordinates; an unnamed one is shown by them already.
                let name = place.name.map { Output.styled($0, .bold) + "  " } ?? ""
                Output.line(name + "\(Output.number(place.latitude)), \(Output.number(place.longitude))")
                if let nearest = place.nearest {
                    Output.line("  nearest known place: \(nearest.label), \(nearest.distanceKm.map(Output.number) ?? "") km")
                }
                Output.line("  " + Output.styled(place.deepLink, .cyan))
                Output.line("  " + place.webLink)
            }
            if !place.historyRecorded { Output.diagnostic("not added to the history: \(place.historyProblem ?? "")") }
            if launch { try Self.launch(place.deepLink) }
        }
    }

    /// Hands `link` to xdg-open; when there is none, says so (the link is printed anyway).
    static func launch(_ link: String) throws {
        guard let opener = ["/usr/bin/xdg-open", "/usr/local/bin/xdg-open"].first(where: FileManager.default.isExecutableFile(atPath:)) else {
            Output.diagnostic("--launch: xdg-open is not installed; open the link above yourself")
            return
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: opener)
        process.arguments = [link]
        try process.run()
        process.waitUntilExit()
    }
}

struct PlaceHistory: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "history",
        abstract: "The places searched for, most recent first; --clear empties it.",
        discussion: "Examples:\n  sb places history --json\n  sb places history --clear"
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Flag(help: "Empty the history, as the app's Clear button does, and say how many places it held.") var clear = false

    func run() async throws {
        if clear {
            return try await appVerb(connection, output, { try await call($0, StoreAPI.historyClear) }) { answer in
                Output.line("cleared the history of \(answer.cleared) place\(answer.cleared == 1 ? "" : "s")")
            }
        }
        try await appVerb(connection, output, { try await call($0, StoreAPI.historyList, StoreAPI.Limit()) }) { answer in
            Output.table(["SEARCHED", "AT"], answer.entries.map { [$0.text, $0.addedAt] })
        }
    }
}

// MARK: items

struct Items: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "items",
        abstract: "The hiring list: items with a name, grouped by list, sorted by name.",
        discussion: """
            Examples:
              sb items              as the apps sort: "Item 1", "Item 100", "Item 2"
              sb items --natural    numbers by value: "Item 1", "Item 2", "Item 100"
              sb items --list 2 --json
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Flag(help: "Natural order: numbers in names by value.") var natural = false
    @Option(name: .customLong("list"), parsing: .unconditional, help: "Only this listId.") var listId: Int?

    func run() async throws {
        let params = SearchAPI.Items(order: natural ? .natural : .lexical, listId: listId)
        try await appVerb(connection, output, { client in
            let answer = try await call(client, SearchAPI.itemsGrouped, params)
            // Nothing at all in the list asked for: say whether there is such a list.
            if let listId, answer.value.total == 0, answer.value.dropped == 0 {
                let lists = try await call(client, SearchAPI.itemsGrouped, SearchAPI.Items(order: .lexical, listId: nil)).value.groups.map(\.listId)
                if !lists.isEmpty, !lists.contains(listId) {
                    Output.diagnostic("no list \(listId) in the hiring list (its lists: \(lists.sorted().map(String.init).joined(separator: ", ")))")
                }
            }
            return answer
        }) { answer in
            for group in answer.groups {
                Output.line(Output.styled("List \(group.listId) (\(group.count) items)", .bold))
                for item in group.items {
                    Output.line("  \(item.name)" + Output.styled("  #\(item.id)", .dim))
                }
            }
            Output.line(Output.styled("\(answer.total) items\(listId.map { " in list \($0)" } ?? ""); \(answer.dropped) without a name left out", .dim))
        }
    }
}

// MARK: news

struct News: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "news",
        abstract: "The news app: sources and their selection, headlines, saved articles.",
        subcommands: [NewsSources.self, NewsHeadlines.self, NewsSave.self, NewsSaved.self, NewsDelete.self]
    )
}

struct NewsSources: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sources",
        abstract: "The news sources (English by default), marking the selected ones; --select chooses them.",
        discussion: """
            Examples:
              sb news sources
              sb news sources --select bbc-news reuters
              sb news sources --select reuters --revision 3
              sb news sources --language all --category technology

            With --revision, the choice is made only if nobody chose since that revision (sb request \
            store sources.selected shows it); else exit status 1 with error -32004.
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Option(parsing: .upToNextOption, help: "Select these source ids (replacing the selection).") var select: [String] = []
    @Option(parsing: .unconditional, help: "With --select: only if the selection is still at this revision (sb request store sources.selected shows it).") var revision: Int?
    @Option(help: "A two-letter language code, or 'all'.") var language: String?
    @Option(help: "A NewsAPI category (business, technology, ...).") var category: String?

    func validate() throws {
        if revision != nil, select.isEmpty { throw ValidationError("--revision goes with --select") }
    }

    /// Source ids the search service's sources do not hold, as sb says so.
    static func noSuch(_ ids: [String]) -> String {
        "no news source \(ids.map { "'\(Output.printable($0))'" }.joined(separator: ", ")) (sb news sources --language all lists them)"
    }

    func run() async throws {
        let params = SearchAPI.Sources(language: language, category: category)
        try await appVerb(connection, output, { client in
            if !select.isEmpty {
                // The store keeps whatever ids it is given, and the sources are the search
                // service's: an id that is no source is refused here, the selection unchanged
                // (kept, it would only make the headlines come back empty). No sources at all
                // (the dataset not in yet) tell nothing: the selection is made as asked.
                let known = Set(try await call(client, SearchAPI.sourcesList, SearchAPI.Sources(language: "all")).value.sources.map(\.source.id))
                let unknown = known.isEmpty ? [] : select.filter { !known.contains($0) }
                guard unknown.isEmpty else {
                    throw Failure(status: ExitStatus.serviceError, message: "\(NewsSources.noSuch(unknown)); the selection is unchanged")
                }
                _ = try await call(client, StoreAPI.sourcesSelect, StoreAPI.Sources(ids: select, revision: revision))
            }
            return try await call(client, SearchAPI.sourcesList, params)
        }) { answer in
            Output.table(["", "ID", "NAME", "CATEGORY", "LANGUAGE", "COUNTRY"], answer.sources.map { listed in
                let source = listed.source
                return [listed.selected ? Output.styled("*", .green) : " ", source.id, source.name, source.category ?? "", source.language ?? "",
                        source.country ?? ""]
            })
        }
    }
}

struct NewsHeadlines: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "headlines",
        abstract: "Headlines from the selected sources (or --source), newest first, a page at a time.",
        discussion: """
            Examples:
              sb news headlines
              sb news headlines --page 2
              sb news headlines --source bbc-news --source cnn --page-size 5
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Option(parsing: .unconditional, help: "The page, from 1.") var page = 1
    @Option(parsing: .unconditional, help: "Headlines per page (1 to 100).") var pageSize = 20
    @Option(name: .customLong("source"), help: "A source id instead of the selection (repeatable).") var sources: [String] = []

    func validate() throws {
        try checkRange(page, flag: "page", field: "page", of: SearchAPI.Headlines.self)
        try checkRange(pageSize, flag: "page-size", field: "pageSize", of: SearchAPI.Headlines.self)
    }

    func run() async throws {
        let params = SearchAPI.Headlines(sources: sources.isEmpty ? nil : sources, page: page, pageSize: pageSize)
        try await appVerb(connection, output, { try await call($0, SearchAPI.headlinesList, params) }) { answer in
            if !answer.unknownSources.isEmpty {
                Output.diagnostic(NewsSources.noSuch(answer.unknownSources))
            }
            guard answer.status == "ok" else {
                Output.line((answer.message ?? "") + (answer.status == "no-sources-selected" ? " (sb news sources --select ID...)" : ""))
                return
            }
            for article in answer.articles {
                Output.line(Output.styled(article.title, .bold))
                Output.line("  " + article.source.name + ", " + article.publishedAt + "  " + Output.styled(article.url, .cyan))
            }
            let more = answer.hasMore ? "; more: sb news headlines --page \(page + 1)" : ""
            Output.line(Output.styled("page \(page), \(answer.total) in all\(more)", .dim))
        }
    }
}

struct NewsSave: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "save",
        abstract: "Save an article by its URL (with its headline when it is one of the current headlines).",
        discussion: "Example:\n  sb news save https://www.reuters.com/some-article"
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The article's URL.") var url: String

    func run() async throws {
        try await appVerb(connection, output, { client in
            // The whole article when the headlines have it; else just its URL.
            var article: JSONValue = ["url": .string(url), "title": .string(url)]
            if let found = try? await findHeadline(client), let encoded = try? JSONValue(encoding: found) { article = encoded }
            return try await call(client, StoreAPI.articlesSave, StoreAPI.Article(article: article))
        }) { answer in
            Output.line("saved \(answer.url) (id \(answer.id))")
        }
    }

    func findHeadline(_ client: BusClient) async throws -> Article? {
        let sources = try await call(client, SearchAPI.sourcesList, SearchAPI.Sources(language: "all")).value
        let ids = sources.sources.map(\.source.id)
        var page = 1
        while page <= 50 {
            let answer = try await call(client, SearchAPI.headlinesList, SearchAPI.Headlines(sources: Array(ids.prefix(100)), page: page, pageSize: 100)).value
            if let article = answer.articles.first(where: { $0.url == url }) { return article }
            guard answer.hasMore else { return nil }
            page += 1
        }
        return nil
    }
}

struct NewsSaved: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "saved",
        abstract: "The saved articles, most recently saved first.",
        discussion: "Example:\n  sb news saved --json"
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        try await appVerb(connection, output, { try await call($0, StoreAPI.articlesList, StoreAPI.Page(limit: 1_000)) }) { answer in
            Output.table(["SAVED", "TITLE", "URL"], answer.articles.map { entry in
                [entry.savedAt, Output.cell(entry.article["title"]), entry.url]
            })
        }
    }
}

struct NewsDelete: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "delete",
        abstract: "Delete a saved article by its URL.",
        discussion: "Example:\n  sb news delete https://www.reuters.com/some-article"
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "The article's URL.") var url: String

    func run() async throws {
        try await appVerb(connection, output, { try await call($0, StoreAPI.articlesDelete, StoreAPI.URL(url: url)) }) { answer in
            Output.line(answer.deleted ? "deleted \(url)" : "not saved: \(url)")
        }
    }
}

// MARK: flights

struct Flights: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "flights",
        abstract: "The flights app: flights with their airlines, the current route, its prices over time, the cheapest route.",
        subcommands: [FlightList.self, FlightRoute.self, FlightHistory.self, FlightCheapest.self],
        defaultSubcommand: FlightList.self
    )
}

struct FlightList: AsyncParsableCommand, TakesNoWord {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "Outbound and inbound flights, each with its airline and price.",
        discussion: "Examples:\n  sb flights\n  sb flights --inbound --json"
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @OptionGroup var otherVerb: NoOtherVerb<Flights>
    @Flag(help: "Outbound flights only.") var outbound = false
    @Flag(help: "Inbound flights only.") var inbound = false

    func validate() throws {
        if outbound && inbound { throw ValidationError("give --outbound or --inbound, not both") }
    }

    func run() async throws {
        let params = SearchAPI.Flights(direction: outbound ? .outbound : inbound ? .inbound : nil)
        try await appVerb(connection, output, { try await call($0, SearchAPI.flightsList, params) }) { answer in
            let flights = (answer.outbound ?? []) + (answer.inbound ?? [])
            Output.table(["ID", "DIRECTION", "FROM", "TO", "AIRLINE", "PRICE"], flights.map { flight in
                ["\(flight.id)", flight.direction.rawValue, flight.departureAirportCode, flight.arrivalAirportCode,
                 flight.airline?.name ?? flight.airlineId, flight.price.description]
            })
            if !answer.unknownAirlines.isEmpty {
                Output.diagnostic("airlines not in the airlines dataset: \(answer.unknownAirlines.joined(separator: ", "))")
            }
        }
    }
}

/// A route (outbound, inbound, total) as lines.
func showRoute(title: String, outbound: PricingAPI.PricedFlight?, inbound: PricingAPI.PricedFlight?, total: Money?, message: String? = nil) {
    Output.line(Output.styled(title, .bold) + (total.map { "  \($0)" } ?? ""))
    for (leg, flight) in [("outbound", outbound), ("inbound", inbound)] {
        guard let flight else { continue }
        Output.line("  \(leg) \(flight.id): \(flight.departureAirportCode)→\(flight.arrivalAirportCode), \(flight.airline), \(flight.price)")
    }
    if let message { Output.line("  " + Output.styled(message, .yellow)) }
}

struct FlightRoute: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "route",
        abstract: "The current route with its price; --select OUT [IN] chooses another (kept across restarts).",
        discussion: """
            Examples:
              sb flights route
              sb flights route --select 3 14
              sb flights route --select 5          an outbound flight alone
              sb flights route --select 3 14 --revision 7

            With --revision, the route is chosen only if nobody chose since that revision; else \
            exit status 1 with error -32004 and the route that won.
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Option(parsing: .upToNextOption, help: ArgumentHelp("Choose the route: an outbound id, then optionally an inbound id.", valueName: "id"))
    var select: [Int] = []
    @Option(parsing: .unconditional, help: "With --select: only if the route is still at this revision (sb flights route --json shows it).") var revision: Int?

    func validate() throws {
        if select.count > 2 { throw ValidationError("--select takes an outbound id and at most one inbound id") }
        if revision != nil, select.isEmpty { throw ValidationError("--revision goes with --select") }
    }

    func run() async throws {
        try await appVerb(connection, output, { client in
            guard let outbound = select.first else { return try await call(client, PricingAPI.routeCurrent) }
            return try await call(client, PricingAPI.routeSelect, PricingAPI.Select(outboundId: outbound, inboundId: select.count == 2 ? select[1] : nil, revision: revision))
        }) { answer in
            showRoute(title: "Current route (\(answer.status))", outbound: answer.outbound, inbound: answer.inbound, total: answer.total, message: answer.message)
        }
    }
}

struct FlightHistory: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "history",
        abstract: "The chosen route's prices over time, as the streams service keeps them (stream route-prices), oldest first.",
        discussion: """
            Each line is one price pricing published: when, the route, its total and the total \
            before (the line above's, where a restarted pricing no longer knew it). A price \
            published again unchanged (the kernel restarted without its state, or pricing \
            restarted and priced the route anew) is one line, as it is one price.

            Examples:
              sb flights history
              sb flights history --last 100 --json
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Option(parsing: .unconditional, help: "Read the stream's last this many messages (default 20, at most 1000).") var last = 20

    func validate() throws {
        try checkRange(last, flag: "last", field: "last", of: StreamsAPI.ReadMessages.self)
    }

    func run() async throws {
        let asked = StreamsAPI.ReadMessages(name: PricingAPI.routeHistoryStream, last: last, filter: PricingAPI.StateKeys.routeCurrent)
        try await withClient(connection) { client in
            let read: Answer<StreamsAPI.Messages>
            do {
                read = try await call(client, StreamsAPI.streamMessages, asked)
            } catch let failure as Failure where failure.error?.code == JSONRPCError.notFoundCode {
                throw Failure(status: failure.status, message: failure.message
                              + "\nThe route's prices are kept when the streams service captures /pricing/route/ into \(PricingAPI.routeHistoryStream) (streams.capture in Config/switchboard.yaml).")
            }
            if output.json {
                Output.json(read.json, compact: true)
                return
            }
            var rows: [[String]] = []
            // Pricing never deletes the route: a deletion is the kernel's state lost (a restart
            // without it). A value that says what the line above says, but for when it was
            // priced and what pricing remembered of the price before, is that price published
            // again (after the kernel or pricing restarted), not a new one.
            var shown: PricingAPI.CurrentRoute?
            for message in read.value.messages {
                let change = try? message.data.decode(as: StreamsAPI.StateChange.self)
                if let change, change.value == nil, change.valueBytes == nil { continue }
                guard let route = try? change?.value?.decode(as: PricingAPI.CurrentRoute.self) else {
                    rows.append([message.published, "-", "(not a route)", "", ""])
                    shown = nil
                    continue
                }
                var price = route
                (price.pricedAt, price.previousTotal, price.firstRun) = (nil, nil, nil)
                if price == shown { continue }
                let before = route.previousTotal ?? shown?.total
                shown = price
                let legs = [route.outbound, route.inbound].compactMap { $0.map { "\($0.id) \($0.departureAirportCode)→\($0.arrivalAirportCode)" } }
                rows.append([route.pricedAt ?? message.published, route.status, legs.joined(separator: ", "),
                             route.total?.description ?? "-", before?.description ?? "-"])
            }
            Output.table(["PRICED", "STATUS", "ROUTE", "TOTAL", "BEFORE"], rows)
        }
    }
}

struct FlightCheapest: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cheapest",
        abstract: "The cheapest outbound flight with its cheapest return, and the cheapest round trip.",
        discussion: "Example:\n  sb flights cheapest --json"
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        try await appVerb(connection, output, { try await call($0, PricingAPI.routeCheapest) }) { answer in
            if let first = answer.cheapestOutbound {
                showRoute(title: "Cheapest outbound and its cheapest return", outbound: first.outbound, inbound: first.inbound, total: first.total, message: first.message)
            }
            if let trip = answer.cheapestRoundTrip {
                showRoute(title: "Cheapest round trip", outbound: trip.outbound, inbound: trip.inbound, total: trip.total)
            }
        }
    }
}

// MARK: datasets

struct Datasets: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "datasets",
        abstract: "The fetcher's datasets: where each copy comes from; refresh them.",
        subcommands: [DatasetList.self, DatasetRefresh.self],
        defaultSubcommand: DatasetList.self
    )
}

func showDatasets(_ entries: [FetcherAPI.DatasetEntry]) {
    Output.table(["DATASET", "ORIGIN", "RECORDS", "VERSION", "FETCHED", "LAST ERROR"], entries.map { entry in
        let origin = entry.origin ?? ""
        return [entry.name, Output.styled(origin, origin == "remote" ? .green : .yellow), "\(entry.records)",
                entry.version ?? "", entry.fetchedAt ?? "", entry.lastError ?? ""]
    })
}

struct DatasetList: AsyncParsableCommand, TakesNoWord {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "Each dataset's origin (remote, cache, bundled), records, version and last error.",
        discussion: "Example:\n  sb datasets"
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @OptionGroup var otherVerb: NoOtherVerb<Datasets>

    func run() async throws {
        try await appVerb(connection, output, { try await call($0, FetcherAPI.datasetsList) }, show: showDatasets)
    }
}

struct DatasetRefresh: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "refresh",
        abstract: "Fetch a dataset (or all) from its source now, and show the outcome.",
        discussion: """
            A refresh can take a while (retries, slow sources): the timeout is at least 60 s.

            Examples:
              sb datasets refresh
              sb datasets refresh countries
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "A dataset (countries, locations, items, sources, headlines, flights, airlines).") var name: String?

    func run() async throws {
        let timeout = max(try connection.requestTimeout, .seconds(60))
        try await appVerb(connection, output, { client in
            // A bar on a terminal, moved on as each dataset's download ends (the parts of the reply).
            Output.progress("refreshing \(name ?? "every dataset")...")
            defer { Output.endProgress() }
            return try await stream(client, FetcherAPI.datasetsRefreshStream, FetcherAPI.Refresh(name: name), timeout: timeout) { step in
                Output.progress("\(Output.bar(Double(step.done) / Double(max(step.total, 1)))) \(step.done)/\(step.total)  \(step.name)\(step.lastError == nil ? "" : " (failed)")")
            }
        }, show: showDatasets)
    }
}
