"""Authenticated xDS, istiod's port 15012 model: TLS with the mesh CA's certificate, and a proxy
that proves who it is with a Kubernetes ServiceAccount token, checked by TokenReview.

A proxy sends `authorization: Bearer TOKEN` on its ADS stream (a projected, audience-bound
token: audience `mcp-mesh` unless told otherwise, as Istio's `istio-ca`). The control plane
asks the API server (`authentication.k8s.io/v1` TokenReview, with that audience) who the token
is; it must be `system:serviceaccount:NS:SA`, and the node's metadata must name the same
NAMESPACE and SERVICE_ACCOUNT, or the stream is refused (UNAUTHENTICATED / PERMISSION_DENIED)
before anything is sent. So a proxy gets secrets (its SVID, its namespace's credentialName
secrets) only for its own namespace and service account; on this port the TokenReview stands
in for the node-bootstrap token (sds.py), which the stream is then given.

Reviews are cached per token for `CACHE_S` (a proxy reconnecting does not cost a request each
time), never past the token's own expiry as the API server reported it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import time

log = logging.getLogger("mcp26.xds.auth")

DEFAULT_AUDIENCE = "mcp-mesh"
CACHE_S = 60.0
SECURE_PORT = 15012
SA_PREFIX = "system:serviceaccount:"


class Refused(Exception):
    """The stream is not allowed: `code` is the gRPC status name."""

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(message)


class TokenReviewer:
    def __init__(self, api, audience: str = DEFAULT_AUDIENCE, clock=time.monotonic):
        self.api, self.audience, self.clock = api, audience, clock
        self._cache: dict[str, tuple[float, tuple[str, str] | None, str]] = {}
        self.reviews = 0

    async def who(self, token: str) -> tuple[str, str]:
        """(namespace, service account) the token authenticates, or Refused."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            if hit[1] is None:
                raise Refused("UNAUTHENTICATED", hit[2])
            return hit[1]
        self.reviews += 1
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": [self.audience]}}
        try:
            out = await self.api.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body)
        except Exception as e:          # the API server unreachable: refuse, and do not cache it
            raise Refused("UNAVAILABLE", f"TokenReview failed: {e}") from None
        status = out.get("status") or {}
        user = (status.get("user") or {}).get("username") or ""
        ok = status.get("authenticated") and self.audience in (status.get("audiences") or [self.audience])
        if len(self._cache) > 10_000:
            self._cache.clear()
        if not ok or not user.startswith(SA_PREFIX) or user.count(":") != 3:
            why = status.get("error") or (f"{user} is not a service account" if ok else "token not authenticated")
            self._cache[key] = (now + CACHE_S, None, why)
            raise Refused("UNAUTHENTICATED", why)
        ns, sa = user[len(SA_PREFIX):].split(":")
        self._cache[key] = (now + CACHE_S, (ns, sa), "")
        return ns, sa


class StreamAuthenticator:
    """Checks a stream's node against its bearer token; gives the node its bootstrap token."""

    def __init__(self, reviewer: TokenReviewer, ca=None):
        self.reviewer, self.ca = reviewer, ca
        self.refused = 0

    async def __call__(self, node, metadata) -> object:
        token = ""
        for k, v in metadata or ():
            if k.lower() == "authorization" and str(v).startswith("Bearer "):
                token = str(v)[7:].strip()
        try:
            if not token:
                raise Refused("UNAUTHENTICATED", "no `authorization: Bearer` ServiceAccount token on the stream")
            ns, sa = await self.reviewer.who(token)
            if (node.namespace, node.service_account) != (ns, sa):
                raise Refused("PERMISSION_DENIED",
                              f"the token is {ns}/{sa}'s; node {node.id} says {node.namespace}/{node.service_account}")
        except Refused as e:
            self.refused += 1
            log.warning("ADS stream of %s refused: %s", node.id, e)
            raise
        if self.ca is not None and node.kind != "grpc":
            node = dataclasses.replace(node, identity_token=self.ca.node_token(node.id, ns, sa))
        return node
