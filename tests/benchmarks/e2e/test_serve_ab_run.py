"""benchmarks/serve_ab.py end to end against this tree's own HEAD: the other commit is checked
out, installed over this venv's packages, served beside ours, measured, and its worktree removed."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from benchmarks import bench_peers

pytestmark = pytest.mark.e2e


def _worktrees() -> set[str]:
    out = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=bench_peers.ROOT, capture_output=True,
                         text=True, check=True).stdout
    return {line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")}


@pytest.mark.slow      # installs a second tree and measures both
def test_serve_ab_measures_both_trees_and_cleans_up():
    before = _worktrees()       # one left by an earlier, killed serve_ab run (or made by hand) is not this run's
    p = subprocess.run([sys.executable, "-m", "benchmarks.serve_ab", "HEAD", "--flags", "--qos-policy balanced",
                        "--concurrency", "2", "--seconds", "0.5", "--rounds", "1"],
                       cwd=bench_peers.ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    row = re.search(r"^\s+2\s+(\d+)/s\s+(\d+)/s\s+([0-9.]+)x\s+([0-9.]+) / ([0-9.]+)\s+(\d+) / (\d+)\s+"
                    r"([0-9.]+)x\s+\d+ \| \d+$", p.stdout, re.M)
    assert row and int(row[1]) > 0 and int(row[2]) > 0, p.stdout
    assert float(row[4]) > 0 and float(row[5]) > 0, p.stdout        # p99 old / new, ms
    assert int(row[6]) > 0 and int(row[7]) > 0 and float(row[8]) > 0, p.stdout     # server CPU µs a request
    left = _worktrees() - before
    assert not left, f"worktrees left behind: {left}"


def test_an_unknown_commit_is_refused_by_name():
    p = subprocess.run([sys.executable, "-m", "benchmarks.serve_ab", "no-such-rev-xyz"],
                       cwd=bench_peers.ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "no commit 'no-such-rev-xyz'" in p.stderr
