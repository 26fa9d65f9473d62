import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import SwitchboardConfig
import ZeroMQ

/// What one download attempt brought.
enum Download: Sendable {
    /// 304: the copy we have is current.
    case notModified
    case body([UInt8], etag: String?, lastModified: String?)
}

/// Why a download failed, and whether trying again may help (timeouts, 5xx, a dropped
/// connection) or not (4xx, too large, a bad URL).
struct DownloadFailure: Error, Sendable, CustomStringConvertible {
    let description: String
    let retriable: Bool
}

/// Fetches a dataset's bytes over HTTP(S) (async-http-client: redirects, timeouts, status
/// checks, conditional GET) or from a `file://` URL, never reading more than the limit.
/// Retries with exponential back-off and full jitter on retriable failures.
final class Downloader: Sendable {
    private let client: HTTPClient

    init() {
        var configuration = HTTPClient.Configuration()
        configuration.redirectConfiguration = .follow(max: 5, allowCycles: false)
        configuration.timeout = .init(connect: .seconds(5))
        configuration.decompression = .enabled(limit: .ratio(20))
        client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }

    func shutdown() async {
        try? await client.shutdown()
    }

    struct Request: Sendable {
        var url: URL
        var headers: [(String, String)]
        var timeout: Duration
        var maxBytes: Int
        var etag: String?
        var lastModified: String?
    }

    /// Downloads with retries: `attempts` tries at most, waiting `base`·2ⁿ (capped at 5 s,
    /// with full jitter) between them.
    func fetch(_ request: Request, attempts: Int, base: Duration,
               onRetry: @Sendable (Int, DownloadFailure) -> Void = { _, _ in }) async throws(DownloadFailure) -> Download {
        var attempt = 1
        while true {
            do {
                return try await fetchOnce(request)
            } catch {
                guard error.retriable, attempt < attempts, !Task.isCancelled else { throw error }
                onRetry(attempt, error)
                let ceiling = min(base.nanoseconds << UInt64(min(attempt - 1, 20)), 5_000_000_000)
                try? await Task.sleep(nanoseconds: UInt64.random(in: 0...ceiling))
                attempt += 1
            }
        }
    }

    func fetchOnce(_ request: Request) async throws(DownloadFailure) -> Download {
        if request.url.isFileURL { return try readFile(request) }
        guard let scheme = request.url.scheme?.lowercased(), scheme == "http" || scheme == "https" else {
            throw DownloadFailure(description: "unsupported URL scheme in \(request.url.absoluteString)", retriable: false)
        }
        var http = HTTPClientRequest(url: request.url.absoluteString)
        for (name, value) in request.headers { http.headers.add(name: name, value: value) }
        http.headers.add(name: "Accept", value: "application/json")
        if let etag = request.etag { http.headers.add(name: "If-None-Match", value: etag) }
        if let lastModified = request.lastModified { http.headers.add(name: "If-Modified-Since", value: lastModified) }
        let deadline = NIODeadline.now() + .nanoseconds(Int64(request.timeout.nanoseconds))
        do {
            let response = try await client.execute(http, deadline: deadline)
            switch response.status.code {
            case 304:
                return .notModified
            case 200..<300:
                break
            case 500..<600, 429, 408:
                throw DownloadFailure(description: "HTTP \(response.status.code) \(response.status.reasonPhrase)", retriable: true)
            default:
                // NewsAPI explains its 4xx in a JSON body: keep it for the error message.
                let detail = (try? await response.body.collect(upTo: 4_096)).map { String(buffer: $0) } ?? ""
                throw DownloadFailure(description: "HTTP \(response.status.code) \(response.status.reasonPhrase)"
                                          + (detail.isEmpty ? "" : ": \(detail.prefix(300))"), retriable: false)
            }
            let length = response.headers.first(name: "Content-Length").flatMap(Int.init)
            if let length, length > request.maxBytes {
                throw DownloadFailure(description: "the body is \(length) bytes, over the limit of \(request.maxBytes)", retriable: false)
            }
            var body: [UInt8] = []
            // One allocation of the announced size, rather than doublings that briefly hold
            // up to three times the body.
            if let length { body.reserveCapacity(length) }
            for try await chunk in response.body {
                guard body.count + chunk.readableBytes <= request.maxBytes else {
                    throw DownloadFailure(description: "the body is over the limit of \(request.maxBytes) bytes", retriable: false)
                }
                body.append(contentsOf: chunk.readableBytesView)
            }
            return .body(body, etag: response.headers.first(name: "ETag"), lastModified: response.headers.first(name: "Last-Modified"))
        } catch let failure as DownloadFailure {
            throw failure
        } catch let error as HTTPClientError where error == .deadlineExceeded || error == .readTimeout || error == .connectTimeout {
            throw DownloadFailure(description: "timed out after \(request.timeout.formatted)", retriable: true)
        } catch let error as HTTPClientError where error == .remoteConnectionClosed {
            throw DownloadFailure(description: "the server closed the connection before the whole body arrived", retriable: true)
        } catch let error as HTTPParserError where error == .invalidEOFState {
            throw DownloadFailure(description: "the server closed the connection before the whole body arrived", retriable: true)
        } catch let error as NIOConnectionError where error.dnsAError != nil || error.dnsAAAAError != nil {
            // The name does not resolve: trying again in a moment will not change that.
            throw DownloadFailure(description: "cannot resolve \(error.host) (\(error))", retriable: false)
        } catch {
            throw DownloadFailure(description: "\(error)", retriable: true)
        }
    }

    /// A file's bytes, read no further than the limit (a file URL can name something that
    /// never ends, such as /dev/zero, or a file that grows while it is read).
    private func readFile(_ request: Request) throws(DownloadFailure) -> Download {
        let path = request.url.path
        do {
            return .body(try FileContents.bytes(path, atMost: request.maxBytes), etag: nil, lastModified: nil)
        } catch {
            throw DownloadFailure(description: "cannot read \(path): \(error.reason)", retriable: false)
        }
    }
}
