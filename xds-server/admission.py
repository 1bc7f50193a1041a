"""A validating admission webhook, as istiod's (`istiod-default-validator`): the API server asks
before it stores a resource, and a resource `mcpctl validate` would reject is refused with the
same message, the field path standing where the file and line stand in a file.

`review(body)` is the protocol, sans-IO: an `admission.k8s.io/v1` AdmissionReview in, its
response out. It validates the one object sent, with mesh.validation (the same validators as
`mcpctl validate` and the control plane), and allows anything it does not model (a kind it
does not know is not its business: the webhook configuration names the kinds it validates).
Warnings go back as the AdmissionReview's `warnings`, which kubectl prints.

`AdmissionServer` serves it over TLS with a certificate from the mesh CA (`SERVICE.NS.svc` and
the address it listens on), and `keep_ca_bundle` keeps the `caBundle` of the
ValidatingWebhookConfiguration equal to the mesh CA's root, as istiod's webhook controller does.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import tempfile
from pathlib import Path

from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.parse import resource_from_document
from mcp26.mesh.resources import MeshConfig
from mcp26.mesh import validation
from mcp26.mesh.kube_source import KINDS, ApiError

log = logging.getLogger("mcp26.xds.admission")

PATH = "/validate"
MAX_BODY = 3 << 20          # the API server's own request limit is 3 MiB
WEBHOOK_CONFIGURATION = "mcp-mesh-validator"
REVIEW_TIMEOUT_S = 8.0
MISSING_RETRY_S = 2.0


def message(d: Diagnostic) -> str:
    """`mcpctl validate`'s line without file:line: resource, field path, message."""
    parts = [p for p in (d.resource, d.field) if p]
    return ": ".join([*parts, d.message])


def review(body: bytes) -> dict:
    """AdmissionReview request (bytes) -> AdmissionReview response (dict)."""
    try:
        req = json.loads(body)
        request = req["request"]
        uid = str(request["uid"])
    except (ValueError, KeyError, TypeError) as e:
        # Not a review at all: nothing to answer to, so an error the API server logs.
        raise ValueError(f"not an admission.k8s.io/v1 AdmissionReview: {e}") from None
    out = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": uid, "allowed": True}}
    if request.get("operation") not in ("CREATE", "UPDATE") or not isinstance(request.get("object"), dict):
        return out
    obj = request["object"]
    errors: list[Diagnostic] = []
    res = resource_from_document(obj, "", 0, {}, errors)
    if res is not None and not errors:
        validation._load_validators()
        if not (validation.GROUP_VALIDATORS.get((res.group, res.kind)) or validation.VALIDATORS.get(res.kind)):
            return out            # not a kind mesh validates
        errors = validation.validate_resource(res, MeshConfig([res]))
    blocking = [d for d in errors if d.severity == "error"]
    warnings = [message(d) for d in errors if d.severity == "warning"]
    if warnings:
        out["response"]["warnings"] = warnings[:20]
    if blocking:
        text = "; ".join(message(d) for d in blocking)
        out["response"].update(allowed=False, status={
            "status": "Failure", "code": 400, "reason": "Invalid",
            "message": f"admission webhook \"validation.mcp-mesh.io\" denied the request: {text}"[:4096]})
    return out


def timed_out(body: bytes) -> dict:
    uid = str(json.loads(body)["request"]["uid"])
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
        "uid": uid, "allowed": False, "status": {"status": "Failure", "code": 400, "reason": "Invalid",
                                                 "message": f"not validated within {REVIEW_TIMEOUT_S:.0f} s: "
                                                            "the object is too large to check"}}}


def server_certificate(ca, hosts: list[str], directory: str | None = None) -> tuple[str, str]:
    """(cert chain path, key path) for the webhook, issued by the mesh CA for `hosts`."""
    chain, key = ca.issue_server(hosts)
    d = Path(directory or tempfile.mkdtemp(prefix="mcp-webhook-"))
    (d / "tls.crt").write_bytes(chain)
    (d / "tls.key").touch(0o600)
    (d / "tls.key").write_bytes(key)
    return str(d / "tls.crt"), str(d / "tls.key")


class AdmissionServer:
    """`review` over HTTPS (aiohttp), on `address:port`."""

    def __init__(self, cert: str, key: str, address: str = "127.0.0.1", port: int = 15017):
        self.cert, self.key, self.address, self.port = cert, key, address, port
        self.reviews = 0
        self._runner = None

    async def start(self) -> None:
        from aiohttp import web

        async def handle(request: web.Request) -> web.Response:
            body = await request.content.read(MAX_BODY + 1)
            if len(body) > MAX_BODY:
                return web.Response(status=413, text=f"an AdmissionReview over {MAX_BODY} bytes")
            try:
                # In a worker thread, bounded: the API server waits `timeoutSeconds` (10 s) and
                # then applies the failure policy; answer first, with a verdict that says why.
                answer = await asyncio.wait_for(asyncio.to_thread(review, body), REVIEW_TIMEOUT_S)
            except ValueError as e:
                return web.Response(status=400, text=str(e))
            except asyncio.TimeoutError:
                answer = timed_out(body)
            self.reviews += 1
            return web.json_response(answer)

        app = web.Application(client_max_size=MAX_BODY + 1)
        app.router.add_post(PATH, handle)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert, self.key)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.address, self.port, ssl_context=ctx)
        await site.start()
        if not self.port:
            self.port = site._server.sockets[0].getsockname()[1]
        log.info("admission webhook on https://%s:%d%s", self.address, self.port, PATH)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def keep_ca_bundle(api, ca_pem: bytes, name: str = WEBHOOK_CONFIGURATION, period: float = 30.0) -> None:
    """Keep every webhook's clientConfig.caBundle in ValidatingWebhookConfiguration `name` equal to
    the mesh CA's root: patched when it differs (conflicts retried at the next round), never
    written when it is already right."""
    bundle = base64.b64encode(ca_pem).decode()
    path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}"
    while True:
        found = True
        try:
            found = await ensure_ca_bundle(api, path, bundle) is not None
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("caBundle of %s: %s", name, e)
        await asyncio.sleep(period if found else MISSING_RETRY_S)    # not applied yet: look again soon


async def ensure_ca_bundle(api, path: str, bundle: str) -> bool | None:
    """One round: True when a patch was sent, False when it was right, None when there is no such configuration."""
    try:
        current = await api.request("GET", path)
    except ApiError as e:
        if e.status == 404:
            return None           # not installed (yet)
        raise
    hooks = current.get("webhooks") or []
    if all((h.get("clientConfig") or {}).get("caBundle") == bundle for h in hooks):
        return False
    patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": current["metadata"]["resourceVersion"]}]
    patch += [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle} for i in range(len(hooks))]
    await api.request("PATCH", path, body=patch, content_type="application/json-patch+json")
    log.info("caBundle of %s set to the mesh CA's root", path.rsplit("/", 1)[-1])
    return True


def rules() -> list[dict]:
    """What the webhook configuration sends here: CREATE and UPDATE of every config kind the
    control plane reads and validates (the core kinds are Kubernetes' own to admit)."""
    by_group: dict[str, list[str]] = {}
    for k in KINDS:
        if k.group and k.group != "discovery.k8s.io":
            by_group.setdefault(k.group, []).append(k.plural)
    return [{"apiGroups": [g], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
             "resources": sorted(plurals), "scope": "*"} for g, plurals in sorted(by_group.items())]


def webhook_configuration(client_config: dict, name: str = WEBHOOK_CONFIGURATION) -> dict:
    """The ValidatingWebhookConfiguration (its caBundle left for keep_ca_bundle to fill)."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{"name": "validation.mcp-mesh.io", "clientConfig": client_config, "rules": rules(),
                          "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                          "timeoutSeconds": 10}]}
