"""The Kubernetes API server as the config source (xds.kube_source), against a real
kube-apiserver and etcd (harness.kube_cluster; skipped where $MCP_KUBE_APISERVER is unset).

- parity: one set of objects loaded from a directory and from the API server gives the
  same xDS resources, byte for byte, for a gateway and a sidecar;
- informers: a change reaches the config; a resync that finds nothing changed changes
  nothing; a compacted resourceVersion (410 Gone) is listed again;
- the change-set rule: a bad object is rejected whole and the last good config served.
"""
import asyncio
import time

import pytest

from harness.paths import TEST_DATA
from mcp26.mesh.change_set import load_config
from mcp26.mesh.kube_source import KubeApi, KubeSource, api_client
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import Translator

pytestmark = pytest.mark.e2e

SHOP = TEST_DATA / "kube-api"
NODES = (
    ProxyNode("router~127.0.0.1~gw.shop~shop.svc.cluster.local", kind="router", namespace="shop",
              labels={"gateway.networking.k8s.io/gateway-name": "shop-gateway", "istio": "ingressgateway"}),
    ProxyNode("sidecar~10.244.1.23~web-a.shop~shop.svc.cluster.local", kind="sidecar", namespace="shop",
              labels={"app": "web"}, service_account="web"),
    ProxyNode("sidecar~10.244.1.21~cart-v1-a.shop~shop.svc.cluster.local", kind="sidecar", namespace="shop",
              labels={"app": "cart", "version": "v1"}, service_account="cart"),
)


def xds_bytes(config) -> dict:
    """{node: {type_url: {name: serialized resource}}} from a fresh Translator."""
    t = Translator()
    return {n.id: {type_url: {name: msg.SerializeToString(deterministic=True) for name, msg in by_name.items()}
                   for type_url, by_name in t.translate(config, n).items()} for n in NODES}


def apply_shop(kube) -> None:
    kube.namespace("shop")
    kube.kubectl("apply", "--server-side", "--field-manager", "test", "-f", str(SHOP / "shop.yaml"))
    for pod, ip in (("cart-v1-a", "10.244.1.21"), ("cart-v2-a", "10.244.1.22"), ("web-a", "10.244.1.23")):
        kube.set_pod_ip("shop", pod, ip)


async def started_source(kube, **kw) -> KubeSource:
    source = KubeSource(KubeApi(await api_client(kube.kubeconfig)), debounce=0.05, **kw)
    source.start()
    await asyncio.wait_for(source.synced(), 30)
    return source


@pytest.fixture(scope="module")
def shop(kube):
    apply_shop(kube)
    return kube


def test_a_directory_and_the_api_server_give_the_same_xds_byte_for_byte(shop, tmp_path):
    # The same set of objects both ways: the file, plus what the API server makes itself
    # (the `kubernetes` Service in `default`), exported as kubectl prints it.
    (tmp_path / "shop.yaml").write_text((SHOP / "shop.yaml").read_text())
    (tmp_path / "apiserver.yaml").write_text(shop.kubectl("get", "service", "kubernetes", "-n", "default",
                                                          "-o", "yaml").stdout)

    async def run():
        source = await started_source(shop)
        try:
            return source.loader()
        finally:
            await source.stop()
            await source.api.client.close()
    from_api = asyncio.run(run())
    from_dir = load_config(str(tmp_path))
    assert [str(w) for w in from_api.warnings] == []
    # The API server's copies carry its defaults (protocol, sessionAffinity, ...) and no
    # address annotation: the same registry either way.
    kinds = lambda c: sorted((r.kind, r.namespace, r.name) for r in c if r.kind not in ("Namespace", "ServiceAccount"))
    assert kinds(from_api) == kinds(from_dir)
    api, directory = xds_bytes(from_api), xds_bytes(from_dir)
    for node in NODES:
        assert api[node.id].keys() == directory[node.id].keys()
        for type_url in api[node.id]:
            assert api[node.id][type_url] == directory[node.id][type_url], (node.id, type_url)
    # and it is a mesh: the cart sidecar's EDS has both Pods, by the labels of the Pods behind them
    eds = api[NODES[1].id]["type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"]
    assert any(b"10.244.1.22" in v for k, v in eds.items() if "v2|cart.shop" in k), sorted(eds)


def test_informers_follow_changes_relist_on_410_and_a_quiet_resync_changes_nothing(shop):
    async def run():
        source = await started_source(shop, resync=3600)
        applied = []

        async def on_change():
            applied.append(source.loader())
        source.on_change = on_change
        try:
            vs = next(i for i in source.informers if i.kind.plural == "virtualservices" and i.kind.group.startswith("networking"))
            # A change: a new VirtualService reaches the config through the watch.
            shop.ok("POST", "/apis/networking.istio.io/v1/namespaces/shop/virtualservices", {
                "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"hosts": ["web.shop.svc.cluster.local"],
                         "http": [{"route": [{"destination": {"host": "web.shop.svc.cluster.local"}}], "timeout": "2s"}]}})
            deadline = time.monotonic() + 10
            while not any(r.name == "web" and r.kind == "VirtualService" for c in applied for r in c):
                assert time.monotonic() < deadline, "the new VirtualService never reached the config"
                await asyncio.sleep(0.05)
            # A resync that finds nothing new: no change set.
            before = source.changes
            for informer in source.informers:
                await informer._list()
            await asyncio.sleep(0.3)
            assert source.changes == before
            # 410 Gone: a watch from a compacted version lists again and keeps the store.
            shop.ok("POST", "/apis/networking.istio.io/v1/namespaces/shop/virtualservices",
                    {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                     "metadata": {"name": "web2", "namespace": "shop"},
                     "spec": {"hosts": ["web2.example.com"], "http": [{"route": [{"destination": {"host": "web.shop.svc.cluster.local"}}]}]}})
            compact(shop)
            gone = vs.relists_gone
            vs.version = "2"        # far behind the compaction
            with pytest.raises(Exception) as e:
                await vs._watch(time.monotonic() + 5)
            assert type(e.value).__name__ == "Gone"
            task = next(t for t in source._tasks if t.get_name() == "informer virtualservices")
            task.cancel()
            # made while no watch ran: only a list finds it
            shop.ok("POST", "/apis/networking.istio.io/v1/namespaces/shop/virtualservices",
                    {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                     "metadata": {"name": "web3", "namespace": "shop"},
                     "spec": {"hosts": ["web3.example.com"], "http": [{"route": [{"destination": {"host": "web.shop.svc.cluster.local"}}]}]}})
            vs.version, vs.need_list = "2", False        # resume a watch from a compacted version
            source._tasks.append(asyncio.get_running_loop().create_task(vs.run()))
            deadline = time.monotonic() + 10
            while ("shop", "web3") not in vs.store:
                assert time.monotonic() < deadline, "no relist after 410"
                await asyncio.sleep(0.05)
            assert vs.relists_gone > gone
            assert {"web", "web2", "web3", "cart"} <= {name for _, name in vs.store}
        finally:
            await source.stop()
            await source.api.client.close()
    asyncio.run(run())


def compact(kube) -> None:
    """Compact etcd's history up to now, so older resourceVersions are gone (410)."""
    import json
    import urllib.request
    rev = json.loads(urllib.request.urlopen(urllib.request.Request(
        kube.etcd_url + "/v3/kv/range", data=json.dumps({"key": "AA=="}).encode(), method="POST"),
        timeout=10).read())["header"]["revision"]
    urllib.request.urlopen(urllib.request.Request(
        kube.etcd_url + "/v3/kv/compaction", data=json.dumps({"revision": rev, "physical": True}).encode(),
        method="POST"), timeout=10).read()


def test_a_bad_object_is_rejected_whole_and_the_last_good_config_kept(shop):
    from mcp26.xds.server import XdsServer
    from mcp26.demo.stack.ports import free_port

    async def run():
        source = KubeSource(KubeApi(await api_client(shop.kubeconfig)), debounce=0.05)
        server = XdsServer("", port=free_port(), admin_port=free_port(), source=source)
        await server.start()
        try:
            good = server.status["generation"]
            assert good and server.status["rejected"] is None
            shop.ok("POST", "/apis/networking.istio.io/v1/namespaces/shop/virtualservices", {
                "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                "metadata": {"name": "bad", "namespace": "shop"},
                "spec": {"hosts": ["cart.shop.svc.cluster.local"],
                         "http": [{"route": [{"destination": {"host": "cart.shop.svc.cluster.local"}, "weight": -3}]}]}})
            deadline = time.monotonic() + 10
            while server.status["rejected"] is None:
                assert time.monotonic() < deadline, "the bad VirtualService was not rejected"
                await asyncio.sleep(0.05)
            assert server.status["generation"] == good
            errors = [e["text"] for e in server.status["rejected"]["errors"]]
            assert errors == ["kubernetes://VirtualService/shop/bad: error: VirtualService/shop/bad: "
                              "spec.http[0].route[0].weight: weight -3 < 0"], errors
            shop.ok("DELETE", "/apis/networking.istio.io/v1/namespaces/shop/virtualservices/bad")
            deadline = time.monotonic() + 10
            while server.status["generation"] == good:
                assert time.monotonic() < deadline, "the good config after the delete was not applied"
                await asyncio.sleep(0.05)
        finally:
            await server.stop()
            await source.api.client.close()
    asyncio.run(run())


def test_a_kind_whose_crd_comes_later_is_found(shop, monkeypatch):
    from mcp26.mesh import kube_source
    from mcp26.mesh.kube_source import Informer, Kind
    monkeypatch.setattr(kube_source, "MISSING_KIND_RETRY_S", 0.3)
    widget = Kind("example.mcp-mesh.io", "v1", "widgets", "Widget")

    async def run():
        api = KubeApi(await api_client(shop.kubeconfig))
        informer = Informer(api, widget, lambda: None, resync=300)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 10)
            assert not informer.served and informer.store == {}
            await asyncio.to_thread(shop.crds, [{
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": "widgets.example.mcp-mesh.io"},
                "spec": {"group": "example.mcp-mesh.io", "scope": "Namespaced",
                         "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                         "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                             "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}])
            await asyncio.to_thread(shop.ok, "POST", "/apis/example.mcp-mesh.io/v1/namespaces/shop/widgets",
                                    {"apiVersion": "example.mcp-mesh.io/v1", "kind": "Widget", "metadata": {"name": "w"}})
            deadline = time.monotonic() + 15
            while ("shop", "w") not in informer.store:
                assert time.monotonic() < deadline, "the new kind was never listed"
                await asyncio.sleep(0.1)
            assert informer.served
        finally:
            task.cancel()
            await api.client.close()
    asyncio.run(run())
