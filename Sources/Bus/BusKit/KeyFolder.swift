public import Foundation
public import ZeroMQ
import SwitchboardConfig

/// The folder of CURVE keys on a machine running the bus (`security.keys_dir`, by default
/// `data/keys`): `switchboard up` fills it on first run, the kernel builds its allow-lists
/// from it, each service takes its own key pair from it, and `sb` finds the local client's
/// key there without flags.
///
/// ```
/// kernel.key  kernel.pub          the kernel's pair; clients need kernel.pub
/// store.key   store.pub  …        one pair per service: may register that service only
/// client.key  client.pub          the local client (sb, scripts)
/// operator.key operator.pub       the local operator: sb drain, restart, reload
/// gateway.key gateway.pub         the HTTP gateway, a client of its own
/// gateway.token                   the bearer token HTTP callers send to the gateway
/// clients/NAME.pub                more clients allowed in (copy their .pub files here)
/// operators/NAME.pub              more operators (clients that may also drain, restart, reload)
/// ```
/// Secret keys are written with mode 0600 and the folder with 0700.
public struct KeyFolder: Sendable, Equatable {
    /// The folder `switchboard up` and `sb` use unless told otherwise (relative to the
    /// current directory, like the store's default database).
    public static let defaultPath = "data/keys"
    /// The pair of the kernel, and of the local client.
    public static let kernel = "kernel"
    public static let client = "client"
    /// The gateway's pair: a client like `client`.
    public static let gateway = "gateway"
    /// The local operator's pair: a client that may also ask what `OperatorsOnly` lists.
    public static let `operator` = "operator"
    /// The supervisor's pair (`switchboard up`): a service key for its own state prefix,
    /// where it says how each process it runs is doing.
    public static let supervisor = "supervisor"

    public let url: URL

    public init(_ path: String) {
        url = URL(fileURLWithPath: path)
    }

    public var path: String { url.path }

    public func secretKeyFile(_ name: String) -> URL { url.appendingPathComponent("\(name).key") }
    public func publicKeyFile(_ name: String) -> URL { url.appendingPathComponent("\(name).pub") }
    /// Public keys of further clients allowed in.
    public var clientsFolder: URL { url.appendingPathComponent("clients") }
    /// Public keys of further operators.
    public var operatorsFolder: URL { url.appendingPathComponent("operators") }

    /// Writes a pair for each of `names` that has no secret key file yet; returns the names
    /// it made a pair for.
    @discardableResult
    public func create(_ names: [String]) throws -> [String] {
        for folder in [url, clientsFolder, operatorsFolder] {
            try Self.makeFolder(folder.path)
            guard chmod(folder.path, 0o700) == 0 else {
                throw KeyFolderError(path: folder.path, problem: "cannot be made private (mode 0700): \(String(cString: strerror(errno)))")
            }
        }
        var made: [String] = []
        for name in names where !FileManager.default.fileExists(atPath: secretKeyFile(name).path) {
            try Self.write(try CurveKeyPair.generate(), to: url.appendingPathComponent(name).path)
            made.append(name)
        }
        return made
    }

    /// The gateway's bearer token file.
    public var gatewayTokenFile: URL { url.appendingPathComponent("gateway.token") }

    /// Writes a new random gateway token (mode 0600) unless there is one; returns whether
    /// it made one.
    @discardableResult
    public func createGatewayToken() throws(KeyFolderError) -> Bool {
        guard !FileManager.default.fileExists(atPath: gatewayTokenFile.path) else { return false }
        try Self.makeFolder(path)
        var generator = SystemRandomNumberGenerator()
        let token = (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }.joined()
        try Self.writeNewFile(gatewayTokenFile.path, token + "\n", mode: 0o600)
        return true
    }

    /// The gateway token, or nil when there is no token file.
    public func gatewayToken() -> String? {
        (try? FileContents.text(gatewayTokenFile.path, atMost: FileContents.largestKeyFile)).map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
    }

    /// Writes `base.key` (mode 0600) and `base.pub`, as `switchboard keygen --out` does,
    /// making their folder if need be and replacing a pair already there (keygen asks for
    /// --force first). Both are written whole under other names first, and renamed into
    /// place only then: a pair that cannot be written (a full disk, no permission, a folder
    /// where the public key goes) leaves what was there before, not a secret key beside
    /// another pair's public key.
    public static func write(_ pair: CurveKeyPair, to base: String) throws(KeyFolderError) {
        guard !base.isEmpty, !base.hasSuffix("/") else {
            throw KeyFolderError(path: "\"\(base)\"", problem: "names no file for a key pair")
        }
        let files = [(path: base + ".key", text: CurveKeyFile.secretFile(pair), mode: mode_t(0o600)),
                     (path: base + ".pub", text: CurveKeyFile.publicFile(pair), mode: mode_t(0o644))]
        try makeFolder(URL(fileURLWithPath: base).deletingLastPathComponent().path)
        let suffix = ".new-\(getpid())"
        defer { for file in files { unlink(file.path + suffix) } }
        for file in files {
            unlink(file.path + suffix)
            try writeNewFile(file.path + suffix, file.text, mode: file.mode, naming: file.path)
        }
        // Two renames cannot be one step: the secret key that was there is kept under a
        // second name (a hard link) until the public key is in place, to be put back if it
        // cannot be; a secret key that was not there is taken away again.
        let (secret, previousSecret) = (files[0].path, files[0].path + ".old-\(getpid())")
        unlink(previousSecret)
        let existed = access(secret, F_OK) == 0
        let kept = existed && link(secret, previousSecret) == 0
        defer { unlink(previousSecret) }
        for (index, file) in files.enumerated() where rename(file.path + suffix, file.path) != 0 {
            let reason = String(cString: strerror(errno))
            if index > 0 {
                if kept { rename(previousSecret, secret) } else if !existed { unlink(secret) }
            }
            throw KeyFolderError(path: file.path, problem: "cannot be written: \(reason)")
        }
    }

    /// Makes the folder at `path` and those above it, as needed.
    private static func makeFolder(_ path: String) throws(KeyFolderError) {
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        } catch {
            throw KeyFolderError(path: path, problem: "cannot be made: \(systemReason(error))")
        }
    }

    /// Writes `text` to a file at `path` that must not exist yet, with `mode` from the start
    /// (a secret is never readable by others, not even for a moment), and on the disk before it
    /// returns. A failure names `naming` (the file the caller means) with the system's reason.
    private static func writeNewFile(_ path: String, _ text: String, mode: mode_t, naming: String? = nil) throws(KeyFolderError) {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode)
        guard descriptor >= 0 else {
            throw KeyFolderError(path: naming ?? path, problem: "cannot be written: \(String(cString: strerror(errno)))")
        }
        let file = FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
        do {
            try file.write(contentsOf: Data(text.utf8))
            try file.synchronize()
        } catch {
            throw KeyFolderError(path: naming ?? path, problem: "cannot be written: \(systemReason(error))")
        }
    }

    /// The secret key in `name.key`.
    public func secretKey(_ name: String) throws(KeyFolderError) -> String {
        let file = secretKeyFile(name)
        let text: String
        do {
            text = try FileContents.text(file.path, atMost: FileContents.largestKeyFile)
        } catch {
            let missing = !FileManager.default.fileExists(atPath: file.path)
            throw KeyFolderError(path: file.path, problem: missing ? "is missing (`switchboard up` creates it on first run)" : "cannot be read: \(error.reason)")
        }
        guard let key = CurveKeyFile.secretKey(in: text) else {
            throw KeyFolderError(path: file.path, problem: "holds no CURVE secret key")
        }
        return key
    }

    /// The public key in `name.pub`, or nil when there is no such file.
    public func publicKey(_ name: String) throws(KeyFolderError) -> String? {
        try Self.publicKey(in: publicKeyFile(name))
    }

    /// The local client's public key, the gateway's, and every `clients/*.pub`.
    public func clientPublicKeys() throws(KeyFolderError) -> [String] {
        try publicKeys([publicKeyFile(Self.client), publicKeyFile(Self.gateway)], andIn: clientsFolder)
    }

    /// The local operator's public key and every `operators/*.pub`.
    public func operatorPublicKeys() throws(KeyFolderError) -> [String] {
        try publicKeys([publicKeyFile(Self.operator)], andIn: operatorsFolder)
    }

    /// Every `clients/*.pub` and `operators/*.pub` by its path, with the key it holds: the keys
    /// admitted beyond the pairs `switchboard up` makes, which a reload compares to say which
    /// files changed. A file that holds no key is named in the error.
    public func furtherPublicKeys() throws(KeyFolderError) -> [(file: String, key: String)] {
        var keys: [(file: String, key: String)] = []
        for file in Self.publicKeyFiles(in: clientsFolder) + Self.publicKeyFiles(in: operatorsFolder) {
            if let key = try Self.publicKey(in: file) { keys.append((file.path, key)) }
        }
        return keys
    }

    private func publicKeys(_ files: [URL], andIn folder: URL) throws(KeyFolderError) -> [String] {
        var keys: [String] = []
        for file in files + Self.publicKeyFiles(in: folder) {
            if let key = try Self.publicKey(in: file) { keys.append(key) }
        }
        return keys
    }

    /// The `.pub` files in `folder`, in the order of their names; none when it is missing.
    private static func publicKeyFiles(in folder: URL) -> [URL] {
        ((try? FileManager.default.contentsOfDirectory(at: folder, includingPropertiesForKeys: nil)) ?? [])
            .filter { $0.pathExtension == "pub" }.sorted { $0.path < $1.path }
    }

    /// The keys `name` connects to the local kernel with: the kernel's public key and
    /// `name.key`.
    public func connectingKeys(as name: String) throws(KeyFolderError) -> CurveClientKeys {
        guard let server = try publicKey(Self.kernel) else {
            throw KeyFolderError(path: publicKeyFile(Self.kernel).path, problem: "is missing (`switchboard up` creates it on first run)")
        }
        let secret = try secretKey(name)
        do {
            return try CurveClientKeys(serverKey: server, secretKey: secret)
        } catch {
            throw KeyFolderError(path: secretKeyFile(name).path, problem: "is not a usable key: \(error)")
        }
    }

    /// The local client's keys, or nil when the folder holds no `client.key` (a bus without CURVE).
    public func clientKeys() throws(KeyFolderError) -> CurveClientKeys? {
        guard FileManager.default.fileExists(atPath: secretKeyFile(Self.client).path) else { return nil }
        return try connectingKeys(as: Self.client)
    }

    /// The local operator's keys when the folder holds `operator.key`, else the client's.
    public func operatorKeys() throws(KeyFolderError) -> CurveClientKeys? {
        guard FileManager.default.fileExists(atPath: secretKeyFile(Self.operator).path) else { return try clientKeys() }
        return try connectingKeys(as: Self.operator)
    }

    /// The name this folder knows `publicKey` by (`client`, `operator`, a service's name,
    /// `clients/NAME`, `operators/NAME`), or nil: to show a key to a person by its name.
    public func name(of publicKey: String) -> String? {
        for (folder, prefix) in [(url, ""), (clientsFolder, "clients/"), (operatorsFolder, "operators/")] {
            let files = (try? FileManager.default.contentsOfDirectory(atPath: folder.path)) ?? []
            for file in files.sorted() where file.hasSuffix(".pub") {
                if (try? Self.publicKey(in: folder.appendingPathComponent(file))) == publicKey { return prefix + file.dropLast(4) }
            }
        }
        return nil
    }

    private static func publicKey(in file: URL) throws(KeyFolderError) -> String? {
        guard FileManager.default.fileExists(atPath: file.path) else { return nil }
        let text: String
        do {
            text = try FileContents.text(file.path, atMost: FileContents.largestKeyFile)
        } catch {
            throw KeyFolderError(path: file.path, problem: "cannot be read: \(error.reason)")
        }
        guard let key = CurveKeyFile.publicKey(in: text) else {
            throw KeyFolderError(path: file.path, problem: "holds no CURVE public key")
        }
        return key
    }
}

/// A key file that is missing or unusable, naming it.
public struct KeyFolderError: Error, Sendable, Equatable, CustomStringConvertible {
    public let path: String
    public let problem: String
    public var description: String { "\(path) \(problem)" }
}
