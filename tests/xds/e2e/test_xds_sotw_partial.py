"""A SotW push of routes carries only the changed RouteConfiguration, and a real Envoy
keeps serving the one left out (xDS "Grouping Resources into Responses": every type
but LDS and CDS is grouped as Delta groups it; xds.ads_protocol).

Two Gateways on two ports give the gateway Envoy two RouteConfigurations. A change
to the route on one port must land there while the other port keeps answering from
its own route; Envoy's RDS stats say only the changed one was handed an update
(update_attempt: with the whole set both were), and a later change to the one left
out lands as well.
"""
import pytest

from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import ControlPlane, mesh_envoy, write_config
from mcp26.demo.stack.xds_scenario import GATEWAY_LABELS, Client, base_config, virtual_service

pytestmark = pytest.mark.e2e

NODE = "router~127.0.0.1~gw-partial.default~default.svc.cluster.local"


def second_gateway(port: int) -> str:
    """The scenario's Gateway, named gw2, on `port`."""
    return base_config(port, {})["gateway.yaml"].replace("name: gw,", "name: gw2,")


def on_gw2(subset: str) -> str:
    return virtual_service(default=[(subset, None)], name="reviews2").replace("gateways: [gw]", "gateways: [gw2]")


def rds_updates(envoy) -> dict[str, int]:
    """RouteConfiguration name -> updates Envoy's RDS subscription for it was handed."""
    stats = envoy.stats(r"\.rds\..*\.update_attempt$")
    return {k.split(".rds.", 1)[1].rsplit(".", 1)[0]: v for k, v in stats.items()}


def test_a_sotw_route_push_sends_only_the_changed_route_and_envoy_keeps_the_other(tmp_path):
    d = str(tmp_path)
    ups = {v: EchoUpstream(v).start() for v in ("v1", "v2", "v3")}
    port1, port2 = free_port(), free_port()
    for name, text in base_config(port1, {v: u.port for v, u in ups.items()}).items():
        write_config(d, name, text)
    write_config(d, "gateway2.yaml", second_gateway(port2))
    write_config(d, "virtualservice2.yaml", on_gw2("v2"))
    cp = ControlPlane(d)
    envoy = mesh_envoy(cp, node_id=NODE, delta=False, labels=GATEWAY_LABELS)
    one, two = Client(port1), Client(port2)
    try:
        cp.start()
        envoy.start()
        cp.wait_synced(NODE, types=("CDS", "EDS", "LDS", "RDS"))
        one.wait_for(lambda u: u == "v1")
        two.wait_for(lambda u: u == "v2")
        before = rds_updates(envoy)
        assert len(before) == 2, before              # one RouteConfiguration per port

        cp.apply("virtualservice.yaml", virtual_service(default=[("v3", None)]), node_id=NODE)
        one.wait_for(lambda u: u == "v3")
        assert two.count(20) == {"v2": 20}           # the route left out of the push still serves
        after = rds_updates(envoy)
        grew = sorted(n for n in after if after[n] > before[n])
        assert grew == [f"http.{port1}"], (before, after)     # port 2's was not in the response

        cp.apply("virtualservice2.yaml", on_gw2("v1"), node_id=NODE)      # and it still takes changes
        two.wait_for(lambda u: u == "v1")
        assert one.count(20) == {"v3": 20}
        assert cp.node_sync(NODE)["types"]["RDS"]["status"] == "SYNCED"
    finally:
        one.close()
        two.close()
        envoy.stop()
        cp.close()
        for u in ups.values():
            u.stop()
