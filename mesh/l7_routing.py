"""The seed's routing fields of an L7SchedulingPolicy: `spec.priority` (0..100),
`spec.matchHeaders` (header name -> exact value) and `spec.backendService`. A request whose
headers all match goes to `backendService` with the QoS class its `priority` maps to.

The rules are those of the shipped ValidatingAdmissionPolicy
(istio-manifests/admission/l7schedulingpolicy-policy.yaml), which a test evaluates against
this module on the same objects:

- the three come together (a policy with none of them is a batching policy only);
- `priority` is an integer in [0, 100];
- each `matchHeaders` name is an RFC 7230 token, each value a string (at most 1 KiB,
  at most 16 headers); the mesh's own session headers cannot be matched on (the client's
  copy is what a route sees);
- `backendService` is a DNS-1123 host name, optionally with `:PORT`.

`priority` -> class (the seed's four names, mesh/qos.py's table):

| spec.priority | class            | X-LLM-Priority |
| ------------- | ---------------- | -------------- |
| 75..100       | latency-critical | critical       |
| 50..74        | interactive      | high           |
| 25..49        | standard         | medium         |
| 0..24         | batch            | low            |

Translation (xds-server/translate/route_configs.py): at every proxy of the policy's
namespace, each virtual host gets, before its own routes, one route per such policy
(highest priority first): the headers matched exactly, to backendService's cluster, with
the class in the route's `mcp-mesh` metadata (`qos_class`). The header-contract filter
reads it there (mesh/header_contract.py ROUTE_CLASS_PROPERTY) as the class asked for, in
place of the client's X-LLM-Priority, caps it by the caller's tier and signs it: the class
stays the mesh's to set, never a route header operation's. `selector` keeps its batching
meaning (which inference workloads' batcher the policy configures).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from mcp26.mesh import headers as H
from mcp26.mesh.header_contract import is_token
from mcp26.mesh.qos import QosClass

PRIORITY_MIN, PRIORITY_MAX = 0, 100
MAX_MATCH_HEADERS = 16
MAX_HEADER_VALUE = 1024
MAX_BACKEND = 253 + 6                     # a DNS name and ":PORT"
# (lowest priority of the band, class), highest band first: the table above
PRIORITY_BANDS = ((75, QosClass.LATENCY_CRITICAL), (50, QosClass.INTERACTIVE),
                  (25, QosClass.STANDARD), (0, QosClass.BATCH))
# What a route cannot match on: headers the mesh sets (the route sees the client's copy).
UNMATCHABLE = (H.END_USER, H.TENANT, H.SESSION_SIG, H.QOS_CLASS, H.DOWNSTREAM_SERVICE_CLUSTER, H.DOWNSTREAM_ALPN)
FIELDS = ("priority", "matchHeaders", "backendService")
# a DNS-1123 name, then optionally :1..65535 (the CRD's pattern, byte for byte)
_BACKEND = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                      r"(:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?$")


def class_for_priority(priority: int) -> QosClass:
    """spec.priority -> the mesh QoS class (the table in the module docstring)."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ValueError(f"priority must be an integer in [{PRIORITY_MIN}, {PRIORITY_MAX}], got {priority!r}")
    return next(c for low, c in PRIORITY_BANDS if priority >= low)


@dataclass(frozen=True)
class RoutingRule:
    priority: int
    match_headers: tuple[tuple[str, str], ...]     # (lower-case name, exact value), sorted
    backend_host: str
    backend_port: int | None

    @property
    def qos_class(self) -> QosClass:
        return class_for_priority(self.priority)


def parse_routing(spec: Mapping[str, Any]) -> tuple[RoutingRule | None, list[tuple[str, str]]]:
    """The routing fields of a spec -> (rule or None when the policy has none, problems as
    (field path, message)); a rule only when there is no problem."""
    if not isinstance(spec, Mapping):
        return None, []
    present = [f for f in FIELDS if f in spec]
    if not present:
        return None, []
    problems: list[tuple[str, str]] = []
    for f in FIELDS:
        if f not in spec:
            problems.append((f"spec.{f}", f"required with {', '.join('spec.' + p for p in present)} "
                                          "(a routing policy has priority, matchHeaders and backendService)"))
    priority = spec.get("priority")
    if "priority" in spec:
        try:
            class_for_priority(priority)
        except ValueError as e:
            problems.append(("spec.priority", str(e)))
    headers = spec.get("matchHeaders")
    pairs = []
    if "matchHeaders" in spec:
        if not isinstance(headers, Mapping) or not headers:
            problems.append(("spec.matchHeaders", "must map at least one header name to its exact value"))
        elif len(headers) > MAX_MATCH_HEADERS:
            problems.append(("spec.matchHeaders", f"at most {MAX_MATCH_HEADERS} headers, got {len(headers)}"))
        else:
            seen = set()
            for name, value in headers.items():
                path = f"spec.matchHeaders.{name}"
                if not is_token(name):
                    problems.append((path, "header name must be an RFC 7230 token"))
                elif name.lower() in UNMATCHABLE:
                    problems.append((path, "a header the mesh sets: a route sees only the client's copy"))
                elif name.lower() in seen:
                    problems.append((path, "the same header twice (names are case-insensitive)"))
                elif not isinstance(value, str):
                    problems.append((path, f"must be a string (the exact value), got {type(value).__name__}"))
                elif len(value) > MAX_HEADER_VALUE:
                    problems.append((path, f"value longer than {MAX_HEADER_VALUE} bytes"))
                else:
                    seen.add(name.lower())
                    pairs.append((name.lower(), value))
    backend = spec.get("backendService")
    host, port = "", None
    if "backendService" in spec:
        if not isinstance(backend, str) or len(backend) > MAX_BACKEND or not _BACKEND.match(backend):
            problems.append(("spec.backendService", f"must be a DNS-1123 host name, optionally with :PORT "
                                                    f"(1..65535), got {backend!r}"))
        else:
            host, _, p = backend.partition(":")
            port = int(p) if p else None
    if problems:
        return None, problems
    return RoutingRule(priority, tuple(sorted(pairs)), host, port), []
