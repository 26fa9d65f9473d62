import ArgumentParser
import BusKit
import Foundation
import ZeroMQ

struct KeygenCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keygen",
        abstract: "Make a CURVE key pair for the kernel, a service host or a client.",
        discussion: """
            Without --out, prints the public and secret keys. With --out NAME, writes NAME.key \
            (both keys; mode 0600; for security.kernel_secret_key_file, security.secret_key_file \
            or sb --key-file) and NAME.pub (the public key, for the allow-lists or server_key).

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

    func run() throws {
        let pair = try CurveKeyPair.generate()
        guard let out else {
            print("public-key = \(pair.publicKey)\nsecret-key = \(pair.secretKey)")
            return
        }
        let secretPath = out + ".key", publicPath = out + ".pub"
        do {
            try KeyFolder.write(pair, to: out, replacing: force)
        } catch let error as KeyFolderError {
            throw ValidationError("\(error)")
        }
        print("wrote \(secretPath) (secret) and \(publicPath)\npublic-key = \(pair.publicKey)")
    }
}
