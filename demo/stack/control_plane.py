"""Run the real control plane (`mcpctl xds serve`, a subprocess) and Envoys attached to it over ADS.

    with ControlPlane(config_dir) as cp:          # started; .port, .admin_port, .address
        with mesh_envoy(cp, node_id="gw", labels={"istio": "ingressgateway"}) as envoy:
            cp.wait_synced("gw")
            ...                                    # write_config(config_dir, "vs.yaml", text) to change it

`mesh_envoy` returns a not-yet-started demo.stack.envoy.Envoy (use it as a context
manager, or call .start()). `cp.kill()` / `cp.start()` restart the control plane
on the same ports. `cp.apply(name, text, node_id)` writes one file and waits until
the change set is served and ACKed (ConfigRejected if the control plane refuses
it). Processes are always stopped on exit, even when a test fails.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port, wait_port
from mcp26.demo.stack.processes import stop_process
from mcp26.serving.executables import executable

GATEWAY_NODE = "router~127.0.0.1~gateway.default~default.svc.cluster.local"


def write_config(config_dir: str, name: str, text: str) -> str:
    """Write one YAML file into the watched directory atomically (temp file + rename)."""
    path = os.path.join(config_dir, name)
    fd, tmp = tempfile.mkstemp(dir=config_dir, prefix=".tmp-", suffix=".part")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def remove_config(config_dir: str, name: str) -> None:
    os.remove(os.path.join(config_dir, name))


class ConfigRejected(RuntimeError):
    """The control plane refused a change set; `.rejected` is its /debug/configz report."""

    def __init__(self, name: str, rejected: dict):
        errors = "; ".join(f"{os.path.basename(e.get('file') or '?')}:{e.get('line')}: {e.get('field')}: "
                           f"{e.get('message')}" for e in rejected.get("errors", [])) or rejected
        super().__init__(f"{name} rejected: {errors}")
        self.rejected = rejected


ADS_TYPES = ("CDS", "EDS", "LDS", "RDS")


class ControlPlane:
    """`mcpctl xds serve` on `config_dir`. `log_path`: where its output goes (a temp file,
    removed by close(), by default); `new_session`: its own session, so a Ctrl-C at the
    terminal reaches only the caller, which then stops it (the demo)."""

    def __init__(self, config_dir: str | None, port: int | None = None, admin_port: int | None = None,
                 test_hooks: bool = True, debounce_ms: int = 100, log_level: str = "info",
                 log_path: str | None = None, new_session: bool = False, extra_args: list[str] | None = None,
                 grpc_frontend: str | None = None, kubeconfig: str | None = None):
        self.config_dir = config_dir
        self.kubeconfig = kubeconfig     # read the API server this names instead of config_dir
        # `--grpc-frontend` (fast, the default, or grpcio); $XDS_GRPC_FRONTEND runs a whole
        # test suite against the other one.
        self.grpc_frontend = grpc_frontend or os.environ.get("XDS_GRPC_FRONTEND")
        self.port = port or free_port()
        self.admin_port = admin_port or free_port()
        self.test_hooks = test_hooks
        self.debounce_ms = debounce_ms
        self.log_level = log_level
        self.new_session = new_session
        self.extra_args = list(extra_args or [])     # more `mcpctl xds serve` flags (e.g. --ca-dir)
        self.proc: subprocess.Popen | None = None
        self._own_log = log_path is None
        self.log_path = log_path or tempfile.mktemp(prefix="xds-", suffix=".log")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "ControlPlane":
        mcpctl = executable("mcpctl")
        source = ["--kubeconfig", self.kubeconfig] if self.kubeconfig else ["--config-dir", self.config_dir]
        args = [mcpctl, "xds", "serve", *source, "--port", str(self.port),
                "--admin-port", str(self.admin_port), "--debounce-ms", str(self.debounce_ms),
                "--log-level", self.log_level]
        if self.grpc_frontend:
            args += ["--grpc-frontend", self.grpc_frontend]
        if self.test_hooks:
            args.append("--test-hooks")
        args += self.extra_args
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=self.new_session)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"control plane exited with {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    self.get("/healthz")
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"control plane admin not up after {timeout}s:\n{self.log_tail()}")
                    time.sleep(0.05)
            wait_port(self.port, timeout=max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()          # a start that fails leaves nothing running
            raise
        return self

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path: str, body: dict) -> tuple[int, str]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}", method="POST",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def healthz(self) -> dict:
        return json.loads(self.get("/healthz")[1])

    def syncz(self) -> list[dict]:
        return json.loads(self.get("/debug/syncz")[1])

    def node_sync(self, node_id: str) -> dict | None:
        return next((n for n in self.syncz() if n["node"] == node_id), None)

    def configz(self) -> dict:
        return json.loads(self.get("/debug/configz")[1])

    def config_dump(self, node_id: str) -> dict:
        return json.loads(self.get(f"/debug/config_dump?node={urllib.request.quote(node_id)}")[1])

    def inject(self, resources: list[dict]) -> dict:
        """Test hook: [{"type_url", "name", "resource": Envoy JSON}] over every snapshot ([] clears)."""
        status, text = self.post("/debug/inject", {"resources": resources})
        if status != 200:
            raise RuntimeError(f"inject failed ({status}): {text}")
        return json.loads(text)

    def wait_synced(self, node_id: str, types=("CDS", "LDS"), generation: str | None = None,
                    timeout: float = 20.0) -> dict:
        """Until the node has ACKed the latest response of each type (and `generation` is served)."""
        deadline = time.monotonic() + timeout
        node = None
        while time.monotonic() < deadline:
            node = self.node_sync(node_id)
            if node and all(node["types"].get(t, {}).get("status") == "SYNCED" for t in types):
                if generation is None or self.configz()["generation"] == generation:
                    return node
            time.sleep(0.05)
        raise TimeoutError(f"{node_id} not synced for {types} after {timeout}s: {node}\n{self.log_tail()}")

    def apply(self, name: str, text: str, node_id: str | None = None, types=ADS_TYPES,
              timeout: float = 30.0) -> str:
        """Write `name` into the watched directory, wait until the change set is served
        (and, with `node_id`, ACKed by that node for `types`) -> the new generation.
        ConfigRejected if the control plane rejects it."""
        before = self.configz()["generation"]
        since = time.time()
        write_config(self.config_dir, name, text)
        deadline = time.monotonic() + timeout
        while True:
            status = self.configz()
            rejected = status.get("rejected")
            if rejected and rejected["at"] >= since:
                raise ConfigRejected(name, rejected)
            if status["generation"] != before:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: config generation still {before} after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.02)
        if node_id:
            self.wait_synced(node_id, types, generation=status["generation"],
                             timeout=max(1.0, deadline - time.monotonic()))
        return status["generation"]

    def wait_generation_change(self, before: str, timeout: float = 10.0) -> dict:
        """Until the served generation differs from `before` (a change set was applied)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.configz()
            if status["generation"] != before:
                return status
            time.sleep(0.02)
        raise TimeoutError(f"config generation still {before} after {timeout}s:\n{self.log_tail()}")

    def wait_rejected(self, since: float, timeout: float = 10.0) -> dict:
        """Until a change set rejected after `since` (time.time()) is reported."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rejected = self.configz().get("rejected")
            if rejected and rejected["at"] >= since:
                return rejected
            time.sleep(0.02)
        raise TimeoutError(f"no rejected change set reported after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 60) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL: the control plane dies without closing its streams cleanly."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc)

    def close(self) -> None:
        self.stop()
        if self._own_log:
            try:
                os.remove(self.log_path)
            except OSError:
                pass

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def mesh_envoy(control_plane: ControlPlane, node_id: str = GATEWAY_NODE, delta: bool = False,
               labels: dict | None = None, cluster: str = "", namespace: str = "",
               log_level: str = "warning", extra_args: list[str] | None = None) -> Envoy:
    """An Envoy (not started) whose bootstrap points at `control_plane` over ADS."""
    from mcp26.xds.bootstrap import envoy_bootstrap
    admin_port = free_port()
    bootstrap = envoy_bootstrap(node_id=node_id, xds_address=control_plane.address, cluster=cluster,
                                admin_port=admin_port, delta=delta, labels=labels, namespace=namespace)
    return Envoy(bootstrap, admin_port=admin_port, log_level=log_level, extra_args=extra_args)
