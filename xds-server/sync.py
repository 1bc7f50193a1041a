"""ACK/NACK bookkeeping per node and type: what /debug/syncz and proxy-status show.

Like istiod's syncz: for each connected proxy and each type, the version and
nonce last sent, the version the proxy last ACKed, and the last NACK with
its error_detail. A NACKed version is never recorded as acked: the proxy
keeps (and we report) its last accepted version.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from mcp26.xds.model import type_urls as t

SHORT_NAMES = {t.CLUSTER: "CDS", t.ENDPOINT: "EDS", t.LISTENER: "LDS", t.ROUTE: "RDS",
               t.EXTENSION_CONFIG: "ECDS", t.SECRET: "SDS"}


def short_name(type_url: str) -> str:
    return SHORT_NAMES.get(type_url, type_url.rsplit(".", 1)[-1])


@dataclass
class TypeSync:
    sent_version: str = ""
    sent_nonce: str = ""
    sent_at: float = 0.0
    resources: int = 0
    acked_version: str = ""
    acked_nonce: str = ""
    acked_at: float = 0.0
    nacked_version: str = ""
    nacked_nonce: str = ""
    nacked_at: float = 0.0
    error: str = ""

    @property
    def status(self) -> str:
        if not self.sent_nonce:
            return "NOT SENT"
        if self.acked_nonce == self.sent_nonce:
            return "SYNCED"
        if self.nacked_nonce == self.sent_nonce:
            return "NACKED"
        return "STALE"

    def as_dict(self) -> dict:
        return {"status": self.status, "sent_version": self.sent_version, "sent_nonce": self.sent_nonce,
                "resources": self.resources, "acked_version": self.acked_version,
                "nacked_version": self.nacked_version, "error": self.error,
                "sent_at": self.sent_at, "acked_at": self.acked_at, "nacked_at": self.nacked_at}


@dataclass
class NodeSync:
    node_id: str
    cluster: str
    protocol: str                     # "sotw" | "delta"
    stream: int                       # which stream owns this entry (a reconnect replaces it)
    connected_at: float = field(default_factory=time.time)
    types: dict[str, TypeSync] = field(default_factory=dict)

    def of(self, type_url: str) -> TypeSync:
        return self.types.setdefault(type_url, TypeSync())


class SyncTracker:
    def __init__(self):
        self.nodes: dict[str, NodeSync] = {}
        self._next_stream = 0

    def connect(self, node_id: str, cluster: str, protocol: str) -> int:
        self._next_stream += 1
        self.nodes[node_id] = NodeSync(node_id, cluster, protocol, self._next_stream)
        return self._next_stream

    def disconnect(self, node_id: str, stream: int) -> None:
        entry = self.nodes.get(node_id)
        if entry is not None and entry.stream == stream:
            del self.nodes[node_id]

    def _entry(self, node_id: str, stream: int, type_url: str) -> TypeSync | None:
        entry = self.nodes.get(node_id)
        return entry.of(type_url) if entry is not None and entry.stream == stream else None

    def sent(self, node_id: str, stream: int, type_url: str, version: str, nonce: str, resources: int) -> None:
        s = self._entry(node_id, stream, type_url)
        if s is not None:
            s.sent_version, s.sent_nonce, s.sent_at, s.resources = version, nonce, time.time(), resources

    def ack(self, node_id: str, stream: int, type_url: str, version: str, nonce: str) -> None:
        s = self._entry(node_id, stream, type_url)
        if s is not None:
            s.acked_version, s.acked_nonce, s.acked_at = version, nonce, time.time()
            if s.nacked_nonce and s.nacked_nonce != nonce:
                s.error = ""   # a later version was accepted: the NACK is history

    def nack(self, node_id: str, stream: int, type_url: str, version: str, nonce: str, error: str) -> None:
        s = self._entry(node_id, stream, type_url)
        if s is not None:
            s.nacked_version, s.nacked_nonce, s.nacked_at, s.error = version, nonce, time.time(), error

    def syncz(self) -> list[dict]:
        return [{"node": n.node_id, "cluster": n.cluster, "protocol": n.protocol,
                 "connected_at": n.connected_at,
                 "types": {short_name(u): s.as_dict() for u, s in n.types.items()}}
                for n in sorted(self.nodes.values(), key=lambda n: n.node_id)]


def format_proxy_status(syncz: list[dict]) -> str:
    """The syncz table as `istioctl proxy-status` prints it."""
    cols = ["CDS", "EDS", "LDS", "RDS", "ECDS"]
    rows = [["NAME", "CLUSTER", "PROTOCOL", *cols]]
    errors = []
    for n in syncz:
        row = [n["node"], n["cluster"] or "-", n["protocol"].upper()]
        for c in cols:
            s = n["types"].get(c)
            row.append(s["status"] if s else "NOT SENT")
            if s and s["status"] == "NACKED":
                errors.append(f"{n['node']} {c} (keeps {s['acked_version'] or 'nothing'}): {s['error']}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    if errors:
        lines += ["", "NACKs:"] + [f"  {e}" for e in errors]
    return "\n".join(lines)
