"""The local mesh the gRPC-Web tests run against, every part real:

    inference backend (`mcpctl serve --model builtin:mlp`, KServe v2 gRPC)
      ^ HTTP/2 (cluster from a ServiceEntry port of protocol GRPC)
    gateway Envoy (config pushed over ADS: grpc_web, cors, router)
      ^ gRPC-Web (HTTP/1.1)                  ^ xDS
    client / browser                       control plane (`mcpctl xds serve`)
                                              ^ /debug/syncz, /debug/config_dump
    console (`mcpctl console`) --------------'   and the backend's /metrics

The mesh config is xds-server/console/examples/grpc-web.yaml with this run's
ports and the console's origin filled in.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import subprocess
import tempfile
import urllib.request
from types import SimpleNamespace

from mcp26.mesh import headers as H
from mcp26.mesh.session import sign_headers
from harness.paths import CONSOLE
from mcp26.wasm import HEADER_CONTRACT_WASM as WASM
from mcp26.demo.stack.ports import free_port, wait_port
from mcp26.demo.stack.processes import stop_process
from mcp26.demo.stack.control_plane import GATEWAY_NODE, ControlPlane, mesh_envoy, write_config
from mcp26.serving.executables import executable

EXAMPLE = CONSOLE / "examples" / "grpc-web.yaml"
MODEL = "mlp"
SERVICE = "/inference.GRPCInferenceService"
SESSION_KEY = hashlib.sha256(b"grpc-web tests").digest()   # the filter signs, the backend verifies


def header_contract_yaml() -> str:
    """The header-contract WasmPlugin on the gateway: it turns X-LLM-Priority into the QoS class."""
    from mcp26.mesh.header_contract import PLUGIN_NAME
    sha = hashlib.sha256(open(WASM, "rb").read()).hexdigest()
    plugin = {"sessionKey": base64.b64encode(SESSION_KEY).decode()}
    return f"""apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {{name: header-contract, namespace: default}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  url: file://{WASM}
  sha256: "{sha}"
  phase: AUTHZ
  pluginName: {PLUGIN_NAME}
  failStrategy: FAIL_CLOSE
  pluginConfig: {json.dumps(plugin)}
"""


def mesh_yaml(gateway_port: int, backend_grpc_port: int, origin: str) -> str:
    text = open(EXAMPLE).read()
    text = text.replace("{number: 8080, name: http, protocol: HTTP}",
                        f"{{number: {gateway_port}, name: http, protocol: HTTP}}")
    text = text.replace("ports: {grpc: 8001}", f"ports: {{grpc: {backend_grpc_port}}}")
    text = re.sub(r'allowOrigins: \[\{exact: "[^"]*"\}\]', f'allowOrigins: [{{exact: "{origin}"}}]', text)
    assert str(gateway_port) in text and str(backend_grpc_port) in text and origin in text, "example changed shape"
    return text


class Console:
    """`mcpctl console` as a subprocess."""

    def __init__(self, port: int | None = None, **flags: str):
        self.port = port or free_port()
        mcpctl = executable("mcpctl")
        self.args = [mcpctl, "console", "--port", str(self.port)]
        for k, v in flags.items():
            self.args += [f"--{k.replace('_', '-')}", str(v)]
        self.log = tempfile.NamedTemporaryFile(prefix="console-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Console":
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_port(self.port, timeout=20)
        except TimeoutError:
            raise RuntimeError(f"console did not start:\n{self.log_tail()}")
        return self

    def api(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            return json.loads(r.read())

    def log_tail(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()[-3000:]

    def stop(self) -> None:
        stop_process(self.proc)
        os.unlink(self.log.name)


@contextlib.contextmanager
def grpcweb_mesh(with_console: bool = True, console_flags: dict | None = None, header_contract: bool = False):
    """Yields a namespace: backend, cp, envoy, envoy_node, gateway_port, console (or None), origin.

    With header_contract, the Wasm header-contract filter is on the gateway too,
    and the backend verifies the session signature it adds (403 without it):
    `direct_metadata(qos_class)` signs a direct call the way the filter would.
    """
    from mcp26.inference.bench.serve_process import ServeProcess
    gateway_port = free_port()
    console_port = free_port()
    origin = f"http://127.0.0.1:{console_port}"   # the page's origin, which the corsPolicy allows
    with contextlib.ExitStack() as stack:
        extra = []
        if header_contract:
            key_file = stack.enter_context(tempfile.NamedTemporaryFile(prefix="session-", suffix=".key"))
            key_file.write(SESSION_KEY)
            key_file.flush()
            extra = ["--session-key-file", key_file.name]
        backend = ServeProcess(f"builtin:{MODEL}", free_port(), free_port(), *extra)
        stack.callback(backend.stop)
        backend.start()
        config_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="grpcweb-mesh-"))
        write_config(config_dir, "grpc-web.yaml", mesh_yaml(gateway_port, backend.grpc_port, origin))
        if header_contract:
            write_config(config_dir, "header-contract.yaml", header_contract_yaml())
        cp = stack.enter_context(ControlPlane(config_dir))
        envoy = stack.enter_context(mesh_envoy(cp, node_id=GATEWAY_NODE, labels={"istio": "ingressgateway"}))
        cp.wait_synced(GATEWAY_NODE, types=("CDS", "EDS", "LDS", "RDS") + (("ECDS",) if header_contract else ()))
        wait_port(gateway_port, timeout=10)
        console = None
        if with_console:
            console = Console(port=console_port, xds_admin=f"http://127.0.0.1:{cp.admin_port}",
                              backend=f"http://127.0.0.1:{backend.http_port}",
                              grpc_web=f"http://127.0.0.1:{gateway_port}",
                              envoy_admin=f"http://127.0.0.1:{envoy.admin_port}", model=MODEL,
                              **(console_flags or {}))
            stack.callback(console.stop)
            console.start()
        def direct_metadata(qos_class: str = "standard") -> tuple:
            if not header_contract:
                return ()
            signed = {H.QOS_CLASS: qos_class}
            return ((H.QOS_CLASS, qos_class), (H.SESSION_SIG, sign_headers(signed, SESSION_KEY)))

        yield SimpleNamespace(backend=backend, cp=cp, envoy=envoy, envoy_node=GATEWAY_NODE, gateway_port=gateway_port,
                              console=console, origin=origin, config_dir=config_dir,
                              header_contract=header_contract, direct_metadata=direct_metadata)
