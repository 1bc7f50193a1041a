"""Endpoint weights the decision loop sets over the admin API (scheduler_actions.py), with expiry.

    POST /scheduler/endpoint-weight
         {"cluster": "outbound|8000||svc.ns.svc.cluster.local",
          "weights": {"127.0.0.2:8000": 9, "127.0.0.3:8000": 1}, "expires_at": UNIX_S}

A weight replaces the `load_balancing_weight` translation gave that endpoint in
the cluster's ClusterLoadAssignment (translate/clusters.py `with_endpoint_weights`);
endpoints not named keep theirs. Each (cluster, endpoint) holds one weight and
one expiry: a later POST replaces it. At `expires_at` the control plane drops
it and pushes the assignment as translated. Only EDS changes: the clusters,
routes and listeners are the same messages, so their versions do not move.

Each XdsServer holds its own table (server.endpoint_weights); what is in force
reaches translation as Overlay.endpoint_weights, which the server replaces
whole after each change (translate/overlay.py). Translation never imports this.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from mcp26.xds.expiring import ExpiringTable
from mcp26.xds.translate.overlay import endpoint_key

MIN_WEIGHT, MAX_WEIGHT = 1, 128      # Envoy needs >= 1; more than 128:1 is a mistake, not a decision
MAX_HOLD_S = 3600.0                  # as class remaps
MAX_WEIGHTS = 1024                   # (cluster, endpoint) pairs in force at once


@dataclass(frozen=True)
class EndpointWeight:
    cluster: str
    endpoint: str           # endpoint_key(): "ADDRESS:PORT", "[V6]:PORT"
    weight: int
    expires_at: float

    def as_json(self, now: float) -> dict:
        return {"cluster": self.cluster, "endpoint": self.endpoint, "weight": self.weight,
                "expires_at": self.expires_at, "expires_in_s": round(self.expires_at - now, 3)}


def parse_endpoint(text) -> str:
    """"ADDRESS:PORT" (IPv6 in brackets) -> its endpoint_key(); ValueError otherwise."""
    if not isinstance(text, str):
        raise ValueError("expected ADDRESS:PORT")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected ADDRESS:PORT with a port 1..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        raise ValueError("expected an IP address before the port") from None
    return endpoint_key(host, int(port))


def parse_weights(body, now: float) -> list[EndpointWeight]:
    """The POST body -> the weights it sets; ValueError naming the field, nothing half-parsed."""
    if not isinstance(body, dict):
        raise ValueError('expected {"cluster": NAME, "weights": {"ADDRESS:PORT": WEIGHT}, "expires_at": UNIX_SECONDS}')
    unknown = sorted(set(body) - {"cluster", "weights", "expires_at"})
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field (expected cluster, weights, expires_at)")
    cluster = body.get("cluster")
    if not isinstance(cluster, str) or not cluster.strip():
        raise ValueError("cluster: expected the Envoy cluster name, e.g. outbound|8000||svc.ns.svc.cluster.local")
    weights = body.get("weights")
    if not isinstance(weights, dict) or not weights:
        raise ValueError('weights: expected {"ADDRESS:PORT": WEIGHT, ...} with at least one endpoint')
    exp = body.get("expires_at")
    if not isinstance(exp, (int, float)) or isinstance(exp, bool):
        raise ValueError("expires_at: expected unix seconds (a number)")
    if not now < exp <= now + MAX_HOLD_S:
        raise ValueError(f"expires_at: must be in the future and within {MAX_HOLD_S:.0f} s")
    out: dict[str, EndpointWeight] = {}
    for ep, w in weights.items():
        try:
            key = parse_endpoint(ep)
        except ValueError as e:
            raise ValueError(f"weights[{ep!r}]: {e}") from None
        if not isinstance(w, int) or isinstance(w, bool) or not MIN_WEIGHT <= w <= MAX_WEIGHT:
            raise ValueError(f"weights[{ep!r}]: must be an integer {MIN_WEIGHT}..{MAX_WEIGHT}, got {w!r}")
        if key in out:
            raise ValueError(f"weights[{ep!r}]: the same endpoint twice")
        out[key] = EndpointWeight(cluster, key, w, float(exp))
    return list(out.values())


class EndpointWeights(ExpiringTable):
    """The weights in force, one per (cluster, endpoint)."""

    def __init__(self):
        key = lambda w: (w.cluster, w.endpoint)  # noqa: E731
        super().__init__(key=key, order=key, limit=MAX_WEIGHTS,
                         over_limit=f"weights: at most {MAX_WEIGHTS} endpoint weights in force")

    def by_cluster(self, now: float | None = None) -> dict[str, dict[str, int]]:
        """{cluster: {endpoint: weight}} of what is in force: the overlay's endpoint_weights."""
        out: dict[str, dict[str, int]] = {}
        for w in self.active(now):
            out.setdefault(w.cluster, {})[w.endpoint] = w.weight
        return out

    def put(self, weights: list[EndpointWeight]) -> None:
        """All of them or (over the limit) none."""
        self.put_all(weights)

    def remove(self, cluster: str, endpoint: str | None = None) -> int:
        return self.remove_where(lambda k: k[0] == cluster and (endpoint is None or k[1] == endpoint))

