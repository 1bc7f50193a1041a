"""`mcpctl proxy-config`: one proxy's xDS in istioctl's proxy-config shapes.

The control plane's view comes from its admin `/debug/config_dump?node=ID`
(what it sent that node); with an Envoy admin address, the proxy's own
`/config_dump?include_eds` is read too and every row says whether Envoy holds
the same resource. Both are reduced to {kind: {name: resource JSON}} first,
so the tables below do not care where a resource came from.

Key material never leaves this module: secrets show their name and kind only,
and any field whose name says it holds a key is redacted, also inside the JSON
string a Wasm plugin's configuration is.
"""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request

KINDS = {"listeners": "LDS", "routes": "RDS", "clusters": "CDS", "endpoints": "EDS", "secret": "SDS",
         "ecds": "ECDS"}
# istioctl's spellings: the singular kinds as the plural (proxy-config cluster NODE).
KIND_ALIASES = {"listener": "listeners", "route": "routes", "cluster": "clusters", "endpoint": "endpoints",
                "secrets": "secret", "extension": "ecds", "extensions": "ecds"}
ALL = "all"            # every kind above, one table each
BOOTSTRAP = "bootstrap"  # the proxy's own bootstrap: only Envoy has it (--envoy-admin)
REDACTED = "<redacted>"
_SECRET_FIELD = re.compile(r"(session_?key|private_?key|password|secret_?key|hmac_?key|signing_?key|^key$)", re.I)


class ProxyConfigError(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def redact(value):
    """A copy of `value` with every key-like field's value replaced."""
    if isinstance(value, dict):
        return {k: (REDACTED if _SECRET_FIELD.search(k) and not isinstance(v, (dict, list)) else redact(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str) and value[:1] in "{[":
        try:
            inner = json.loads(value)       # a Wasm plugin's configuration is JSON in a string
        except ValueError:
            return value
        return json.dumps(redact(inner), sort_keys=True)
    return value


# -- reading ---------------------------------------------------------------
def _get_json(url: str, what: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            body = json.loads(e.read())
        except ValueError:
            body = {}
        known = ", ".join(body.get("nodes") or []) or "none"
        raise ProxyConfigError(f"{what}: {body.get('error') or e} (connected nodes: {known})") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ProxyConfigError(f"cannot reach {what} at {url}: {e}") from None


def control_plane_view(admin_url: str, node: str) -> dict:
    """What the control plane at `admin_url` (http://HOST:PORT, mesh.cli_context) sent `node`."""
    dump = _get_json(f"{admin_url}/debug/config_dump?node={urllib.parse.quote(node)}",
                     "the control plane admin")
    return {short: {name: r.get("resource", {}) for name, r in by_name.items()}
            for short, by_name in (dump.get("resources") or {}).items()}


def envoy_view_from_dump(dump: dict) -> dict:
    """Envoy's /config_dump -> {kind: {name: resource}}, the xDS-delivered (dynamic)
    resources only: static ones come from the bootstrap, never from the control plane."""
    out: dict = {k: {} for k in KINDS.values()}
    for cfg in dump.get("configs") or []:
        t = cfg.get("@type", "").rsplit(".", 1)[-1]
        if t == "ClustersConfigDump":
            for c in cfg.get("dynamic_active_clusters") or []:
                out["CDS"][c["cluster"]["name"]] = c["cluster"]
        elif t == "ListenersConfigDump":
            for lis in cfg.get("dynamic_listeners") or []:
                state = lis.get("active_state") or lis.get("warming_state") or {}
                if state.get("listener"):
                    out["LDS"][lis["name"]] = state["listener"]
        elif t == "RoutesConfigDump":
            for r in cfg.get("dynamic_route_configs") or []:
                out["RDS"][r["route_config"]["name"]] = r["route_config"]
        elif t == "EndpointsConfigDump":
            for e in cfg.get("dynamic_endpoint_configs") or []:
                ec = e["endpoint_config"]
                out["EDS"][ec.get("cluster_name", "")] = ec
        elif t == "SecretsConfigDump":
            for s in cfg.get("dynamic_active_secrets") or []:
                out["SDS"][s.get("name", "")] = {"name": s.get("name", ""), **_secret_kind_only(s.get("secret") or {})}
    return out


def envoy_view(address: str) -> dict:
    return envoy_view_from_dump(_get_json(f"http://{address}/config_dump?include_eds", "the Envoy admin"))


def _clean(resource: dict) -> dict:
    """Envoy's JSON and the control plane's differ in type-URL fields; compare without '@type'."""
    if isinstance(resource, dict):
        return {k: _clean(v) for k, v in resource.items() if k != "@type"}
    if isinstance(resource, list):
        return [_clean(v) for v in resource]
    return resource


def compare(mine: dict, envoy: dict) -> dict:
    """name -> 'same' | 'differs' | 'missing in Envoy' | 'only in Envoy'."""
    out = {}
    for name, res in mine.items():
        if name not in envoy:
            out[name] = "missing in Envoy"
        else:
            out[name] = "same" if _holds(_clean(_snake(envoy[name])), _clean(_snake(res))) else "differs"
    for name in envoy:
        if name not in mine:
            out[name] = "only in Envoy"
    return out


def _holds(envoy, sent) -> bool:
    """Whether Envoy's copy has everything that was sent: Envoy's dump fills in
    defaults (EDS health status, overprovisioning), so extra fields are fine."""
    if isinstance(sent, dict):
        return isinstance(envoy, dict) and all(k in envoy and _holds(envoy[k], v) for k, v in sent.items())
    if isinstance(sent, list):
        return isinstance(envoy, list) and len(envoy) == len(sent) and all(map(_holds, envoy, sent))
    return envoy == sent


def _snake(value):
    """Envoy's admin JSON uses proto field names (snake_case), MessageToDict camelCase: compare as one."""
    if isinstance(value, dict):
        return {re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), k): _snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake(v) for v in value]
    return value


# -- tables ----------------------------------------------------------------
def _g(d: dict, *keys, default=None):
    """First of several spellings (camelCase from the control plane, snake_case from Envoy)."""
    for k in keys:
        if k in d:
            return d[k]
    return default


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    fmt = lambda row: "   ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip()
    return "\n".join([fmt(header)] + [fmt(r) for r in rows]) + "\n"


def _cluster_rows(clusters: dict) -> list[list[str]]:
    rows = []
    for name, c in sorted(clusters.items()):
        parts = name.split("|")
        if len(parts) == 4:
            direction, port, subset, fqdn = parts
        else:
            direction, port, subset, fqdn = "-", "-", "-", name
        ctype = _g(c, "type", default="") or (_g(c, "clusterType", "cluster_type", default={}) or {}).get("name") or "STATIC"
        rows.append([fqdn, port, subset or "-", direction, ctype, _istio_config(c, "destination-rule")])
    return rows


def _istio_config(resource: dict, kind: str) -> str:
    """name.namespace from istiod-style metadata (/apis/.../namespaces/NS/KIND/NAME), else '-'."""
    md = _g(resource, "metadata", default={}) or {}
    fm = _g(md, "filterMetadata", "filter_metadata", default={}) or {}
    path = str((fm.get("istio") or {}).get("config") or "")
    m = re.search(r"/namespaces/([^/]+)/" + kind + r"/([^/]+)$", path)
    return f"{m.group(2)}.{m.group(1)}" if m else "-"


def _listener_rows(listeners: dict) -> list[list[str]]:
    rows = []
    for name, lis in sorted(listeners.items()):
        sa = (_g(lis, "address", default={}) or {}).get("socketAddress") or (lis.get("address") or {}).get("socket_address") or {}
        address, port = sa.get("address", "-"), str(_g(sa, "portValue", "port_value", default="-"))
        if _g(lis, "apiListener", "api_listener"):
            rows.append([address if sa else name, port, "ALL", f"Route: {name} (proxyless gRPC)"])
            continue
        for chain in _g(lis, "filterChains", "filter_chains", default=[]) or []:
            fcm = _g(chain, "filterChainMatch", "filter_chain_match", default={}) or {}
            sni = _g(fcm, "serverNames", "server_names", default=[])
            alpn = _g(fcm, "applicationProtocols", "application_protocols", default=[])
            match = ("SNI: " + ",".join(sni)) if sni else ("ALPN: " + ",".join(alpn)) if alpn else "ALL"
            rows.append([address, port, match, _chain_destination(chain)])
    return rows


def _chain_destination(chain: dict) -> str:
    for f in chain.get("filters") or []:
        tc = _g(f, "typedConfig", "typed_config", default={}) or {}
        rds = tc.get("rds")
        if rds:
            return f"Route: {_g(rds, 'routeConfigName', 'route_config_name', default='')}"
        if _g(tc, "routeConfig", "route_config"):
            return "Inline Route"
        if tc.get("cluster"):
            return f"Cluster: {tc['cluster']}"
        wc = _g(tc, "weightedClusters", "weighted_clusters")
        if wc:
            return "Clusters: " + ",".join(c.get("name", "") for c in wc.get("clusters") or [])
    return "-"


def _domains(domains: list[str]) -> str:
    # As istioctl: port-qualified twins add nothing; the rest are summarised.
    plain = [d for d in domains if not (":" in d and d.rsplit(":", 1)[0] in domains)] or domains
    if not plain:
        return "-"
    return plain[0] if len(plain) == 1 else f"{plain[0]} + {len(plain) - 1} more..."


def _route_match(route: dict) -> str:
    m = route.get("match") or {}
    if "prefix" in m:
        text = m["prefix"] + "*" if m["prefix"].endswith("/") else m["prefix"] + "*"
    elif "path" in m:
        text = m["path"]
    elif _g(m, "safeRegex", "safe_regex"):
        text = _g(m, "safeRegex", "safe_regex")["regex"]
    elif _g(m, "pathSeparatedPrefix", "path_separated_prefix"):
        text = _g(m, "pathSeparatedPrefix", "path_separated_prefix") + "/*"
    else:
        text = "/*"
    extra = [h.get("name", "") for h in m.get("headers") or []]
    extra += ["?" + q.get("name", "") for q in _g(m, "queryParameters", "query_parameters", default=[]) or []]
    return text + (f" ({', '.join(extra)})" if extra else "")


def _route_rows(routes: dict) -> list[list[str]]:
    rows = []
    for name, rc in sorted(routes.items()):
        for vh in _g(rc, "virtualHosts", "virtual_hosts", default=[]) or []:
            for r in vh.get("routes") or [{}]:
                vs = _istio_config(r, "virtual-service")
                rows.append([name, vh.get("name", ""), _domains(vh.get("domains") or []), _route_match(r),
                             vs if vs != "-" else ("404" if not r else "-")])
    return rows


def _endpoint_rows(assignments: dict) -> list[list[str]]:
    rows = []
    for name, cla in sorted(assignments.items()):
        for group in cla.get("endpoints") or []:
            for lb in _g(group, "lbEndpoints", "lb_endpoints", default=[]) or []:
                sa = ((lb.get("endpoint") or {}).get("address") or {})
                sa = _g(sa, "socketAddress", "socket_address", default={}) or {}
                status = _g(lb, "healthStatus", "health_status", default="HEALTHY")
                status = "HEALTHY" if status in ("UNKNOWN", "HEALTHY") else status
                rows.append([f"{sa.get('address', '?')}:{_g(sa, 'portValue', 'port_value', default='?')}",
                             status, "OK", name])
    return rows


def _secret_kind_only(secret: dict) -> dict:
    for field, kind in (("tlsCertificate", "Cert Chain"), ("tls_certificate", "Cert Chain"),
                        ("validationContext", "CA"), ("validation_context", "CA"),
                        ("sessionTicketKeys", "Session Ticket Keys"), ("session_ticket_keys", "Session Ticket Keys"),
                        ("genericSecret", "Generic"), ("generic_secret", "Generic")):
        if field in secret:
            return {"type": kind}
    return {"type": "Unknown"}


def _secret_rows(secrets: dict) -> list[list[str]]:
    return [[name, _secret_kind_only(s).get("type") if "type" not in s else s["type"], "ACTIVE"]
            for name, s in sorted(secrets.items())]


SHORT = {
    "clusters": (["SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION RULE"], _cluster_rows),
    "listeners": (["ADDRESSES", "PORT", "MATCH", "DESTINATION"], _listener_rows),
    "routes": (["NAME", "VHOST NAME", "DOMAINS", "MATCH", "VIRTUAL SERVICE"], _route_rows),
    "endpoints": (["ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER"], _endpoint_rows),
    "secret": (["RESOURCE NAME", "TYPE", "STATUS"], _secret_rows),
}


def _ecds_rows(configs: dict) -> list[list[str]]:
    return [[name, str(_g(c, "typedConfig", "typed_config", default={}).get("@type", "-")).rsplit(".", 1)[-1]]
            for name, c in sorted(configs.items())]


SHORT["ecds"] = (["NAME", "TYPE"], _ecds_rows)


def cluster_key(name: str) -> tuple[str, str, str, str]:
    """(direction, port, subset, fqdn) of an Istio cluster name outbound|80|v1|reviews.ns.svc.cluster.local."""
    parts = name.split("|")
    return tuple(parts) if len(parts) == 4 else ("", "", "", name)


def select(kind: str, resources: dict, fqdn: str | None = None, port: int | None = None,
           subset: str | None = None, direction: str | None = None) -> dict:
    """istioctl proxy-config's filters: clusters and endpoints by --fqdn, --port, --subset and
    --direction (parts of the Istio cluster name); listeners by --port."""
    if kind in ("clusters", "endpoints"):
        def keep(name):
            d, p, s, f = cluster_key(name)
            return ((fqdn is None or f == fqdn or f.startswith(fqdn + ".")) and (port is None or p == str(port))
                    and (subset is None or s == subset) and (direction is None or d == direction))
        return {n: r for n, r in resources.items() if keep(n)}
    if kind == "listeners" and port is not None:
        return {n: r for n, r in resources.items() if any(row[1] == str(port) for row in _listener_rows({n: r}))}
    return resources


def render(kind: str, resources: dict, output: str = "short", sync: dict | None = None) -> str:
    """One kind's resources as istioctl prints them; `sync` (name -> state) adds a column."""
    if kind == "secret":
        resources = {n: {"name": n, **(s if "type" in s else _secret_kind_only(s))} for n, s in resources.items()}
    resources = redact(resources)
    if output in ("json", "yaml"):
        listing = [resources[n] for n in sorted(resources)]
        if sync is not None:
            listing = {"resources": listing, "envoy": dict(sorted(sync.items()))}
        if output == "json":
            return json.dumps(listing, indent=2) + "\n"
        import yaml
        return yaml.safe_dump(listing, sort_keys=False)
    header, rows_of = SHORT[kind]
    if sync is None:
        return _table(header, rows_of(resources))
    rows = []
    for name in sorted(resources):
        for row in rows_of({name: resources[name]}):
            rows.append(row + [sync.get(name, "?").upper()])
    for name in sorted(n for n, s in sync.items() if s == "only in Envoy"):
        rows.append([name] + ["-"] * (len(header) - 1) + ["ONLY IN ENVOY"])
    return _table(header + ["ENVOY"], rows)


def bootstrap(envoy_admin: str | None, output: str) -> str:
    """The proxy's bootstrap from Envoy's own /config_dump (the control plane never sent it)."""
    if not envoy_admin:
        raise ProxyConfigError("bootstrap: only Envoy holds its bootstrap; give its admin address with "
                               "--envoy-admin HOST:PORT", code=2)
    dump = _get_json(f"http://{envoy_admin}/config_dump", "the Envoy admin")
    found = [c.get("bootstrap") for c in dump.get("configs") or []
             if str(c.get("@type", "")).endswith("BootstrapConfigDump")] or [None]
    doc = redact(found[0] or {})
    if output == "yaml":
        import yaml
        return yaml.safe_dump(doc, sort_keys=False)
    return json.dumps(doc, indent=2) + "\n"


def run(kind: str, node: str, admin_url: str, envoy_admin: str | None = None, output: str = "short",
        **filters) -> str:
    kind = KIND_ALIASES.get(kind, kind)
    if kind == BOOTSTRAP:
        return bootstrap(envoy_admin, output)
    if kind == ALL:
        view = control_plane_view(admin_url, node)
        envoy = envoy_view(envoy_admin) if envoy_admin else None
        if output in ("json", "yaml"):
            doc = {k: [redact(r) for _n, r in sorted(select(k, view.get(short, {}), **filters).items())]
                   for k, short in KINDS.items()}
            if output == "json":
                return json.dumps(doc, indent=2) + "\n"
            import yaml
            return yaml.safe_dump(doc, sort_keys=False)
        return "\n".join(_one(k, view, envoy, output, filters) for k in KINDS)
    return _one(kind, control_plane_view(admin_url, node), envoy_view(envoy_admin) if envoy_admin else None,
                output, filters, heading=False)


def _one(kind: str, view: dict, envoy: dict | None, output: str, filters: dict, heading: bool = True) -> str:
    short = KINDS[kind]
    mine = select(kind, view.get(short, {}), **filters)
    sync = None
    if envoy is not None:
        sync = compare(mine, select(kind, envoy.get(short, {}), **filters))
    text = (f"{kind.upper()}:\n" if heading else "") + render(kind, mine, output, sync)
    if sync is not None and output == "short":
        bad = sorted(n for n, s in sync.items() if s != "same")
        text += (f"\n{len(bad)} of {len(sync)} differ between the control plane and Envoy: {', '.join(bad)}\n"
                 if bad else f"\nEnvoy holds the same {len(sync)} {kind} the control plane sent.\n")
    return text
