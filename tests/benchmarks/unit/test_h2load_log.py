"""benchmarks/h2load_log.py: h2load's per-request log as the benchmarks read it."""
from __future__ import annotations

from benchmarks import h2load_log


def test_read_and_summarise_an_h2load_log(tmp_path):
    log = tmp_path / "h2load.log"
    # start (us, wall clock), HTTP status, latency (us): as h2load --log-file writes
    log.write_text("1000\t200\t250\n2500\t200\t300\n\n3000\t503\t90\n4000\t200\t260\n")
    rows = h2load_log.read(str(log))
    assert rows == [(1000, 200, 250), (2500, 200, 300), (3000, 503, 90), (4000, 200, 260)]
    got = h2load_log.summary(rows)
    assert (got["ok"], got["errors"], got["span_s"]) == (3, 1, 0.003)
    assert (got["p50_ms"], got["p99_ms"]) == (0.26, 0.3)     # of the 200s only
    assert h2load_log.summary([]) == {"ok": 0, "errors": 0, "span_s": 0.0, "p50_ms": None, "p99_ms": None}
