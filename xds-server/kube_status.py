"""Status on the API server's objects, as istiod writes it, by one replica at a time.

`LeaderElection` holds a `coordination.k8s.io/v1` Lease as client-go's leaderelection does
(15 s lease, renewed every 5 s, tried every 2 s; a write conflict means another replica won).
While this replica leads, `StatusWriter.write(server)` sets, after each change set:

- Gateway API (the spec's conditions, `observedGeneration` on each): a Gateway of class
  `istio` gets `Accepted` and `Programmed`, and per listener `Accepted`, `Programmed`,
  `ResolvedRefs`, `attachedRoutes` and `supportedKinds`; an HTTPRoute or GRPCRoute gets one
  `parents` entry per parentRef with `Accepted` and `ResolvedRefs`, under Istio's controller
  name. Reasons come from the conversion's findings (mesh.gateway_api: NotAllowedByListeners,
  NoMatchingParent, RefNotPermitted, InvalidKind ...).
- An InferencePool gets a `parents` entry per Gateway whose routes send to it.
- An Istio resource gets `validationMessages` (istioctl analyze's codes, level ERROR,
  WARNING or INFO), as istiod's analysis status does.

Nothing is written that did not change (a condition keeps its `lastTransitionTime` while its
status stays), writes go to the status subresource as merge patches, and a failed write is
tried again at the next change set.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import re
import socket

from mcp26.mesh.gateway_api import CONTROLLER_CLASSES, GROUP as GATEWAY_GROUP, ROUTE_KINDS
from mcp26.mesh.kube_source import ApiError, KINDS

log = logging.getLogger("mcp26.xds.status")

CONTROLLER_NAME = "istio.io/gateway-controller"
LEASE_NAME = "mcp-mesh-status-leader"
LEASE_S, RENEW_S, RETRY_S = 15, 5.0, 2.0
ISTIO_GROUPS = ("networking.istio.io", "security.istio.io", "extensions.istio.io", "telemetry.istio.io")
_NOTE = re.compile(r"^(Accepted|ResolvedRefs|Programmed)=False \((\w+)\): (.*)$")
LEVELS = {"error": "ERROR", "warning": "WARNING", "info": "INFO"}
# (group, kind) whose status this writes: what the ClusterRole lets it patch (kube_control.py).
STATUS_KINDS = {(GATEWAY_GROUP, "Gateway"), (GATEWAY_GROUP, "HTTPRoute"), (GATEWAY_GROUP, "GRPCRoute"),
                ("inference.networking.k8s.io", "InferencePool"),
                *((g, k) for g, k in (("networking.istio.io", "VirtualService"), ("networking.istio.io", "DestinationRule"),
                                      ("networking.istio.io", "Gateway"), ("networking.istio.io", "ServiceEntry"),
                                      ("networking.istio.io", "WorkloadEntry"), ("networking.istio.io", "Sidecar"),
                                      ("security.istio.io", "AuthorizationPolicy"),
                                      ("security.istio.io", "PeerAuthentication"),
                                      ("security.istio.io", "RequestAuthentication"),
                                      ("extensions.istio.io", "WasmPlugin")))}


def now_rfc3339(micro: bool = False) -> str:
    t = dt.datetime.now(dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if micro else t.strftime("%Y-%m-%dT%H:%M:%SZ")


class LeaderElection:
    def __init__(self, api, namespace: str, name: str = LEASE_NAME, identity: str = ""):
        self.api, self.namespace, self.name = api, namespace, name
        self.identity = identity or f"{socket.gethostname()}_{os.getpid()}"
        self.leading = False
        self.changed = asyncio.Event()       # set on every gain or loss
        self.transitions = 0

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    async def run(self) -> None:
        while True:
            try:
                won = await self.try_acquire_or_renew()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("lease %s/%s: %s", self.namespace, self.name, e)
                won = False
            if won != self.leading:
                self.leading = won
                self.transitions += 1
                self.changed.set()
                log.info("%s %s the status lease %s/%s", self.identity, "holds" if won else "lost",
                         self.namespace, self.name)
            await asyncio.sleep(RENEW_S if self.leading else RETRY_S)

    async def try_acquire_or_renew(self) -> bool:
        try:
            lease = await self.api.request("GET", self.path)
        except ApiError as e:
            if e.status != 404:
                raise
            lease = None
        stamp = now_rfc3339(micro=True)
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": LEASE_S,
                             "acquireTime": stamp, "renewTime": stamp, "leaseTransitions": 0}}
            try:
                await self.api.request("POST", self.path.rsplit("/", 1)[0], body=body)
                return True
            except ApiError as e:
                if e.status == 409:          # another replica made it first
                    return False
                raise
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.identity and not _expired(spec):
            return False
        if holder != self.identity:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec["acquireTime"] = stamp
        spec.update(holderIdentity=self.identity, renewTime=stamp, leaseDurationSeconds=LEASE_S)
        lease["spec"] = spec
        try:             # PUT with the resourceVersion read: a conflict (409) means someone else wrote first
            await self.api.request("PUT", self.path, body=lease)
            return True
        except ApiError as e:
            if e.status == 409:
                return False
            raise

    async def release(self) -> None:
        """On a clean stop: let another replica take over at once, as client-go's ReleaseOnCancel."""
        if not self.leading:
            return
        try:
            lease = await self.api.request("GET", self.path)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"].update(holderIdentity="", leaseDurationSeconds=1)
                await self.api.request("PUT", self.path, body=lease)
        except Exception as e:
            log.warning("releasing the lease: %s", e)
        self.leading = False


def _expired(spec: dict) -> bool:
    renew = spec.get("renewTime") or spec.get("acquireTime")
    if not renew:
        return True
    try:
        t = dt.datetime.strptime(renew.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    except ValueError:
        t = dt.datetime.strptime(renew.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S%z")
    return dt.datetime.now(dt.timezone.utc) > t + dt.timedelta(seconds=int(spec.get("leaseDurationSeconds") or LEASE_S))


# --- what the status should be -------------------------------------------------------------

def _condition(type_: str, ok: bool, reason: str, message: str, generation) -> dict:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message,
            "observedGeneration": generation}


def _notes_by(diagnostics: list[dict]) -> dict[str, list[tuple[str, str, str, str]]]:
    """{resource ref: [(field, condition, reason, message)]} from the conversion's findings."""
    out: dict[str, list] = {}
    for d in diagnostics:
        m = _NOTE.match(d.get("message") or "")
        if m:
            out.setdefault(d.get("resource") or "", []).append((d.get("field") or "", *m.groups()))
    return out


def desired_statuses(objects: list[dict], diagnostics: list[dict]) -> dict[tuple, dict]:
    """{(apiVersion, kind, namespace, name): status} for the objects this control plane reports on.
    `diagnostics`: the latest change set's findings (server.status's dicts), accepted or rejected."""
    notes = _notes_by(diagnostics)
    out: dict[tuple, dict] = {}
    gateways, routes, pools = [], [], []
    for o in objects:
        group = str(o.get("apiVersion", "")).split("/")[0]
        if group == GATEWAY_GROUP and o.get("kind") == "Gateway":
            gateways.append(o)
        elif group == GATEWAY_GROUP and o.get("kind") in ROUTE_KINDS:
            routes.append(o)
        elif o.get("kind") == "InferencePool":
            pools.append(o)
        elif group in ISTIO_GROUPS:
            out[_key(o)] = _validation_messages(o, diagnostics)
    ours = {(g["metadata"].get("namespace"), g["metadata"]["name"]): g for g in gateways
            if (g.get("spec") or {}).get("gatewayClassName") in CONTROLLER_CLASSES}
    attached: dict[tuple, int] = {}
    pool_parents: dict[tuple, list] = {}
    for r in routes:
        meta, gen = r["metadata"], r["metadata"].get("generation")
        ref = f"{r['kind']}/{meta.get('namespace')}/{meta['name']}"
        mine = notes.get(ref, [])
        unresolved = [(reason, msg) for f, cond, reason, msg in mine if cond == "ResolvedRefs"]
        parents = []
        for i, p in enumerate((r.get("spec") or {}).get("parentRefs") or []):
            gw_key = (p.get("namespace") or meta.get("namespace"), p.get("name"))
            if (p.get("kind") or "Gateway") == "Gateway" and gw_key not in ours and gw_key[1]:
                continue            # another controller's Gateway: not ours to report on
            refused = [(reason, msg) for f, cond, reason, msg in mine
                       if cond == "Accepted" and f == f"spec.parentRefs[{i}]"]
            accepted = _condition("Accepted", not refused, refused[0][0] if refused else "Accepted",
                                  refused[0][1] if refused else "Route was valid", gen)
            resolved = _condition("ResolvedRefs", not unresolved, unresolved[0][0] if unresolved else "ResolvedRefs",
                                  unresolved[0][1] if unresolved else "All references resolved", gen)
            parent_ref = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": p.get("name"),
                          **{k: p[k] for k in ("namespace", "sectionName", "port") if p.get(k) is not None}}
            parents.append({"parentRef": parent_ref, "controllerName": CONTROLLER_NAME,
                            "conditions": [accepted, resolved]})
            if not refused:
                for lis in (ours[gw_key].get("spec") or {}).get("listeners") or [] if gw_key in ours else []:
                    if not p.get("sectionName") or p["sectionName"] == lis.get("name"):
                        attached[(*gw_key, lis.get("name"))] = attached.get((*gw_key, lis.get("name")), 0) + 1
                for rule in (r.get("spec") or {}).get("rules") or []:
                    for b in rule.get("backendRefs") or []:
                        if b.get("kind") == "InferencePool":
                            pk = (b.get("namespace") or meta.get("namespace"), b.get("name"))
                            if gw_key not in pool_parents.setdefault(pk, []):
                                pool_parents[pk].append(gw_key)
        out[_key(r)] = {"parents": parents}
    for (ns, name), g in ours.items():
        gen = g["metadata"].get("generation")
        ref = f"Gateway/{ns}/{name}"
        listener_notes = {f: (reason, msg) for f, cond, reason, msg in notes.get(ref, [])}
        listeners = []
        for i, lis in enumerate((g.get("spec") or {}).get("listeners") or []):
            bad = listener_notes.get(f"spec.listeners[{i}].protocol")
            kinds = [{"group": GATEWAY_GROUP, "kind": k} for k in
                     (("GRPCRoute", "HTTPRoute") if lis.get("protocol") in ("HTTP", "HTTPS") else ())]
            listeners.append({"name": lis.get("name"), "attachedRoutes": attached.get((ns, name, lis.get("name")), 0),
                              "supportedKinds": kinds, "conditions": [
                                  _condition("Accepted", not bad, bad[0] if bad else "Accepted",
                                             bad[1] if bad else "No errors found", gen),
                                  _condition("Programmed", not bad, "Invalid" if bad else "Programmed",
                                             bad[1] if bad else "No errors found", gen),
                                  _condition("ResolvedRefs", True, "ResolvedRefs", "No errors found", gen)]})
        out[_key(g)] = {"conditions": [
            _condition("Accepted", True, "Accepted", "Resource accepted", gen),
            _condition("Programmed", True, "Programmed", "Resource programmed: served to its proxies over xDS", gen)],
            "listeners": listeners}
    for p in pools:
        meta, gen = p["metadata"], p["metadata"].get("generation")
        parents = [{"parentRef": {"group": GATEWAY_GROUP, "kind": "Gateway", "namespace": ns, "name": name},
                    "conditions": [_condition("Accepted", True, "Accepted", "Referenced by an HTTPRoute of this Gateway", gen),
                                   _condition("ResolvedRefs", True, "ResolvedRefs", "All references resolved", gen)]}
                   for ns, name in pool_parents.get((meta.get("namespace"), meta["name"]), [])]
        out[_key(p)] = {"parents": parents}
    return out


def _validation_messages(o: dict, diagnostics: list[dict]) -> dict:
    meta = o["metadata"]
    ref = f"{o['kind']}/{meta.get('namespace') or 'default'}/{meta['name']}"
    msgs = []
    for d in diagnostics:
        if d.get("resource") == ref and d.get("severity") in LEVELS:
            m = {"level": LEVELS[d["severity"]], "type": {"code": d.get("code") or "MCP0001"},
                 "description": f"{d.get('field')}: {d.get('message')}" if d.get("field") else d.get("message")}
            if m not in msgs:
                msgs.append(m)
    return {"validationMessages": msgs, "observedGeneration": meta.get("generation")} if msgs else {}


def _key(o: dict) -> tuple:
    meta = o["metadata"]
    return o["apiVersion"], o["kind"], meta.get("namespace") or "", meta["name"]


def _without_times(v):
    if isinstance(v, dict):
        return {k: _without_times(x) for k, x in v.items() if k != "lastTransitionTime"}
    if isinstance(v, list):
        return [_without_times(x) for x in v]
    return v


def _keep_times(new, old):
    """`new` with each condition's lastTransitionTime taken from `old` where its status stayed."""
    if isinstance(new, dict):
        if isinstance(new.get("type"), str) and "status" in new and "reason" in new:        # a condition
            before = old if isinstance(old, dict) else {}
            same = before.get("status") == new["status"] and before.get("lastTransitionTime")
            return {**new, "lastTransitionTime": before["lastTransitionTime"] if same else now_rfc3339()}
        return {k: _keep_times(v, (old or {}).get(k) if isinstance(old, dict) else None) for k, v in new.items()}
    if isinstance(new, list):
        olds = old if isinstance(old, list) else []
        by_type = {o["type"]: o for o in olds if isinstance(o, dict) and isinstance(o.get("type"), str)}
        out = []
        for i, v in enumerate(new):
            match = by_type.get(v["type"]) if isinstance(v, dict) and isinstance(v.get("type"), str) \
                else (olds[i] if i < len(olds) else None)
            out.append(_keep_times(v, match))
        return out
    return new


class StatusWriter:
    def __init__(self, api, source, election: LeaderElection):
        self.api, self.source, self.election = api, source, election
        self.writes = 0
        self._lock = asyncio.Lock()

    async def write(self, diagnostics: list[dict]) -> int:
        """One round: patch every status that differs from what it should be. Returns writes made."""
        if not self.election.leading:
            return 0
        async with self._lock:
            objects = self.source.objects()
            current = {_key(o): o for o in objects}
            made = 0
            for key, want in desired_statuses(objects, diagnostics).items():
                obj = current[key]
                have = obj.get("status") or {}
                if "parents" in want and obj["kind"] in ROUTE_KINDS:     # other controllers' entries stay
                    want = {**want, "parents": want["parents"] + [
                        p for p in have.get("parents") or [] if p.get("controllerName") != CONTROLLER_NAME]}
                if _without_times(want) == _without_times(have):
                    continue
                want = _keep_times(want, have)
                if await self._patch(obj, want):
                    made += 1
            self.writes += made
            return made

    async def _patch(self, obj: dict, status: dict) -> bool:
        kind = next((k for k in KINDS if k.api_version == obj["apiVersion"] and k.kind == obj["kind"]), None)
        if kind is None:
            return False
        meta = obj["metadata"]
        # Keys the writer no longer sets are removed (null in a merge patch), others replaced.
        patch = {"status": {**{k: None for k in (obj.get("status") or {}) if k not in status}, **status}}
        try:
            await self.api.request("PATCH", kind.path(meta.get("namespace", ""), meta["name"]) + "/status",
                                   body=patch, content_type="application/merge-patch+json")
            return True
        except ApiError as e:
            if e.status in (404, 409):        # deleted meanwhile, or a conflict: the next round
                return False
            log.warning("status of %s/%s: %s", obj["kind"], meta["name"], e)
            return False


    async def run(self, server, period: float = 30.0) -> None:
        """Write after every change set the server takes or rejects, on gaining the lease, and
        every `period` s (a write that failed is tried again)."""
        while True:
            waits = [asyncio.ensure_future(server.changed.wait()), asyncio.ensure_future(self.election.changed.wait())]
            await asyncio.wait(waits, timeout=period, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            server.changed.clear()
            self.election.changed.clear()
            try:
                await self.write(findings(server.status))
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("writing status: %s", e)


def findings(status: dict) -> list[dict]:
    """The latest change set's diagnostics from the server's status: its warnings, and the
    errors of a change set it rejected."""
    return [*(status.get("warnings") or []), *((status.get("rejected") or {}).get("errors") or [])]
