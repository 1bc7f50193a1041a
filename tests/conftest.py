"""Shared pytest set-up.

Tests are grouped by the part they test (tests/<part>/, `pytest tests/scheduler` runs every
scheduler test) and, within a part, by what they need: `unit/` runs in-process, `e2e/` starts
real Envoy, servers or eBPF programs and carries the `e2e` marker (`-m "not e2e"` leaves them
out of a quick run). A file under an e2e/ folder that forgets the marker fails collection here
rather than slipping into quick runs. Other markers: `slow` (measures ratios, p99 bounds, cold
compiles or builds; `make test` runs them) and `adversarial` (hostile input on purpose).
"""
import pytest


def pytest_collection_modifyitems(config, items):
    unmarked = sorted({item.nodeid.split("::")[0] for item in items
                       if "e2e" in item.path.parent.parts and item.get_closest_marker("e2e") is None})
    if unmarked:
        raise pytest.UsageError("tests under an e2e/ folder without the e2e marker "
                                "(add `pytestmark = pytest.mark.e2e`): " + ", ".join(unmarked))
