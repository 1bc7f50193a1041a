"""`python -m benchmarks xds_change` runs end to end (a small mesh) and records every stage."""
from __future__ import annotations

import json

from benchmarks import bench_xds_change


def test_small_run_records_every_stage(tmp_path, capsys):
    out = tmp_path / "xds_change.json"
    assert bench_xds_change.main(["--services", "40", "--shapes", "3", "--changes", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["shapes"] == 3 and doc["per_change"] == 1
    assert set(doc["ms"]) == {"load incremental", "load full", "build kept", "build fresh"}
    assert all(len(v) == 2 and all(ms > 0 for ms in v) for v in doc["ms"].values())
    table = capsys.readouterr().out
    assert "build" in table and "total" in table
