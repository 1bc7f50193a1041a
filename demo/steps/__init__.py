"""The demo's steps: one module each, found here without a list to edit.

A step module exports STEP = Step(order, name, run) (demo.framework). discover()
imports every module of this package and runs their steps by ascending `order`
(gaps of 10, so a new step fits between two). A step imports only
demo.framework, harness and mesh, never another step: what steps share
(the gateway, the control plane, the upstreams) is on the Demo they get.
"""
from __future__ import annotations

import importlib
import pkgutil

from mcp26.demo.framework import Step


def discover() -> list[Step]:
    steps = [importlib.import_module(f"{__name__}.{m.name}").STEP for m in pkgutil.iter_modules(__path__)]
    orders = [s.order for s in steps]
    if len(set(orders)) != len(orders):
        clash = sorted({o for o in orders if orders.count(o) > 1})
        raise RuntimeError(f"two demo steps share an order: {clash}")
    return sorted(steps, key=lambda s: s.order)
