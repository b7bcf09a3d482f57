"""A real HTTPS receiver on loopback for the delivery tests, with a certificate from trustme.

Each path behaves as its name says; every request is recorded (headers, body) before it is answered.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import trustme


class Receiver:
    def __init__(self, tmp_path) -> None:
        self.ca = trustme.CA()
        cert = self.ca.issue_cert("localhost", "127.0.0.1")
        self.ca_file = str(tmp_path / "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_file)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        cert.configure_cert(context)
        self.requests: dict[str, list[tuple[dict[str, str], bytes, float]]] = defaultdict(list)
        self.counts: dict[str, int] = defaultdict(int)
        self.fail_first = 2
        self.hang_seconds = 3.0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                path = self.path
                with receiver.lock:
                    receiver.counts[path] += 1
                    n = receiver.counts[path]
                    receiver.requests[path].append(({k.lower(): v for k, v in self.headers.items()}, body, time.time()))
                receiver.answer(self, path, n)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str, host: str = "localhost") -> str:
        return f"https://{host}:{self.port}{path}"

    def answer(self, h: BaseHTTPRequestHandler, path: str, n: int) -> None:
        def send(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            h.send_response(status)
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.send_header("content-length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)

        if path.startswith("/ok"):
            send(204)
        elif path == "/flaky":
            send(503 if n <= self.fail_first else 200, b"busy" if n <= self.fail_first else b"ok")
        elif path == "/throttle":
            send(429, b"slow down", {"Retry-After": "2"}) if n == 1 else send(200, b"ok")
        elif path == "/error":
            send(500, b"internal error")
        elif path == "/refuse":
            send(400, b"bad document")
        elif path == "/hang":
            if n == 1:
                time.sleep(self.hang_seconds)
                h.close_connection = True
                return
            send(200, b"ok")
        elif path == "/cut":
            if n == 1:
                h.send_response(200)
                h.send_header("content-length", "1000")
                h.end_headers()
                h.wfile.write(b"partial")
                h.wfile.flush()
                h.connection.shutdown(socket.SHUT_RDWR)
                h.close_connection = True
                return
            send(200, b"ok")
        elif path == "/redirect":
            send(302, b"", {"Location": "https://example.org/elsewhere"})
        elif path == "/redirect-same":
            send(307, b"", {"Location": "/ok-after-redirect"})
        elif path == "/big":
            h.send_response(200)
            h.send_header("content-length", str(10 * 1024 * 1024))
            h.end_headers()
            chunk = b"x" * 65536
            try:
                for _ in range(160):
                    h.wfile.write(chunk)
            except OSError:
                pass
            h.close_connection = True
        elif path.startswith("/slow"):
            time.sleep(0.2)
            send(200, b"ok")
        else:
            send(404, b"no such path")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
