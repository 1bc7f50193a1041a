"""The console's HTTP server: the page, its bundle, and a small JSON API.

GET /                 the page (static/index.html)
GET /console.js       the esbuild bundle (web/dist/, built by `make web`)
GET /api/config       what the page needs to start: the gRPC-Web URL, QoS priorities
GET /api/mesh         proxies (ACK/NACK), routes, clusters and endpoints with health; the served generation and
                      the last change set rejected whole (/debug/configz); each model's load
                      (the backend's /v1/load); whether the control plane answers (when it
                      does not: the last answer, with the time it stopped)
                      the Endpoint Picker's picks and refusals (its /stats) and the decision
                      loop's last decisions with their inputs (its /status), read whether or
                      not the control plane answers
GET /api/latency      p50/p99 per QoS class over the last window, as a time series

The page calls the backend itself (gRPC-Web through Envoy); this server only
reads the control plane's admin endpoints and the backend's /metrics.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp
from aiohttp import web

from mcp26.mesh import headers as H
from mcp26.mesh.qos import LLM_PRIORITY_CLASSES, QOS_CLASS_NAMES, QosClass
from mcp26.xds.console import mesh_state
from mcp26.xds.console.latency import DEFAULT_METRIC, LatencyWindow

log = logging.getLogger("mcp26.xds.console")
HERE = os.path.dirname(os.path.abspath(__file__))
INDEX = os.path.join(HERE, "static", "index.html")
BUNDLE = os.path.join(HERE, "web", "dist", "console.js")


@dataclass
class ConsoleOptions:
    xds_admin: str = "http://127.0.0.1:18001"
    backend: str = ""                 # the backend's HTTP base (its /metrics)
    grpc_web: str = "http://127.0.0.1:8080"
    envoy_admin: str = ""             # a gateway Envoy's admin, for observed endpoint health
    picker: str = ""                  # the Endpoint Picker's admin (its /stats)
    decision_loop: str = ""           # the decision loop's admin (its /status)
    model: str = ""
    latency_metric: str | None = DEFAULT_METRIC
    scrape_s: float = 1.0
    window_s: float = 10.0
    timeout_s: float = 2.0
    # A proxy's config dump takes seconds at 1,000 services (docs/benchmarks/xds.md, "The console")
    dump_timeout_s: float = 60.0


def _json(data, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, sort_keys=True))


class Console:
    def __init__(self, options: ConsoleOptions):
        self.o = options
        self.latency = LatencyWindow(window_s=options.window_s)
        self.latency_error: str | None = None
        # The control plane as last seen: when it stops answering, the page keeps the last
        # good view (marked with its time) under an "unreachable since" banner.
        self.last_mesh: dict | None = None
        self.last_ok = 0.0
        self.unreachable_since = 0.0
        self._session: aiohttp.ClientSession | None = None
        self._scraper: asyncio.Task | None = None
        # Per proxy, its routes and clusters as of the versions it was sent: a dump is fetched and
        # turned into rows again only when one of them changed (at 1,000 services a dump costs seconds).
        self._rows: dict[str, tuple[tuple, list, list]] = {}
        self._mesh_lock = asyncio.Lock()      # pages polling at once share one round of fetches
        self._shared: tuple[float, dict] | None = None     # (when, the last /api/mesh answer)

    async def _get(self, base: str, path: str, timeout_s: float | None = None) -> tuple[object | str | None, str | None]:
        """(body, None) or (None, a readable reason): a source being down is shown, not raised."""
        if not base:
            return None, "not configured"
        url = base.rstrip("/") + path
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
        try:
            async with self._session.get(url, **({"timeout": timeout} if timeout else {})) as r:
                text = await r.text()
                if r.status != 200:
                    return None, f"{url}: HTTP {r.status}: {text[:200]}"
                return (json.loads(text) if "json" in r.content_type else text), None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return None, f"{url}: {type(e).__name__}: {e}" if str(e) else f"{url}: {type(e).__name__}"
        except json.JSONDecodeError as e:
            return None, f"{url}: not JSON: {e}"

    # -- handlers --------------------------------------------------------------

    async def index(self, request):
        return web.FileResponse(INDEX, headers={"cache-control": "no-store"})

    async def bundle(self, request):
        if not os.path.exists(BUNDLE):
            return web.Response(status=503, text=f"console bundle {BUNDLE} is not built: run `make web`",
                                content_type="text/plain")
        return web.FileResponse(BUNDLE, headers={"cache-control": "no-store"})

    async def config(self, request):
        return _json({"grpcWebUrl": self.o.grpc_web, "model": self.o.model,
                      "priorities": list(LLM_PRIORITY_CLASSES), "priorityHeader": H.LLM_PRIORITY,
                      "priorityClasses": {p: c.header_value for p, c in LLM_PRIORITY_CLASSES.items()},
                      "classes": list(QOS_CLASS_NAMES), "pollMs": int(self.o.scrape_s * 1000),
                      "levels": {str(c.priority_level): c.header_value for c in QosClass}})

    async def _scheduling(self) -> tuple[dict, dict]:
        """(the picker's and the decision loop's panels, their sources); they do not depend on the
        control plane, so they stay current when it is down."""
        (stats, picker_err), (status, loop_err) = await asyncio.gather(
            self._get(self.o.picker, "/stats"), self._get(self.o.decision_loop, "/status"))
        def panel(base, err, doc, shape):
            if not base:
                return None
            return {"error": f"unreachable: {err}"} if err else shape(doc)
        return ({"picker": panel(self.o.picker, picker_err, stats, mesh_state.picker),
                 "decisionLoop": panel(self.o.decision_loop, loop_err, status, mesh_state.decision_loop)},
                {"endpoint picker": {"url": self.o.picker, "error": picker_err if self.o.picker else None},
                 "decision loop": {"url": self.o.decision_loop, "error": loop_err if self.o.decision_loop else None}})

    async def mesh(self, request):
        async with self._mesh_lock:
            if self._shared is not None and time.monotonic() - self._shared[0] < self.o.scrape_s / 2:
                return _json(self._shared[1])          # another page's poll just made it
            doc = await self._mesh()
            self._shared = (time.monotonic(), doc)
            return _json(doc)

    async def _node_rows(self, proxy: dict) -> tuple[list, list, str | None]:
        """(routes, clusters, error) of one proxy, from the cache while its sent versions hold."""
        key = tuple((t["type"], t["sent"]) for t in proxy["types"])
        cached = self._rows.get(proxy["id"])
        if cached is not None and cached[0] == key:
            return cached[1], cached[2], None
        dump, err = await self._get(self.o.xds_admin, f"/debug/config_dump?node={quote(proxy['id'], safe='')}",
                                    timeout_s=self.o.dump_timeout_s)
        if err or not isinstance(dump, dict):
            return [], [], err or "config_dump: not a JSON object"
        res = dump.get("resources", {})
        routes = mesh_state.routes(res, node=proxy["id"], locations=dump.get("rule_sources"))
        clusters = mesh_state.clusters(res)
        self._rows[proxy["id"]] = (key, routes, clusters)
        return routes, clusters, None

    async def _mesh(self) -> dict:
        now = time.time()
        scheduling, scheduling_sources = await self._scheduling()
        syncz, syncz_err = await self._get(self.o.xds_admin, "/debug/syncz")
        if syncz_err is not None and self.o.xds_admin:
            self.unreachable_since = self.unreachable_since or now
            stale = dict(self.last_mesh or {"proxies": [], "routes": [], "clusters": [], "config": None,
                                            "inference": None})
            stale["sources"] = {**stale.get("sources", {}),
                                "control plane": {"url": self.o.xds_admin, "error": syncz_err}}
            stale["controlPlane"] = {"reachable": False, "unreachableSince": self.unreachable_since,
                                     "lastOk": self.last_ok or None, "error": syncz_err}
            stale["updatedAt"] = self.last_ok or None
            stale.update(scheduling, schedulingUpdatedAt=now)
            stale["sources"].update(scheduling_sources)
            return stale
        configz, _ = await self._get(self.o.xds_admin, "/debug/configz")
        observed, envoy_err = {}, None
        if self.o.envoy_admin:
            dump, envoy_err = await self._get(self.o.envoy_admin, "/clusters?format=json")
            observed = mesh_state.observed_health(dump) if isinstance(dump, dict) else {}
        proxies = mesh_state.proxies(syncz if isinstance(syncz, list) else [])
        rows = await asyncio.gather(*(self._node_rows(p) for p in proxies))
        for gone in set(self._rows) - {p["id"] for p in proxies}:
            del self._rows[gone]
        routes, clusters, seen = [], [], set()
        for p, (node_routes, node_clusters, err) in zip(proxies, rows):
            if err:
                p["error"] = err
                continue
            routes += node_routes
            for c in node_clusters:
                if c["name"] not in seen:   # the same cluster is pushed to many proxies
                    seen.add(c["name"])
                    clusters.append(mesh_state.observed_in(c, observed))
        inference, inference_err = await self._get(self.o.backend, "/v1/load")
        doc = {"sources": {"control plane": {"url": self.o.xds_admin, "error": syncz_err},
                           "envoy admin": {"url": self.o.envoy_admin, "error": envoy_err},
                           "model server": {"url": self.o.backend, "error": inference_err},
                           **scheduling_sources},
               "proxies": proxies, "routes": routes, "clusters": clusters,
               "config": mesh_state.config_status(configz if isinstance(configz, dict) else None),
               "inference": mesh_state.inference(inference if isinstance(inference, dict) else None),
               "controlPlane": {"reachable": True, "unreachableSince": None, "lastOk": now, "error": None},
               "updatedAt": now, **scheduling, "schedulingUpdatedAt": now}
        self.last_mesh, self.last_ok, self.unreachable_since = doc, now, 0.0
        return doc

    async def latency_api(self, request):
        note = (f"from {self.o.backend}/metrics ({self.latency.metric}), {self.o.window_s:g} s window"
                if self.latency.metric else f"no latency histogram labelled by QoS class at {self.o.backend or '(backend not set)'}/metrics")
        if self.latency_error:
            note += f" — {self.latency_error}"
        return _json({"series": self.latency.series(), "metric": self.latency.metric, "note": note})

    # -- lifecycle -------------------------------------------------------------

    async def _scrape_loop(self):
        while True:
            if self.o.backend:
                text, err = await self._get(self.o.backend, "/metrics")
                self.latency_error = err
                if isinstance(text, str):
                    self.latency.add(text, self.o.latency_metric)
            await asyncio.sleep(self.o.scrape_s)

    async def on_startup(self, app):
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.o.timeout_s))
        self._scraper = asyncio.create_task(self._scrape_loop())

    async def on_cleanup(self, app):
        self._scraper.cancel()
        await asyncio.gather(self._scraper, return_exceptions=True)
        await self._session.close()

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([web.get("/", self.index), web.get("/console.js", self.bundle),
                        web.get("/api/config", self.config), web.get("/api/mesh", self.mesh),
                        web.get("/api/latency", self.latency_api)])
        app.on_startup.append(self.on_startup)
        app.on_cleanup.append(self.on_cleanup)
        return app


async def run(options: ConsoleOptions, host: str = "127.0.0.1", port: int = 15100,
              ready: asyncio.Event | None = None) -> None:
    runner = web.AppRunner(Console(options).app(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        print(f"MCP Mesh console: http://{host}:{port}/", flush=True)
        if ready:
            ready.set()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
