"""Authoring tools: `mcpctl route explain` (which rule a request takes, traced to
the YAML) and `mcpctl proxy-config` (a proxy's xDS in istioctl's shapes).

envoy_match    Envoy's virtual host and route matching over RouteConfiguration messages
sources        Envoy objects back to file:line (pluggable rule sources and backends)
route_explain  load, translate for one proxy, match, explain
proxy_config   istioctl's proxy-config tables from a config dump
cli            the sub-commands, registered by xds.cli
"""
