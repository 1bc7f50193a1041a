"""The config source: a Kubernetes API server, listed and watched as istiod's informers do.

Every kind the directory mode reads is listed, then watched from the list's resourceVersion
(`allowWatchBookmarks`, so a quiet kind's version stays current); a watch that ends is
resumed from the last version seen, a `410 Gone` (that version compacted away) lists again,
and a failed request is retried with exponential backoff (0.5 s .. 30 s, as client-go's
reflector). Every `resync` seconds each kind is listed afresh and compared with the store: a
resync that finds nothing changed changes nothing (no change set, no push).

A kind whose CRD is not installed (404 on the list) is empty, and is looked for again every
30 s, as istiod starts an informer when an optional CRD appears. Any change is applied once the objects have been
still for `debounce` seconds (at most `max_debounce`), like the directory's change sets.

The objects become `Resource`s through mesh.parse.resource_from_document, the directory's own
function, and the change set is checked by mesh.change_set.check_config with the same caches
as incremental_load.py: taken whole, or the last good config kept. Pods' addresses come from
`status.podIP` and EndpointSlices, so no `mcp-mesh.io/addresses` annotation is needed here.

kubernetes_asyncio (the official client's asyncio port) supplies the configuration (kubeconfig,
in-cluster service account, token refresh) and the HTTP transport. Neither it nor the
synchronous client has client-go's informer (a list-watch loop with a store), so that loop is
here: about a hundred lines, and each of the rules above is tested against a real API server
(tests/xds/e2e/test_kube_source.py). It is the mesh's because two parts read the API server through
it: the control plane (every kind) and the Endpoint Picker (its pool's Pods, InferencePool and
InferenceObjectives, scheduler/pool_source.py).
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from mcp26.mesh.diagnostics import ConfigError, Diagnostic
from mcp26.mesh.parse import resource_from_document
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.validation import ValidationCache
from mcp26.mesh.analyze import AnalysisCache
from mcp26.mesh.change_set import check_config

log = logging.getLogger("mcp26.mesh.kube")

TLS_SECRETS = "type=kubernetes.io/tls"     # credentialName secrets only, not every token in the cluster


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    field_selector: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str = "", name: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace and self.namespaced:
            base += f"/namespaces/{namespace}"
        return f"{base}/{self.plural}" + (f"/{name}" if name else "")


# What the directory mode reads, as the API server serves it (the versions Istio's and the
# Gateway API's CRDs store). Workload controllers (Deployment, ...) are not read here: on a
# cluster their Pods exist.
KINDS = (
    Kind("", "v1", "namespaces", "Namespace", namespaced=False),
    Kind("", "v1", "services", "Service"),
    Kind("", "v1", "pods", "Pod"),
    Kind("", "v1", "serviceaccounts", "ServiceAccount"),
    Kind("", "v1", "secrets", "Secret", field_selector=TLS_SECRETS),
    Kind("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
    Kind("networking.istio.io", "v1", "virtualservices", "VirtualService"),
    Kind("networking.istio.io", "v1", "destinationrules", "DestinationRule"),
    Kind("networking.istio.io", "v1", "gateways", "Gateway"),
    Kind("networking.istio.io", "v1", "serviceentries", "ServiceEntry"),
    Kind("networking.istio.io", "v1", "workloadentries", "WorkloadEntry"),
    Kind("networking.istio.io", "v1", "sidecars", "Sidecar"),
    Kind("security.istio.io", "v1", "authorizationpolicies", "AuthorizationPolicy"),
    Kind("security.istio.io", "v1", "peerauthentications", "PeerAuthentication"),
    Kind("security.istio.io", "v1", "requestauthentications", "RequestAuthentication"),
    Kind("extensions.istio.io", "v1alpha1", "wasmplugins", "WasmPlugin"),
    Kind("gateway.networking.k8s.io", "v1", "gatewayclasses", "GatewayClass", namespaced=False),
    Kind("gateway.networking.k8s.io", "v1", "gateways", "Gateway"),
    Kind("gateway.networking.k8s.io", "v1", "httproutes", "HTTPRoute"),
    Kind("gateway.networking.k8s.io", "v1", "grpcroutes", "GRPCRoute"),
    Kind("gateway.networking.k8s.io", "v1beta1", "referencegrants", "ReferenceGrant"),
    Kind("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool"),
    Kind("inference.networking.x-k8s.io", "v1alpha2", "inferenceobjectives", "InferenceObjective"),
    Kind("scheduling.mcp-mesh.io", "v1alpha1", "l7schedulingpolicies", "L7SchedulingPolicy"),
)

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 30.0
MISSING_KIND_RETRY_S = 30.0   # a kind whose CRD is not installed is looked for again this often
WATCH_TIMEOUT_S = 300          # the server ends a watch after this; resumed from the last version
STRIPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


class Gone(Exception):
    """410: the resourceVersion asked for has been compacted away; list again."""


class ApiError(Exception):
    def __init__(self, status: int, body: str, path: str):
        self.status, self.body, self.path = status, body, path
        super().__init__(f"{status} from {path}: {body[:300]}")


class KubeConfigError(ValueError):
    """A kubeconfig or in-cluster configuration that does not load; the message names which."""


async def api_client(kubeconfig: str | None = None, context: str | None = None):
    """kubernetes_asyncio's ApiClient from a kubeconfig, or in-cluster (the Pod's service account);
    KubeConfigError where it does not load (malformed YAML, no such context, not in a Pod)."""
    from kubernetes_asyncio import client, config
    try:
        if kubeconfig:
            return await config.new_client_from_config(config_file=kubeconfig, context=context)
        conf = client.Configuration()
        config.load_incluster_config(client_configuration=conf)
        return client.ApiClient(configuration=conf)
    except Exception as e:     # the client's ConfigException, yaml's errors, OSError, KeyError ...
        raise KubeConfigError(f"Kubernetes configuration {kubeconfig or '(in-cluster)'}: "
                              f"{str(e).strip() or type(e).__name__}") from None


class KubeApi:
    """JSON requests and watch streams on any path, through the official client's transport."""

    def __init__(self, client):
        self.client = client
        self.requests = 0                  # sent, for the scale benchmark's requests per second
        self.refused: dict[int, int] = {}  # non-2xx answers by status (403: RBAC too narrow)

    async def _send(self, method: str, path: str, query=None, body=None, content_type: str = "application/json",
                    timeout=None):
        self.requests += 1
        headers = {"Accept": "application/json", "Content-Type": content_type}
        return await self.client.call_api(
            path, method, query_params=list((query or {}).items()), header_params=headers,
            body=body, auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout)

    async def request(self, method: str, path: str, query=None, body=None,
                      content_type: str = "application/json", timeout: float = 30) -> dict:
        resp = await self._send(method, path, query, body, content_type, timeout)
        try:
            text = await resp.text()
        finally:
            resp.release()
        if not 200 <= resp.status < 300:
            self.refused[resp.status] = self.refused.get(resp.status, 0) + 1
        if resp.status == 410:
            raise Gone(text)
        if not 200 <= resp.status < 300:
            raise ApiError(resp.status, text, path)
        return json.loads(text) if text else {}

    async def watch(self, path: str, query: dict):
        """The events of one watch request, as dicts, until the server ends it."""
        resp = await self._send("GET", path, {**query, "watch": "true"},
                                timeout=(10, WATCH_TIMEOUT_S + 30))
        try:
            if resp.status != 200:
                self.refused[resp.status] = self.refused.get(resp.status, 0) + 1
            if resp.status == 410:
                raise Gone(await resp.text())
            if resp.status != 200:
                raise ApiError(resp.status, await resp.text(), path)
            while True:
                line = await resp.content.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            resp.release()


def _slim(obj: dict) -> dict:
    """What the registry reads of an object: managedFields and kubectl's last-applied copy dropped
    (istiod's informers strip managedFields the same way: a third of a Pod's bytes)."""
    meta = obj.get("metadata") or {}
    meta.pop("managedFields", None)
    ann = meta.get("annotations")
    if ann:
        for key in STRIPPED_ANNOTATIONS:
            ann.pop(key, None)
    return obj


class Informer:
    """List then watch one kind into `store` ({(namespace, name): object}); `changed()` on every change."""

    def __init__(self, api: KubeApi, kind: Kind, changed: Callable[[], None], resync: float,
                 namespace: str = ""):
        self.api, self.kind, self.changed, self.resync = api, kind, changed, resync
        self.path = kind.path(namespace)     # one namespace's objects, or (""), every namespace's
        self.store: dict[tuple[str, str], dict] = {}
        self.version = ""
        self.served = True             # False: the kind's CRD is not installed
        self.synced = asyncio.Event()
        self.lists = self.watches = self.relists_gone = 0
        self.need_list = True          # False: resume the watch from `version` (the store is current)
        self.last_error: str | None = None     # why the last list or watch failed (a 403, ...)

    async def run(self) -> None:
        backoff = BACKOFF_MIN_S
        next_resync = time.monotonic() + self.resync
        while True:
            try:
                if self.need_list or time.monotonic() >= next_resync:
                    await self._list()
                    self.need_list, next_resync = False, time.monotonic() + self.resync
                    if not self.served:            # its CRD may be installed any time: look again soon
                        await asyncio.sleep(min(self.resync, MISSING_KIND_RETRY_S))
                        self.need_list = True
                        continue
                await self._watch(next_resync)
                backoff = BACKOFF_MIN_S
            except asyncio.CancelledError:
                raise
            except Gone:
                log.info("%s: resourceVersion %s is gone; listing again", self.kind.plural, self.version)
                self.relists_gone += 1
                self.need_list = True
            except Exception as e:       # the API server restarting, a network error, a 5xx: back off
                self.last_error = f"{self.kind.plural}: {e}"
                log.warning("%s: %s; retrying in %.1f s", self.kind.plural, e, backoff)
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _query(self) -> dict:
        return {"fieldSelector": self.kind.field_selector} if self.kind.field_selector else {}

    async def _list(self) -> None:
        self.lists += 1
        try:
            body = await self.api.request("GET", self.path, self._query())
        except ApiError as e:
            if e.status != 404:
                raise
            self.served = False        # no such CRD (yet): an empty kind, looked for again at resync
            body = {"items": [], "metadata": {"resourceVersion": ""}}
        else:
            self.served = True
        fresh = {}
        for obj in body.get("items") or []:
            obj.setdefault("apiVersion", self.kind.api_version)
            obj.setdefault("kind", self.kind.kind)
            meta = obj.get("metadata") or {}
            fresh[(meta.get("namespace", ""), meta.get("name", ""))] = _slim(obj)
        self.version = (body.get("metadata") or {}).get("resourceVersion", "")
        if _versions(fresh) != _versions(self.store):
            self.store = fresh
            self.changed()
        self.synced.set()

    async def _watch(self, until: float) -> None:
        self.watches += 1
        timeout = max(1, min(WATCH_TIMEOUT_S, int(until - time.monotonic())))
        query = {**self._query(), "resourceVersion": self.version, "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(timeout)}
        async for event in self.api.watch(self.path, query):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone(obj.get("message", ""))
                raise ApiError(int(obj.get("code") or 500), obj.get("message", ""), self.path)
            meta = obj.get("metadata") or {}
            self.version = meta.get("resourceVersion") or self.version
            if kind == "BOOKMARK":
                continue
            key = (meta.get("namespace", ""), meta.get("name", ""))
            if kind == "DELETED":
                if self.store.pop(key, None) is not None:
                    self.changed()
            elif kind in ("ADDED", "MODIFIED"):
                obj.setdefault("apiVersion", self.kind.api_version)
                obj.setdefault("kind", self.kind.kind)
                old = self.store.get(key)
                if old is None or (old.get("metadata") or {}).get("resourceVersion") != meta.get("resourceVersion"):
                    self.store[key] = obj = _slim(obj)
                    # A config kind's status (what the status writer wrote) is no input to the
                    # translation: kept in the store, but no change set for it.
                    if old is None or not self.kind.group or self.kind.group == "discovery.k8s.io" \
                            or _content(old) != _content(obj):
                        self.changed()


def _content(obj: dict) -> tuple:
    """An object less its status and the versions that a status write changes."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("resourceVersion", "managedFields")}
    return meta, {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _versions(store: dict) -> dict:
    return {k: (o.get("metadata") or {}).get("resourceVersion") for k, o in store.items()}


class KubeSource:
    """Calls `on_change()` after each debounced change of the watched kinds; `loader` builds the config."""

    needs_sync = True      # the server waits for every kind's first list before its first translation

    def __init__(self, api: KubeApi, on_change: Callable[[], Awaitable[None]] | None = None,
                 debounce: float = 0.1, max_debounce: float = 10.0, resync: float = 300.0,
                 kinds: tuple[Kind, ...] = KINDS, namespace: str = ""):
        """`kinds`, in `namespace` ("": every namespace, cluster-scoped kinds always whole)."""
        self.api = api
        self.on_change = on_change
        self.debounce, self.max_debounce = debounce, max_debounce
        self.informers = [Informer(api, k, self._changed, resync, namespace) for k in kinds]
        self.loader = KubeLoader(self)
        self.changes = 0
        self.inotify = None            # (the directory source's; the admin log line reads it)
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False

    def describe(self) -> str:
        return f"the Kubernetes API at {self.api.client.configuration.host}"

    def _changed(self) -> None:
        self._dirty.set()

    def start(self) -> None:
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(i.run(), name=f"informer {i.kind.plural}") for i in self.informers]
        self._tasks.append(loop.create_task(self._apply_loop(), name="kube change sets"))

    async def synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers))
        self._dirty.clear()            # the first apply reads everything listed so far

    @property
    def failure(self) -> str | None:
        for t in self._tasks:
            if t.done() and not self._stopping:
                exc = None if t.cancelled() else t.exception()
                return f"{t.get_name()} ended: {type(exc).__name__}: {exc}" if exc else f"{t.get_name()} ended"
        return None

    async def stop(self) -> None:
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _apply_loop(self) -> None:
        await self.synced()        # the first lists are the first change set (the server's own apply)
        while True:
            await self._dirty.wait()
            first = time.monotonic()
            # Debounce: until nothing has changed for `debounce` s, or `max_debounce` has passed.
            while time.monotonic() - first < self.max_debounce:
                self._dirty.clear()
                await asyncio.sleep(self.debounce)
                if not self._dirty.is_set():
                    break
            self._dirty.clear()
            self.changes += 1
            if self.on_change is not None:
                try:
                    await self.on_change()
                except Exception:
                    log.exception("applying a change from the API server failed")

    def objects(self) -> list[dict]:
        return [o for i in self.informers for _, o in sorted(i.store.items())]


def resource_of(obj: dict) -> tuple[Resource | None, list[Diagnostic]]:
    """An API object as the mesh model's Resource; its diagnostics name `kubernetes://KIND/NS/NAME`."""
    meta = obj.get("metadata") or {}
    errors: list[Diagnostic] = []
    res = resource_from_document(obj, f"kubernetes://{obj.get('kind')}/{meta.get('namespace') or ''}/{meta.get('name')}",
                                 0, {}, errors)
    return res, errors


class KubeLoader:
    """The API server's objects -> a checked MeshConfig, as IncrementalLoader does for files:
    Resources kept by (kind, namespace, name, resourceVersion), so validation (by resource
    object) and analysis caches are reused across change sets."""

    def __init__(self, source: KubeSource):
        self.source = source
        self._resources: dict[tuple, Resource] = {}
        self.parsed = 0
        self.validation = ValidationCache()
        self.analysis = AnalysisCache()

    def __call__(self, _where: str = "") -> MeshConfig:
        kept: dict[tuple, Resource] = {}
        resources, errors = [], []
        self.parsed = 0
        for obj in self.source.objects():
            meta = obj.get("metadata") or {}
            # A config kind's generation moves with its spec alone (a status write leaves it); the
            # core kinds' resourceVersion moves with everything, a Pod's podIP included.
            # (labels and annotations move neither: they are part of the key).
            version = (meta.get("generation"), json.dumps([meta.get("labels"), meta.get("annotations")], sort_keys=True)) \
                if "." in str(obj.get("apiVersion")).split("/")[0] \
                and not str(obj.get("apiVersion")).startswith("discovery.k8s.io/") else None
            key = (obj.get("apiVersion"), obj.get("kind"), meta.get("namespace"), meta.get("name"),
                   meta.get("uid"), version if version is not None else meta.get("resourceVersion"))
            res = self._resources.get(key)
            if res is None:
                res, errs = resource_of(obj)
                self.parsed += 1
                errors.extend(errs)
                if res is None:
                    continue
            kept[key] = res
            resources.append(res)
        self._resources = kept
        if errors:
            raise ConfigError(errors)
        return check_config(MeshConfig(resources), self.validation, analysis=self.analysis)
