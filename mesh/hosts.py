"""Host names as Istio reads them: DNS-1123 rules, short names, wildcards.

One definition for validation (mesh.validation), analysis (mesh.analyze)
and translation (xds_server): a VirtualService in namespace `ns` naming the
short host `reviews` means `reviews.ns.svc.cluster.local`, exactly as istiod
resolves it.
"""
from __future__ import annotations

import ipaddress
import re
from functools import lru_cache

DOMAIN_SUFFIX = "cluster.local"   # istiod's default --domain
MESH_GATEWAY = "mesh"             # the reserved gateway name: every sidecar

# Istio's pkg/config/labels: a DNS-1123 label (Istio accepts upper case, as
# host names are case-insensitive), and a label with a leading `*` / `*-`.
_DNS1123_LABEL = re.compile(r"^[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?$")
_WILDCARD_LABEL = re.compile(r"^(?:\*|(?:\*|\*-)?[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?)$")
# Kubernetes label keys (optional DNS-subdomain prefix + qualified name) and values.
_QUALIFIED_NAME = re.compile(r"^(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_K8S_NAME_LABEL = re.compile(r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?$")


@lru_cache(maxsize=8192)
def is_dns1123_label(s: str) -> bool:
    return len(s) <= 63 and bool(_DNS1123_LABEL.match(s))


def is_k8s_name_label(s: str) -> bool:
    """A Kubernetes object name / namespace label: lower case only."""
    return len(s) <= 63 and bool(_K8S_NAME_LABEL.match(s))


def is_k8s_subdomain(s: str) -> bool:
    """A Kubernetes object name: lower-case DNS-1123 labels joined by dots, <= 253."""
    return len(s) <= 253 and all(is_k8s_name_label(p) for p in s.split("."))


def _dns1123_labels(domain: str) -> str | None:
    parts = domain.split(".")
    if parts[-1].isdigit():
        return f"domain name {domain!r} invalid (top level domain {parts[-1]!r} cannot be all-numeric)"
    for i, label in enumerate(parts):
        if i == len(parts) - 1 and label == "":
            return None          # a trailing dot: `istio.io.`
        if not is_dns1123_label(label):
            return f"domain name {domain!r} invalid (label {label!r} invalid)"
    return None


def _preconditions(name: str) -> str | None:
    if len(name) > 255:
        return f"domain name {name!r} too long (max 255)"
    if not name:
        return "empty domain name not allowed"
    return None


@lru_cache(maxsize=8192)
def fqdn_error(name: str) -> str | None:
    """Istio's ValidateFQDN: None when valid, else the reason."""
    return _preconditions(name) or _dns1123_labels(name)


@lru_cache(maxsize=8192)
def wildcard_domain_error(name: str) -> str | None:
    """Istio's ValidateWildcardDomain: a wildcard is allowed in the first label only."""
    err = _preconditions(name)
    if err:
        return err
    first, _, rest = name.partition(".")
    if not _WILDCARD_LABEL.match(first) or len(first) > 64:
        return f"domain name {name!r} invalid (label {first!r} invalid)"
    return _dns1123_labels(rest) if rest else None


def partial_wildcard_error(name: str) -> str | None:
    if "*" in name and name != "*" and not name.startswith("*."):
        return f"partial wildcard {name!r} not allowed"
    return None


def is_ip(s: str) -> bool:
    try:
        ipaddress.ip_address(s)
        return True
    except ValueError:
        return False


def ip_subnet_error(s: str) -> str | None:
    """Istio's ValidateIPSubnet: an address or a CIDR block."""
    if s.count("/") == 1:
        try:
            ipaddress.ip_network(s, strict=False)
            return None
        except ValueError:
            return f"{s} is not a valid CIDR block"
    return None if is_ip(s) else f"{s} is not a valid IP"


def label_key_error(key: str) -> str | None:
    prefix, sep, name = key.rpartition("/")
    if sep:
        if not prefix or len(prefix) > 253 or any(not _K8S_NAME_LABEL.match(p) for p in prefix.split(".")):
            return f"invalid tag key {key!r}: prefix must be a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return f"invalid tag key {key!r}"
    return None


def label_value_error(value: str) -> str | None:
    if value == "":
        return None
    if len(value) > 63 or not _QUALIFIED_NAME.match(value):
        return f"invalid tag value {value!r}"
    return None


@lru_cache(maxsize=8192)
def resolve_short_name(host: str, namespace: str) -> str:
    """istiod's host.Name resolution: a name without dots is `name.ns.svc.<suffix>`.

    Wildcards and FQDNs are kept as they are (lower-cased: DNS is case-insensitive).
    """
    host = host.lower()
    if "." in host or host == "*" or host.startswith("*") or is_ip(host):
        return host
    return f"{host}.{namespace}.svc.{DOMAIN_SUFFIX}"


def host_matches(pattern: str, host: str) -> bool:
    """Whether `pattern` (possibly `*.x` or `*`) covers `host` (Istio's host.Name.Matches, one way)."""
    if pattern == host or pattern == "*":
        return True
    if pattern.startswith("*"):
        suffix = pattern[1:]
        if host.startswith("*"):
            return host[1:].endswith(suffix)
        return host.endswith(suffix)
    return False


def hosts_overlap(a: str, b: str) -> bool:
    """Istio's host.Name.Matches: either side's wildcard covers the other."""
    return host_matches(a, b) or host_matches(b, a)


def gateway_ref(name: str, namespace: str) -> str:
    """A VirtualService's gateway entry -> `namespace/name` (or `mesh`).

    Accepts `ns/name`, a bare `name` (the VirtualService's namespace) and the
    legacy `name.ns.svc.cluster.local` form.
    """
    if name == MESH_GATEWAY:
        return name
    if "/" in name:
        ns, _, gw = name.partition("/")
        return f"{ns}/{gw}"
    if "." in name:
        parts = name.split(".")
        return f"{parts[1]}/{parts[0]}"
    return f"{namespace}/{name}"
