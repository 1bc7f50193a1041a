"""TranslateOptions: how this control plane translates, fixed for a Translator's life.

The command line builds them (`mcpctl xds serve`, cli.py); a Translator is
made with them and caches what it translates under them. Nothing here
changes while a server runs: what does (the decision loop's remaps and
weights, the config's Wasm modules) is the Overlay (overlay.py).
"""
from __future__ import annotations

from dataclasses import dataclass

# Envoy's own default and Istio's EDGE-profile value (istiod itself turns it off).
DEFAULT_STREAM_IDLE_TIMEOUT_S = 300.0
MAX_DURATION_S = 315_576_000_000        # google.protobuf.Duration's range (10,000 years)


@dataclass(frozen=True)
class TranslateOptions:
    """bind_address: where gateway and sidecar listeners bind. istiod binds
    0.0.0.0; this project binds loopback by default (every server does).
    upstream_bind_address: the source address of QoS-marked upstream
    connections (upstream_bind_config; a v6 address uses IPV6_TCLASS).
    stream_idle_timeout_s: every HCM's stream_idle_timeout (0: off, as istiod);
    `mcpctl xds serve --stream-idle-timeout` sets it (tests use a short one)."""
    bind_address: str = "127.0.0.1"
    upstream_bind_address: str = "127.0.0.1"
    stream_idle_timeout_s: float = DEFAULT_STREAM_IDLE_TIMEOUT_S

    def __post_init__(self):
        s = self.stream_idle_timeout_s
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s < MAX_DURATION_S:
            raise ValueError(f"stream_idle_timeout_s: expected seconds >= 0 (0: off) and under "
                             f"{MAX_DURATION_S}, not {s!r}")
