"""AuthorizationPolicy (security.istio.io v1/v1beta1) -> envoy.filters.http.rbac
(and ext_authz for CUSTOM), as istiod's authz builder does it
(istio/istio pilot/pkg/security/authz/builder/builder.go).

The policies that select the proxy (policy_scope.selects: its namespace or the
root namespace istio-system, `selector.matchLabels`) are grouped by action;
each group is one filter, in Istio's order:

    CUSTOM  per provider: an RBAC filter whose *shadow* rules (action DENY,
            policies named `istio-ext-authz-PROVIDER-ns[NS]-policy[NAME]-rule[I]`)
            only mark a match in dynamic metadata, then ext_authz enabled by
            that mark -- the external server is asked only for the requests a
            rule matches. An unknown or invalid provider: the rules DENY.
    AUDIT   an RBAC filter with action LOG (marks the request for access logs)
    DENY    an RBAC filter with action DENY
    ALLOW   an RBAC filter with action ALLOW: when any ALLOW policy applies, a
            request no ALLOW rule matches is refused

Each rule is one RBAC policy `ns[NS]-policy[NAME]-rule[I]` (authz_model.py);
a policy without rules is one that matches nothing, so an ALLOW with no
rules denies everything and a DENY with no rules denies nothing. The
annotation `istio.io/dry-run: "true"` moves a policy to the filter's shadow
rules (stats under `istio_dry_run_allow_`/`istio_dry_run_deny_`, no effect).
Denials are Envoy's own 403 `RBAC: access denied`.

Difference from Istio: istiod puts the CUSTOM ext_authz filters before the
AUTHN phase (before jwt_authn); here every filter of this module sits in the
AUTHZ phase after the AUTHZ-phase Wasm plugins (http_filters.CHAIN), so an
ext_authz server sees requests whose JWT was already checked.
"""
from __future__ import annotations

from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as rbac_http
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm

from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.model.type_urls import Snapshot
from mcp26.xds.translate import authz_ext, authz_model
from mcp26.xds.translate.overlay import Overlay
from mcp26.xds.translate.phases import Phase
from mcp26.xds.translate.policy_scope import selects

KIND = "AuthorizationPolicy"
RBAC_FILTER = "envoy.filters.http.rbac"
EXT_AUTHZ_FILTER = "envoy.filters.http.ext_authz"
DRY_RUN = "istio.io/dry-run"
BAD_CUSTOM_SUFFIX = "-deny-due-to-bad-CUSTOM-action"
SHADOW_PREFIX = {rbac_pb2.RBAC.ALLOW: "istio_dry_run_allow_", rbac_pb2.RBAC.DENY: "istio_dry_run_deny_"}
EXT_AUTHZ_SHADOW_PREFIX = "istio_ext_authz_"


def policies(config: MeshConfig, node: ProxyNode) -> list[Resource]:
    """The AuthorizationPolicies that apply to `node`, in a stable order."""
    return sorted((r for r in config.of_kind(KIND) if selects(r, node)), key=lambda r: (r.namespace, r.name))


def _dry_run(res: Resource) -> bool:
    return str((res.annotations or {}).get(DRY_RUN, "")).lower() in ("true", "1", "t")


def policy_name(res: Resource, index: int, provider: str = "") -> str:
    prefix = f"{authz_ext.EXT_AUTHZ_PREFIX}-{provider}-" if provider else ""
    return f"{prefix}ns[{res.namespace}]-policy[{res.name}]-rule[{index}]"


def _add_rules(target: rbac_pb2.RBAC, res: Resource, action, provider: str = "") -> None:
    """builder.build for one policy: a policy per rule; a rule istiod cannot
    generate is skipped (validation rejects those before translation)."""
    rules = res.spec.get("rules") or []
    strict = action == rbac_pb2.RBAC.ALLOW
    for i, rule in enumerate(rules):
        try:
            target.policies[policy_name(res, i, provider)].CopyFrom(
                authz_model.rule_policy(rule or {}, res.namespace, strict))
        except authz_model.RuleError:
            continue
    if not rules:
        target.policies[policy_name(res, 0, provider)].CopyFrom(authz_model.match_never())


def _filter(msg) -> hcm.HttpFilter:
    name = EXT_AUTHZ_FILTER if msg.DESCRIPTOR.full_name.endswith("ext_authz.v3.ExtAuthz") else RBAC_FILTER
    f = hcm.HttpFilter(name=name)
    f.typed_config.Pack(msg)
    return f


def _rbac_filter(pols: list[Resource], action) -> hcm.HttpFilter | None:
    if not pols:
        return None
    enforce, shadow = rbac_pb2.RBAC(action=action), rbac_pb2.RBAC(action=action)
    for res in pols:
        _add_rules(shadow if _dry_run(res) else enforce, res, action)
    cfg = rbac_http.RBAC()
    if any(not _dry_run(r) for r in pols):
        cfg.rules.CopyFrom(enforce)
    if any(_dry_run(r) for r in pols):
        cfg.shadow_rules.CopyFrom(shadow)
    # istiod names the prefix from the shadow rules' action, ALLOW when there are none.
    cfg.shadow_rules_stat_prefix = SHADOW_PREFIX.get(action if any(_dry_run(r) for r in pols)
                                                     else rbac_pb2.RBAC.ALLOW, "")
    return _filter(cfg)


def _custom_filters(config: MeshConfig, pols: list[Resource]) -> list[hcm.HttpFilter]:
    by_provider: dict[str, list[Resource]] = {}
    for res in pols:
        by_provider.setdefault(((res.spec.get("provider") or {}).get("name") or ""), []).append(res)
    known = authz_ext.providers(config)
    out = []
    multiple = len(by_provider) > 1     # istiod needs PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS for that
    for provider in sorted(by_provider):
        enforce, shadow = rbac_pb2.RBAC(action=rbac_pb2.RBAC.DENY), rbac_pb2.RBAC(action=rbac_pb2.RBAC.DENY)
        for res in by_provider[provider]:
            _add_rules(shadow if _dry_run(res) else enforce, res, rbac_pb2.RBAC.DENY, provider)
        try:
            if multiple:
                raise authz_ext.ProviderError("multiple CUSTOM providers for one workload")
            if provider not in known:
                raise authz_ext.ProviderError(f"provider {provider!r} is not defined")
            ext = authz_ext.ext_authz(config, known[provider])
        except authz_ext.ProviderError:
            bad = rbac_pb2.RBAC(action=rbac_pb2.RBAC.DENY)
            for name, pol in enforce.policies.items():
                bad.policies[name + BAD_CUSTOM_SUFFIX].CopyFrom(pol)
            out.append(_filter(rbac_http.RBAC(rules=bad)))
            continue
        cfg = rbac_http.RBAC(shadow_rules=enforce, shadow_rules_stat_prefix=EXT_AUTHZ_SHADOW_PREFIX)
        if shadow.policies:
            cfg.rules.CopyFrom(shadow)
        ext.filter_enabled_metadata.CopyFrom(authz_ext.enabled_for(provider))
        out += [_filter(cfg), _filter(ext)]
    return out


def http_filters(config: MeshConfig, node: ProxyNode, port: int, phase: Phase) -> list:
    """CUSTOM, then AUDIT, DENY, ALLOW filters, in the AUTHZ phase."""
    if phase is not Phase.AUTHZ:
        return []
    pols = policies(config, node)
    if not pols:
        return []
    groups: dict[str, list[Resource]] = {}
    for res in pols:
        groups.setdefault(res.spec.get("action") or "ALLOW", []).append(res)
    out = _custom_filters(config, groups.get("CUSTOM", []))
    for action, enum in (("AUDIT", rbac_pb2.RBAC.LOG), ("DENY", rbac_pb2.RBAC.DENY), ("ALLOW", rbac_pb2.RBAC.ALLOW)):
        f = _rbac_filter(groups.get(action, []), enum)
        if f is not None:
            out.append(f)
    return out


def resources(config: MeshConfig, node: ProxyNode, overlay: Overlay) -> Snapshot:
    """Nothing extra: ext_authz calls a ServiceEntry's cluster, which translation emits."""
    return {}
