import ArgumentParser
import BusKit
import Foundation
import StandardStreams
import ZeroMQ

struct KeygenCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keygen",
        abstract: "Make a CURVE key pair for the kernel, a service host or a client.",
        discussion: """
            Without --out, prints the public and secret keys. With --out NAME, writes NAME.key \
            (both keys; mode 0600; for security.kernel_secret_key_file, security.secret_key_file \
            or sb --key-file) and NAME.pub (the public key, for the allow-lists or server_key), \
            making NAME's folder if need be. An existing pair is replaced only with --force, and \
            whole: exit status 64 when it exists, 73 when the files cannot be written (the old pair \
            is left as it was).

            Examples:
              switchboard keygen --out keys/kernel
              switchboard keygen --out keys/services
              switchboard keygen --out keys/alice
            """
    )

    @Option(help: "Write NAME.key and NAME.pub instead of printing.")
    var out: String?
    @Flag(help: "Replace existing files.")
    var force = false

    func validate() throws {
        guard let out else { return }
        guard !out.isEmpty, !out.hasSuffix("/") else {
            throw ValidationError("--out \"\(out)\" names no file: give a path such as keys/alice, for keys/alice.key and keys/alice.pub")
        }
        for file in [out + ".key", out + ".pub"] where !force && FileManager.default.fileExists(atPath: file) {
            throw ValidationError("\(file) exists; use --force to replace it")
        }
    }

    func run() throws {
        let pair = try CurveKeyPair.generate()
        guard let out else {
            print("public-key = \(pair.publicKey)\nsecret-key = \(pair.secretKey)")
            return
        }
        do {
            try KeyFolder.write(pair, to: out)
        } catch {
            // As `switchboard up` says keys it cannot make: EX_CANTCREAT.
            StandardStreams.writeError("switchboard keygen: \(error)\n")
            throw ExitCode(73)
        }
        print("wrote \(out).key (secret) and \(out).pub\npublic-key = \(pair.publicKey)")
    }
}
