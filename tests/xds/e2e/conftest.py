"""A real Kubernetes API server (harness.kube_cluster), one per test module (a few seconds to
start), so that no module sees another's objects; the tests skip, saying why, where the
binaries are absent (CI has none)."""
import pytest

from harness.kube_cluster import KubeCluster, binaries, stand_in_crds


@pytest.fixture(scope="module")
def kube():
    api, etcd, why = binaries()
    if not api:
        pytest.skip(why)
    cluster = KubeCluster().start()
    try:
        cluster.crds(stand_in_crds())
        yield cluster
    finally:
        cluster.stop()
