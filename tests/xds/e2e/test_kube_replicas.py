"""Two control-plane replicas on one API server (skipped where $MCP_KUBE_APISERVER is unset):
they serve identical resources at identical versions; an Envoy whose bootstrap lists both
loses the one it is on to kill -9 under steady traffic, moves to the other, fails no
request, and takes the next change from the survivor (measured as test_xds_resilience.py's
kill -9 test measures it)."""
import json
import time

import pytest

from mcp26.demo.stack.control_plane import ControlPlane
from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.xds_scenario import GATEWAY_LABELS, Client, base_config, virtual_service
from mcp26.xds.bootstrap import envoy_bootstrap

import threading

pytestmark = [pytest.mark.e2e, pytest.mark.adversarial]

NODE = "router~127.0.0.1~gw-k.default~default.svc.cluster.local"
TYPES = ("CDS", "EDS", "LDS", "RDS")


class Load(threading.Thread):
    """Steady requests through the gateway; a failure is a non-200 or a connection error."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.client, self.ok, self.failed, self.errors, self.running = Client(port), 0, 0, [], True

    def run(self):
        while self.running:
            try:
                status, upstream, _ = self.client.get(timeout=2)
                ok = status == 200 and upstream
            except OSError as e:
                ok, status = False, repr(e)
            self.ok += bool(ok)
            if not ok:
                self.failed += 1
                self.errors.append(status)
            time.sleep(0.002)

    def stop(self):
        self.running = False
        self.join(5)


def versions(cp: ControlPlane, node: str) -> dict:
    return {t: s["acked_version"] for t, s in cp.node_sync(node)["types"].items()}


def test_two_replicas_serve_the_same_and_a_kill_moves_proxies_without_a_failed_request(kube):
    ups = {v: EchoUpstream(v).start() for v in ("v1", "v2", "v3")}
    gateway_port = free_port()
    config = base_config(gateway_port, {v: u.port for v, u in ups.items()})
    kube.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(config.values()))
    cps = [ControlPlane(None, kubeconfig=kube.kubeconfig, extra_args=["--no-status"]) for _ in range(2)]
    envoys = []
    try:
        for cp in cps:
            cp.start()
        # Each replica alone: the same resources at the same versions (content hashes).
        alone = []
        for i, cp in enumerate(cps):
            admin = free_port()
            e = Envoy(envoy_bootstrap(node_id=f"{NODE}-{i}", xds_address=cp.address, admin_port=admin,
                                      labels=GATEWAY_LABELS), admin_port=admin).start(wait_ready=False)
            envoys.append(e)
            alone.append(cp)
        for i, cp in enumerate(cps):
            cp.wait_synced(f"{NODE}-{i}", types=TYPES)
        assert versions(cps[0], f"{NODE}-0") == versions(cps[1], f"{NODE}-1")
        dumps = [e.config_dump() for e in envoys]
        def dynamic(dump):       # {kind: [(version, resource)]} of what came over xDS
            out = {}
            for c in dump["configs"]:
                for key in ("dynamic_active_clusters", "dynamic_route_configs", "dynamic_listeners"):
                    if key in c:
                        out[key] = sorted((e.get("version_info"), json.dumps(
                            e.get("cluster") or e.get("route_config") or e.get("active_state", {}).get("listener"),
                            sort_keys=True)) for e in c.get(key) or [])     # (a Struct's map has no order)
            return out
        assert dynamic(dumps[0]) == dynamic(dumps[1]) and dynamic(dumps[0])["dynamic_active_clusters"]
        for e in envoys:        # they hold the gateway's port too (SO_REUSEPORT): only the next one may
            e.stop()
        envoys.clear()
        # One Envoy listing both; it is on one of them.
        admin = free_port()
        both = Envoy(envoy_bootstrap(node_id=NODE, xds_address=f"{cps[0].address},{cps[1].address}",
                                     admin_port=admin, labels=GATEWAY_LABELS), admin_port=admin)
        envoys.append(both.start())
        deadline = time.monotonic() + 20
        while not any(cp.node_sync(NODE) for cp in cps):
            assert time.monotonic() < deadline, "the Envoy with both replicas never connected"
            time.sleep(0.1)
        on, other = (cps[0], cps[1]) if cps[0].node_sync(NODE) else (cps[1], cps[0])
        on.wait_synced(NODE, types=TYPES)
        client = Client(gateway_port)
        client.wait_for(lambda u: u == "v1")
        load = Load(gateway_port)
        load.start()
        try:
            time.sleep(0.5)
            on.kill()
            other.wait_synced(NODE, types=TYPES, timeout=30)       # moved to the survivor
            # and takes the next change from it
            kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                         input=virtual_service(default=[("v3", None)]))
            try:
                client.wait_for(lambda u: u == "v3", timeout=30)
            except TimeoutError as e:       # say what the survivor had then
                raise AssertionError(f"{e}; survivor: {other.configz()}; its view of the node: {other.node_sync(NODE)}; "
                                     f"Envoy: {both.stats('control_plane')}\n{other.log_tail()[-2000:]}\n"
                                     f"{both.log_tail()}") from None
            time.sleep(0.3)
        finally:
            load.stop()
        print(f"replicas: {load.ok} requests ok, {load.failed} failed across the kill")
        assert load.failed == 0, load.errors[:5]
        assert load.ok > 100
    finally:
        for e in envoys:
            e.stop()
        for cp in cps:
            cp.close()
        for u in ups.values():
            u.stop()
