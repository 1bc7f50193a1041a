"""How the loop calls a policy: two methods, whatever runs them.

The built-in (builtin_policy.py) is plain Python; a policy FILE is a Wasm
component run by the plugin host (scheduler/plugins/host.py) once that host
exists, and until then a plain Python file defining decide() and score()
(tests use that for policies that raise or are slow).
"""
from __future__ import annotations

import importlib.util
import os
from typing import Protocol

from scheduler.decisions import Action, EndpointInfo, RequestInfo, Signals


class Policy(Protocol):
    def decide(self, signals: Signals) -> list[Action]: ...

    def score(self, request: RequestInfo, endpoints: list[EndpointInfo]) -> list[float]: ...


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


def load_policy(path: str | None, **builtin_options) -> tuple[Policy, str]:
    """(policy, what it is) for --policy FILE, or the built-in decision table."""
    if not path:
        from scheduler.loop.builtin_policy import BuiltinPolicy
        return BuiltinPolicy(**builtin_options), "builtin (plain Python)"
    if not os.path.isfile(path):
        raise ValueError(f"--policy {path}: no such file")
    if path.endswith(".py"):
        return PythonFilePolicy(path), f"python:{path}"
    raise ValueError(f"--policy {path}: expected a .py file (Wasm components need scheduler/plugins/host.py)")
