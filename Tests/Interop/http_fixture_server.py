#!/usr/bin/env python3
"""A local HTTP server for the fetcher's tests: serves files from a folder, with faults.

Usage: http_fixture_server.py FOLDER
Binds 127.0.0.1 on a free port and prints "PORT <n>" on its first line of output.

Paths:
  /ok/FILE              200 with the file, an ETag and Last-Modified; 304 when the
                        request's If-None-Match matches the ETag
  /flaky/N/FILE         500 for the first N requests of this path, then as /ok/FILE
  /slow/SECONDS/FILE    waits, then as /ok/FILE
  /truncated/FILE       announces the whole length, sends half, closes
  /status/CODE/FILE     answers CODE with the file as its body
  /redirect/FILE        302 to /ok/FILE
Every request is counted; GET /_count/PATH answers how many requests PATH got.
"""
import hashlib
import http.server
import os
import sys
import threading
import time

FOLDER = sys.argv[1]
counts = {}
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_file(self, name, status=200):
        path = os.path.join(FOLDER, os.path.basename(name))
        if not os.path.isfile(path):
            self.send_plain(404, b"no such file")
            return
        with open(path, "rb") as handle:
            body = handle.read()
        etag = '"%s"' % hashlib.sha256(body).hexdigest()[:16]
        if status == 200 and self.headers.get("If-None-Match") == etag:
            self.send_response(304)
            self.send_header("ETag", etag)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", "Sat, 21 Nov 2026 10:00:00 GMT")
        self.end_headers()
        self.wfile.write(body)

    def send_plain(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts[0] == "_count":
            key = "/" + "/".join(parts[1:])
            with lock:
                self.send_plain(200, str(counts.get(key, 0)).encode())
            return
        with lock:
            counts[self.path] = counts.get(self.path, 0) + 1
            seen = counts[self.path]
        kind = parts[0]
        if kind == "ok" and len(parts) == 2:
            self.send_file(parts[1])
        elif kind == "flaky" and len(parts) == 3:
            if seen <= int(parts[1]):
                self.send_plain(500, b"try again")
            else:
                self.send_file(parts[2])
        elif kind == "slow" and len(parts) == 3:
            time.sleep(float(parts[1]))
            self.send_file(parts[2])
        elif kind == "truncated" and len(parts) == 2:
            with open(os.path.join(FOLDER, os.path.basename(parts[1])), "rb") as handle:
                body = handle.read()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
        elif kind == "status" and len(parts) == 3:
            self.send_file(parts[2], status=int(parts[1]))
        elif kind == "redirect" and len(parts) == 2:
            self.send_response(302)
            self.send_header("Location", "/ok/" + parts[1])
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_plain(404, b"unknown path")


def exit_when_parent_is_gone():
    """The lifeline: stdin is a pipe only the process that started this one writes to;
    end-of-file there means it is gone (even by SIGKILL), and so this server goes too."""
    while sys.stdin.buffer.read(4096):
        pass
    os._exit(0)


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
threading.Thread(target=exit_when_parent_is_gone, daemon=True).start()
print("PORT %d" % server.server_address[1], flush=True)
try:
    server.serve_forever()
except KeyboardInterrupt:
    pass
