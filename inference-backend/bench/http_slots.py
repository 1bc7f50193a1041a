"""Engine slots over HTTP/1.1 keep-alive connections (one request each)."""
from __future__ import annotations

from mcp26.inference.bench import errors
from mcp26.inference.bench.engine import OnDone
from mcp26.inference.bench.http1 import Http1Connection


class HttpSlot:
    def __init__(self, host: str, port: int, payloads: list[bytes]):
        self.conn = Http1Connection(host, port)
        self.payloads = payloads          # one pre-encoded request per priority

    async def connect(self) -> None:
        await self.conn.connect()

    def start(self, prio: int, on_done: OnDone) -> None:
        def done(status, label, queue_us, compute_us, body) -> None:
            on_done(label, queue_us, compute_us)
        self.conn.request(self.payloads[prio], done)

    def expire(self, older_than: float) -> None:
        c = self.conn
        if c.on_done is not None and c.started < older_than:
            c.abort(errors.TIMEOUT)

    def close(self) -> None:
        self.conn.close()
