"""How the loop calls a policy: two methods, whatever runs them.

  --policy (none)            the seed's decision table as a Wasm plugin: PolicyHost(None)
  --policy FILE.py|FILE.wasm a Wasm policy plugin (componentize-py builds a .py; cached)
  --policy builtin-python    the same table in plain Python (loop/builtin_policy.py), for comparison
  --policy python:FILE.py    a plain Python file with decide()/score() run in-process (tests:
                             policies that raise or are slow, without a componentize-py build)

Loading a Wasm plugin blocks (~30-60 s cold: build + compile; ~0.1 s from the caches): the
service loads it in a worker thread before the loop starts.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Protocol

from mcp26.scheduler.decisions import Action, EndpointInfo, RequestInfo, Signals
from mcp26.scheduler.loop.builtin_policy import REMAP_HOLD_S, BuiltinPolicy

BUILTIN_PYTHON = "builtin-python"


class Policy(Protocol):
    def decide(self, signals: Signals) -> list[Action]: ...

    def score(self, request: RequestInfo, endpoints: list[EndpointInfo]) -> list[float]: ...


class PolicyFailed(Exception):
    """A plugin call that did not answer (the host's reason: fuel, deadline, trap, ...)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class PythonFilePolicy:
    """A plain Python file with module-level decide(signals) and score(request, endpoints)."""

    def __init__(self, path: str):
        self.path = path
        spec = importlib.util.spec_from_file_location(f"scheduler_policy_{abs(hash(path))}", path)
        if spec is None or spec.loader is None:
            raise ValueError(f"{path}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not callable(getattr(module, "decide", None)):
            raise ValueError(f"{path}: defines no decide(signals)")
        self._module = module

    def decide(self, signals: Signals) -> list[Action]:
        return list(self._module.decide(signals))

    def score(self, request: RequestInfo, endpoints: list[EndpointInfo]) -> list[float]:
        fn = getattr(self._module, "score", None)
        return [0.0] * len(endpoints) if fn is None else [float(x) for x in fn(request, endpoints)]


class WasmPolicy:
    """A Wasm policy plugin through scheduler/plugins/host.py's PolicyHost.

    A failed call (PolicyHost returns ok=False with the previous actions) raises PolicyFailed
    with the host's reason, so the loop keeps its last decision and counts the reason.
    hold_s, when given, overrides the plugin's remap hold (tests use short holds)."""

    def __init__(self, host, hold_s: float | None = None):
        self.host, self.hold_s = host, hold_s

    def decide(self, signals: Signals) -> list[Action]:
        d = self.host.decide(signals)
        if not d.ok:
            reason, _, detail = (d.error or "unknown: ").partition(": ")
            raise PolicyFailed(reason, detail)
        if self.hold_s is None:
            return list(d.actions)
        return [dataclasses.replace(a, hold_s=self.hold_s) if a.kind == "remap-class" else a for a in d.actions]

    def score(self, request: RequestInfo, endpoints: list[EndpointInfo]) -> list[float]:
        s = self.host.score(request, endpoints)
        if s is None:
            raise PolicyFailed("score", self.host.last_error or "failed")
        return s

    def stats(self) -> dict:
        return self.host.stats()

    def close(self) -> None:
        self.host.close()


def load_policy(spec: str | None, hold_s: float | None = None, cache_dir: str | None = None,
                watch: bool = False, burst_preset: str | None = None) -> tuple[Policy, str]:
    """(policy, what it is). Blocking for a Wasm plugin: call it off the event loop."""
    if burst_preset and spec != BUILTIN_PYTHON:
        raise ValueError(f"--rebatch-on-burst needs --policy {BUILTIN_PYTHON}: the Wasm plugins' signals "
                         "(wit/policy.wit) do not carry write bursts")
    if spec == BUILTIN_PYTHON:
        return (BuiltinPolicy(hold_s=REMAP_HOLD_S if hold_s is None else hold_s, burst_preset=burst_preset),
                "builtin-python (plain Python)")
    if spec and spec.startswith("python:"):
        path = spec[len("python:"):]
        if not os.path.isfile(path):
            raise ValueError(f"--policy {spec}: no such file")
        return PythonFilePolicy(path), f"python:{path}"
    if spec and not os.path.isfile(spec):
        raise ValueError(f"--policy {spec}: no such file")
    if spec and not spec.endswith((".py", ".wasm")):
        raise ValueError(f"--policy {spec}: expected FILE.py or FILE.wasm (a Wasm plugin), "
                         f"python:FILE.py or {BUILTIN_PYTHON}")
    from mcp26.scheduler.plugins.host import PolicyHost
    host = PolicyHost(spec or None, cache_dir=cache_dir)
    info = host.load()                         # raises BuildError/PluginError: the loop does not start
    host.decide(Signals(now_s=0.0))            # the first call pays the instance's warm-up (~30 ms), not cycle 1
    if watch:
        host.start_watching()
    what = "seed table" if not spec else spec
    return WasmPolicy(host, hold_s), (f"wasm:{what} (sha256 {info['sha256'][:12]}, "
                                      f"{'cached' if info.get('compiled_from_cache') else 'compiled'})")
