"""What one HTTP/2 connection may make the server do: each limit a named setting with a
safe default, and how often each was hit, for /metrics.

The defaults, and where each comes from:
- resets (RST_STREAM from the client, and streams the server had to reset because of what
  the client sent) as a token bucket per connection, nghttp2's defaults (burst 1,000,
  33 a second: nghttp2_option_set_stream_reset_rate_limit). Rapid reset (CVE-2023-44487)
  ends at the 1,001st within a second: GOAWAY ENHANCE_YOUR_CALM.
- PINGs: grpc-core's ping-abuse policy (ping_abuse_policy.cc): a PING sooner than
  `min_ping_interval_s` after the last one, with no answer sent between, is a strike;
  past `max_ping_strikes` GOAWAY ENHANCE_YOUR_CALM "too_many_pings". Only what the server
  sends for a call a handler took clears the strikes, never a refusal the client provoked.
- other control frames (SETTINGS, PRIORITY, WINDOW_UPDATE, empty DATA, unknown types,
  PINGs too) per connection per second: a flood of frames that each cost the server
  a little and move nothing (CVE-2019-9512/9513/9515/9518) ends at the limit.
- header blocks: CONTINUATION frames per block (a 64 KiB block needs four at 16 KiB; a
  flood of empty ones is CVE-2024-27316's shape), a time limit on an unfinished block,
  encoded bytes per block, and decoded fields and bytes per block (an HPACK bomb: one-byte
  references to a large table entry). Past `max_header_list` (grpc-core's 16 KiB) only that
  request is refused (RESOURCE_EXHAUSTED) and the block is still read, so the HPACK table
  stays the peer's; past the field or decoded-byte cap decoding stops and the connection ends
  (COMPRESSION_ERROR would say the table is lost; it is lost because we stopped: ENHANCE_YOUR_CALM).
- SETTINGS entries per frame (a 16 KiB frame holds 2,730): the window change of a frame is
  applied once, whatever it holds.
- bytes the server holds for a connection's streams behind the client's flow-control windows:
  past the cap new streams are refused (REFUSED_STREAM) until the client reads.
- the listen backlog: proxies reconnecting at once after a control-plane restart overflow
  asyncio's default 100 and wait for SYN retransmits (1 s, 3 s, ...).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

LISTEN_BACKLOG = 4096           # the kernel caps it at net.core.somaxconn (4,096 on current kernels)


@dataclass(frozen=True)
class Limits:
    max_concurrent_streams: int = 1024
    stream_window: int = 256 << 10          # SETTINGS_INITIAL_WINDOW_SIZE we advertise (given back as read)
    connection_window: int = 16 << 20       # and the connection's receive window
    max_header_list: int = 16 << 10         # decoded bytes (RFC 7541 sizes) before the request is refused
    max_header_fields: int = 1000           # fields in one block: past it decoding stops, GOAWAY
    max_header_decoded: int = 256 << 10     # decoded bytes in one block: past it decoding stops, GOAWAY
    max_header_block: int = 64 << 10        # encoded bytes of a block with its CONTINUATIONs
    max_continuations: int = 32             # CONTINUATION frames per block
    header_block_timeout_s: float = 1.0     # a block left unfinished this long: GOAWAY
    max_settings_entries: int = 32          # entries in one SETTINGS frame
    reset_burst: int = 1000                 # resets a connection may cause at once
    resets_per_s: float = 33.0              # and the rate they come back at
    max_control_frames_per_s: int = 10_000  # SETTINGS, PING, PRIORITY, WINDOW_UPDATE, empty DATA, unknown
    min_ping_interval_s: float = 300.0      # grpc-core's min_recv_ping_interval_without_data
    idle_ping_interval_s: float = 7200.0    # the same while no stream is open (keepalive_permit_without_calls 0)
    max_ping_strikes: int = 2
    max_queued_bytes: int = 32 << 20        # held behind the client's windows, all streams together
    closed_streams_remembered: int = 256    # how a recent stream closed, to answer late frames as §5.1 says
    listen_backlog: int = LISTEN_BACKLOG


DEFAULT = Limits()

# What each hit is called in /metrics, and the number of hits this process has seen.
HIT_NAMES = ("resets", "pings", "control_frames", "continuations", "header_block_timeout", "header_block_size",
             "header_fields", "header_decoded", "header_list", "settings_entries", "queued_bytes",
             "flow_control", "malformed")
hits: collections.Counter = collections.Counter()

METRIC = "mcp_h2_limit_hits"     # counter by limit: what an HTTP/2 peer was refused or closed for


_exported: list = []        # registries METRIC is in (a second export to one is a no-op)


def export_metrics(registry) -> None:
    """METRIC (`mcp_h2_limit_hits_total{limit=...}`) in a prometheus_client `registry`: the
    process-wide counts (every gRPC port this process serves on the project's HTTP/2 stack)."""
    from prometheus_client.core import CounterMetricFamily

    if any(r is registry for r in _exported):
        return
    _exported.append(registry)

    class _Hits:
        def collect(self):
            family = CounterMetricFamily(METRIC, "Times an HTTP/2 client hit one of the server's limits "
                                         "(serving/h2/limits.py), by limit", labels=("limit",))
            for name in HIT_NAMES:
                family.add_metric((name,), hits[name])
            yield family

    registry.register(_Hits())
