"""What the networking.istio.io kinds share, after istio/istio
pkg/config/validation: the served versions, protocol names, and
`check_kind` (apiVersion, metadata, the CRD schema) that every networking
validator runs first.

Messages keep Istio's wording where Istio has one, so a search for the
message finds Istio's documentation and issues. Each kind has its own module:
gateway.py, virtualservice.py, destination_rule.py, service_entry.py,
workload_entry.py.
"""
from __future__ import annotations

from mcp26.mesh import hosts
from mcp26.mesh.resources import Resource
from mcp26.mesh.validation.networking_schema import SPECS
from mcp26.mesh.validation.report import Report
from mcp26.mesh.validation.schema import SchemaErrors, check

NETWORKING_VERSIONS = ("networking.istio.io/v1", "networking.istio.io/v1beta1", "networking.istio.io/v1alpha3")

# protocol.Parse in Istio (case-insensitive); anything else is Unsupported.
PROTOCOLS = {"http", "https", "http2", "grpc", "grpc-web", "tcp", "tls", "udp", "mongo",
             "redis", "mysql", "http_proxy", "hbone", "triple"}
HTTP_PROTOCOLS = {"http", "http2", "grpc", "grpc-web", "http_proxy"}
TLS_PROTOCOLS = {"https", "tls"}


TOP_LEVEL_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")


def _top_level_keys(res: Resource) -> list[str]:
    return [p for p in res.lines if p and "." not in p and "[" not in p]


def check_kind(res: Resource) -> Report:
    """apiVersion and the CRD schema. `rep.typed` is False when a value has the
    wrong type, and then the semantic rules (which trust types) do not run."""
    rep = Report(res)
    if res.api_version not in NETWORKING_VERSIONS:
        rep.error("apiVersion", f"{res.kind} is not served at {res.api_version!r}; "
                                f"expected one of {', '.join(NETWORKING_VERSIONS)}")
    if not hosts.is_k8s_name_label(res.namespace):
        rep.error("metadata.namespace", f"invalid namespace {res.namespace!r}: must be a DNS-1123 label")
    if res.name and not hosts.is_k8s_subdomain(res.name):
        rep.error("metadata.name", f"invalid name {res.name!r}: must be a lower-case DNS-1123 subdomain")
    for key in _top_level_keys(res):
        if key not in TOP_LEVEL_FIELDS:
            rep.error(key, f"unknown field {key!r} at the top level of a {res.kind}"
                           + (" (did you mean 'spec'?)" if key.lower().startswith("spec") else ""))
    if not isinstance(res.spec, dict):
        rep.error("spec", f"spec must be a mapping, got {type(res.spec).__name__}")
        rep.typed = False
        return rep
    errs = SchemaErrors()
    check(res.spec, SPECS[res.kind], "spec", errs)
    for path, message in errs.errors:
        rep.error(path, message)
    rep.typed = not errs.wrong_type
    return rep


def hosts_header_ok(name: str) -> bool:
    """Istio's validHeaderRegex: ^[-_A-Za-z0-9]+$"""
    return bool(name) and all(c.isascii() and (c.isalnum() or c in "-_") for c in name)
