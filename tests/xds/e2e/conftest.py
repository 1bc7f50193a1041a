"""A real Kubernetes API server (harness.kube_cluster), started once for the Kubernetes tests
of this folder; they skip, saying why, where the binaries are absent (CI has none)."""
import pytest

from harness.kube_cluster import KubeCluster, binaries, stand_in_crds


@pytest.fixture(scope="session")
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
