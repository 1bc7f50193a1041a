"""Echo upstreams: each answers with its own name and the request it saw."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mcp26.demo.stack.ports import free_port


class EchoUpstream:
    """An HTTP/1.1 server on `host` (127.0.0.1 unless given another loopback
    address) answering JSON:
    {"upstream": name, "method", "path", "headers": {lower-case name: value}, "body"}.
    With `metrics` set ({name: value}), GET /metrics answers them as Prometheus
    text instead, like a model server reporting its load.
    """

    def __init__(self, name: str, port: int | None = None, status: int = 200, host: str = "127.0.0.1"):
        self.name = name
        self.host = host
        self.port = port or free_port(host)
        self.status = status
        self.requests: list[dict] = []
        self.metrics: dict[str, float] | None = None
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True   # headers and body go in two writes: no 40 ms delayed-ACK stall

            def _answer(self):
                if self.path == "/metrics" and upstream.metrics is not None:
                    out = "".join(f"{k} {v}\n" for k, v in dict(upstream.metrics).items()).encode()
                    self.send_response(200)
                    self.send_header("content-type", "text/plain; version=0.0.4")
                    self.send_header("content-length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                    return
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
                seen = {"upstream": upstream.name, "method": self.command, "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
                upstream.requests.append(seen)
                out = json.dumps(seen).encode()
                self.send_response(upstream.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.send_header("x-upstream", upstream.name)
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer

            def do_HEAD(self):
                self.send_response(upstream.status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "EchoUpstream":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
