internal import CZeroMQ
#if canImport(Glibc)
internal import Glibc
#endif

/// A CURVE key pair as Z85 text (40 characters each), as `switchboard keygen` prints it.
public struct CurveKeyPair: Sendable, Hashable {
    public let publicKey: String
    public let secretKey: String

    public init(publicKey: String, secretKey: String) {
        self.publicKey = publicKey
        self.secretKey = secretKey
    }

    /// Generates a new key pair; fails with `ENOTSUP` when libzmq was built without CURVE.
    public static func generate() throws(ZMQError) -> CurveKeyPair {
        var publicKey = [CChar](repeating: 0, count: 41)
        var secretKey = [CChar](repeating: 0, count: 41)
        try zmqCall("zmq_curve_keypair") { zmq_curve_keypair(&publicKey, &secretKey) }
        return CurveKeyPair(publicKey: text(publicKey), secretKey: text(secretKey))
    }

    /// The public key that belongs to a Z85 secret key.
    public static func publicKey(forSecretKey secretKey: String) throws(ZMQError) -> String {
        var publicKey = [CChar](repeating: 0, count: 41)
        try zmqCall("zmq_curve_public") { zmq_curve_public(&publicKey, secretKey) }
        return text(publicKey)
    }
}

/// ZeroMQ's Z85 text encoding (RFC 32/Z85), which CURVE keys are written in.
public enum Z85 {
    /// Encodes bytes whose count is a multiple of 4; `nil` otherwise.
    public static func encode(_ bytes: [UInt8]) -> String? {
        guard bytes.count % 4 == 0 else { return nil }
        var text = [CChar](repeating: 0, count: bytes.count * 5 / 4 + 1)
        guard zmq_z85_encode(&text, bytes, bytes.count) != nil else { return nil }
        return ZeroMQ.text(text)
    }

    /// Decodes text whose length is a multiple of 5; `nil` for any other or invalid text.
    public static func decode(_ text: String) -> [UInt8]? {
        let count = text.utf8.count
        guard count % 5 == 0,
            text.utf8.allSatisfy({ $0 >= 0x21 && $0 <= 0x7D && $0 != 0x22 && $0 != 0x27 && $0 != 0x2C && $0 != 0x3B && $0 != 0x5C && $0 != 0x5F && $0 != 0x60 && $0 != 0x7C })
        else { return nil }
        var bytes = [UInt8](repeating: 0, count: count * 4 / 5)
        guard zmq_z85_decode(&bytes, text) != nil else { return nil }
        return bytes
    }
}

/// The text in a NUL-terminated C buffer.
func text(_ buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// What a connecting socket needs to talk to a CURVE-secured kernel: the kernel's public
/// key, and this peer's own key pair (the public half is derived from the secret one).
public struct CurveClientKeys: Sendable, Hashable {
    public let serverKey: String
    public let publicKey: String
    public let secretKey: String

    /// Fails with `EINVAL` when a key is not 40 characters of Z85.
    public init(serverKey: String, secretKey: String) throws(ZMQError) {
        guard Z85.decode(serverKey)?.count == 32 else { throw ZMQError(call: "CURVE server key", code: EINVAL) }
        guard Z85.decode(secretKey)?.count == 32 else { throw ZMQError(call: "CURVE secret key", code: EINVAL) }
        self.serverKey = serverKey
        self.secretKey = secretKey
        publicKey = try CurveKeyPair.publicKey(forSecretKey: secretKey)
    }

    /// Makes `socket` a CURVE client of the server (before it connects).
    public func apply(to socket: ZMQSocket) throws(ZMQError) {
        try socket.set(.curveServerKey, serverKey)
        try socket.set(.curvePublicKey, publicKey)
        try socket.set(.curveSecretKey, secretKey)
    }
}

extension ZMQSocket {
    /// Makes the socket a CURVE client when `keys` are given; a no-op otherwise.
    public func secure(_ keys: CurveClientKeys?) throws(ZMQError) {
        try keys?.apply(to: self)
    }
}

/// The key files `switchboard keygen --out NAME` writes: `NAME.key` (secret, mode 0600)
/// and `NAME.pub`, lines of `name = value` with `#` comments.
public enum CurveKeyFile {
    public static func secretFile(_ pair: CurveKeyPair) -> String {
        """
        # Switchboard CURVE key pair. Keep this file private; share only the .pub file.
        public-key = \(pair.publicKey)
        secret-key = \(pair.secretKey)

        """
    }

    public static func publicFile(_ pair: CurveKeyPair) -> String {
        """
        # Switchboard CURVE public key: add it to security.worker_keys, client_keys or operator_keys.
        public-key = \(pair.publicKey)

        """
    }

    /// The secret key in a key file's text; nil when there is none or it is not valid Z85.
    public static func secretKey(in text: String) -> String? { value("secret-key", in: text) }
    /// The public key in a key file's text.
    public static func publicKey(in text: String) -> String? { value("public-key", in: text) }

    private static func value(_ name: String, in text: String) -> String? {
        for line in text.split(whereSeparator: \.isNewline) {
            let parts = line.split(separator: "=", maxSplits: 1).map { String($0.drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed()) }
            guard parts.count == 2, parts[0] == name else { continue }
            return Z85.decode(parts[1])?.count == 32 ? parts[1] : nil
        }
        return nil
    }
}
