public import BusProtocol

/// One method of a service's contract: its service, name and one-line summary, with the
/// `Codable` types of its params and result. The service's method table, `sb` and every
/// service that calls it use this one value, so the name is written once.
public struct Method<Params: Codable & Sendable, Result: Codable & Sendable>: Sendable {
    public let service: String
    public let name: String
    public let summary: String
    /// Whether it changes state: a request sent again (after a failover, say) is then
    /// answered with the result it already had instead of running twice (``ExactlyOnce``).
    public let changesState: Bool

    public init(_ service: String, _ name: String, _ summary: String, changesState: Bool = false) {
        self.service = service
        self.name = name
        self.summary = summary
        self.changesState = changesState
    }

    /// Its entry in the service's `rpc.discover` document: the params by name, each with its
    /// schema, and the result's schema, all generated from the types.
    public var methodDescription: MethodDescription {
        let params = JSONSchema.of(Params.self)
        let properties = params["properties"]?.objectValue ?? [:]
        let required = Set((params["required"]?.arrayValue ?? []).compactMap(\.stringValue))
        return MethodDescription(
            name: name, summary: summary,
            params: properties.keys.sorted().map { ContentDescriptor(name: $0, required: required.contains($0), schema: properties[$0]!) },
            result: ContentDescriptor(name: "result", required: nil, schema: JSONSchema.of(Result.self)))
    }

    /// The same method with its result read as plain JSON, exactly as the service sent it
    /// (for printing and forwarding).
    public var json: Method<Params, JSONValue> { Method<Params, JSONValue>(service, name, summary, changesState: changesState) }

    /// The params' JSON text for a request (none for ``NoParams``).
    public func paramsText(_ params: Params) throws -> [UInt8]? {
        if params is NoParams { return nil }
        if let json = params as? JSONValue, json.isNull { return nil }
        return try encodeJSON(params)
    }
}

/// A method that can answer in parts (18/MDP PARTIALs, then a FINAL): `method` is its
/// one-reply form (name, params, the whole result), `Part` what each part carries. Asked
/// to stream, the service sends each part as it has it and ends with its result less the
/// parts; asked otherwise (7/MDP, a batch), it answers one reply: `gather` puts the parts
/// back into that result, so both forms give the same answer.
public struct StreamMethod<Params: Codable & Sendable, Part: Codable & Sendable, Result: Codable & Sendable>: Sendable {
    public let method: Method<Params, Result>
    public let gather: @Sendable (Result, [Part]) -> Result

    public init(_ method: Method<Params, Result>, part: Part.Type, gather: @escaping @Sendable (Result, [Part]) -> Result) {
        precondition(!method.changesState, "\(method.name): a method that changes state is answered once, not in parts")
        self.method = method
        self.gather = gather
    }

    public var service: String { method.service }
    public var name: String { method.name }

    /// The one-reply form's entry, with the part's schema (`x-part`).
    public var methodDescription: MethodDescription {
        var description = method.methodDescription
        description.part = ContentDescriptor(name: "part", required: nil, schema: JSONSchema.of(Part.self))
        return description
    }
}

/// For methods that take no params: accepts absent params, `{}` and `[]`.
public struct NoParams: Codable, Sendable, SchemaDescribed {
    public init() {}
    public static var jsonSchema: JSONValue { ["type": "object", "additionalProperties": false] }
    public static var schemaSample: NoParams { NoParams() }
}

extension Method where Params == NoParams, Result == ServiceDescription {
    /// `rpc.discover`, which every service and the kernel answer with their contract.
    public static func discover(_ service: String) -> Method {
        Method(service, "rpc.discover", "This service's methods, with their params and result as JSON Schema (OpenRPC document).")
    }
}

/// A service's contract as `rpc.discover` answers it: an OpenRPC 1.3.2 document whose schemas
/// are JSON Schema 2020-12, said in `x-jsonSchemaDialect` (OpenRPC's root allows only its
/// own fields and `x-` extensions).
public struct ServiceDescription: Codable, Sendable, Equatable {
    public struct Info: Codable, Sendable, Equatable {
        public var title: String
        public var version: String
    }
    public var openrpc = "1.3.2"
    public var info: Info
    public var jsonSchemaDialect = JSONSchema.dialect
    public var methods: [MethodDescription]

    enum CodingKeys: String, CodingKey {
        case openrpc, info, methods
        case jsonSchemaDialect = "x-jsonSchemaDialect"
    }

    public init(service: String, methods: [MethodDescription]) {
        info = Info(title: service, version: "1")
        self.methods = methods
    }
}

public struct MethodDescription: Codable, Sendable, Equatable {
    public var name: String
    public var summary: String
    public var paramStructure = "by-name"
    public var params: [ContentDescriptor]
    public var result: ContentDescriptor
    /// What each part carries, for a method that can answer in parts (OpenRPC extension `x-part`).
    public var part: ContentDescriptor?

    public init(name: String, summary: String, params: [ContentDescriptor], result: ContentDescriptor, part: ContentDescriptor? = nil) {
        self.name = name
        self.summary = summary
        self.params = params
        self.result = result
        self.part = part
    }

    enum CodingKeys: String, CodingKey {
        case name, summary, paramStructure, params, result
        case part = "x-part"
    }
}

/// OpenRPC's name for a named schema: one param, or the result.
public struct ContentDescriptor: Codable, Sendable, Equatable {
    public var name: String
    public var required: Bool?
    public var schema: JSONValue
}
