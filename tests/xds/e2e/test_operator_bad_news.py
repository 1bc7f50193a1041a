"""Bad news where operators look: a change set rejected whole and a NACK show in
`mcpctl proxy-status` (and its exit code) and in /metrics, under mesh's names and
istiod's; `mcpctl version` reads the control plane and its proxies' Envoy version."""
import json
import signal
import re
import subprocess
import time

import pytest
import yaml

from mcp26.demo.stack.control_plane import ControlPlane, mesh_envoy, write_config
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.xds_scenario import GATEWAY_LABELS, base_config, virtual_service
from mcp26.serving.executables import executable
from mcp26.xds.model.type_urls import ROUTE

pytestmark = pytest.mark.e2e

NODE = "router~127.0.0.1~gw-o.default~default.svc.cluster.local"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("operator"))
    ups = {v: EchoUpstream(v).start() for v in ("v1", "v2", "v3")}
    port = free_port()
    for name, text in base_config(port, {v: u.port for v, u in ups.items()}).items():
        write_config(d, name, text)
    cp = ControlPlane(d)
    envoy = mesh_envoy(cp, node_id=NODE, labels=GATEWAY_LABELS)
    try:
        cp.start()
        envoy.start()
        cp.wait_synced(NODE, types=("CDS", "EDS", "LDS", "RDS"))
        yield {"cp": cp, "dir": d, "envoy": envoy}
    finally:
        envoy.stop()
        cp.close()
        for u in ups.values():
            u.stop()


def mcpctl(*args, env=None):
    return subprocess.run([executable("mcpctl"), *args], capture_output=True, text=True, timeout=60, env=env)


def scrape(cp) -> str:
    status, text = cp.get("/metrics")
    assert status == 200
    return text


def sample(text: str, name: str, **labels) -> float | None:
    for line in text.splitlines():
        m = re.match(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            return float(m.group(2))
    return None


def test_metrics_carry_istiod_names_and_one_library(mesh):
    text = scrape(mesh["cp"])
    envoy_version = re.search(r'pilot_xds\{version="(\d+\.\d+\.\d+)"\} 1\.0', text)
    assert envoy_version, text                              # one Envoy, by its build version
    assert "# TYPE pilot_xds_pushes untyped" in text        # istiod's name: no `_total`
    assert sample(text, "pilot_xds_pushes", type="cds") >= 1 and sample(text, "pilot_xds_pushes", type="rds") >= 1
    assert 'pilot_proxy_convergence_time_bucket{le="0.1"}' in text      # istiod's buckets
    assert "otel_scope" not in text                          # prometheus_client alone
    # the translate histogram is in seconds: the sample lands within a decade of its value
    count, total = sample(text, "xds_translate_duration_seconds_count"), sample(text, "xds_translate_duration_seconds_sum")
    assert count >= 1
    first = min(float(le) for le, n in re.findall(r'xds_translate_duration_seconds_bucket\{le="([^"]+)"\} (\S+)', text)
                if le != "+Inf" and float(n) == count)
    assert first <= max(10 * total / count, 0.005), (first, total / count)


def test_version_shows_control_plane_and_envoy(mesh):
    out = mcpctl("version", "-o", "json", "--control-plane", f"127.0.0.1:{mesh['cp'].admin_port}")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["controlPlane"]["version"] == doc["client"]["version"]
    assert [p["count"] for p in doc["dataPlane"]] == [1] and re.fullmatch(r"\d+\.\d+\.\d+", doc["dataPlane"][0]["version"])


def test_rejected_change_set_shows_in_proxy_status_and_metrics(mesh):
    cp, d = mesh["cp"], mesh["dir"]
    admin = f"http://127.0.0.1:{cp.admin_port}"
    ok = mcpctl("proxy-status", "--control-plane", admin)
    assert ok.returncode == 0 and "CONFIG REJECTED" not in ok.stdout, ok.stdout
    assert sample(scrape(cp), "xds_config_last_rejected_timestamp_seconds") == 0
    generation = cp.configz()["generation"]
    since = time.time()
    write_config(d, "virtualservice.yaml", virtual_service(default=[("v9", None)]))     # no such subset
    try:
        cp.wait_rejected(since)
        out = mcpctl("proxy-status", env={"MCPCTL_CONTROL_PLANE": admin, "PATH": "/usr/bin:/bin"})
        assert out.returncode == 3, out
        row = next(line for line in out.stdout.splitlines() if line.startswith(NODE))
        assert row.split()[3:7] == ["SYNCED"] * 4                                  # the proxies are fine ...
        tail = out.stdout[out.stdout.index("CONFIG REJECTED"):]                        # ... the change set is not
        assert f"every proxy keeps {generation}" in tail
        assert re.search(r"virtualservice\.yaml:\d+: error IST0101: VirtualService/default/reviews: .*v9", tail), tail
        doc = yaml.safe_load(mcpctl("proxy-status", "-o", "yaml", "--control-plane", admin).stdout)
        assert doc["config"]["rejected"]["errors"][0]["line"] > 0
        text = scrape(cp)
        assert sample(text, "xds_config_last_rejected_timestamp_seconds") >= since
        assert sample(text, "xds_config_rejected_total") >= 1 and sample(text, "xds_config_rejected_errors") >= 1
    finally:
        write_config(d, "virtualservice.yaml", virtual_service(default=[("v2", None)]))   # a change: pushed
        cp.wait_generation_change(generation)
        cp.wait_synced(NODE, types=("RDS",))
    assert mcpctl("proxy-status", "--control-plane", admin).returncode == 0
    text = scrape(cp)
    assert sample(text, "xds_config_rejected_errors") == 0
    assert sample(text, "pilot_proxy_convergence_time_count") >= 1    # the fix was pushed to the proxy


def test_a_nack_is_counted_by_type_and_node(mesh):
    cp = mesh["cp"]
    good = cp.node_sync(NODE)["types"]["RDS"]["acked_version"]
    name = next(iter(cp.config_dump(NODE)["resources"]["RDS"]))
    # A RouteConfiguration Envoy must reject: RE2 has no lookahead.
    route = {"name": name, "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
        {"match": {"safe_regex": {"regex": "/(?=x)"}}, "route": {"cluster": "outbound|80|v3|reviews.mesh.local"}}]}]}
    cp.inject([{"type_url": ROUTE, "name": name, "resource": route}])
    try:
        deadline = time.monotonic() + 10
        while cp.node_sync(NODE)["types"]["RDS"]["status"] != "NACKED" and time.monotonic() < deadline:
            time.sleep(0.05)
        out = mcpctl("proxy-status", "--admin-address", f"127.0.0.1:{cp.admin_port}")
        assert out.returncode == 3 and f"keeps {good}" in out.stdout, out.stdout
        text = scrape(cp)
        assert sample(text, "pilot_total_xds_rejects", type="rds") >= 1
        assert sample(text, "xds_nacks_total", type="RDS", node=NODE) >= 1
    finally:
        cp.inject([])
        cp.wait_synced(NODE, types=("RDS",))


def test_xds_serve_writes_the_context_that_proxy_status_reads(tmp_path, monkeypatch):
    context = tmp_path / "context.yaml"
    monkeypatch.setenv("MCPCTL_CONTEXT", str(context))
    monkeypatch.delenv("MCPCTL_CONTROL_PLANE", raising=False)
    (tmp_path / "config").mkdir()
    with ControlPlane(str(tmp_path / "config"), extra_args=["--write-context"]) as cp:
        doc = yaml.safe_load(context.read_text())
        assert doc["controlPlane"] == f"http://127.0.0.1:{cp.admin_port}" and doc["writtenBy"] == "mcpctl xds serve"
        out = mcpctl("proxy-status")                       # no flag, no variable: the context file
        assert out.returncode == 0 and out.stdout.startswith("NAME"), out
        assert mcpctl("version", "-o", "json").returncode == 0
        cp.proc.send_signal(signal.SIGINT)                 # Ctrl-C: a clean stop removes the context it wrote
        cp.proc.wait(30)
        assert not context.exists()


def test_xds_serve_stops_cleanly_on_sigterm(tmp_path, monkeypatch):
    """A Pod's stop (SIGTERM) is a clean stop too: exit 0, the context it wrote removed."""
    context = tmp_path / "context.yaml"
    monkeypatch.setenv("MCPCTL_CONTEXT", str(context))
    (tmp_path / "config").mkdir()
    with ControlPlane(str(tmp_path / "config"), extra_args=["--write-context"]) as cp:
        assert context.exists()
        cp.proc.send_signal(signal.SIGTERM)
        assert cp.proc.wait(30) == 0
        assert not context.exists()
