"""One AuthorizationPolicy rule -> one Envoy RBAC Policy, as istiod builds it
(istio/istio pilot/pkg/security/authz/model: model.go, generator.go and
matcher/*.go), for HTTP filter chains.

A rule's `from` sources become principals (ORed), its `to` operations
permissions (ORed); within one source or operation every field is ANDed,
the values of one field ORed, and `notValues` a NOT of their OR. `when`
conditions are ANDed into every source (principal-side keys) or every
operation (permission-side keys), in Istio's order: the source/operation
fields first (principals, requestPrincipals, serviceAccounts, trustDomains,
namespaces, remoteIpBlocks, ipBlocks; hosts, methods, paths, ports), then the
conditions as written.

Where Istio reads the JWT: jwt_authn's verified payload in dynamic metadata.
Istio stores it under `payload`; this mesh's jwt_authn stores it under
mesh.header_contract.JWT_PAYLOAD_METADATA_KEY (the header-contract filter
reads it there), so the metadata paths use that key. A request principal is
`iss/sub`, matched as the `iss` and `sub` claims separately (the extended
matcher Istio uses): the split is at the last `/`.
"""
from __future__ import annotations

import ipaddress
from envoy.config.core.v3 import address_pb2, extension_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.config.route.v3 import route_components_pb2 as route
from envoy.extensions.path.match.uri_template.v3 import uri_template_match_pb2
from envoy.type.matcher.v3 import metadata_pb2, path_pb2, regex_pb2, string_pb2, value_pb2

from mcp26.mesh.header_contract import JWT_AUTHN_FILTER, JWT_PAYLOAD_METADATA_KEY

SPIFFE = "spiffe://"
MATCH_ONE, MATCH_ANY = "{*}", "{**}"

# `when` keys: principal side (who asks) and permission side (what is asked).
PRINCIPAL_KEYS = ("source.ip", "remote.ip", "source.namespace", "source.serviceAccount", "source.trustDomain",
                  "source.principal", "request.auth.principal", "request.auth.audiences",
                  "request.auth.presenter")
PERMISSION_KEYS = ("destination.ip", "destination.port", "connection.sni")
HEADER_KEY, CLAIMS_KEY, ENVOY_FILTER_KEY = "request.headers", "request.auth.claims", "experimental.envoy.filters."


class RuleError(ValueError):
    """A value istiod cannot generate a matcher for (validation rejects these first)."""


# --- string, header, metadata matchers (matcher/*.go) -----------------------------------------

def regex(r: str) -> string_pb2.StringMatcher:
    return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=r))


def quote_meta(s: str) -> str:
    """Go's regexp.QuoteMeta (Python's re.escape also escapes `-`, `/`, ...)."""
    return "".join("\\" + c if c in _GO_SPECIAL else c for c in s)


_GO_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def string_matcher(v: str, prefix: str = "") -> string_pb2.StringMatcher:
    """StringMatcherWithPrefix: `*` any non-empty, `*x` suffix, `x*` prefix, else exact."""
    if v == "*":
        return regex(".+")
    if v.startswith("*"):
        if not prefix:
            return string_pb2.StringMatcher(suffix=v[1:])
        return regex(prefix + ".*" + quote_meta(v[1:]))
    if v.endswith("*"):
        return string_pb2.StringMatcher(prefix=prefix + v[:-1])
    return string_pb2.StringMatcher(exact=prefix + v)


def header_matcher(name: str, v: str, ignore_case: bool = False) -> route.HeaderMatcher:
    """HeaderMatcher / HostMatcher: `*` is present_match (an empty prefix is invalid in Envoy)."""
    if v == "*":
        return route.HeaderMatcher(name=name, present_match=True)
    if v.startswith("*"):
        sm = string_pb2.StringMatcher(suffix=v[1:], ignore_case=ignore_case)
    elif v.endswith("*"):
        sm = string_pb2.StringMatcher(prefix=v[:-1], ignore_case=ignore_case)
    else:
        sm = string_pb2.StringMatcher(exact=v, ignore_case=ignore_case)
    return route.HeaderMatcher(name=name, string_match=sm)


def _or_values(values: list[str]) -> value_pb2.ValueMatcher:
    """StringOrMatcher: one value as itself, several as an or_match."""
    ms = [value_pb2.ValueMatcher(string_match=string_matcher(v)) for v in values]
    if len(ms) == 1:
        return ms[0]
    return value_pb2.ValueMatcher(or_match=value_pb2.OrMatcher(value_matchers=ms))


def metadata(filter_name: str, keys: list[str], value: value_pb2.ValueMatcher) -> metadata_pb2.MetadataMatcher:
    m = metadata_pb2.MetadataMatcher(filter=filter_name, value=value)
    for k in keys:
        m.path.add(key=k)
    return m


def jwt_list_matcher(claims: list[str], value: value_pb2.ValueMatcher) -> metadata_pb2.MetadataMatcher:
    """MetadataListValueMatcher with useExtendedJwt: a claim matches as a string, or
    as a list holding a matching string."""
    one_of = value_pb2.ValueMatcher(list_match=value_pb2.ListMatcher(one_of=value))
    either = value_pb2.ValueMatcher(or_match=value_pb2.OrMatcher(value_matchers=[one_of, value]))
    return metadata(JWT_AUTHN_FILTER, [JWT_PAYLOAD_METADATA_KEY, *claims], either)


def jwt_claim(claim: str, sm: string_pb2.StringMatcher) -> metadata_pb2.MetadataMatcher:
    return metadata(JWT_AUTHN_FILTER, [JWT_PAYLOAD_METADATA_KEY, claim], value_pb2.ValueMatcher(string_match=sm))


def cidr(value: str) -> address_pb2.CidrRange:
    """AddrStrToCidrRange: an address is a /32 (or /128); a CIDR keeps its own length."""
    try:
        if "/" in value:
            net = ipaddress.ip_network(value, strict=False)
            return _cidr(value.split("/")[0], net.prefixlen)
        addr = ipaddress.ip_address(value)
    except ValueError:
        raise RuleError(f"invalid IP address or CIDR {value!r}") from None
    return _cidr(value, addr.max_prefixlen)


def _cidr(prefix: str, length: int) -> address_pb2.CidrRange:
    c = address_pb2.CidrRange(address_prefix=prefix)
    c.prefix_len.value = length
    return c


def port(value: str) -> int:
    if not str(value).isdigit() or int(value) > 65535:
        raise RuleError(f"invalid port {value!r}")
    return int(value)


def names_in_brackets(s: str) -> list[str]:
    """extractNameInNestedBrackets: `[a][b]` -> [a, b]; `[a.b]` -> [a.b]."""
    out, i = [], 0
    while i < len(s):
        end = s.find("]", i)
        if s[i:i + 1] != "[" or end < 0 or "[" in s[i + 1:end]:
            if s.startswith("[") and s.endswith("]") and len(s) > 2:
                return [s[1:-1]]
            raise RuleError(f"expecting format [<NAME>], but found {s}")
        out.append(s[i + 1:end])
        i = end + 1
    return out


# --- principal side -----------------------------------------------------------------------------

def _authenticated(sm: string_pb2.StringMatcher) -> rbac_pb2.Principal:
    """The peer certificate's URI SAN (else DNS SAN, else subject): Envoy's principal_name."""
    return rbac_pb2.Principal(authenticated=rbac_pb2.Principal.Authenticated(principal_name=sm))


def _namespace(v: str) -> rbac_pb2.Principal:
    ns = ".*".join(quote_meta(p) for p in v.split("*"))
    return _authenticated(regex(f".*/ns/{ns}/.*"))


def _service_account(default_ns: str):
    def gen(v: str) -> rbac_pb2.Principal:
        ns, _, sa = v.partition("/") if "/" in v else (default_ns, "", v)
        return _authenticated(regex(f"spiffe://.+/ns/{quote_meta(ns)}/(.+/|)sa/{quote_meta(sa)}(/.+)?"))
    return gen


def _trust_domain(v: str) -> rbac_pb2.Principal:
    if v == "*":
        return _authenticated(string_pb2.StringMatcher(prefix=SPIFFE))
    if "*" not in v:
        return _authenticated(string_pb2.StringMatcher(prefix=f"{SPIFFE}{v}/"))
    a, b = v.split("*", 1)
    return _authenticated(regex(f"spiffe://{quote_meta(a)}[^/]*{quote_meta(b)}/.*"))


def _request_principals(values: list[str]) -> rbac_pb2.Principal:
    """requestPrincipalGenerator.extendedPrincipal: `iss/sub` as two claim matchers."""
    any_ = regex(".+")
    out = []
    for v in values:
        idx = v.rfind("/")
        found = idx >= 0
        iss, sub = (v[:idx], v[idx + 1:]) if found else (v, "")
        if v == "*":
            m_iss, m_sub = any_, any_
        elif v.startswith("*"):
            if found:
                m_iss = any_ if iss == "*" else string_pb2.StringMatcher(suffix=iss[1:])
                m_sub = string_pb2.StringMatcher(exact=sub)
            else:
                m_iss, m_sub = any_, string_pb2.StringMatcher(suffix=v[1:])
        elif v.endswith("*"):
            if found:
                m_iss = string_pb2.StringMatcher(exact=iss)
                m_sub = any_ if sub == "*" else string_pb2.StringMatcher(prefix=sub[:-1])
            else:
                m_iss, m_sub = string_pb2.StringMatcher(prefix=v[:-1]), any_
        else:
            m_iss, m_sub = string_pb2.StringMatcher(exact=iss), string_pb2.StringMatcher(exact=sub)
        out.append(p_and([rbac_pb2.Principal(metadata=jwt_claim("iss", m_iss)),
                          rbac_pb2.Principal(metadata=jwt_claim("sub", m_sub))]))
    return out[0] if len(out) == 1 else p_or(out)


def _claims(key: str):
    claims = names_in_brackets(key[len(CLAIMS_KEY):])
    return lambda values: rbac_pb2.Principal(metadata=jwt_list_matcher(claims, _or_values(values)))


def _jwt_list(claim: str):
    return lambda values: rbac_pb2.Principal(metadata=jwt_list_matcher([claim], _or_values(values)))


def _request_header(key: str):
    rest = key[len(HEADER_KEY):]
    if not (rest.startswith("[") and rest.endswith("]")):
        raise RuleError(f"expecting format [<NAME>], but found {rest}")
    name = rest[1:-1]
    return lambda v: rbac_pb2.Principal(header=header_matcher(name, v))


def p_and(ids): return rbac_pb2.Principal(and_ids=rbac_pb2.Principal.Set(ids=ids))
def p_or(ids): return rbac_pb2.Principal(or_ids=rbac_pb2.Principal.Set(ids=ids))
def p_not(p): return rbac_pb2.Principal(not_id=p)
def m_and(rules): return rbac_pb2.Permission(and_rules=rbac_pb2.Permission.Set(rules=rules))
def m_or(rules): return rbac_pb2.Permission(or_rules=rbac_pb2.Permission.Set(rules=rules))
def m_not(p): return rbac_pb2.Permission(not_rule=p)


# --- permission side ----------------------------------------------------------------------------

def _path(v: str) -> rbac_pb2.Permission:
    if MATCH_ONE in v or MATCH_ANY in v:
        tpl = uri_template_match_pb2.UriTemplateMatchConfig(
            path_template=v.replace(MATCH_ANY, "**").replace(MATCH_ONE, "*"))
        ext = extension_pb2.TypedExtensionConfig(name="uri-template")
        ext.typed_config.Pack(tpl)
        return rbac_pb2.Permission(uri_template=ext)
    return rbac_pb2.Permission(url_path=path_pb2.PathMatcher(path=string_matcher(v)))


def _envoy_filter(key: str):
    """experimental.envoy.filters.NAME[KEY]: dynamic metadata of filter NAME at KEY."""
    parts = key[len("experimental."):].rstrip("]").split("[", 1)
    if len(parts) != 2:
        raise RuleError(f"invalid key: {key}")

    def gen(values):
        ms = []
        for v in values:
            if v.startswith("[") and v.endswith("]"):
                inner = value_pb2.ValueMatcher(string_match=string_matcher(v.strip("[]")))
                ms.append(value_pb2.ValueMatcher(list_match=value_pb2.ListMatcher(one_of=inner)))
            else:
                ms.append(value_pb2.ValueMatcher(string_match=string_matcher(v)))
        vm = ms[0] if len(ms) == 1 else value_pb2.ValueMatcher(or_match=value_pb2.OrMatcher(value_matchers=ms))
        return rbac_pb2.Permission(metadata=metadata(parts[0], [parts[1]], vm))
    return gen


# --- the model ----------------------------------------------------------------------------------

class _Rule:
    """One key with its values and notValues. `each` makes one matcher per value
    (ORed); `whole` one matcher for all values (Istio's extended generators)."""

    def __init__(self, values, not_values, each=None, whole=None):
        self.values, self.not_values, self.each, self.whole = list(values or []), list(not_values or []), each, whole

    def build(self, side: str, strict: bool) -> list:
        """strict (ALLOW): a value that cannot be matched fails the rule, which
        istiod then drops (a smaller ALLOW). Otherwise (DENY, AUDIT) only that
        matcher is dropped (a wider DENY): Istio's checkError."""
        either, negate = (p_or, p_not) if side == "principal" else (m_or, m_not)
        out = []
        for vals, neg in ((self.values, False), (self.not_values, True)):
            if not vals:
                continue
            if self.whole:
                m = _tolerant(lambda: self.whole(vals), strict)
            else:
                ms = [x for x in (_tolerant(lambda v=v: self.each(v), strict) for v in vals) if x is not None]
                m = either(ms) if ms else None
            if m is not None:
                out.append(negate(m) if neg else m)
        return out


def _tolerant(make, strict: bool):
    try:
        return make()
    except RuleError:
        if strict:
            raise
        return None


def _when_rule(key: str, values, not_values, policy_ns: str) -> tuple[str, _Rule]:
    """Which side a `when` key goes to and its generator (model.New's switch)."""
    gens = {
        "destination.ip": ("permission", lambda v: rbac_pb2.Permission(destination_ip=cidr(v))),
        "destination.port": ("permission", lambda v: rbac_pb2.Permission(destination_port=port(v))),
        "connection.sni": ("permission", lambda v: rbac_pb2.Permission(requested_server_name=string_matcher(v))),
        "source.ip": ("principal", lambda v: rbac_pb2.Principal(direct_remote_ip=cidr(v))),
        "remote.ip": ("principal", lambda v: rbac_pb2.Principal(remote_ip=cidr(v))),
        "source.namespace": ("principal", _namespace),
        "source.trustDomain": ("principal", _trust_domain),
        "source.serviceAccount": ("principal", _service_account(policy_ns)),
        "source.principal": ("principal", lambda v: _authenticated(string_matcher(v, SPIFFE))),
    }
    if key in gens:
        side, each = gens[key]
        return side, _Rule(values, not_values, each=each)
    if key.startswith(ENVOY_FILTER_KEY):
        return "permission", _Rule(values, not_values, whole=_envoy_filter(key))
    whole = {"request.auth.principal": _request_principals,
             "request.auth.audiences": _jwt_list("aud"),
             "request.auth.presenter": _jwt_list("azp")}.get(key)
    if whole:
        return "principal", _Rule(values, not_values, whole=whole)
    if key.startswith(HEADER_KEY):
        return "principal", _Rule(values, not_values, each=_request_header(key))
    if key.startswith(CLAIMS_KEY):
        return "principal", _Rule(values, not_values, whole=_claims(key))
    raise RuleError(f"unknown attribute {key}")


def _source_rules(src: dict, policy_ns: str) -> list[_Rule]:
    """A source's fields in the order Istio's insertFront leaves them."""
    g = lambda f: src.get(f)  # noqa: E731
    return [r for r in (
        _Rule(g("principals"), g("notPrincipals"), each=lambda v: _authenticated(string_matcher(v, SPIFFE))),
        _Rule(g("requestPrincipals"), g("notRequestPrincipals"), whole=_request_principals),
        _Rule(g("serviceAccounts"), g("notServiceAccounts"), each=_service_account(policy_ns)),
        _Rule(g("trustDomains"), g("notTrustDomains"), each=_trust_domain),
        _Rule(g("namespaces"), g("notNamespaces"), each=_namespace),
        _Rule(g("remoteIpBlocks"), g("notRemoteIpBlocks"), each=lambda v: rbac_pb2.Principal(remote_ip=cidr(v))),
        _Rule(g("ipBlocks"), g("notIpBlocks"), each=lambda v: rbac_pb2.Principal(direct_remote_ip=cidr(v))),
    ) if r.values or r.not_values]


def _operation_rules(op: dict) -> list[_Rule]:
    g = lambda f: op.get(f)  # noqa: E731
    return [r for r in (
        _Rule(g("hosts"), g("notHosts"), each=lambda v: rbac_pb2.Permission(header=header_matcher(":authority", v, True))),
        _Rule(g("methods"), g("notMethods"), each=lambda v: rbac_pb2.Permission(header=header_matcher(":method", v))),
        _Rule(g("paths"), g("notPaths"), each=_path),
        _Rule(g("ports"), g("notPorts"), each=lambda v: rbac_pb2.Permission(destination_port=port(v))),
    ) if r.values or r.not_values]


def rule_policy(rule: dict, policy_ns: str, strict: bool = True) -> rbac_pb2.Policy:
    """model.New + Generate for an HTTP chain. Raises RuleError where istiod
    would skip the rule (an unknown `when` key, a bad IP or port)."""
    base = {"principal": [], "permission": []}
    for cond in rule.get("when") or []:
        side, r = _when_rule(cond.get("key", ""), cond.get("values"), cond.get("notValues"), policy_ns)
        if r.values or r.not_values:
            base[side].append(r)
    principals = [_source_rules(f.get("source") or {}, policy_ns) + base["principal"] for f in rule.get("from") or []]
    if not rule.get("from"):
        principals = [base["principal"]]
    permissions = [_operation_rules(t.get("operation") or {}) + base["permission"] for t in rule.get("to") or []]
    if not rule.get("to"):
        permissions = [base["permission"]]
    policy = rbac_pb2.Policy()
    for rl in permissions:
        ands = [m for r in rl for m in r.build("permission", strict)] or [rbac_pb2.Permission(any=True)]
        policy.permissions.append(m_and(ands))
    for rl in principals:
        ands = [p for r in rl for p in r.build("principal", strict)] or [rbac_pb2.Principal(any=True)]
        policy.principals.append(p_and(ands))
    return policy


# An AuthorizationPolicy without rules: a policy that matches nothing (ALLOW-nothing denies all).
def match_never() -> rbac_pb2.Policy:
    return rbac_pb2.Policy(permissions=[m_not(rbac_pb2.Permission(any=True))],
                           principals=[p_not(rbac_pb2.Principal(any=True))])
