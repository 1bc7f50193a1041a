"""Carrying a policy's actions out through the mesh (scheduler/README.md "Decision loop").

  remap-class     the control plane's admin API (POST /scheduler/class-remap, loopback),
                  which pushes the header-contract filter's configuration over ECDS
  upgrade-flow    kept here as marked flows (status, /flows) for the Endpoint Picker's path
  endpoint-weight the control plane's admin API (POST /scheduler/endpoint-weight, loopback),
                  which pushes the cluster's EDS assignment with that load_balancing_weight;
                  the cluster is the action's `value`, else the pool's (pool_cluster)
  batcher-policy  the replica's admin API (POST /admin/policy), timed
  class-weight    every replica's admin API (POST /admin/class-weight): the class's share of batch
                  slots in the batchers (inference-backend/batch_formation.py "Weighted share")

A remap or weight is posted when it is new, changes, or has less than half its hold left: a
policy that says the same thing every period does not push ECDS or EDS every period.
"""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from mcp26.mesh import gateway_api
from mcp26.scheduler.decisions import Action
from mcp26.scheduler.loop.marks import write_marks

DEFAULT_HOLD_S = 60.0      # a remap or weight whose action names no hold


def pool_cluster(pool_ref: str) -> str:
    """The Envoy cluster of an InferencePool NAMESPACE/NAME: its shadow service's, as the
    control plane names clusters (outbound|PORT||HOST, xds-server/translate/names.py)."""
    namespace, _, name = pool_ref.partition("/")
    return f"outbound|{gateway_api.POOL_SERVICE_PORT}||{gateway_api.pool_host(name, namespace)}"


class ActionApplier:
    def __init__(self, control_plane_admin: str, replica_admin: dict[str, str] | None = None,
                 timeout_s: float = 2.0, marks_path: str | None = None, weight_cluster: str | None = None):
        self.marks_path = marks_path                        # the flow marks file the Endpoint Picker reads
        self.control_plane = control_plane_admin           # host:port of xds-server's admin
        self.replica_admin = dict(replica_admin or {})      # endpoint -> host:port of its admin API
        self.timeout_s = timeout_s
        self.remaps: dict[str, dict] = {}                   # from -> {"to", "expires_at"} as the control plane took it
        self.flows: dict[str, dict] = {}                    # flow -> {"class", "reserved_threads", "expires_at"}
        self.weight_cluster = weight_cluster                # the cluster an endpoint-weight names by default
        self.weights: dict[tuple, dict] = {}                # (cluster, endpoint) -> {"weight", "expires_at"}
        self.class_weights: dict[tuple, int] = {}           # (endpoint, class) -> the weight it took
        self._session: aiohttp.ClientSession | None = None

    async def _post(self, url: str, body: dict) -> tuple[int, dict, float]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        started = time.perf_counter()
        async with self._session.post(url, json=body) as r:
            text = await r.text()
        try:
            doc = json.loads(text) if text else {}
        except ValueError:
            doc = {"body": text[:200]}
        return r.status, doc, (time.perf_counter() - started) * 1e3

    async def apply(self, actions: list[Action], now: float, flow_hold_s: float) -> list[dict]:
        """One outcome per action: {"kind", "subject", "applied", "ms", "error"?, ...}."""
        self._write_marks_after = False
        out = list(await asyncio.gather(*(self._one(a, now, flow_hold_s) for a in actions)))
        if self.marks_path and (self._write_marks_after or self._marks_due(now)):
            write_marks(self.marks_path, self.flows)
            self._marks_written = now
        return out

    def _marks_due(self, now: float) -> bool:
        """Rewritten each period while flows are marked (their expiry moves), once when the last goes."""
        return getattr(self, "_marks_written", None) is None or bool(self.flows) or getattr(self, "_had_flows", False)

    async def _one(self, a: Action, now: float, flow_hold_s: float) -> dict:
        out = {"kind": a.kind, "subject": a.subject, "value": a.value, "applied": False}
        try:
            if a.kind == "remap-class":
                return {**out, **await self._remap(a, now)}
            if a.kind == "upgrade-flow":
                if a.subject not in self.flows and self.marks_path:
                    self._write_marks_after = True
                self.flows[a.subject] = {"class": a.value, "reserved_threads": a.reserved_threads,
                                         "expires_at": now + flow_hold_s}
                return {**out, "applied": True, "expires_at": now + flow_hold_s}
            if a.kind == "batcher-policy":
                return {**out, **await self._batcher(a)}
            if a.kind == "endpoint-weight":
                return {**out, **await self._weight(a, now)}
            if a.kind == "class-weight":
                return {**out, **await self._class_weight(a)}
            return {**out, "note": "recorded; no mesh carrier for this kind yet"}
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return {**out, "error": f"{type(e).__name__}: {e}"}

    async def _remap(self, a: Action, now: float) -> dict:
        hold = a.hold_s or DEFAULT_HOLD_S
        have = self.remaps.get(a.subject)
        if have and have["to"] == a.value and have["expires_at"] - now > hold / 2:
            return {"applied": True, "unchanged": True, "expires_at": have["expires_at"]}
        expires_at = now + hold
        status, doc, ms = await self._post(f"http://{self.control_plane}/scheduler/class-remap",
                                           {"from": a.subject, "to": a.value, "expires_at": expires_at})
        if status != 200:
            return {"error": f"control plane answered {status}: {doc.get('error', doc)}", "ms": ms}
        self.remaps[a.subject] = {"to": a.value, "expires_at": expires_at}
        return {"applied": True, "expires_at": expires_at, "ms": round(ms, 3),
                "generation": doc.get("generation"), "republish_ms": doc.get("republish_ms")}

    async def _weight(self, a: Action, now: float) -> dict:
        cluster = a.value or self.weight_cluster
        if not cluster:
            return {"error": "endpoint-weight: no cluster (the action's value, or the loop's pool)"}
        weight = round(a.weight)        # Envoy's weights are integers; the control plane checks the range
        hold = a.hold_s or DEFAULT_HOLD_S
        have = self.weights.get((cluster, a.subject))
        if have and have["weight"] == weight and have["expires_at"] - now > hold / 2:
            return {"applied": True, "unchanged": True, "expires_at": have["expires_at"]}
        expires_at = now + hold
        status, doc, ms = await self._post(f"http://{self.control_plane}/scheduler/endpoint-weight",
                                           {"cluster": cluster, "weights": {a.subject: weight},
                                            "expires_at": expires_at})
        if status != 200:
            return {"error": f"control plane answered {status}: {doc.get('error', doc)}", "ms": ms}
        self.weights[(cluster, a.subject)] = {"weight": weight, "expires_at": expires_at}
        return {"applied": True, "expires_at": expires_at, "ms": round(ms, 3), "cluster": cluster,
                "generation": doc.get("generation"), "republish_ms": doc.get("republish_ms")}

    async def _class_weight(self, a: Action) -> dict:
        """Post a class's weight to every replica once it is new or changed (each period's same
        answer posts nothing); a replica that refused is asked again next period."""
        if not self.replica_admin:
            return {"note": "recorded: no replica admin addresses (--replica-admin) to carry it to"}
        weight = round(a.weight)
        todo = [e for e in self.replica_admin if self.class_weights.get((e, a.subject)) != weight]
        if not todo:
            return {"applied": True, "unchanged": True}
        results = await asyncio.gather(*(self._post(f"http://{self.replica_admin[e]}/admin/class-weight",
                                                    {"class": a.subject, "weight": weight}) for e in todo),
                                       return_exceptions=True)
        errors = []
        for e, r in zip(todo, results):
            if isinstance(r, Exception) or r[0] != 200:
                errors.append(f"{e}: {r if isinstance(r, Exception) else r[1].get('error', r[1])}")
            else:
                self.class_weights[(e, a.subject)] = weight
        return {"applied": not errors, **({"error": "; ".join(errors)} if errors else {}), "replicas": len(todo)}

    def in_force_weights(self, now: float) -> list[dict]:
        """The endpoint weights the control plane took, with their expiry (status)."""
        return [{"cluster": c, "endpoint": e, **v, "expires_in_s": round(v["expires_at"] - now, 3)}
                for (c, e), v in sorted(self.weights.items())]

    async def _batcher(self, a: Action) -> dict:
        admin = self.replica_admin.get(a.subject)
        if admin is None:
            return {"error": f"no admin address for replica {a.subject} (--replica-admin)"}
        try:
            # a preset's name is the spec's qosPolicy (the replica refuses fields it does not know)
            body = json.loads(a.value) if a.value.strip().startswith("{") else {"qosPolicy": a.value}
        except ValueError as e:
            return {"error": f"value: {e}"}
        status, doc, ms = await self._post(f"http://{admin}/admin/policy", body)
        if status != 200:
            return {"error": f"replica answered {status}: {doc.get('error', doc)}", "ms": ms}
        return {"applied": True, "ms": round(ms, 3), "generation": doc.get("generation")}

    def expire(self, now: float) -> None:
        self._had_flows = bool(self.flows)
        for table in (self.remaps, self.flows, self.weights):
            for k in [k for k, v in table.items() if v["expires_at"] <= now]:
                del table[k]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
