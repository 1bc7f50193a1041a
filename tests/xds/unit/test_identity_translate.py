"""Translation of ISTIO_MUTUAL, Sidecar ingress/egress, PeerAuthentication and credentialName; their validation."""
from __future__ import annotations

import base64

import pytest
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from mcp26.mesh.change_set import load_texts
from mcp26.mesh.diagnostics import ConfigError
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import translate
from mcp26.xds.model.type_urls import CLUSTER, LISTENER, ROUTE

BASE = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: b, namespace: shop}
spec:
  hosts: [b.shop.svc.cluster.local]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  subjectAltNames: ["spiffe://cluster.local/ns/shop/sa/b"]
  endpoints: [{address: 127.0.0.1, ports: {http: 15081}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: c, namespace: other}
spec:
  hosts: [c.other.svc.cluster.local]
  ports: [{number: 9090, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.1}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: b, namespace: shop}
spec:
  host: b.shop.svc.cluster.local
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
  subsets: [{name: v1, labels: {version: v1}}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: b, namespace: shop}
spec:
  workloadSelector: {labels: {app: b}}
  ingress: [{port: {number: 15081, protocol: HTTP, name: http}, defaultEndpoint: "127.0.0.1:8080"}]
  egress: [{hosts: ["./*"]}]
"""
B = ProxyNode(id="sidecar~127.0.0.1~b-1.shop~shop.svc.cluster.local", namespace="shop", kind="sidecar",
              labels={"app": "b"})


def _pa(mode, ports=""):
    return f"""
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: pa, namespace: shop}}
spec:
  selector: {{matchLabels: {{app: b}}}}
  mtls: {{mode: {mode}}}
{ports}"""


def _unpack(any_msg, cls):
    out = cls()
    any_msg.Unpack(out)
    return out


def test_istio_mutual_cluster_as_istiod():
    snap = translate(load_texts({"m.yaml": BASE}), B)
    for name, subset in (("outbound|9080||b.shop.svc.cluster.local", ""),
                         ("outbound|9080|v1|b.shop.svc.cluster.local", "v1")):
        ctx = _unpack(snap[CLUSTER][name].transport_socket.typed_config, tls_pb2.UpstreamTlsContext)
        assert ctx.sni == f"outbound_.9080_.{subset}_.b.shop.svc.cluster.local"
        common = ctx.common_tls_context
        assert list(common.alpn_protocols) == ["istio-peer-exchange", "istio"]
        assert common.tls_certificate_sds_secret_configs[0].name == "default"
        assert common.combined_validation_context.validation_context_sds_secret_config.name == "ROOTCA"
        sans = common.combined_validation_context.default_validation_context.match_typed_subject_alt_names
        assert [(m.san_type, m.matcher.exact) for m in sans] == [(3, "spiffe://cluster.local/ns/shop/sa/b")]  # URI


@pytest.mark.parametrize("mode,chains", [("STRICT", ["tls"]), ("PERMISSIVE", ["tls", "raw_buffer"]),
                                         ("DISABLE", [""]), ("UNSET", ["tls", "raw_buffer"])])
def test_inbound_chains_follow_peer_authentication(mode, chains):
    snap = translate(load_texts({"m.yaml": BASE + _pa(mode)}), B)
    lis = snap[LISTENER]["127.0.0.1_15081"]
    assert lis.traffic_direction == 1       # INBOUND
    assert [c.filter_chain_match.transport_protocol for c in lis.filter_chains] == chains
    for chain in lis.filter_chains:
        hcm = _unpack(chain.filters[0].typed_config, hcm_pb2.HttpConnectionManager)
        assert hcm.forward_client_cert_details == hcm_pb2.HttpConnectionManager.SANITIZE_SET
        assert hcm.set_current_client_cert_details.uri
        rc = hcm.route_config
        assert rc.virtual_hosts[0].routes[0].route.cluster == "inbound|15081||"
        assert "x-envoy-downstream-service-cluster" in rc.request_headers_to_remove
        assert chain.HasField("transport_socket") == (chain.filter_chain_match.transport_protocol == "tls")
        if chain.HasField("transport_socket"):
            ctx = _unpack(chain.transport_socket.typed_config, tls_pb2.DownstreamTlsContext)
            assert ctx.require_client_certificate.value
    app = snap[CLUSTER]["inbound|15081||"].load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
    assert (app.socket_address.address, app.socket_address.port_value) == ("127.0.0.1", 8080)


def test_port_level_mtls_overrides_workload_mode():
    ports = "  portLevelMtls:\n    15081: {mode: DISABLE}\n"
    snap = translate(load_texts({"m.yaml": BASE + _pa("STRICT", ports)}), B)
    assert [c.filter_chain_match.transport_protocol for c in snap[LISTENER]["127.0.0.1_15081"].filter_chains] == [""]


def test_sidecar_egress_limits_outbound():
    snap = translate(load_texts({"m.yaml": BASE}), B)
    assert "outbound|9080||b.shop.svc.cluster.local" in snap[CLUSTER]
    assert not any("c.other" in n for n in snap[CLUSTER])
    assert "9090" not in snap[ROUTE] and "127.0.0.1_9090" not in snap[LISTENER]
    other = ProxyNode(id="sidecar~127.0.0.1~x.shop~shop.svc.cluster.local", namespace="shop", kind="sidecar")
    full = translate(load_texts({"m.yaml": BASE}), other)      # no Sidecar selects it: everything
    assert "outbound|9090||c.other.svc.cluster.local" in full[CLUSTER] and "127.0.0.1_9090" in full[LISTENER]


def test_gateway_credential_name_over_sds(tmp_path):
    gw = """
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: shop}
spec:
  selector: {istio: ingressgateway}
  servers: [{port: {number: 8443, name: https, protocol: HTTPS}, hosts: ["*"],
             tls: {mode: SIMPLE, credentialName: shop-cert}}]
"""
    node = ProxyNode(id="router~127.0.0.1~gw.shop~shop.svc.cluster.local", namespace="shop",
                     labels={"istio": "ingressgateway"})
    snap = translate(load_texts({"g.yaml": gw}), node)
    chain = snap[LISTENER]["127.0.0.1_8443"].filter_chains[-1]
    ctx = _unpack(chain.transport_socket.typed_config, tls_pb2.DownstreamTlsContext)
    assert ctx.common_tls_context.tls_certificate_sds_secret_configs[0].name == "kubernetes://shop-cert"


def _errors(text):
    with pytest.raises(ConfigError) as e:
        load_texts({"bad.yaml": text})
    return [str(d) for d in e.value.diagnostics]


def test_bad_input_named_by_file_line_resource_field():
    errs = _errors("""apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: pa, namespace: shop}
spec:
  mtls: {mode: STRICT, bogus: 1}
""")
    assert any("bad.yaml:5" in e and "spec.mtls.bogus" in e and "unknown field" in e for e in errs), errs
    errs = _errors("""apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: pa, namespace: shop}
spec:
  portLevelMtls:
    "8080": {mode: DISABLE}
""")
    assert any("spec.portLevelMtls" in e and "requires a workload selector" in e for e in errs), errs
    errs = _errors("""apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: s, namespace: shop}
spec:
  ingress: [{port: {number: 9080}}]
  egress: [{hosts: [nope]}]
  extra: true
""")
    assert any("Sidecar/shop/s: spec.extra: unknown field" in e for e in errs), errs


def test_malformed_secret():
    good_key = base64.b64encode(b"not a key").decode()
    bad_crt = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nxx").decode()
    errs = _errors(f"""apiVersion: v1
kind: Secret
metadata: {{name: shop-cert, namespace: shop}}
type: kubernetes.io/tls
data:
  tls.crt: {bad_crt}
  tls.key: {good_key}
""")
    assert any("bad.yaml:6" in e and "Secret/shop/shop-cert: data.tls.crt: not a PEM certificate" in e
               for e in errs), errs
    errs = _errors("""apiVersion: v1
kind: Secret
metadata: {name: s2, namespace: shop}
type: kubernetes.io/tls
data: {tls.crt: "%%%"}
""")
    assert any("data.tls.crt: not valid base64" in e for e in errs), errs
    assert any("needs data['tls.key']" in e for e in errs), errs


IDENTITIES = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: d, namespace: shop}
spec:
  hosts: [d.shop.svc.cluster.local]
  ports: [{number: 9070, name: http, protocol: HTTP}]
  resolution: STATIC
  subjectAltNames: ["spiffe://cluster.local/ns/shop/sa/legacy"]
  workloadSelector: {labels: {app: d}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: e, namespace: shop}
spec:
  hosts: [e.shop.svc.cluster.local]
  ports: [{number: 9060, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.2, serviceAccount: inline}]
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: d-1, namespace: shop}
spec: {address: 127.0.0.3, serviceAccount: d-sa, labels: {app: d, security.istio.io/tlsMode: istio}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: d-2, namespace: shop}
spec: {address: 127.0.0.4, labels: {app: d}}
"""
D = "outbound|9070||d.shop.svc.cluster.local"


def _sans(ctx) -> list[str]:
    return [m.matcher.exact for m in ctx.common_tls_context.combined_validation_context
            .default_validation_context.match_typed_subject_alt_names]


def test_istio_mutual_sans_are_every_endpoints_service_account_as_istiod():
    dr = """
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: d, namespace: shop}
spec: {host: d.shop.svc.cluster.local, trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: e, namespace: shop}
spec: {host: e.shop.svc.cluster.local, trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}}
"""
    snap = translate(load_texts({"m.yaml": BASE + "---" + IDENTITIES + dr}), B)
    ctx = _unpack(snap[CLUSTER][D].transport_socket.typed_config, tls_pb2.UpstreamTlsContext)
    # WorkloadEntry d-1's account, and the ServiceEntry's own; d-2 has none.
    assert _sans(ctx) == ["spiffe://cluster.local/ns/shop/sa/d-sa", "spiffe://cluster.local/ns/shop/sa/legacy"]
    e = _unpack(snap[CLUSTER]["outbound|9060||e.shop.svc.cluster.local"].transport_socket.typed_config,
                tls_pb2.UpstreamTlsContext)
    assert _sans(e) == ["spiffe://cluster.local/ns/shop/sa/inline"]     # an inline endpoint's account
    # The rule's own subjectAltNames replace them.
    own = dr.replace("{mode: ISTIO_MUTUAL}", '{mode: ISTIO_MUTUAL, subjectAltNames: ["spiffe://x/ns/y/sa/z"]}')
    snap = translate(load_texts({"m.yaml": BASE + "---" + IDENTITIES + own}), B)
    ctx = _unpack(snap[CLUSTER][D].transport_socket.typed_config, tls_pb2.UpstreamTlsContext)
    assert _sans(ctx) == ["spiffe://x/ns/y/sa/z"]


def test_auto_mtls_matches_tls_mode_istio_endpoints_without_a_destination_rule():
    from mcp26.xds.model.type_urls import ENDPOINT
    snap = translate(load_texts({"m.yaml": BASE + "---" + IDENTITIES}), B)
    cluster = snap[CLUSTER][D]
    assert not cluster.HasField("transport_socket")
    istio, plain = cluster.transport_socket_matches
    assert (istio.name, dict(istio.match), plain.name, dict(plain.match)) == \
        ("tlsMode-istio", {"tlsMode": "istio"}, "tlsMode-disabled", {})
    ctx = _unpack(istio.transport_socket.typed_config, tls_pb2.UpstreamTlsContext)
    assert ctx.sni == "outbound_.9070_._.d.shop.svc.cluster.local"
    assert "spiffe://cluster.local/ns/shop/sa/d-sa" in _sans(ctx)
    assert plain.transport_socket.name == "envoy.transport_sockets.raw_buffer"
    marked = {lb.endpoint.address.socket_address.address:
              dict(lb.metadata.filter_metadata["envoy.transport_socket_match"])
              for loc in snap[ENDPOINT][D].endpoints for lb in loc.lb_endpoints}
    assert marked == {"127.0.0.3": {"tlsMode": "istio"}, "127.0.0.4": {}}
    # A service none of whose endpoints has a sidecar stays plaintext.
    assert not snap[CLUSTER]["outbound|9060||e.shop.svc.cluster.local"].transport_socket_matches


@pytest.mark.parametrize("extra", [
    "---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: default, namespace: shop}\n"
    "spec: {mtls: {mode: DISABLE}}\n",
    "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: d, namespace: shop}\n"
    "spec: {host: d.shop.svc.cluster.local, trafficPolicy: {tls: {mode: DISABLE}}}\n",
], ids=["namespace-DISABLE", "destination-rule-DISABLE"])
def test_no_auto_mtls_when_disabled(extra):
    snap = translate(load_texts({"m.yaml": BASE + "---" + IDENTITIES + extra}), B)
    cluster = snap[CLUSTER][D]
    assert not cluster.transport_socket_matches and not cluster.HasField("transport_socket")
