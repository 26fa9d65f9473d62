public import SwitchboardConfig
public import ZeroMQ
import Foundation

/// `security:`: CURVE for every piece that connects to the kernel.
///
/// Two ways to give keys. By default they live in `keys_dir` (``KeyFolder``): `switchboard
/// up` makes them on first run, the kernel allows each service's key to serve that service
/// and the local client's key (and any in `clients/`), and each piece takes its own pair.
/// Or explicitly, for machines that do not share a folder: the kernel's secret key and the
/// allow-lists, and for a connecting piece the kernel's public key and its own secret key.
/// Keys in `client_keys`, `worker_keys` and `operator_keys` are allowed in either way.
public struct SecuritySettings: Sendable, Equatable {
    /// nil when the configuration does not say: `switchboard up` then turns CURVE on; a
    /// kernel run alone stays plain (with a warning), for any ZeroMQ peer, and a service run
    /// alone speaks plain text (warned of if a kernel with CURVE on refuses it).
    public var curve: Bool?
    public var keysDir = KeyFolder.defaultPath
    public var kernelSecretKey: String?
    public var serverKey: String?
    public var secretKey: String?
    public var clientKeys: [String] = []
    public var workerKeys: [String] = []
    /// Clients that may also drain workers, restart services and reload (`OperatorsOnly`).
    public var operatorKeys: [String] = []

    public init() {}

    public static let schema = ConfigSchema.map([
        "curve": .value, "keys_dir": .value, "kernel_secret_key": .text, "kernel_secret_key_file": .value,
        "server_key": .text, "secret_key": .text, "secret_key_file": .value, "client_keys": .value, "worker_keys": .value,
        "operator_keys": .value,
    ])

    /// Reads `security:` (a key given as a file is read now, so a missing file is named here).
    public init(reading security: ConfigSection) throws(ConfigError) {
        curve = try security.bool("curve")
        if let value = try security.text("keys_dir", "a folder path") { keysDir = value }
        kernelSecretKey = try Self.secretKey(in: security, inline: "kernel_secret_key", file: "kernel_secret_key_file")
        secretKey = try Self.secretKey(in: security, inline: "secret_key", file: "secret_key_file")
        if security.has("server_key") { serverKey = try Self.z85Key(security.values["server_key"]!, security.path("server_key")) }
        if let list = try security.strings("client_keys") { clientKeys = try Self.keys(list, security.path("client_keys")) }
        if let list = try security.strings("worker_keys") { workerKeys = try Self.keys(list, security.path("worker_keys")) }
        if let list = try security.strings("operator_keys") { operatorKeys = try Self.keys(list, security.path("operator_keys")) }
    }

    public var keyFolder: KeyFolder { KeyFolder(keysDir) }

    /// Whether CURVE is on: as configured, else `defaultOn` (true under `switchboard up`).
    public func isOn(default defaultOn: Bool = false) -> Bool { curve ?? defaultOn }

    /// The keys piece `name` (a service, or "client") connects with: nil when CURVE is off.
    public func connectingKeys(as name: String) throws(ConfigError) -> CurveClientKeys? {
        guard isOn() else { return nil }
        if serverKey == nil && secretKey == nil {
            do {
                return try keyFolder.connectingKeys(as: name)
            } catch {
                throw ConfigError(path: "security.keys_dir", problem: "\(error)")
            }
        }
        guard let serverKey else {
            throw ConfigError(path: "security.server_key", problem: "required with security.secret_key: the kernel's public key")
        }
        guard let secretKey else {
            throw ConfigError(path: "security.secret_key_file", problem: "required with security.server_key: this host's secret key")
        }
        do {
            return try CurveClientKeys(serverKey: serverKey, secretKey: secretKey)
        } catch {
            throw ConfigError(path: "security", problem: "the keys are not usable: \(error)")
        }
    }

    private static func z85Key(_ value: Any, _ path: String) throws(ConfigError) -> String {
        guard let text = (value as? String)?.trimmingCharacters(in: .whitespacesAndNewlines), Z85.decode(text)?.count == 32 else {
            throw ConfigError(path: path, problem: "expected a CURVE key: 40 characters of Z85 as `switchboard keygen` prints, got \(ConfigSection.describe(value))")
        }
        return text
    }

    private static func keys(_ list: [String], _ path: String) throws(ConfigError) -> [String] {
        var keys: [String] = []
        for (index, item) in list.enumerated() { keys.append(try z85Key(item, "\(path)[\(index)]")) }
        return keys
    }

    /// A secret key given inline or as a file holding it (as `switchboard keygen --out` writes).
    private static func secretKey(in section: ConfigSection, inline: String, file: String) throws(ConfigError) -> String? {
        if section.has(inline) && section.has(file) {
            throw ConfigError(path: section.path(inline), problem: "give either \(inline) or \(file), not both")
        }
        if let value = section.values[inline] { return try z85Key(value, section.path(inline)) }
        guard let path = try section.text(file, "a file path") else { return nil }
        let text: String
        do {
            text = try FileContents.text(path, atMost: FileContents.largestKeyFile)
        } catch {
            throw ConfigError(path: section.path(file), problem: "cannot read \(path): \(error.reason)")
        }
        guard let secret = CurveKeyFile.secretKey(in: text) else {
            throw ConfigError(path: section.path(file), problem: "\(path) holds no CURVE secret key (expected the file `switchboard keygen --out` writes)")
        }
        return secret
    }
}
