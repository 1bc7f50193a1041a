"""Shared pytest set-up. The helpers tests use (Envoy, the control plane,
upstreams, ports, certificates) are the installed `harness` package.

Every test under tests/e2e/ must carry the `e2e` marker (`-m "not e2e"` is
how a quick run leaves the real Envoys, servers and eBPF out); a file that
forgets it fails collection here rather than slipping into quick runs.
"""
import os

import pytest

E2E_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e") + os.sep


def pytest_collection_modifyitems(config, items):
    unmarked = sorted({item.nodeid.split("::")[0] for item in items
                       if str(item.path).startswith(E2E_DIR) and item.get_closest_marker("e2e") is None})
    if unmarked:
        raise pytest.UsageError("tests under tests/e2e/ without the e2e marker "
                                "(add `pytestmark = pytest.mark.e2e`): " + ", ".join(unmarked))
