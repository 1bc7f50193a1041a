"""A kubectl-style bookinfo (Services, ServiceAccounts, Deployments, a ConfigMap)
plus Gateway API routes, served by the control plane to a real Envoy: header
match, weights, redirect, mirror and segment-aware prefixes route as Gateway
API says; and validate, analyze and serve give the same verdict on the same
files (a bad route is refused by all three, and nothing changes in Envoy)."""
import collections
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from mcp26.demo.stack.ports import free_port, port_is_free
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import ConfigRejected, ControlPlane, mesh_envoy
from harness.paths import TEST_DATA

pytestmark = pytest.mark.e2e

DATA = os.path.join(TEST_DATA, "kube")
NODE = "router~127.0.0.1~bookinfo-gateway.bookinfo~bookinfo.svc.cluster.local"
ADDRESSES = {"productpage": "127.0.0.11", "reviews-v1": "127.0.0.12", "reviews-v2": "127.0.0.13"}


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None


OPENER = urllib.request.build_opener(NoRedirect)


def get(port, path, headers=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with OPENER.open(req, timeout=5) as r:
            import json
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, None, e.headers


@pytest.fixture(scope="module")
def stack():
    for _ in range(50):
        app_port = free_port(ADDRESSES["productpage"])
        if all(port_is_free(app_port, a) for a in ADDRESSES.values()):
            break
    gw_port = free_port()
    d = tempfile.mkdtemp(prefix="kube-gwapi-")
    for name in ("bookinfo.yaml", "gateway-api.yaml"):
        text = open(os.path.join(DATA, name)).read().replace("9080", str(app_port)).replace("port: 8080", f"port: {gw_port}")
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    ups = {name: EchoUpstream(name, port=app_port, host=addr).start() for name, addr in ADDRESSES.items()}
    try:
        with ControlPlane(d) as cp:
            with mesh_envoy(cp, node_id=NODE, namespace="bookinfo",
                            labels={"gateway.networking.k8s.io/gateway-name": "bookinfo-gateway"}) as envoy:
                cp.wait_synced(NODE, types=("CDS", "EDS", "LDS", "RDS"))
                deadline = time.monotonic() + 20
                while get(gw_port, "/productpage")[0] != 200:
                    assert time.monotonic() < deadline, envoy.log_tail() if hasattr(envoy, "log_tail") else ""
                    time.sleep(0.1)
                yield cp, gw_port, ups, d
    finally:
        for u in ups.values():
            u.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_header_match_goes_to_the_version_service(stack):
    _, port, _, _ = stack
    for _ in range(5):
        status, seen, _ = get(port, "/reviews", {"end-user": "jason"})
        assert status == 200 and seen["upstream"] == "reviews-v2"


def test_weights_split_between_services_and_the_header_modifier_applies(stack):
    _, port, ups, _ = stack
    counts = collections.Counter()
    for i in range(200):
        status, seen, _ = get(port, f"/reviews/{i}")
        assert status == 200 and seen["headers"]["x-route"] == "weighted"
        counts[seen["upstream"]] += 1
    assert set(counts) == {"reviews-v1", "reviews-v2"}
    assert 120 <= counts["reviews-v1"] <= 180, counts             # 3:1 -> 150 expected


def test_path_prefix_is_segment_aware(stack):
    _, port, _, _ = stack
    status, seen, _ = get(port, "/reviewsX")                      # not /reviews/...: the "/" rule
    assert status == 200 and seen["upstream"] == "productpage"


def test_redirect_answers_301_with_the_new_path(stack):
    _, port, ups, _ = stack
    status, _, headers = get(port, "/old")
    assert status == 301 and headers["location"].endswith("/productpage")
    time.sleep(0.2)
    assert not any(r["path"] == "/old" for u in ups.values() for r in u.requests)   # answered by Envoy


def test_mirror_sends_a_copy_to_the_mirror_backend(stack):
    _, port, ups, _ = stack
    mark = f"/productpage?m={time.time()}"
    status, seen, _ = get(port, mark)
    assert status == 200 and seen["upstream"] == "productpage"
    deadline = time.monotonic() + 5
    while not any(r["path"] == mark for name in ("reviews-v1", "reviews-v2") for r in ups[name].requests):
        assert time.monotonic() < deadline, "the mirrored copy never arrived"
        time.sleep(0.05)


def test_validate_analyze_and_serve_agree_on_the_same_files(mcpctl, stack):
    cp, port, _, d = stack
    for verb in ("validate", "analyze"):
        r = mcpctl(verb, d)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "skipping v1 ConfigMap" in r.stdout                   # said once, not an error
    assert cp.configz()["rejected"] is None
    bad = open(os.path.join(d, "gateway-api.yaml")).read().replace("value: /old}", "value: old}")
    tmp = tempfile.mkdtemp(prefix="kube-bad-")
    shutil.copy(os.path.join(d, "bookinfo.yaml"), tmp)
    with open(os.path.join(tmp, "gateway-api.yaml"), "w") as f:
        f.write(bad)
    for verb in ("validate", "analyze"):
        r = mcpctl(verb, tmp)
        assert r.returncode == 1 and "spec.rules[2].matches[0].path.value" in r.stdout, r.stdout + r.stderr   # findings on stdout, as istioctl
    with pytest.raises(ConfigRejected) as e:
        cp.apply("gateway-api.yaml", bad)
    assert "spec.rules[2].matches[0].path.value" in str(e.value)
    status, _, headers = get(port, "/old")                        # the last good config still serves
    assert status == 301
