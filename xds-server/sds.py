"""SDS on the ADS stream, as istiod serves it: per-node secrets laid over the shape's snapshot.

Secret names (istio-agent's): `default` (the workload's certificate chain and
key) and `ROOTCA` (the trust bundle); a Gateway's `credentialName: NAME` is
`kubernetes://NAME` (tls.crt + tls.key of a `kubernetes.io/tls` Secret in the
gateway's namespace) and `kubernetes://NAME-cacert` (its ca.crt, MUTUAL).

Key generation. istiod signs a CSR that istio-agent makes next to Envoy, so a
key never leaves the pod. Here Envoy talks to the control plane directly (no
agent), so the control plane generates each node's key and serves it in the
`default` secret, over the loopback ADS connection. The key is in the
control plane's memory, never on disk and never in a view
(/debug/config_dump shows the shape's snapshot, which holds no secret;
/debug/certs shows certificates only).

Who may have which identity. A node says its namespace and service account
in node metadata (NAMESPACE, SERVICE_ACCOUNT) and proves it with
IDENTITY_TOKEN, the node-bootstrap token of ca.py (HMAC of node id,
namespace and service account under a key only the CA dir holds; `mcpctl
envoy bootstrap --ca-dir` writes it). A node without a valid token gets no
`default` secret (ROOTCA is public and always served), so it cannot present
a mesh identity; its listeners that need one do not come up. Limits: the
token is a bearer secret in the bootstrap file (whoever reads it can be that
node until the token key is rotated); it never expires and cannot be revoked
alone; ADS itself is plaintext on loopback, so a local process that can read
the bootstrap can read that node's key too. Kubernetes' answer (projected,
audience-bound, expiring ServiceAccount tokens checked by TokenReview) needs
an API server, which this file mode has not.

Rotation (istio-agent's rule): a certificate is re-issued at half its
lifetime, and pushed as a new `default` secret: Envoy uses it for new
connections and keeps the ones it has, so nothing is dropped.
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from envoy.extensions.transport_sockets.tls.v3 import secret_pb2

from mcp26.mesh.resources import MeshConfig
from mcp26.xds.cache import PreparedSnapshot, Selection, prepare
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.model.type_urls import SECRET

if TYPE_CHECKING:   # ca.py loads cryptography (~9 MB resident): only a control plane with a CA needs it
    from mcp26.xds.ca import IssuedCert, MeshCA

log = logging.getLogger("mcp26.xds.sds")

WORKLOAD_SECRET = "default"
ROOT_SECRET = "ROOTCA"
CREDENTIAL_PREFIX = "kubernetes://"
CA_CERT_SUFFIX = "-cacert"
TLS_SECRET_TYPE = "kubernetes.io/tls"


def credential_secret_name(credential: str) -> str:
    return CREDENTIAL_PREFIX + credential


def tls_secret(name: str, chain: bytes, key: bytes) -> secret_pb2.Secret:
    s = secret_pb2.Secret(name=name)
    s.tls_certificate.certificate_chain.inline_bytes = chain
    s.tls_certificate.private_key.inline_bytes = key
    return s


def validation_secret(name: str, ca_pem: bytes) -> secret_pb2.Secret:
    s = secret_pb2.Secret(name=name)
    s.validation_context.trusted_ca.inline_bytes = ca_pem
    return s


def secret_data(res) -> dict[str, bytes]:
    """A Secret's data (base64) and stringData, decoded. Validation (mesh.validation.secret) checked it."""
    out = {}
    for k, v in (res.spec.get("data") or {}).items():
        try:
            out[k] = base64.b64decode(str(v), validate=True)
        except (binascii.Error, ValueError):
            pass
    for k, v in (res.spec.get("stringData") or {}).items():
        out[k] = str(v).encode()
    return out


def credential_secrets(config, namespace: str) -> dict[str, secret_pb2.Secret]:
    """`kubernetes://NAME` (and `-cacert`) for each kubernetes.io/tls Secret of `namespace`."""
    out = {}
    if not isinstance(config, MeshConfig):
        return out      # no config yet, or a test's opaque config for its own translate function
    for res in config.of_kind("Secret"):
        if res.namespace != namespace or res.spec.get("type") != TLS_SECRET_TYPE:
            continue
        data = secret_data(res)
        name = credential_secret_name(res.name)
        if data.get("tls.crt") and data.get("tls.key"):
            out[name] = tls_secret(name, data["tls.crt"], data["tls.key"])
        if data.get("ca.crt"):
            out[name + CA_CERT_SUFFIX] = validation_secret(name + CA_CERT_SUFFIX, data["ca.crt"])
    return out


@dataclass
class NodeIdentity:
    """What one node was issued, and the packed secrets that carry it."""
    node: ProxyNode
    cert: IssuedCert | None
    refused: str = ""
    prepared: dict | None = None


class NodeSnapshot(PreparedSnapshot):
    """A shape's snapshot plus one node's secrets. Every other type is the
    shape's, so selections and diffs of CDS/LDS/... stay shared between the
    nodes of a shape; only SECRET is computed per node."""

    def __init__(self, base: PreparedSnapshot, secrets: dict):
        merged = dict(base.resources)
        merged[SECRET] = {**base.of_type(SECRET), **secrets}
        super().__init__(merged, base.generation)
        self.base = base
        self._own: set[int] = set()

    def selection(self, type_url: str, wildcard: bool, names: set[str], key: tuple) -> Selection:
        if type_url != SECRET:
            return self.base.selection(type_url, wildcard, names, key)
        sel = super().selection(type_url, wildcard, names, key)
        self._own.add(id(sel))
        return sel

    def diff(self, held: Selection, want: Selection) -> tuple[list, list]:
        return super().diff(held, want) if id(want) in self._own else self.base.diff(held, want)


class IdentityService:
    """Issues and rotates each node's SVID and lays SDS secrets over its snapshot.

    `ca` None: no mesh CA (no `default`/`ROOTCA`); credentialName secrets are
    served all the same. Called on the event loop and from worker threads:
    the lock guards `_nodes`.
    """

    def __init__(self, ca: MeshCA | None, ttl: float = 0.0, clock=None):
        self.ca = ca
        self.ttl = ttl
        self.clock = clock or (lambda: dt.datetime.now(dt.timezone.utc))
        self._nodes: dict[str, NodeIdentity] = {}
        self._overlays: dict[str, tuple] = {}       # node id -> (base, prepared, NodeSnapshot)
        self._credentials: dict[tuple, dict] = {}  # (id(config), ns) -> prepared credential secrets
        self._root = prepare(ROOT_SECRET, validation_secret(ROOT_SECRET, ca.root_pem())) if ca else None
        self._lock = threading.Lock()
        self.config = None

    # -- identities ----------------------------------------------------------------
    def _identity(self, node: ProxyNode) -> NodeIdentity:
        with self._lock:
            found = self._nodes.get(node.id)
            if found is not None and found.node.identity_token == node.identity_token \
                    and (found.node.namespace, found.node.service_account) == (node.namespace, node.service_account):
                return found
            found = self._nodes[node.id] = self._issue(node)
            return found

    def _issue(self, node: ProxyNode) -> NodeIdentity:
        if self.ca is None or node.kind == "grpc":
            return NodeIdentity(node, None, "no mesh CA" if self.ca is None else "proxyless gRPC")
        if not self.ca.check_token(node.identity_token, node.id, node.namespace, node.service_account):
            reason = ("no IDENTITY_TOKEN in node metadata" if not node.identity_token else
                      f"IDENTITY_TOKEN does not name node {node.id!r} as {node.namespace}/{node.service_account}")
            log.warning("no workload certificate for %s: %s", node.id, reason)
            return NodeIdentity(node, None, reason)
        cert = self.ca.issue(node.namespace, node.service_account, self.ttl, now=self.clock())
        log.info("issued %s to %s (serial %x, until %s)", cert.spiffe_id, node.id, cert.serial,
                 cert.not_after.isoformat())
        return NodeIdentity(node, cert, prepared={
            WORKLOAD_SECRET: prepare(WORKLOAD_SECRET, tls_secret(WORKLOAD_SECRET, cert.cert_chain_pem, cert.key_pem))})

    def rotate_due(self, connected: list[ProxyNode]) -> list[str]:
        """Re-issue every connected node's certificate past half its lifetime; the ids rotated."""
        now = self.clock()
        rotated = []
        for node in connected:
            with self._lock:
                found = self._nodes.get(node.id)
            if found is None or found.cert is None:
                continue
            half = found.cert.not_before + (found.cert.not_after - found.cert.not_before) / 2
            if now >= half:
                with self._lock:
                    self._nodes[node.id] = self._issue(node)
                rotated.append(node.id)
        return rotated

    def forget(self, connected: list[ProxyNode]) -> None:
        """Drop what nodes no longer connected were issued (their keys leave memory)."""
        ids = {n.id for n in connected}
        with self._lock:
            for gone in [i for i in self._nodes if i not in ids]:
                del self._nodes[gone]
                self._overlays.pop(gone, None)

    # -- the snapshot a node is served ---------------------------------------------
    def overlay(self, node: ProxyNode, base: PreparedSnapshot | None) -> PreparedSnapshot | None:
        if base is None:
            return None
        ident = self._identity(node)
        secrets = dict(self._credential_secrets(node.namespace))
        if self._root is not None:
            secrets[ROOT_SECRET] = self._root
        secrets.update(ident.prepared or {})
        ids = tuple((n, id(r)) for n, r in sorted(secrets.items()))
        with self._lock:
            cached = self._overlays.get(node.id)
            if cached is not None and cached[0] is base and cached[1] == ids:
                return cached[2]
            snap = NodeSnapshot(base, secrets)
            self._overlays[node.id] = (base, ids, snap)
            return snap

    def _credential_secrets(self, namespace: str) -> dict:
        config = self.config
        key = (id(config), namespace)
        found = self._credentials.get(key)
        if found is None:
            if len(self._credentials) > 64:
                self._credentials.clear()
            found = self._credentials[key] = {n: prepare(n, s) for n, s in
                                              credential_secrets(config, namespace).items()}
        return found

    # -- /debug/certs -----------------------------------------------------------------
    def debug_certs(self) -> dict:
        """Certificates only (subject, SAN, validity, serial): never a key."""
        if self.ca is not None:                 # a cert below implies a CA
            from mcp26.xds.ca import describe   # here, not at import: see TYPE_CHECKING above
        out = {"trust_domain": self.ca.trust_domain if self.ca else None,
               "root": describe(self.ca.root_pem()) if self.ca else [],
               "plugged_in_ca": bool(self.ca and self.ca.plugged),
               "workload_cert_ttl_s": self.ttl if self.ca else None, "nodes": {}}
        with self._lock:
            nodes = dict(self._nodes)
        for node_id, ident in sorted(nodes.items()):
            entry = {"namespace": ident.node.namespace, "service_account": ident.node.service_account}
            if ident.cert is None:
                entry["refused"] = ident.refused
            else:
                entry.update(spiffe_id=ident.cert.spiffe_id, chain=describe(ident.cert.cert_chain_pem))
            out["nodes"][node_id] = entry
        return out


async def rotation_loop(identity: IdentityService, hub, period: float) -> None:
    """Every `period`: re-issue what is past half its life and push it to those nodes only;
    forget nodes that left."""
    import asyncio
    while True:
        await asyncio.sleep(period)
        nodes = hub.nodes()
        identity.forget(nodes)
        rotated = identity.rotate_due(nodes)
        if rotated:
            hub.notify(rotated)


def rotation_period(ttl: float) -> float:
    """How often to look: a tenth of the lifetime, between 0.1 s and 60 s."""
    return min(60.0, max(0.1, ttl / 10))
