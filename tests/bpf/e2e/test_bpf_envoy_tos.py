"""The two DSCP paths through the real Envoy, read off `lo` (AF_PACKET):

- no eBPF: a DestinationRule annotated `qos.mcp-mesh.io/class` is translated
  (xds.translate) into clusters whose upstream_bind_config carries
  IP_TOS = class.tos; Envoy's upstream connections carry that DSCP.
- eBPF by socket mark: a cluster with SO_MARK set (a socket option the control
  plane can push) and `--dscp-mark MARK=CLASS` in the tc marker on `lo`.
"""
from __future__ import annotations

import socket
import string
import urllib.request

import pytest

from mcp26.bpf import attach, tc
from mcp26.bpf.policy import build_policy
from mcp26.mesh.resources import MeshConfig
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.qos import QosClass
from harness.bpf_env import Capture, require_bpf, tcp_segments
from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.xds.translate import translate
from mcp26.xds.translate.static import static_bootstrap
from mcp26.xds.model.node import ProxyNode

pytestmark = pytest.mark.e2e
TCP_RST = 0x04

MESH = string.Template("""
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: edge, namespace: default}
spec:
  selector: {istio: ingressgateway}
  servers: [{port: {number: $GW, name: http, protocol: HTTP}, hosts: ["*"]}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: models, namespace: default}
spec:
  hosts: [models.mesh.local]
  ports: [{number: 8000, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints:
  - {address: 127.0.0.1, ports: {http: $V1}, labels: {version: v1}}
  - {address: 127.0.0.1, ports: {http: $V2}, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: plain, namespace: default}
spec:
  hosts: [plain.mesh.local]
  ports: [{number: 8000, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.1, ports: {http: $PLAIN}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: models
  namespace: default
  annotations:
    qos.mcp-mesh.io/class: interactive
    qos.mcp-mesh.io/class.v2: latency-critical
spec:
  host: models.mesh.local
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: models, namespace: default}
spec:
  hosts: ["*"]
  gateways: [edge]
  http:
  - match: [{uri: {prefix: /v1}}]
    route: [{destination: {host: models.mesh.local, subset: v1, port: {number: 8000}}}]
  - match: [{uri: {prefix: /v2}}]
    route: [{destination: {host: models.mesh.local, subset: v2, port: {number: 8000}}}]
  - route: [{destination: {host: plain.mesh.local, port: {number: 8000}}}]
""")


def upstream_tos(envoy_port: int, path: str, upstream_port: int) -> set[int]:
    """The TOS bytes of Envoy's segments to `upstream_port` during one request."""
    cap = Capture("lo", upstream_port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{envoy_port}{path}", timeout=10) as r:
            assert r.status == 200
        segs = tcp_segments(cap.frames(0.3), dport=upstream_port)
    finally:
        cap.close()
    assert segs, f"no segments to port {upstream_port} captured"
    # A bare RST answering a segment that arrives after Envoy's socket is gone
    # comes from the kernel with no socket (tcp_v4_send_reset reflects the
    # incoming TOS): IP_TOS cannot reach it, so it is not Envoy's to mark.
    return {tos for tos, flags, _, _ in segs if flags != TCP_RST}


@pytest.fixture
def capture_allowed():
    try:
        Capture("lo").close()
    except PermissionError:
        pytest.skip("AF_PACKET capture needs root (CAP_NET_RAW)")


def test_annotated_destination_rule_gives_upstream_connections_its_dscp(capture_allowed):
    ups = {name: EchoUpstream(name).start() for name in ("v1", "v2", "plain")}
    gw = free_port()
    config = MeshConfig(parse_documents(MESH.substitute(GW=gw, V1=ups["v1"].port, V2=ups["v2"].port,
                                                       PLAIN=ups["plain"].port), "mesh.yaml"))
    snap = translate(config, ProxyNode("router~127.0.0.1~gw.default~default.svc.cluster.local",
                                       kind="router", labels={"istio": "ingressgateway"}))
    try:
        with Envoy(static_bootstrap(snap)) as envoy:
            assert upstream_tos(gw, "/v1/infer", ups["v1"].port) == {QosClass.INTERACTIVE.tos}
            assert upstream_tos(gw, "/v2/infer", ups["v2"].port) == {QosClass.LATENCY_CRITICAL.tos}
            assert upstream_tos(gw, "/other", ups["plain"].port) == {0}
            assert envoy.proc.poll() is None
    finally:
        for u in ups.values():
            u.stop()


SO_MARK = 36


def mark_bootstrap(listen: int, upstream: int, mark: int) -> dict:
    """A listener proxying TCP to one cluster whose upstream sockets get SO_MARK."""
    return {"static_resources": {
        "listeners": [{"name": "in", "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                       "filter_chains": [{"filters": [{"name": "tcp", "typed_config": {
                           "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                           "stat_prefix": "in", "cluster": "marked"}}]}]}],
        "clusters": [{"name": "marked", "type": "STATIC", "connect_timeout": "2s",
                      "upstream_bind_config": {
                          "source_address": {"address": "127.0.0.1", "port_value": 0},
                          "socket_options": [{"level": socket.SOL_SOCKET, "name": SO_MARK, "int_value": mark,
                                              "state": "STATE_PREBIND"}]},
                      "load_assignment": {"cluster_name": "marked", "endpoints": [{"lb_endpoints": [{"endpoint": {
                          "address": {"socket_address": {"address": "127.0.0.1", "port_value": upstream}}}}]}]}}],
    }}


def test_envoy_socket_mark_selects_the_ebpf_class(capture_allowed):
    require_bpf()
    mark = 0x4D51E                                  # only this test's sockets carry it
    up = EchoUpstream("marked").start()
    listen = free_port()
    try:
        with Envoy(mark_bootstrap(listen, up.port, mark)):
            assert upstream_tos(listen, "/", up.port) == {0}           # before attach: unmarked
            had_clsact = tc.has_clsact("lo")
            attach.attach("lo", build_policy(marks=[f"{mark}=latency-critical"]))
            try:
                assert upstream_tos(listen, "/", up.port) == {QosClass.LATENCY_CRITICAL.tos}
            finally:
                attach.detach("lo")
            assert tc.has_clsact("lo") == had_clsact, "detach must restore lo's qdiscs"
            assert not attach.status("lo")
    finally:
        up.stop()
