"""What Envoy does when it NACKs, and when the control plane dies and comes back.

- A resource Envoy rejects (injected through the server's test hook, since
  our validation never lets one through): the node keeps serving the routes
  it last accepted, and /debug/syncz shows the NACK and Envoy's error.
- SIGKILL the control plane under steady traffic: Envoy keeps serving;
  restart it on the same port: Envoy reconnects and converges, and takes the
  next change. Both SotW and Delta; no request may fail throughout.
"""
import subprocess
import threading
import time

import pytest

from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import ControlPlane, mesh_envoy, write_config
from mcp26.demo.stack.xds_scenario import GATEWAY_LABELS, Client, base_config, virtual_service
from mcp26.xds.model.type_urls import ROUTE
from mcp26.serving.executables import executable

pytestmark = pytest.mark.e2e

NODE = "router~127.0.0.1~gw-r.default~default.svc.cluster.local"
JASON = {"end-user": "jason"}


@pytest.fixture(params=["sotw", "delta"])
def mesh(request, tmp_path):
    ups = {v: EchoUpstream(v).start() for v in ("v1", "v2", "v3")}
    gateway_port = free_port()
    for name, text in base_config(gateway_port, {v: u.port for v, u in ups.items()}).items():
        write_config(str(tmp_path), name, text)
    cp = ControlPlane(str(tmp_path))
    envoy = mesh_envoy(cp, node_id=NODE, delta=request.param == "delta", labels=GATEWAY_LABELS)
    client = Client(gateway_port)
    try:
        cp.start()
        envoy.start()
        cp.wait_synced(NODE, types=("CDS", "EDS", "LDS", "RDS"))
        yield {"cp": cp, "envoy": envoy, "client": client, "dir": str(tmp_path), "port": gateway_port}
    finally:
        client.close()
        envoy.stop()
        cp.close()
        for u in ups.values():
            u.stop()


def route_name(port):
    return f"http.{port}"


def test_nacked_route_keeps_previous_routes_and_syncz_shows_error(mesh):
    cp, c = mesh["cp"], mesh["client"]
    good = cp.node_sync(NODE)["types"]["RDS"]["acked_version"]
    # A RouteConfiguration Envoy must reject: RE2 has no lookahead.
    bad = {"name": route_name(mesh["port"]), "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
        {"match": {"safe_regex": {"regex": "/(?=x)"}}, "route": {"cluster": "outbound|80|v3|reviews.mesh.local"}}]}]}
    cp.inject([{"type_url": ROUTE, "name": bad["name"], "resource": bad}])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        rds = cp.node_sync(NODE)["types"]["RDS"]
        if rds["status"] == "NACKED":
            break
        time.sleep(0.05)
    assert rds["status"] == "NACKED", rds
    assert "regex" in rds["error"].lower() or "(?=" in rds["error"], rds["error"]
    assert rds["acked_version"] == good                 # the last accepted version, not the rejected one
    assert rds["nacked_version"] != good
    status = subprocess.run([executable("mcpctl"), "proxy-status",
                             "--admin-address", f"127.0.0.1:{cp.admin_port}"],
                            capture_output=True, text=True, timeout=60)
    row = next(line for line in status.stdout.splitlines() if line.startswith(NODE))
    assert row.split()[3:7] == ["SYNCED", "SYNCED", "SYNCED", "NACKED"], status.stdout   # CDS EDS LDS RDS
    assert f"keeps {good}" in status.stdout and rds["error"][:40] in status.stdout
    # Envoy still routes by what it accepted before.
    assert c.count(10, JASON) == {"v2": 10} and c.count(10) == {"v1": 10}
    assert any(k.endswith("update_rejected") and v >= 1 for k, v in mesh["envoy"].stats("rds").items())
    # A later good change is taken and clears the NACK.
    cp.inject([])
    write_config(mesh["dir"], "virtualservice.yaml", virtual_service(default=[("v3", None)]))
    c.wait_for(lambda u: u == "v3")
    cp.wait_synced(NODE, types=("RDS",))
    assert cp.node_sync(NODE)["types"]["RDS"]["error"] == ""


def pushed_resources(cp) -> float:
    total = 0.0
    for line in cp.get("/metrics")[1].splitlines():
        if line.startswith("xds_pushed_resources_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Load(threading.Thread):
    """Steady requests to the gateway, counting every failure."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.client = Client(port)
        self.ok, self.failed, self.errors = 0, 0, []
        self.running = True

    def run(self):
        while self.running:
            try:
                status, upstream, _ = self.client.get(timeout=2)
                if status == 200 and upstream:
                    self.ok += 1
                else:
                    self.failed += 1
                    self.errors.append(status)
            except OSError as e:
                self.failed += 1
                self.errors.append(repr(e))
            time.sleep(0.002)

    def stop(self):
        self.running = False
        self.join(5)
        self.client.close()


def test_control_plane_killed_and_restarted_envoy_serves_throughout(mesh):
    cp, envoy = mesh["cp"], mesh["envoy"]
    load = Load(mesh["port"])
    load.start()
    try:
        time.sleep(0.3)
        cp.kill()
        served_before = load.ok
        time.sleep(1.5)
        assert load.ok > served_before                  # Envoy keeps serving with the control plane gone
        assert any(k.endswith("control_plane.connected_state") and v == 0
                   for k, v in envoy.stats("control_plane").items())
        cp.start()                                      # same ports, same directory
        cp.wait_synced(NODE, types=("CDS", "EDS", "LDS", "RDS"))
        if cp.node_sync(NODE)["protocol"] == "delta":
            # initial_resource_versions matched every content hash: nothing was resent.
            assert pushed_resources(cp) == 0, cp.get("/metrics")[1]
        assert any(k.endswith("control_plane.connected_state") and v == 1
                   for k, v in envoy.stats("control_plane").items())
        # Converged: the restarted control plane's next change reaches Envoy.
        write_config(mesh["dir"], "virtualservice.yaml", virtual_service(default=[("v3", None)]))
        Client(mesh["port"]).wait_for(lambda u: u == "v3")
        time.sleep(0.2)
    finally:
        load.stop()
    assert load.failed == 0, load.errors[:5]
    assert load.ok > 100
    # No listener was drained and re-added by the reconnect (no full reset).
    assert envoy.stats("listener_manager.total_listeners_draining").get(
        "listener_manager.total_listeners_draining", 0) == 0
    assert envoy.stats("listener_manager.listener_removed").get("listener_manager.listener_removed", 0) == 0
