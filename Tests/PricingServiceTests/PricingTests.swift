import BusProtocol
import Catalog
import Contracts
import Foundation
@testable import PricingService
import SwitchboardTestSupport
import Testing

/// Flights in the source format, for datasets of a test's own.
func flightsFile(outbound: [(id: Int, from: String, to: String, price: String)], inbound: [(id: Int, from: String, to: String, price: String)]) -> Data {
    func list(_ flights: [(id: Int, from: String, to: String, price: String)]) -> String {
        flights.map { #"{"id":\#($0.id),"airline":"Transavia","departureAirportCode":"\#($0.from)","arrivalAirportCode":"\#($0.to)","price":\#($0.price)}"# }
            .joined(separator: ",")
    }
    return Data(#"{"data":{"outboundFlights":[\#(list(outbound))],"inboundFlights":[\#(list(inbound))]}}"#.utf8)
}

func flights(_ data: Data) throws -> [Flight] {
    guard case .flights(let flights) = try Dataset.flights.decode(data).content else { return [] }
    return flights
}

@Suite("pricing: quotes, the cheapest route, money and deals (in process)")
struct PricingTests {
    let pricing = PricingService()

    @Test("route.quote: a related pair is priced exactly; the fixtures' outbound 1 returns by 11, 12 or 15")
    func quotes() async throws {
        let quote = try await pricing.quote(.init(outboundId: 1, inboundId: 12))
        #expect(quote["total"] == ["amount": "45.00", "currency": "EUR"])
        #expect(quote["outbound"]?["price"]?["amount"] == "15.00" && quote["inbound"]?["price"]?["amount"] == "30.00")
        #expect(try await pricing.quote(.init(outboundId: 1, inboundId: 11))["total"]?["amount"] == "65.00")
        #expect(try await pricing.quote(.init(outboundId: 3, inboundId: 13))["total"]?["amount"] == "50.00")
    }

    @Test("route.quote: an unrelated pair is -32004 saying why; unknown ids are -32003 naming the field")
    func badQuotes() async throws {
        let unrelated = await rpcError { try await pricing.quote(.init(outboundId: 1, inboundId: 13)) }
        #expect(unrelated?.code == -32004 && unrelated?.data?["related"] == [11, 12, 15])
        #expect(unrelated?.message.contains("inbound 13 (AMS→GIR) does not fly the reverse of outbound 1 (BCN→AMS)") == true)
        let five = await rpcError { try await pricing.quote(.init(outboundId: 5, inboundId: 11)) }
        #expect(five?.code == -32004 && five?.message.contains("it has no related inbound flight") == true)
        let unknownOut = await rpcError { try await pricing.quote(.init(outboundId: 99, inboundId: 11)) }
        #expect(unknownOut?.code == -32003 && unknownOut?.data?["field"] == "outboundId")
        let unknownIn = await rpcError { try await pricing.quote(.init(outboundId: 1, inboundId: 99)) }
        #expect(unknownIn?.code == -32003 && unknownIn?.data?["field"] == "inboundId")
        let swapped = await rpcError { try await pricing.quote(.init(outboundId: 11, inboundId: 1)) }
        #expect(swapped?.code == -32003 && swapped?.message.contains("11 is an inbound flight") == true)
    }

    @Test("route.cheapest: outbound 1 with its cheapest related inbound (12 and 15 tie at 30: 12 by id), and the cheapest round trip")
    func cheapest() async throws {
        let answer = await pricing.cheapest()
        let first = try #require(answer["cheapestOutbound"])
        #expect(first["outbound"]?["id"] == 1 && first["inbound"]?["id"] == 12 && first["complete"] == true)
        #expect(first["total"] == ["amount": "45.00", "currency": "EUR"])
        #expect(answer["cheapestRoundTrip"]?["outbound"]?["id"] == 1 && answer["cheapestRoundTrip"]?["inbound"]?["id"] == 12)
    }

    @Test("route.cheapest: the cheapest outbound without a related inbound says so and has no total; ties go by id")
    func cheapestWithoutReturn() async throws {
        let pricing = PricingService()
        let data = flightsFile(outbound: [(7, "BCN", "ROT", "10"), (5, "BCN", "ROT", "10"), (2, "GIR", "AMS", "20"), (3, "GIR", "AMS", "20")],
                               inbound: [(14, "AMS", "GIR", "5"), (13, "AMS", "GIR", "5"), (20, "AMS", "GIR", "9")])
        await pricing.load(.flights(try flights(data)), version: "t1")
        let answer = await pricing.cheapest()
        let first = try #require(answer["cheapestOutbound"])
        #expect(first["outbound"]?["id"] == 5 && first["inbound"] == nil && first["total"] == nil && first["complete"] == false)
        #expect(first["message"]?.stringValue?.contains("outbound 5 (BCN→ROT) has no related inbound flight") == true)
        let trip = try #require(answer["cheapestRoundTrip"])
        #expect(trip["outbound"]?["id"] == 2 && trip["inbound"]?["id"] == 13 && trip["total"]?["amount"] == "25.00")
    }

    @Test("money: decimal arithmetic is exact (0.10 + 0.20 = 0.30), amounts are strings with two decimals")
    func money() throws {
        let tenth = try #require(Money("0.10", currency: "EUR"))
        let fifth = try #require(Money("0.20", currency: "EUR"))
        let sum = try #require(tenth.adding(fifth))
        #expect(sum == Money(amount: Decimal(string: "0.3")!, currency: "EUR") && sum.amountText == "0.30")
        var total = Money(amount: 0, currency: "EUR")
        for _ in 0..<10 { total = total.adding(Money("0.10", currency: "EUR")!)! }
        #expect(total.amountText == "1.00" && total.amount == 1)
        #expect(Money("15", currency: "EUR")?.amountText == "15.00")
        #expect(Money("1234567890123.455", currency: "EUR")?.amountText == "1234567890123.46")
        #expect(Money("-3.5", currency: "EUR")?.amountText == "-3.50")
        #expect(Money("0.10", currency: "EUR")?.adding(Money("1", currency: "USD")!) == nil)
        for bad in ["1e2", "1,5", ".", "", "-", "1.2.3", " 1", "0x10", "NaN"] { #expect(Money(bad, currency: "EUR") == nil, "\(bad)") }
        let encoded = try JSONValue(encoding: sum)
        #expect(encoded == ["amount": "0.30", "currency": "EUR"])
        #expect(try encoded.decode(as: Money.self) == sum)
    }

    @Test("deals.rollback: the same seed gives the same deal; messages are filled in")
    func rollback() async throws {
        let a = try await pricing.rollback(.init(seed: 42))
        #expect(try await pricing.rollback(.init(seed: 42)) == a)
        #expect(a["title"] == "Rollback Deal" && a["seed"] == 42 && a["country"]?["name"]?.stringValue != nil)
        var countries: Set<String> = []
        for seed in 0..<200 {
            let deal = try await pricing.rollback(.init(seed: Int64(seed)))
            let message = try #require(deal["message"]?.stringValue)
            #expect(!message.contains("{") && !message.contains("http") && message.contains(deal["country"]?["name"]?.stringValue ?? "?"))
            countries.insert(deal["country"]?["code"]?.stringValue ?? "")
        }
        #expect(countries.count > 50)
        // Without a seed: a random one, returned so the deal can be had again.
        let random = try await pricing.rollback(.init(seed: nil))
        let seed = try #require(random["seed"]?.intValue)
        #expect(try await pricing.rollback(.init(seed: seed)) == random)
        #expect(try await pricing.rollback(.init(seed: -7))["seed"] == -7)
    }

    @Test("deals.today: one deal per date, the same from any service; a bad date is -32602")
    func today() async throws {
        let day = try await pricing.today(.init(date: "2026-11-21"))
        #expect(day["title"] == "Deal of the Day!" && day["date"] == "2026-11-21")
        #expect(try await PricingService().today(.init(date: "2026-11-21")) == day)
        let now = try await pricing.today(.init(date: nil))
        #expect(now["date"] == .string(Day.text(Date())))
        for bad in ["2026-02-30", "2026-13-01", "26-11-21", "2026-11-21T00:00:00Z", "tomorrow", ""] {
            let error = await rpcError { try await pricing.today(.init(date: bad)) }
            #expect(error?.code == -32602 && error?.data?["field"] == "date", "\(bad)")
        }
        #expect(Day.parse("2028-02-29") == "2028-02-29")
        let untilMidnight = Day.untilNextDay(from: Date(timeIntervalSince1970: 1_795_219_200 - 1))
        #expect(untilMidnight == .seconds(1))
    }

    @Test("flags in messages are emoji made from the country code")
    func flagEmoji() {
        #expect(DealMaker.flagEmoji("MX") == "🇲🇽" && DealMaker.flagEmoji("nl") == "🇳🇱")
        #expect(DealMaker.flagEmoji("XYZ") == nil && DealMaker.flagEmoji("1A") == nil)
    }

    @Test("a country without a capital or currency gets a message that needs neither")
    func dealWithoutCapital() throws {
        let maker = DealMaker([Country(name: "Bouvet Island", capital: nil, code: "BV", region: "AN", regionName: nil, currency: nil,
                                       flag: nil, language: nil, demonym: nil)])
        for seed in 0..<50 {
            let deal = try #require(maker.deal(seed: UInt64(seed)))
            #expect(!deal.message.contains("{") && !deal.message.contains(", .") && deal.message.contains("Bouvet Island"))
        }
    }
}
