"""Flows the loop marked (upgrade-flow actions), shared with the Endpoint Picker as a small file:
the loop writes it (atomically: a temp file renamed) when its marks change, the picker re-reads
it when its mtime changes (checked at most every `check_s`) and looks a request's downstream
address up: Envoy's `source.address` request attribute, the very connection the kernel sampled.
Never x-forwarded-for: its first entry is the client's to write, so any client could claim a
marked flow's address.

    {"flows": {"CLIENT_IP:PORT": {"class": "latency-critical", "expires_at": UNIX_S, "flow": "..."}}}
"""
from __future__ import annotations

import json
import os
import time


def client_of(flow: str) -> str:
    """"src_ip:src_port->dst_ip:dst_port" -> "src_ip:src_port"."""
    return flow.split("->", 1)[0]


def write_marks(path: str, flows: dict[str, dict]) -> None:
    doc = {"flows": {client_of(k): {"class": v["class"], "expires_at": v["expires_at"], "flow": k}
                     for k, v in flows.items()}}
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


class FlowMarks:
    def __init__(self, path: str, check_s: float = 0.02):
        self.path, self.check_s = path, check_s
        self._marks: dict[str, dict] = {}
        self._mtime = None
        self._checked = 0.0

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.check_s:
            return
        self._checked = now
        try:
            mtime = os.stat(self.path).st_mtime_ns
            if mtime == self._mtime:
                return
            with open(self.path) as f:
                self._marks = json.load(f).get("flows", {})
            self._mtime = mtime
        except (OSError, ValueError):
            self._marks, self._mtime = {}, None

    def lookup(self, source_address: str | None) -> str | None:
        """The class the flow from `source_address` (IP:PORT) was marked with, or None."""
        self._refresh()
        now = time.time()
        mark = self._marks.get(source_address or "")
        return mark["class"] if mark and mark["expires_at"] > now else None
