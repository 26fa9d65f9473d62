import BusProtocol
import Catalog
import Contracts
import Foundation

/// The countries app's deals: a country at a discount, with a message. The same seed gives
/// the same deal; the deal of the day takes its seed from the date, so everyone sees the
/// same one that day, whichever process answers.
struct DealMaker: Sendable {
    /// The countries in a fixed order (by code), so a seed means the same country whatever
    /// order the dataset lists them in.
    let countries: [Country]

    init(_ countries: [Country]) {
        self.countries = countries.sorted { $0.code < $1.code }
    }

    /// Discounts offered, in percent.
    static let discounts = [10, 15, 20, 25, 30, 35, 40, 50]

    /// Message templates: `{country}`, `{capital}`, `{discount}`, `{flag}`, `{currency}`.
    /// A template needing a capital or a currency is only used for a country that has one.
    static let templates = [
        "{discount}% rolled back on every trip to {country} this week. {flag}",
        "Prices in {country} just rolled back: save {discount}% on your next visit to {capital}.",
        "{flag} {country} is calling, and it is {discount}% cheaper than yesterday.",
        "Pack light, pay less: {discount}% off a city break in {capital}, {country}.",
        "This week only: {country} for {discount}% less. Pay in {currency}, smile in any language.",
        "We rolled the dice and it landed on {country}: {discount}% off, today and while it lasts.",
    ]

    struct Deal: Sendable {
        let country: Country
        let discount: Int
        let message: String
    }

    /// The deal for `seed`; nil when there are no countries.
    func deal(seed: UInt64) -> Deal? {
        guard !countries.isEmpty else { return nil }
        var generator = SeededGenerator(seed: seed)
        let country = countries[Int(generator.next() % UInt64(countries.count))]
        let discount = Self.discounts[Int(generator.next() % UInt64(Self.discounts.count))]
        let capital = country.capital.flatMap { $0.isEmpty ? nil : $0 }
        let currency = country.currency?.name ?? country.currency?.code
        let usable = Self.templates.filter { template in
            (capital != nil || !template.contains("{capital}")) && (currency != nil || !template.contains("{currency}"))
        }
        let template = usable[Int(generator.next() % UInt64(usable.count))]
        let message = template
            .replacingOccurrences(of: "{country}", with: country.name)
            .replacingOccurrences(of: "{capital}", with: capital ?? "")
            .replacingOccurrences(of: "{discount}", with: String(discount))
            .replacingOccurrences(of: "{currency}", with: currency ?? "")
            .replacingOccurrences(of: "{flag}", with: Self.flagEmoji(country.code) ?? "")
            .trimmingCharacters(in: .whitespaces)
        return Deal(country: country, discount: discount, message: message)
    }

    /// The flag as an emoji, from the ISO code's regional indicator symbols (`MX` → 🇲🇽);
    /// the dataset's `flag` is a link to a picture, not something to put in a sentence.
    static func flagEmoji(_ code: String) -> String? {
        let letters = code.uppercased().unicodeScalars
        guard letters.count == 2, letters.allSatisfy({ $0.value >= 65 && $0.value <= 90 }) else { return nil }
        var text = ""
        for letter in letters { text.unicodeScalars.append(Unicode.Scalar(0x1F1E6 + letter.value - 65)!) }
        return text
    }

    /// The seed of the deal of the day `date` (`YYYY-MM-DD`).
    static func seed(forDay date: String) -> UInt64 { SeededGenerator.seed(from: "deal-of-the-day:\(date)") }
}

extension DealMaker.Deal {
    /// As `deals.today` and `deals.rollback` answer it.
    func answer(title: String, seed: Int64? = nil, date: String? = nil) -> PricingAPI.Deal {
        PricingAPI.Deal(title: title, seed: seed, date: date,
                        country: PricingAPI.Deal.Country(name: country.name, code: country.code, capital: country.capital, flag: country.flag,
                                                         flagEmoji: DealMaker.flagEmoji(country.code), region: country.region),
                        discountPercent: discount, message: message)
    }
}

/// Calendar days in UTC, as `YYYY-MM-DD`.
enum Day {
    private static let calendar: Calendar = {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        return calendar
    }()

    static func text(_ date: Date) -> String {
        let parts = calendar.dateComponents([.year, .month, .day], from: date)
        return String(format: "%04d-%02d-%02d", parts.year!, parts.month!, parts.day!)
    }

    /// A valid calendar date written `YYYY-MM-DD` (so not `2026-02-30`), else nil.
    static func parse(_ text: String) -> String? {
        let parts = text.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0].count == 4, parts[1].count == 2, parts[2].count == 2,
              parts.allSatisfy({ $0.allSatisfy(\.isASCII) && $0.allSatisfy(\.isNumber) }),
              let year = Int(parts[0]), let month = Int(parts[1]), let day = Int(parts[2]),
              let date = calendar.date(from: DateComponents(year: year, month: month, day: day)),
              Self.text(date) == text else { return nil }
        return text
    }

    /// How long until the next midnight UTC.
    static func untilNextDay(from now: Date = Date()) -> Duration {
        let start = calendar.startOfDay(for: now)
        let next = calendar.date(byAdding: .day, value: 1, to: start)!
        return .milliseconds(Int64(max(1, next.timeIntervalSince(now) * 1_000)))
    }
}
