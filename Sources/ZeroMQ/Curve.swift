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
