public import BusProtocol
public import Foundation

/// An amount of money: an exact decimal with its currency code (ISO 4217), never a binary
/// float. On the wire: `{"amount": "45.00", "currency": "EUR"}`, the amount a string with
/// two decimals.
public struct Money: Sendable, Hashable, Codable, CustomStringConvertible {
    public var amount: Decimal
    public var currency: String

    public init(amount: Decimal, currency: String) {
        self.amount = amount
        self.currency = currency
    }

    /// Parses a plain decimal such as `"0.10"` or `"15"`; nil for anything else
    /// (exponents, grouping, spaces, more than one point).
    public init?(_ text: String, currency: String) {
        var digits = 0
        var points = 0
        for (offset, character) in text.enumerated() {
            switch character {
            case "0"..."9": digits += 1
            case ".": points += 1
            case "-" where offset == 0: break
            default: return nil
            }
        }
        guard digits > 0, points <= 1, let amount = Decimal(string: text, locale: Locale(identifier: "en_US_POSIX")) else { return nil }
        self.init(amount: amount, currency: currency)
    }

    /// The amount rounded half-even to two decimals, as `"45.00"`.
    public var amountText: String {
        var value = amount
        var rounded = Decimal()
        NSDecimalRound(&rounded, &value, 2, .bankers)
        var text = NSDecimalNumber(decimal: rounded).stringValue
        if !text.contains(".") { text += "." }
        let decimals = text.count - 1 - text.distance(from: text.startIndex, to: text.firstIndex(of: ".")!)
        return text + String(repeating: "0", count: max(0, 2 - decimals))
    }

    public var description: String { "\(amountText) \(currency)" }

    /// The sum of two amounts in one currency; nil when the currencies differ.
    public func adding(_ other: Money) -> Money? {
        guard currency == other.currency else { return nil }
        return Money(amount: amount + other.amount, currency: currency)
    }

    /// The difference `self - other` in one currency; nil when the currencies differ.
    public func subtracting(_ other: Money) -> Money? {
        guard currency == other.currency else { return nil }
        return Money(amount: amount - other.amount, currency: currency)
    }

    enum CodingKeys: String, CodingKey { case amount, currency }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let currency = try container.decode(String.self, forKey: .currency)
        let text = try container.decode(String.self, forKey: .amount)
        guard let money = Money(text, currency: currency) else {
            throw DecodingError.dataCorruptedError(forKey: .amount, in: container, debugDescription: "not a decimal amount: \(text)")
        }
        self = money
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(amountText, forKey: .amount)
        try container.encode(currency, forKey: .currency)
    }
}

extension Money: SchemaDescribed {
    public static var jsonSchema: JSONValue {
        ["type": "object", "additionalProperties": false, "required": ["amount", "currency"],
         "properties": ["amount": ["type": "string", "pattern": "^-?[0-9]+(\\.[0-9]+)?$"], "currency": ["type": "string"]]]
    }
    public static var schemaSample: Money { Money(amount: 0, currency: "EUR") }
}
