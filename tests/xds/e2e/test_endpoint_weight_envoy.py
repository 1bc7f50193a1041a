"""The decision loop's endpoint weights through real Envoy: `mcpctl xds serve` takes a POST
/scheduler/endpoint-weight of 9:1 on its loopback admin API and pushes the cluster's EDS
assignment with those weights (SotW and Delta); the split of real requests at the two echo
upstreams (127.0.0.2, 127.0.0.3) moves to about 9:1 while CDS and LDS are not sent again;
at the (short) expiry the translated weights come back and the split is even again. Bad
input is refused with the field named, and nothing is applied."""
import asyncio
import json
import re
import sys
import time
import urllib.request

import pytest
from aiohttp import web

from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import ControlPlane, mesh_envoy, write_config
from mcp26.demo.stack.xds_scenario import GATEWAY_LABELS, Client
from mcp26.scheduler.decisions import Action
from mcp26.scheduler.loop.actions import ActionApplier
from mcp26.scheduler.loop.loop import DecisionLoop
from mcp26.scheduler.loop.service import make_app
from harness.manifests import documents, manifest

pytestmark = pytest.mark.e2e

NODE = "router~127.0.0.1~gw-w.default~default.svc.cluster.local"
HOSTS = ("127.0.0.2", "127.0.0.3")
CLUSTER = "outbound|80||weighted.mesh.local"
N = 100


def _config(gw_port: int, ports: dict) -> str:
    eps = "\n".join(f"  - {{address: {h}, ports: {{http: {p}}}}}" for h, p in ports.items())
    return documents(manifest("gateway.yaml", gw_port=gw_port), f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: weighted, namespace: default}}
spec:
  hosts: [weighted.mesh.local]
  location: MESH_INTERNAL
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints:
{eps}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: weighted, namespace: default}}
spec:
  host: weighted.mesh.local
  trafficPolicy: {{loadBalancer: {{simple: ROUND_ROBIN}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: weighted, namespace: default}}
spec:
  hosts: ["*"]
  gateways: [gw]
  http: [{{route: [{{destination: {{host: weighted.mesh.local}}}}]}}]
""")


@pytest.fixture(scope="module", params=["sotw", "delta"])
def mesh(request, tmp_path_factory):
    config_dir = str(tmp_path_factory.mktemp(f"weights-{request.param}"))
    ups = [EchoUpstream(h, host=h).start() for h in HOSTS]
    gw_port = free_port()
    write_config(config_dir, "mesh.yaml", _config(gw_port, {u.host: u.port for u in ups}))
    cp = ControlPlane(config_dir)
    envoy = mesh_envoy(cp, node_id=NODE, delta=request.param == "delta", labels=GATEWAY_LABELS,
                       namespace="default")
    client = Client(gw_port)
    try:
        cp.start()
        envoy.start()
        cp.wait_synced(NODE, types=("CDS", "EDS", "LDS", "RDS"))
        client.wait_for(lambda who: who in HOSTS)
        yield {"cp": cp, "envoy": envoy, "client": client, "ports": {u.host: u.port for u in ups}}
    finally:
        client.close()
        envoy.stop()
        cp.close()
        for u in ups:
            u.stop()


def _envoy_weights(envoy) -> dict:
    """host -> the weight Envoy's cluster manager holds for it (admin /clusters)."""
    out = {}
    for line in envoy.admin("/clusters")[1].splitlines():
        parts = line.split("::")
        if len(parts) == 4 and parts[0] == CLUSTER and parts[2] == "weight":
            out[parts[1].rsplit(":", 1)[0]] = int(parts[3])
    return out


def _wait_weights(envoy, want: dict, timeout=10.0):
    deadline = time.monotonic() + timeout
    while (got := _envoy_weights(envoy)) != want:
        assert time.monotonic() < deadline, f"Envoy holds {got}, expected {want}:\n{envoy.log_tail()}"
        time.sleep(0.02)


def _versions(envoy) -> dict:
    """The version_info of every dynamic cluster and listener Envoy holds (CDS, LDS)."""
    out = {}
    for c in envoy.config_dump()["configs"]:
        for key in ("dynamic_active_clusters", "dynamic_listeners"):
            for item in c.get(key, []):
                name = item.get("cluster", {}).get("name") or item.get("name")
                state = item.get("active_state", item)
                out[(key, name)] = state.get("version_info")
    return out


def _post(cp, body):
    status, text = cp.post("/scheduler/endpoint-weight", body)
    return status, json.loads(text)


def test_bad_input_is_refused_by_field_and_nothing_applied(mesh):
    cp, (a, b) = mesh["cp"], [f"{h}:{p}" for h, p in mesh["ports"].items()]
    exp = time.time() + 30
    cases = [
        ({"cluster": CLUSTER, "weights": {a: 0}, "expires_at": exp}, 400, f"weights['{a}']"),
        ({"cluster": CLUSTER, "weights": {a: 9, b: 129}, "expires_at": exp}, 400, f"weights['{b}']"),
        ({"cluster": CLUSTER, "weights": {a: 9}, "expires_at": time.time() - 1}, 400, "expires_at"),
        ({"cluster": CLUSTER, "weights": {a: 9}}, 400, "expires_at"),
        ({"weights": {a: 9}, "expires_at": exp}, 400, "cluster"),
        ({"cluster": "outbound|80||nowhere.mesh.local", "weights": {a: 9}, "expires_at": exp}, 404, "cluster"),
        ({"cluster": CLUSTER, "weights": {a: 9, "127.0.0.9:1": 1}, "expires_at": exp}, 404, "127.0.0.9:1"),
    ]
    for body, status, field in cases:
        got, doc = _post(cp, body)
        assert (got, doc["error"].startswith(field) or field in doc["error"]) == (status, True), (body, doc)
    assert json.loads(cp.get("/scheduler/endpoint-weight")[1])["endpoint_weights"] == []
    assert _envoy_weights(mesh["envoy"]) == {h: 1 for h in HOSTS}


def test_weights_move_the_split_and_expire(mesh):
    cp, envoy, client = mesh["cp"], mesh["envoy"], mesh["client"]
    even = client.count(N)
    assert set(even) == set(HOSTS) and all(30 <= v <= 70 for v in even.values()), even
    before = _versions(envoy)
    assert any(k[0] == "dynamic_active_clusters" for k in before) and any(k[0] == "dynamic_listeners" for k in before)
    (ha, pa), (hb, pb) = mesh["ports"].items()
    status, doc = _post(cp, {"cluster": CLUSTER, "weights": {f"{ha}:{pa}": 9, f"{hb}:{pb}": 1},
                             "expires_at": time.time() + 3.0})
    assert status == 200, doc
    assert {(w["endpoint"], w["weight"]) for w in doc["endpoint_weights"]} == {(f"{ha}:{pa}", 9), (f"{hb}:{pb}", 1)}
    _wait_weights(envoy, {ha: 9, hb: 1})
    split = client.count(N)
    assert split.get(ha, 0) >= 80 and split.get(hb, 0) >= 3, split
    assert _versions(envoy) == before          # only EDS was pushed: clusters and listeners are the same versions
    # the expiry: the control plane drops the weights and pushes the translated assignment
    _wait_weights(envoy, {ha: 1, hb: 1}, timeout=10)
    assert json.loads(cp.get("/scheduler")[1])["endpoint_weights"] == []
    again = client.count(N)
    assert all(30 <= again.get(h, 0) <= 70 for h in HOSTS), again


def test_delete_restores_at_once(mesh):
    cp, envoy = mesh["cp"], mesh["envoy"]
    (ha, pa), (hb, _) = mesh["ports"].items()
    assert _post(cp, {"cluster": CLUSTER, "weights": {f"{ha}:{pa}": 5}, "expires_at": time.time() + 60})[0] == 200
    _wait_weights(envoy, {ha: 5, hb: 1})
    status, text = cp.get("/scheduler/endpoint-weight")
    assert [w["weight"] for w in json.loads(text)["endpoint_weights"]] == [5]
    url = f"http://127.0.0.1:{cp.admin_port}/scheduler/endpoint-weight?cluster={urllib.request.quote(CLUSTER)}"
    with urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=5) as r:
        assert json.load(r)["removed"] == 1
    _wait_weights(envoy, {ha: 1, hb: 1})


def test_the_loops_applier_carries_endpoint_weights_and_status_shows_them(mesh):
    """scheduler/loop/actions.py: endpoint-weight actions through this control plane's API;
    `mcpctl scheduler status` shows them with their expiry; a bad one is the API's error."""
    cp, envoy = mesh["cp"], mesh["envoy"]
    (ha, pa), (hb, _) = mesh["ports"].items()
    applier = ActionApplier(f"127.0.0.1:{cp.admin_port}", weight_cluster=CLUSTER)
    loop = DecisionLoop(None, "test", lambda: [], applier)
    actions = [Action("endpoint-weight", f"{ha}:{pa}", weight=9, hold_s=4.0),
               Action("endpoint-weight", "127.0.0.9:1", weight=3),
               Action("endpoint-weight", f"{ha}:{pa}", value="outbound|80||nowhere.mesh.local", weight=2)]

    async def run():
        runner = web.AppRunner(make_app(loop), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            out = await applier.apply(actions, time.time(), flow_hold_s=1.0)
            again = await applier.apply(actions[:1], time.time(), flow_hold_s=1.0)
            await asyncio.to_thread(_wait_weights, envoy, {ha: 9, hb: 1})
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "mcp26.mesh.cli", "scheduler", "status", "--admin",
                f"127.0.0.1:{runner.addresses[0][1]}", stdout=asyncio.subprocess.PIPE)
            text = (await proc.communicate())[0].decode()
            return out, again, text
        finally:
            await applier.close()
            await runner.cleanup()

    out, again, text = asyncio.run(run())
    assert out[0]["applied"] and out[0]["cluster"] == CLUSTER, out[0]
    assert "404" in out[1]["error"] and "127.0.0.9:1" in out[1]["error"], out[1]
    assert "404" in out[2]["error"] and "cluster" in out[2]["error"], out[2]
    assert again[0].get("unchanged"), again          # the same weight within its hold is not posted again
    assert re.search(rf"in force: endpoint {ha}:{pa} weight 9 in {re.escape(CLUSTER)}, expires in [1-3]\.\d s",
                     text), text
    _wait_weights(envoy, {ha: 1, hb: 1}, timeout=10)   # the hold runs out at the control plane
    applier.expire(time.time())
    assert applier.in_force_weights(time.time()) == []
