"""What every step of the demo gets (Demo), returns (Check) and is (Step).

Demo holds what the run shares: the ports it picked (the documented defaults
when free, else any free one), the processes it started (each in its own
session, output in the work dir; stop_all() stops every one, whatever
happened), the watched config directory and the control plane serving it,
the demo's manifests with this run's ports, and waits.
"""
from __future__ import annotations

import http.client
import importlib.resources
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from mcp26.demo.stack.ports import free_port_block, preferred_port
from mcp26.demo.stack.processes import stop_processes
from mcp26.demo.stack.upstreams import EchoUpstream
from mcp26.demo.stack.control_plane import ADS_TYPES, ControlPlane, write_config
from mcp26.demo.stack.xds_scenario import Client

# The demo's own data: the config it serves first (config/) and the routing changes (steps/).
MANIFESTS = Path(str(importlib.resources.files(__package__) / "manifests"))
GATEWAY_NODE = "router~127.0.0.1~demo-gateway.default~default.svc.cluster.local"
GATEWAY_AUTHORITY = "reviews.demo.local"     # the ServiceEntry host of manifests/config/services.yaml
VERSIONS = ("v1", "v2", "v3")


@dataclass
class Check:
    name: str
    expected: str
    observed: str
    ok: bool


@dataclass(frozen=True)
class Step:
    """One numbered part of the demo. `order` places it (steps run by ascending order);
    `run(demo)` prints what it shows and returns its checks (an exception fails the demo)."""
    order: int
    name: str
    run: Callable[["Demo"], list[Check]]


@dataclass
class Process:
    name: str
    proc: subprocess.Popen
    log: Path

    def log_tail(self, n: int = 20) -> str:
        try:
            return "".join(self.log.read_text(errors="replace").splitlines(True)[-n:])
        except OSError:
            return ""


def show_counts(counts: dict[str, int]) -> str:
    """{"v1": 816, "v3": 184} -> "v1 816, v3 184"."""
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "nothing"


class Demo:
    def __init__(self, args):
        self.args = args
        self.mcpctl = str(Path(sys.executable).parent / "mcpctl")
        self.taken: set[int] = set()
        self.xds_port = self.port(args.xds_port)
        self.admin_port = self.port(args.admin_port)
        self.gateway_port = self.port(args.gateway_port)
        self.envoy_admin_port = self.port(args.envoy_admin_port)
        self.upstream_ports = {v: self.port(args.upstream_port + i) for i, v in enumerate(VERSIONS)}
        self.manifests = Path(args.manifests)
        self.workdir = Path(tempfile.mkdtemp(prefix="mcp-demo-"))
        self.config_dir = self.workdir / "config"
        self.config_dir.mkdir()
        self.control_plane = ControlPlane(str(self.config_dir), port=self.xds_port, admin_port=self.admin_port,
                                          test_hooks=False, log_path=str(self.workdir / "control-plane.log"),
                                          new_session=True)
        self.processes: list[Process] = []
        self.upstreams: list[EchoUpstream] = []
        self.urls: dict[str, str] = {}      # what a step serves, for --serve (name -> URL)

    def port(self, preferred: int | None = None) -> int:
        """`preferred` if free, else any free port; never one this run already picked."""
        return preferred_port(preferred, self.taken)

    def port_block(self, n: int) -> int:
        """A base port with n consecutive free ports from it (`mcpctl serve --replicas`)."""
        while True:
            base = free_port_block(n)
            block = set(range(base, base + n))
            if not block & self.taken:
                self.taken |= block
                return base

    # -- processes
    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.adopt(name, proc, log)
        return proc

    def adopt(self, name: str, proc: subprocess.Popen, log: str | Path) -> None:
        """A process a harness driver started (the control plane): stopped with the rest."""
        self.processes.append(Process(name, proc, Path(log)))

    def exited(self) -> list[Process]:
        return [p for p in self.processes if p.proc.poll() is not None]

    def stop_all(self) -> None:
        stop_processes(p.proc for p in reversed(self.processes))
        for u in self.upstreams:
            u.stop()
        if not self.args.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- config
    def manifest(self, name: str) -> str:
        """One of the demo's manifests (e.g. "steps/2-split-80-20.yaml") with this run's ports:
        the files carry the defaults."""
        docs = [d for d in yaml.safe_load_all((self.manifests / name).read_text()) if d]
        for doc in docs:
            spec = doc.get("spec") or {}
            if doc.get("kind") == "Gateway":
                for server in spec.get("servers", []):
                    server["port"]["number"] = self.gateway_port
            if doc.get("kind") == "ServiceEntry":
                for ep in spec.get("endpoints", []):
                    version = (ep.get("labels") or {}).get("version")
                    if version in self.upstream_ports:
                        ep["ports"] = {name: self.upstream_ports[version] for name in ep.get("ports", {"http": 0})}
        return yaml.safe_dump_all(docs, sort_keys=False)

    def write_config(self, name: str, text: str) -> None:
        """Atomically, as a GitOps sync would: the watcher never sees half a file."""
        write_config(str(self.config_dir), name, text)

    def apply(self, name: str, text: str, types: tuple[str, ...] = ADS_TYPES) -> str:
        """Write `name` into the watched directory; wait until the gateway ACKed the change
        (for `types`) -> the generation served. Raises if the control plane rejects it."""
        return self.control_plane.apply(name, text, node_id=GATEWAY_NODE, types=types)

    # -- waits, the gateway
    def wait(self, what: str, predicate, timeout: float = 30.0):
        """Until predicate() is truthy (-> its value); errors while a server comes up are retried."""
        deadline = time.monotonic() + timeout
        last_error = None
        while time.monotonic() < deadline:
            try:
                value = predicate()
                if value:
                    return value
            except (OSError, ValueError, KeyError, http.client.HTTPException) as e:
                last_error = e
            time.sleep(0.05)
        raise RuntimeError(f"timed out waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))

    def wait_synced(self) -> None:
        """Until the gateway has ACKed the latest CDS, EDS, LDS and RDS."""
        self.control_plane.wait_synced(GATEWAY_NODE, ADS_TYPES, timeout=30)

    def gateway(self) -> Client:
        """A keep-alive client to the reviews gateway (GET /reviews), counting who answered."""
        return Client(self.gateway_port, authority=GATEWAY_AUTHORITY, path="/reviews")
