import Foundation
import HTTPTypes
import Hummingbird
import NIOCore

/// The page the gateway serves at `/`: static files shipped with the build
/// (`Resources/page`), read once at start. No CDN and no build step: the machines are offline.
struct Page: Sendable {
    struct File: Sendable {
        let contentType: String
        let bytes: ByteBuffer
    }

    let files: [String: File]

    static func load() throws -> Page {
        guard let folder = Bundle.module.url(forResource: "page", withExtension: nil, subdirectory: "Resources") else {
            throw CocoaError(.fileNoSuchFile, userInfo: [NSLocalizedDescriptionKey: "the gateway's page is missing from the build (Resources/page)"])
        }
        var files: [String: File] = [:]
        for url in try FileManager.default.contentsOfDirectory(at: folder, includingPropertiesForKeys: nil) {
            let type = switch url.pathExtension {
            case "html": "text/html; charset=utf-8"
            case "js": "text/javascript; charset=utf-8"
            case "css": "text/css; charset=utf-8"
            case "svg": "image/svg+xml"
            case "png": "image/png"
            default: "application/octet-stream"
            }
            files[url.lastPathComponent] = File(contentType: type, bytes: ByteBuffer(bytes: try Data(contentsOf: url)))
        }
        return Page(files: files)
    }

    /// What a path the gateway does not serve is answered.
    static func notFound() -> Response {
        Response(status: .notFound, headers: [.contentType: "text/plain"], body: .init(byteBuffer: ByteBuffer(string: "not found\n")))
    }

    func response(for name: String) -> Response {
        guard let file = files[name] else { return Self.notFound() }
        var headers: HTTPFields = [.contentType: file.contentType, .cacheControl: "no-cache"]
        // The page talks only to this gateway.
        headers[.contentSecurityPolicy] = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'"
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: file.bytes))
    }
}
