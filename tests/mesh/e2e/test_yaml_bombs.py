"""YAML built to exhaust the parser: an alias bomb, a recursive alias, deep nesting.

767 bytes of nested anchors once grew the control plane past 4.2 GB. Each is now
refused with `file:line: error: Kind/ns/name: field: refused YAML: ...`, by the
control plane's loader, by a running control plane and by `mcpctl validate`, and
memory stays bounded: the loaders run in a child under a 1 GiB address-space
limit and a timeout, and their peak RSS is measured.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from mcp26.demo.stack.control_plane import ControlPlane, write_config
from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.parse import parse_documents
from mcp26.serving.executables import executable

pytestmark = [pytest.mark.e2e, pytest.mark.adversarial]

MCPCTL = executable("mcpctl")
LIMIT_AS = 1 << 30          # the child may not map more than 1 GiB
PEAK_RSS_MB = 300           # what the refusing child may reach at most (imports included)


def alias_bomb(levels: int = 9) -> str:
    """The reported bomb: l0 = 9 strings, l{i} = 9 aliases of l{i-1}, `extra: *l8` (9^9 leaves)."""
    rows = ["    l0: &l0 [" + ", ".join(['"lol"'] * 9) + "]"]
    rows += [f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    rows.append(f"    extra: *l{levels - 1}")
    return textwrap.dedent("""\
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata:
          name: reviews
          namespace: default
        spec:
          hosts: [reviews.mesh.local]
          http:
          - route: [{destination: {host: reviews.mesh.local}}]
          tags:
        """) + "\n".join(rows) + "\n"


# A child's ru_maxrss starts at the size of the process it was forked (or vforked) from, and a
# full test run grows this one (388 MB seen). So a small launcher process forks the loader and
# reports the loader's own peak (wait4) through a file: the launcher is what this process forks.
LAUNCHER = f"""import os, resource, sys
pid = os.fork()
if pid == 0:
    resource.setrlimit(resource.RLIMIT_AS, ({LIMIT_AS}, {LIMIT_AS}))
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_limited(args, timeout=60):
    """Run `args` under RLIMIT_AS and a timeout -> (returncode, stdout, stderr, peak RSS MB, seconds).
    The peak is this child's own (wait4 in the launcher), not the largest of every child so far."""
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.NamedTemporaryFile("r") as peak:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, peak.name, *args], stdout=out, stderr=err,
                                text=True, start_new_session=True)
        killer = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
        killer.start()
        try:
            proc.wait()
        finally:
            killer.cancel()
        out.seek(0), err.seek(0)
        peak_kb = int(peak.read() or 0)
        return proc.returncode, out.read(), err.read(), peak_kb / 1024, time.monotonic() - started


def test_the_bomb_is_small():
    assert 600 <= len(alias_bomb()) <= 900       # the report's 767 bytes, give or take the names


def test_control_plane_loader_refuses_the_bomb_with_bounded_memory(tmp_path):
    (tmp_path / "vs.yaml").write_text(alias_bomb())
    code = ("import sys\nfrom mcp26.xds.incremental_load import IncrementalLoader\n"
            "from mcp26.mesh.diagnostics import ConfigError\n"
            "try:\n    IncrementalLoader()(sys.argv[1])\nexcept ConfigError as e:\n    print(e); sys.exit(3)\n")
    rc, out, err, peak_mb, took = run_limited([sys.executable, "-c", code, str(tmp_path)])
    assert rc == 3, (rc, out[-2000:], err[-2000:], peak_mb, took)
    assert f"{tmp_path / 'vs.yaml'}:" in out and "error: VirtualService/default/reviews: spec.tags" in out
    assert "excessive aliasing" in out, out
    print(f"peak RSS {peak_mb:.0f} MB, {took:.1f} s")
    assert peak_mb < PEAK_RSS_MB and took < 30, (peak_mb, took)


def test_mcpctl_validate_refuses_the_bomb_with_bounded_memory(tmp_path):
    (tmp_path / "vs.yaml").write_text(alias_bomb())
    rc, out, err, peak_mb, took = run_limited([MCPCTL, "validate", str(tmp_path / "vs.yaml")])
    assert rc == 1, (rc, out, err[-2000:], peak_mb, took)
    assert f"{tmp_path / 'vs.yaml'}:" in out and "VirtualService/default/reviews" in out
    assert "refused YAML: excessive aliasing" in out, out
    print(f"peak RSS {peak_mb:.0f} MB, {took:.1f} s")
    assert peak_mb < PEAK_RSS_MB and took < 30, (peak_mb, took)


def test_running_control_plane_rejects_the_bomb_and_stays_healthy(tmp_path):
    write_config(str(tmp_path), "se.yaml", "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\n"
                 "metadata: {name: a}\nspec: {hosts: [a.example], resolution: NONE, "
                 "ports: [{number: 80, name: http, protocol: HTTP}]}\n")
    with ControlPlane(str(tmp_path)) as cp:
        gen = cp.configz()["generation"]
        assert gen
        since = time.time()
        write_config(str(tmp_path), "vs.yaml", alias_bomb())
        rejected = cp.wait_rejected(since, timeout=15)
        text = json.dumps(rejected)
        assert "vs.yaml" in text and "excessive aliasing" in text and "VirtualService/default/reviews" in text
        status, body = cp.get("/healthz")
        assert status == 200 and json.loads(body)["generation"] == gen     # the last good config kept
        rss_kb = int(next(l for l in open(f"/proc/{cp.proc.pid}/status") if l.startswith("VmHWM")).split()[1])
        assert rss_kb < PEAK_RSS_MB * 1024, rss_kb


@pytest.mark.parametrize("text, message, field", [
    ("spec: &a {hosts: [x], loop: *a}\n", "recursive alias", "spec.loop"),
    ("spec: {hosts: [x], deep: " + "[" * 300 + "]" * 300 + "}\n", "nested deeper than 200 levels", "spec.deep"),
])
def test_recursion_and_depth_are_refused_with_file_line_and_field(text, message, field):
    head = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: ns}\n"
    with pytest.raises(ConfigError) as e:
        parse_documents(head + text, file="r.yaml")
    d = e.value.diagnostics[0]
    assert (d.file, d.resource, d.line) == ("r.yaml", "VirtualService/ns/r", 4), str(d)
    assert d.field.startswith(field) and message in d.message, str(d)


def test_ordinary_anchors_and_a_large_file_still_parse():
    reused = "".join(f"  - match: [{{uri: {{prefix: /p{i}}}}}]\n    headers: "
                     + ("&h {request: {set: {a: b, c: d}}}" if i == 0 else "*h") + "\n" for i in range(500))
    vs = parse_documents("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: x}\n"
                         "spec:\n  hosts: [a]\n  http:\n" + reused)[0]
    assert vs.spec["http"][499]["headers"] == {"request": {"set": {"a": "b", "c": "d"}}}
    from benchmarks.bench_config_load import service
    big = "---\n".join(service(i) for i in range(1000))      # 1,000 services in one file
    assert len(parse_documents(big, file="big.yaml")) == 3000
