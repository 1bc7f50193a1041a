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


@pytest.fixture
def mcpctl(capsys, monkeypatch):
    """`mcpctl ARGS...` in this process (mcp26.mesh.cli.main), answered as a subprocess would be:
    a CompletedProcess with returncode, stdout and stderr. Starting the console script costs
    ~1 s of imports a call; tests that read only its output and exit code use this, and those
    that test the process itself (signals, child processes, its environment, its memory) still
    start it. `stdin=` feeds standard input; argparse's refusals come back as exit code 2."""
    import io
    import subprocess
    import sys
    from mcp26.mesh.cli import main

    def run(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()                                  # what the test printed before is not ours
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit_:                          # argparse's usage errors, --help
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["mcpctl", *argv], code, out, err)
    return run


@pytest.fixture(scope="module")
def kube():
    """A real Kubernetes API server (harness.kube_cluster), one per test module (a few seconds to
    start), so that no module sees another's objects, with the CRDs of the kinds the mesh reads;
    the tests skip, saying why, where the binaries are absent (CI has none)."""
    from harness.kube_cluster import KubeCluster, binaries, stand_in_crds
    api, etcd, why = binaries()
    if not api:
        pytest.skip(why)
    cluster = KubeCluster().start()
    try:
        cluster.crds(stand_in_crds())
        yield cluster
    finally:
        cluster.stop()
