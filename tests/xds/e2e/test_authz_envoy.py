"""AuthorizationPolicy through real Envoy: translate()'s output booted as a
static bootstrap (exactly what ADS would serve) on a gateway with a
RequestAuthentication whose tokens are minted here; and peer-certificate
principals on a TLS listener whose clients present SPIFFE URI SANs.
Every check is the status Envoy returned and which upstream answered."""
import datetime
import http.client
import json
import os
import ssl
import tempfile

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.protobuf import json_format

from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.tokens import Issuer
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.mesh.change_set import load_texts
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import Phase, rbac, translate
from mcp26.xds.translate.static import static_bootstrap

pytestmark = pytest.mark.e2e
ISS = "https://idp.mesh.test"

BASE = """apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: gw, namespace: {ns}}}
spec:
  selector: {{istio: ingressgateway}}
  servers: [{{port: {{number: {gw}, name: http, protocol: HTTP}}, hosts: ["*"]}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: app, namespace: {ns}}}
spec:
  hosts: [app.mesh.local]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{http: {up}}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: app, namespace: {ns}}}
spec:
  hosts: ["*"]
  gateways: [gw]
  http: [{{route: [{{destination: {{host: app.mesh.local}}}}]}}]
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: jwt, namespace: {ns}}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  jwtRules: [{{issuer: "{iss}", jwks: '{jwks}'}}]
"""

POLICIES = f"""---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: deny-mallory, namespace: shop}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  action: DENY
  rules: [{{from: [{{source: {{requestPrincipals: ["{ISS}/mallory"]}}}}]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: allow, namespace: shop}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  rules:
  - to: [{{operation: {{methods: [GET], paths: ["/items/*"]}}}}]
  - from: [{{source: {{requestPrincipals: ["*"]}}}}]
    to: [{{operation: {{paths: ["/admin/*"]}}}}]
    when: [{{key: "request.auth.claims[group]", values: [admins]}}]
  - to: [{{operation: {{paths: [/canary]}}}}]
    when: [{{key: "request.headers[x-canary]", values: ["yes"]}}]
"""

MESH_DENY = """---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-debug, namespace: istio-system}
spec:
  action: DENY
  rules: [{to: [{operation: {paths: ["/debug/*"]}}]}]
"""


def gateway(text: str, ns: str, port: int) -> Envoy:
    node = ProxyNode(f"router~127.0.0.1~gw.{ns}~{ns}.svc.cluster.local", namespace=ns,
                     labels={"istio": "ingressgateway"})
    return Envoy(static_bootstrap(translate(load_texts({"c.yaml": text}), node)))


def call(port, path, method="GET", headers=None, token=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    h = dict(headers or {})
    if token:
        h["authorization"] = f"Bearer {token}"
    conn.request(method, path, headers=h)
    r = conn.getresponse()
    body = r.read().decode()
    return r.status, r.getheader("x-upstream"), body


@pytest.fixture(scope="module")
def idp():
    return Issuer("k1", ISS, "mesh")


@pytest.fixture(scope="module")
def shop_gateway(idp):
    with EchoUpstream("app") as up:
        gw = free_port()
        text = BASE.format(ns="shop", gw=gw, up=up.port, iss=ISS, jwks=idp.jwks) + POLICIES + MESH_DENY
        with gateway(text, "shop", gw) as envoy:
            yield gw, envoy


def test_deny_by_request_principal_and_another_principal_passes(shop_gateway, idp):
    gw, _ = shop_gateway
    assert call(gw, "/items/1", token=idp.token(sub="alice"))[:2] == (200, "app")
    status, upstream, body = call(gw, "/items/1", token=idp.token(sub="mallory"))
    assert (status, upstream, body) == (403, None, "RBAC: access denied")


def test_allow_by_method_and_path(shop_gateway):
    gw, _ = shop_gateway
    assert call(gw, "/items/7")[:2] == (200, "app")          # no token: the ALLOW rule needs none
    assert call(gw, "/items/7", method="POST")[0] == 403
    assert call(gw, "/orders/7")[0] == 403                    # no ALLOW rule matches


def test_claims_condition_string_and_list(shop_gateway, idp):
    gw, _ = shop_gateway
    assert call(gw, "/admin/x", token=idp.token(sub="ann", group="admins"))[:2] == (200, "app")
    assert call(gw, "/admin/x", token=idp.token(sub="ann", group=["users", "admins"]))[:2] == (200, "app")
    assert call(gw, "/admin/x", token=idp.token(sub="bob", group="users"))[0] == 403
    assert call(gw, "/admin/x")[0] == 403                     # no token, no claims


def test_header_condition(shop_gateway):
    gw, _ = shop_gateway
    assert call(gw, "/canary", headers={"x-canary": "yes"})[:2] == (200, "app")
    assert call(gw, "/canary", headers={"x-canary": "no"})[0] == 403


def test_mesh_wide_deny_from_root_namespace_and_rbac_stats(shop_gateway):
    gw, envoy = shop_gateway
    before = envoy.stats("rbac")
    assert call(gw, "/debug/x")[0] == 403
    after = envoy.stats("rbac")
    denied = [k for k in after if k.endswith("rbac.denied")]
    assert denied and sum(after[k] for k in denied) > sum(before.get(k, 0) for k in denied)


def test_root_namespace_deny_applies_to_a_proxy_in_another_namespace(idp):
    with EchoUpstream("billing") as up:
        gw = free_port()
        text = BASE.format(ns="billing", gw=gw, up=up.port, iss=ISS, jwks=idp.jwks) + MESH_DENY
        with gateway(text, "billing", gw):
            assert call(gw, "/debug/vars")[0] == 403
            assert call(gw, "/ok")[:2] == (200, "billing")


def test_allow_nothing_denies_all(idp):
    allow_nothing = ("---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n"
                     "metadata: {name: allow-nothing, namespace: shop}\nspec: {}\n")
    with EchoUpstream("app") as up:
        gw = free_port()
        text = BASE.format(ns="shop", gw=gw, up=up.port, iss=ISS, jwks=idp.jwks) + allow_nothing
        with gateway(text, "shop", gw):
            assert [call(gw, p, token=idp.token(sub="alice"))[0] for p in ("/", "/items/1")] == [403, 403]


# --- principals from the peer certificate ------------------------------------------------------

def _cert(name, key, issuer_name, issuer_key, uri=None, ca=False):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
         .issuer_name(issuer_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(hours=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if uri:
        b = b.add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=False)
    elif not ca:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _write(d, name, cert, key):
    cp, kp = os.path.join(d, f"{name}.pem"), os.path.join(d, f"{name}.key")
    with open(cp, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(kp, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return cp, kp


PRINCIPAL_POLICIES = """apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ns-shop, namespace: shop}
spec:
  rules: [{from: [{source: {namespaces: [shop]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-evil, namespace: shop}
spec:
  action: DENY
  rules: [{from: [{source: {principals: [cluster.local/ns/shop/sa/evil]}}]}]
"""


@pytest.fixture(scope="module")
def mtls_listener():
    d = tempfile.mkdtemp(prefix="authz-pki-")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mesh root")])
    ca = _cert("mesh root", ca_key, ca_name, ca_key, ca=True)
    ca_path, _ = _write(d, "ca", ca, ca_key)
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv_cert, srv_key_path = _write(d, "server", _cert("server", srv_key, ca_name, ca_key), srv_key)
    clients = {}
    for sa, ns in (("web", "shop"), ("evil", "shop"), ("web", "other")):
        k = ec.generate_private_key(ec.SECP256R1())
        clients[f"{ns}/{sa}"] = _write(d, f"{ns}-{sa}", _cert(sa, k, ca_name, ca_key,
                                                              uri=f"spiffe://cluster.local/ns/{ns}/sa/{sa}"), k)
    node = ProxyNode("sidecar~127.0.0.1~b.shop~shop.svc.cluster.local", namespace="shop", kind="sidecar")
    filters = [json.loads(json_format.MessageToJson(f)) for f in
               rbac.http_filters(load_texts({"p.yaml": PRINCIPAL_POLICIES}), node, 8443, Phase.AUTHZ)]
    port = free_port()
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                    "HttpConnectionManager",
           "stat_prefix": "inbound_8443",
           "route_config": {"virtual_hosts": [{"name": "b", "domains": ["*"], "routes": [
               {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "b"}}}]}]},
           "http_filters": filters + [{"name": "envoy.filters.http.router", "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}
    tls = {"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
           "require_client_certificate": True,
           "common_tls_context": {
               "tls_certificates": [{"certificate_chain": {"filename": srv_cert},
                                     "private_key": {"filename": srv_key_path}}],
               "validation_context": {"trusted_ca": {"filename": ca_path}}}}
    bootstrap = {"static_resources": {"listeners": [{
        "name": "inbound", "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": hcm}],
                           "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": tls}}]}]}}
    with Envoy(bootstrap):
        yield port, ca_path, clients


def _tls_call(port, ca_path, cert):
    ctx = ssl.create_default_context(cafile=ca_path)
    ctx.check_hostname = False
    ctx.load_cert_chain(*cert)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
    conn.request("GET", "/")
    r = conn.getresponse()
    return r.status, r.read().decode()


def test_principal_rules_read_the_peer_certificate(mtls_listener):
    port, ca, clients = mtls_listener
    assert _tls_call(port, ca, clients["shop/web"]) == (200, "b")
    assert _tls_call(port, ca, clients["shop/evil"]) == (403, "RBAC: access denied")   # DENY by principal
    assert _tls_call(port, ca, clients["other/web"])[0] == 403                         # ALLOW by namespace
