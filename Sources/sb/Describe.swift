import ArgumentParser
import BusKit
import BusProtocol
import ContractKit
import Contracts

struct Describe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "describe",
        abstract: "What the services offer: their methods with params and results, from each service's rpc.discover.",
        discussion: """
            Every service (and the kernel) describes itself: an OpenRPC document whose params and
            results are JSON Schema (2020-12), generated from its contract.

            Examples:
              sb describe                          every method of every registered service
              sb describe pricing                  pricing's methods with their params and results
              sb describe pricing route.quote      one method: each param, and the result's schema
              sb describe store --json             the OpenRPC document
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "A service (default: every registered service and the kernel).") var service: String?
    @Argument(help: "One of its methods.") var method: String?

    func run() async throws {
        try await withClient(connection) { client in
            guard let service else { return try await describeAll(client) }
            let document = try await call(client, Method.discover(service))
            let description = try decodeResult(ServiceDescription.self, document)
            guard let method else {
                if output.json { return Output.json(document, compact: true) }
                return Output.table(["METHOD", "PARAMS", "RESULT", "SUMMARY"], description.methods.map { method in
                    [method.name, Self.params(method), Self.type(method.result.schema), method.summary]
                })
            }
            guard let found = description.methods.first(where: { $0.name == method }) else {
                throw Failure(status: ExitStatus.serviceError, message: "\(service) has no method \(method); it has \(description.methods.map(\.name).joined(separator: ", "))")
            }
            if output.json { return Output.json(try JSONValue(encoding: found), compact: true) }
            Output.line(Output.styled("\(service) \(found.name)", .bold) + "  " + found.summary)
            Output.table(["PARAM", "TYPE", "REQUIRED"], found.params.map { [$0.name, Self.type($0.schema), $0.required == true ? "yes" : "no"] })
            Output.line("result: " + Self.type(found.result.schema, depth: 4))
            Output.line(Output.styled("(the params' and result's JSON Schema: sb describe \(service) \(found.name) --json)", .dim))
        }
    }

    /// Every registered service's methods (the kernel's first), one table.
    private func describeAll(_ client: BusClient) async throws {
        let list = try await call(client, KernelAPI.servicesList)
        let names = [KernelAPI.service] + (list["services"]?.arrayValue ?? []).compactMap { $0["name"]?.stringValue }
        var documents: [String: JSONValue] = [:], rows: [[String]] = []
        for name in names {
            do {
                let document = try await client.call(Method.discover(name).json)
                let description = try decodeResult(ServiceDescription.self, document)
                documents[name] = document
                rows += description.methods.map { [name, $0.name, Self.params($0), $0.summary] }
            } catch {
                documents[name] = .null
                rows.append([name, "-", "-", Output.styled("no description: \(error)", .yellow)])
            }
        }
        if output.json { return Output.json(.object(documents), compact: true) }
        Output.table(["SERVICE", "METHOD", "PARAMS", "SUMMARY"], rows)
    }

    /// `outboundId: integer, inboundId?: integer`.
    static func params(_ method: MethodDescription) -> String {
        method.params.map { "\($0.name)\($0.required == true ? "" : "?"): \(type($0.schema))" }.joined(separator: ", ")
    }

    /// A schema in a few characters: `integer`, `[string]`, `any`, `"a"|"b"`, an object's
    /// fields (`{id: integer, name?: string}`) down to `depth` levels, `object` below.
    static func type(_ schema: JSONValue, depth: Int = 1) -> String {
        let type = { (inner: JSONValue) in Self.type(inner, depth: depth - 1) }
        if case .array(let choices)? = schema["enum"] { return choices.map(\.description).joined(separator: "|") }
        if case .array(let choices)? = schema["anyOf"] { return choices.map { Self.type($0, depth: depth) }.joined(separator: " | ") }
        let names: [String] = switch schema["type"] {
        case .string(let name)?: [name]
        case .array(let list)?: list.compactMap(\.stringValue).filter { $0 != "null" }
        default: []
        }
        guard !names.isEmpty else { return "any" }
        return names.map { name in
            if name == "array", let items = schema["items"] { return "[\(Self.type(items, depth: depth))]" }
            if name == "object", depth > 0, let properties = schema["properties"]?.objectValue {
                let required = Set((schema["required"]?.arrayValue ?? []).compactMap(\.stringValue))
                return "{" + properties.keys.sorted().map { "\($0)\(required.contains($0) ? "" : "?"): \(type(properties[$0]!))" }.joined(separator: ", ") + "}"
            }
            return name
        }.joined(separator: "|")
    }
}
