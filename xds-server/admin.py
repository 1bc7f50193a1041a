"""Admin HTTP (aiohttp, on the control plane's loop), as istiod's debug endpoints.

/healthz                      200 while serving; says whether a config is loaded; 503 with
                              the reason once the directory watch has stopped (no change
                              would be applied any more)
/debug/syncz                  per node and type: sent, acked, nacked + error
/debug/configz                the config being served and the last rejected change set
/debug/config_dump?node=ID    the node's snapshot as Envoy JSON
/debug/tracez[?name=xds.push] recent OpenTelemetry spans
/debug/certs                  the mesh CA's root and each node's certificate (no keys)
/metrics                      Prometheus text (OpenTelemetry metrics)
                              (every view: session keys and Wasm env values redacted)
/scheduler, POST|DELETE /scheduler/class-remap, GET|POST|DELETE /scheduler/endpoint-weight
                              the decision loop's remaps and endpoint weights (scheduler_actions.py)
POST /debug/inject            test hook only (serve --test-hooks): raw resources over every snapshot
"""
from __future__ import annotations

import json

from aiohttp import web
from google.protobuf import json_format

from mcp26.serving.json_body import parse_json_body
from mcp26.xds.resource_overrides import parse_overrides
from mcp26.xds.scheduler_actions import routes as scheduler_routes   # the decision loop's API
from mcp26.xds.sync import short_name

from mcp26.xds.redact import known_secrets, redact, redact_text

def _json(data, status: int = 200, secrets=()) -> web.Response:
    # Every view is redacted (xds.redact): the session key is in the
    # snapshots, and can be quoted back in a NACK or a diagnostic.
    text = redact_text(json.dumps(redact(data), indent=1, sort_keys=True), secrets)
    return web.Response(text=text, status=status, content_type="application/json")


def make_app(server) -> web.Application:
    async def healthz(request):
        body = {"status": "ok", "config_loaded": server.cache.ready,
                "generation": server.status["generation"]}
        failure = server.source.failure
        if failure:
            return _json({**body, "status": "unhealthy", "reason": failure}, 503)
        return _json(body)

    async def syncz(request):
        return _json(server.hub.tracker.syncz(), secrets=known_secrets(server.cache.config))

    async def configz(request):
        return _json(server.status, secrets=known_secrets(server.cache.config))

    async def config_dump(request):
        node_id = request.query.get("node", "")
        node, snap = server.node_snapshot(node_id)
        if node is None:
            return _json({"error": f"no connected node {node_id!r}",
                          "nodes": sorted(n.id for n in server.hub.nodes())}, 404)
        out = {"node": node_id, "kind": node.kind, "generation": snap.generation if snap else "",
               "resources": {}}
        for type_url, by_name in (snap.resources.items() if snap else ()):
            out["resources"][short_name(type_url)] = {
                name: {"version": r.version, "resource": json_format.MessageToDict(r.message)}
                for name, r in by_name.items()}
        return _json(out, secrets=known_secrets(server.cache.config))

    async def tracez(request):
        return _json(server.telemetry.recent_spans(request.query.get("name")),
                     secrets=known_secrets(server.cache.config))

    async def metrics(request):
        return web.Response(body=server.telemetry.prometheus_text(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def inject(request):
        if not server.test_hooks:
            return _json({"error": "test hooks are off (serve --test-hooks)"}, 403)
        try:
            overrides = parse_overrides(parse_json_body(await request.read()))
        except (ValueError, KeyError, json_format.ParseError) as e:
            return _json({"error": str(e)}, 400)
        server.inject(overrides)
        return _json({"injected": {short_name(t): sorted(v) for t, v in overrides.items()}})

    async def certs(request):
        # The mesh CA's root and each node's workload certificate: subject, SAN,
        # validity, serial -- never key material (sds.IdentityService.debug_certs).
        return _json(server.identity.debug_certs())

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/debug/syncz", syncz),
                    web.get("/debug/configz", configz), web.get("/debug/config_dump", config_dump),
                    web.get("/debug/tracez", tracez), web.get("/metrics", metrics),
                    web.get("/debug/certs", certs),
                    web.post("/debug/inject", inject)])
    app.add_routes(scheduler_routes(server))
    return app


async def start_admin(server, address: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(make_app(server), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, address, port)
    await site.start()
    return runner
