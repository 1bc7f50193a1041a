"""Bad config written into the watched directory: rejected whole, the last good config kept.

Each case writes a broken change set next to a working mesh, then checks
that /debug/configz names file, line, resource and field, that the control
plane logged it, that the served generation did not move, and that Envoy
still routes by the last good config.
"""
import os
import time

import pytest

from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import ControlPlane, mesh_envoy, remove_config, write_config
from mcp26.demo.stack.xds_scenario import GATEWAY_LABELS, Client, base_config, virtual_service

pytestmark = pytest.mark.e2e

NODE = "router~127.0.0.1~gw-b.default~default.svc.cluster.local"
JASON = {"end-user": "jason"}
VS = "VirtualService/default/reviews"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("bad-config"))
    ups = {v: EchoUpstream(v).start() for v in ("v1", "v2", "v3")}
    port = free_port()
    for name, text in base_config(port, {v: u.port for v, u in ups.items()}).items():
        write_config(d, name, text)
    cp = ControlPlane(d)
    envoy = mesh_envoy(cp, node_id=NODE, labels=GATEWAY_LABELS)
    client = Client(port)
    try:
        cp.start()
        envoy.start()
        cp.wait_synced(NODE, types=("CDS", "EDS", "LDS", "RDS"))
        yield {"cp": cp, "dir": d, "client": client, "good_vs": virtual_service(default=[("v1", None)])}
    finally:
        client.close()
        envoy.stop()
        cp.close()
        for u in ups.values():
            u.stop()


def vs_with(route_rule: str) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: reviews
  namespace: default
spec:
  hosts: ["*"]
  gateways: [gw]
  http:
{route_rule}"""


CASES = {
    "malformed-yaml": ({"virtualservice.yaml": "apiVersion: networking.istio.io/v1\nkind: VirtualService\n"
                        "metadata: {name: reviews\nspec: {}\n"},
                       {"file": "virtualservice.yaml", "message": "malformed YAML"}),
    "unknown-kind": ({"virtualservice.yaml": virtual_service(default=[("v3", None)]),   # a good change ...
                      "extra.yaml": "apiVersion: networking.istio.io/v1\nkind: VirtualServise\n"   # ... and a bad one
                                    "metadata: {name: typo, namespace: default}\nspec: {}\n"},
                     {"file": "extra.yaml", "resource": "VirtualServise/default/typo", "field": "kind",
                      "message": "unknown kind"}),
    "invalid-regex": ({"virtualservice.yaml": vs_with(
                          "  - match: [{uri: {regex: '/(unclosed'}}]\n"
                          "    route: [{destination: {host: reviews.mesh.local, subset: v3}}]\n")},
                      {"file": "virtualservice.yaml", "resource": VS, "field": "spec.http[0].match[0].uri.regex"}),
    "missing-subset": ({"virtualservice.yaml": vs_with(
                           "  - route: [{destination: {host: reviews.mesh.local, subset: v9}}]\n")},
                       {"file": "virtualservice.yaml", "resource": VS, "field": "spec.http[0].route[0].destination.subset",
                        "message": "v9"}),
    "weight-out-of-range": ({"virtualservice.yaml": vs_with(
                                "  - route:\n"
                                "    - {destination: {host: reviews.mesh.local, subset: v1}, weight: 180}\n"
                                "    - {destination: {host: reviews.mesh.local, subset: v3}, weight: -80}\n")},
                            {"file": "virtualservice.yaml", "resource": VS, "field": "spec.http[0].route[1].weight",
                             "message": "-80"}),
    "duplicate-hosts": ({"vs-copy.yaml": virtual_service(default=[("v3", None)], name="reviews-copy")},
                        {"file": "vs-copy.yaml", "resource": "VirtualService/default/reviews-copy",
                         "field": "spec.hosts[0]", "code": "IST0109"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_change_set_rejected_whole_last_good_served(mesh, case):
    files, expect = CASES[case]
    cp, c, d = mesh["cp"], mesh["client"], mesh["dir"]
    generation = cp.configz()["generation"]
    since = time.time()
    for name, text in files.items():
        write_config(d, name, text)
    try:
        rejected = cp.wait_rejected(since)
        errors = rejected["errors"]
        match = [e for e in errors if e["file"].endswith(expect["file"])
                 and all(v in e[k] for k, v in expect.items() if k not in ("file",))]
        assert match, f"no error like {expect} in {errors}"
        err = match[0]
        assert err["line"] > 0 and os.path.isabs(err["file"])
        assert f"{err['file']}:{err['line']}" in err["text"]
        assert err["text"] in cp.log_tail(200)            # the control plane logged it
        time.sleep(0.3)                                   # (were anything pushed, it would be by now)
        assert cp.configz()["generation"] == generation   # nothing applied
        assert c.count(5, JASON) == {"v2": 5} and c.count(5) == {"v1": 5}
    finally:
        for name in files:
            if name == "virtualservice.yaml":
                write_config(d, name, mesh["good_vs"])
            else:
                remove_config(d, name)
        cp.wait_generation_change(generation)
        assert cp.configz()["rejected"] is None
