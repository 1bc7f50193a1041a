"""A small header-contract gateway for the adversarial tests (not a test module).

The stack of tests/wasm/e2e/test_wasm_contract.py cut to what these tests attack: the
real control plane (`mcpctl xds serve`) on a watched directory holding a Gateway,
a ServiceEntry + VirtualService to one echo upstream, a RequestAuthentication
(authn.yaml, inline JWKS) and the header-contract WasmPlugin (wasm.yaml,
FAIL_CLOSE), each from tests/data/manifests/, and a real Envoy attached over ADS
(SotW or Delta).
"""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import tempfile
import time

from mcp26.wasm import HEADER_CONTRACT_WASM as WASM
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.tokens import Issuer
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import GATEWAY_NODE, ControlPlane, mesh_envoy, write_config
from harness.manifests import documents, manifest, wasm_module

KEY = hashlib.sha256(b"adversarial session key").digest()
ISSUER, AUDIENCE = "https://issuer.mesh.test", "mesh-gateway"
GW_LABELS = {"istio": "ingressgateway"}
NODE = GATEWAY_NODE


def texts(gw_port: int, upstream_port: int, issuer: Issuer) -> dict[str, str]:
    plugin = {"sessionKey": base64.b64encode(KEY).decode(),
              "tenants": {"acme": {"allowedHeaders": ["x-tenant-acme-*"]}}}
    return {
        "mesh.yaml": documents(
            manifest("gateway.yaml", gw_port=gw_port),
            manifest("service_entry.yaml", name="reviews", number=80, port_name="http", protocol="HTTP",
                     upstream=upstream_port),
            manifest("gateway_route.yaml", name="reviews", host="reviews.mesh.local")),
        "authn.yaml": manifest("gateway_jwt.yaml", issuer=ISSUER, audience=AUDIENCE, jwks=issuer.jwks),
        "wasm.yaml": manifest("header_contract_plugin.yaml", plugin_config=plugin, **wasm_module(WASM)),
    }


class ContractStack:
    """`with ContractStack(delta=False) as s:` -> s.cp, s.envoy, s.upstream, s.issuer, s.dir, s.get()."""

    def __init__(self, delta: bool = False):
        self.delta = delta

    def __enter__(self) -> "ContractStack":
        self.issuer = Issuer("adv-1", ISSUER, AUDIENCE)
        self.dir = tempfile.mkdtemp(prefix="mesh-adversarial-")
        self.gw_port = free_port()
        self.upstream = EchoUpstream("v1").start()
        self.texts = texts(self.gw_port, self.upstream.port, self.issuer)
        for name, text in self.texts.items():
            write_config(self.dir, name, text)
        self.cp = ControlPlane(self.dir)
        self.envoy = None
        try:
            self.cp.start()
            self.envoy = mesh_envoy(self.cp, labels=GW_LABELS, namespace="default", delta=self.delta)
            self.envoy.start()
            self.cp.wait_synced(NODE, types=("CDS", "LDS", "ECDS"))
            self.wait_serving()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        self.cp.close()
        self.upstream.stop()
        for name in os.listdir(self.dir):
            os.remove(os.path.join(self.dir, name))
        os.rmdir(self.dir)

    def get(self, headers: dict | None = None, timeout: float = 5.0) -> tuple[int, dict]:
        """(status, the echo upstream's JSON or {}) for GET / through the gateway."""
        conn = http.client.HTTPConnection("127.0.0.1", self.gw_port, timeout=timeout)
        try:
            conn.request("GET", "/r", headers={"host": "reviews.example.com", **(headers or {})})
            r = conn.getresponse()
            data = r.read()
            try:
                return r.status, json.loads(data) if data else {}
            except ValueError:
                return r.status, {}
        finally:
            conn.close()

    def wait_serving(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                status, seen = self.get({"authorization": f"Bearer {self.issuer.token(sub='probe')}"})
                if status == 200 and seen.get("headers", {}).get("end-user") == "probe":
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"gateway not serving:\n{self.envoy.log_tail()}\n{self.cp.log_tail()}")
            time.sleep(0.1)

    def wasm_vm_stats(self) -> dict[str, int]:
        """Envoy's counters of Wasm VMs created (a rebuilt VM raises them)."""
        return {k: v for k, v in self.envoy.stats("wasm").items() if k.endswith(".created")}
