"""The operator examples (istio-manifests/examples) pass mesh's checks and the
real Envoy takes what the control plane makes of them.

The examples are loaded as the control plane loads a change set, translated
for an ingress gateway, and booted in Envoy as a static bootstrap; the
gateway then answers on its listener as the YAML says. Traffic stays on
127.0.0.1: gateway ports become free ports, endpoint addresses loopback ones,
the DNS-resolved egress host `localhost`, and no request goes to an upstream.
"""
import glob
import http.client
import os
import re
import tempfile
from pathlib import Path

import pytest

from mcp26.mesh.change_set import load_texts
from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port

pytestmark = pytest.mark.e2e
translate_mod = pytest.importorskip("mcp26.xds.translate")
from mcp26.xds.translate.static import static_bootstrap  # noqa: E402
from mcp26.xds.model.type_urls import LISTENER, ROUTE
from mcp26.xds.model.node import ProxyNode  # noqa: E402
from mcp26.manifests import EXAMPLES  # noqa: F401
from harness.paths import checkout_examples

EXAMPLES = str(EXAMPLES)


def local_examples(http_port: int, https_port: int) -> dict:
    texts = {}
    for path in sorted(glob.glob(os.path.join(checkout_examples(Path(tempfile.mkdtemp())), "*.yaml"))):
        with open(path) as f:
            text = f.read()
        if "kind: Gateway" in text:      # the gateway's own port, not a service's
            text = re.sub(r"number: 8080(\n\s+name: http)", rf"number: {http_port}\1", text)
        text = text.replace("number: 8443", f"number: {https_port}")
        text = re.sub(r"address: 10\.\d+\.\d+\.(\d+)", r"address: 127.0.0.\1", text)
        texts[path] = text.replace("models.example.com", "localhost")
    return texts


def get(port: int, host: str, path: str):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path, headers={"Host": host})
        r = c.getresponse()
        return r.status, r.getheader("location"), r.read()
    finally:
        c.close()


def test_examples_boot_in_envoy_and_the_gateway_answers_as_written():
    http_port, https_port = free_port(), free_port()
    config = load_texts(local_examples(http_port, https_port))   # raises on any blocking finding
    assert not [w for w in config.warnings if w.severity == "warning"]
    snap = translate_mod.translate(config, ProxyNode("router~127.0.0.1~gw.bookinfo~bookinfo.svc.cluster.local",
                                                     kind="router", namespace="bookinfo",
                                                     labels={"istio": "ingressgateway"}))
    assert any(n.endswith(f"_{http_port}") for n in snap[LISTENER])       # the Gateway servers' port
    bootstrap = static_bootstrap(snap)
    booted = {lis["name"] for lis in bootstrap["static_resources"]["listeners"]}
    # The HTTPS server's certificate comes from credentialName over SDS (per node, from the
    # control plane): a static bootstrap cannot fetch it, so that listener is left out.
    assert booted == set(snap[LISTENER]) - {f"127.0.0.1_{https_port}"}
    with Envoy(bootstrap) as envoy:
        dump = envoy.admin("/config_dump?resource=static_listeners")[1]
        for name in booted:
            assert f'"name": "{name}"' in dump
        assert envoy.proc.poll() is None
        # gateway.yaml: plain HTTP for api.example.com redirects to HTTPS (tls.httpsRedirect).
        status, location, _ = get(http_port, "api.example.com", "/healthz")
        assert (status, location) == (301, "https://api.example.com/healthz")
        # bookinfo.yaml: the gateway routes only the paths the VirtualService lists.
        assert get(http_port, "bookinfo.example.com", "/not-routed")[0] == 404
        assert get(http_port, "unknown.example.com", "/productpage")[0] == 404
    assert set(snap[ROUTE])
