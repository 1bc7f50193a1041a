"""Status as istiod writes it, on a real API server (skipped where $MCP_KUBE_APISERVER is unset):
Gateway API conditions with reasons and observedGeneration, route parents, InferencePool
parents, Istio validationMessages; one writer at a time through a Lease; nothing rewritten
that did not change."""
import asyncio
import time

import pytest

from harness.paths import TEST_DATA
from mcp26.demo.stack.ports import free_port
from mcp26.mesh.kube_source import KubeApi, KubeSource, api_client
from mcp26.xds.kube_status import CONTROLLER_NAME, LeaderElection, StatusWriter
from mcp26.xds.server import XdsServer

pytestmark = pytest.mark.e2e

NS = "status"


def conditions(status: dict) -> dict:
    return {c["type"]: (c["status"], c["reason"], c["observedGeneration"]) for c in status.get("conditions") or []}


async def replica(kube, identity: str):
    api = KubeApi(await api_client(kube.kubeconfig))
    source = KubeSource(api, debounce=0.05)
    server = XdsServer("", port=free_port(), admin_port=free_port(), source=source)
    await server.start()
    election = LeaderElection(api, NS, identity=identity)
    writer = StatusWriter(api, source, election)
    tasks = [asyncio.create_task(election.run()), asyncio.create_task(writer.run(server, period=1))]
    return server, election, writer, tasks


async def until(check, what: str, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


def test_status_is_written_once_by_the_leader_as_istiod_writes_it(kube):
    kube.namespace(NS)
    text = (TEST_DATA / "kube-api" / "shop.yaml").read_text().replace("namespace: shop", f"namespace: {NS}") \
        .replace("{name: shop, labels", f"{{name: {NS}, labels").replace(".shop.svc", f".{NS}.svc").replace("ns/shop/", f"ns/{NS}/")
    kube.kubectl("apply", "--server-side", "-f", "-", input=text)
    for pod, ip in (("cart-v1-a", "10.244.1.21"), ("cart-v2-a", "10.244.1.22"), ("web-a", "10.244.1.23")):
        kube.set_pod_ip(NS, pod, ip)
    # a route no listener accepts (the listener takes routes from its own namespace only)
    kube.namespace("other")
    kube.kubectl("apply", "--server-side", "-f", "-", input=f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: stray, namespace: other}}
spec:
  parentRefs: [{{name: shop-gateway, namespace: {NS}}}]
  rules: [{{backendRefs: [{{name: cart, namespace: {NS}, port: 8080}}]}}]
""")
    kube.kubectl("apply", "--server-side", "-f", "-", input=f"""
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: lonely, namespace: {NS}}}
spec:
  host: web.{NS}.svc.cluster.local
  subsets: [{{name: v9, labels: {{version: v9}}}}]
""")
    gw_path = f"/apis/gateway.networking.k8s.io/v1/namespaces/{NS}/gateways/shop-gateway"
    route_path = f"/apis/gateway.networking.k8s.io/v1/namespaces/{NS}/httproutes/shop"

    async def run():
        a = await replica(kube, "replica-a")
        b = await replica(kube, "replica-b")
        try:
            await until(lambda: a[1].leading or b[1].leading, "nobody took the lease")
            await asyncio.sleep(2 * 2.0 + 0.5)           # both have tried at least twice
            assert a[1].leading != b[1].leading, "two leaders"
            leader, follower = (a, b) if a[1].leading else (b, a)
            gw = await until(lambda: kube.get(gw_path).get("status", {}).get("listeners") and kube.get(gw_path),
                             "no Gateway status")
            gen = gw["metadata"]["generation"]
            assert conditions(gw["status"]) == {"Accepted": ("True", "Accepted", gen),
                                                "Programmed": ("True", "Programmed", gen)}
            (listener,) = gw["status"]["listeners"]
            assert listener["attachedRoutes"] == 1 and conditions(listener)["Accepted"] == ("True", "Accepted", gen)
            route = kube.get(route_path)
            (parent,) = route["status"]["parents"]
            assert parent["controllerName"] == CONTROLLER_NAME
            assert parent["parentRef"]["name"] == "shop-gateway"
            assert conditions(parent) == {"Accepted": ("True", "Accepted", route["metadata"]["generation"]),
                                          "ResolvedRefs": ("True", "ResolvedRefs", route["metadata"]["generation"])}
            stray = await until(lambda: kube.get("/apis/gateway.networking.k8s.io/v1/namespaces/other/httproutes/stray")
                                .get("status"), "no status on the stray route")
            assert conditions(stray["parents"][0])["Accepted"][:2] == ("False", "NotAllowedByListeners")
            # an Istio resource with a finding gets validationMessages (IST0173: a subset selecting nothing)
            dr = await until(lambda: kube.get(f"/apis/networking.istio.io/v1/namespaces/{NS}/destinationrules/lonely")
                             .get("status"), "no validationMessages")
            assert dr["observedGeneration"] == 1
            assert [(m["level"], m["type"]["code"]) for m in dr["validationMessages"]] == [("WARNING", "IST0173")], dr
            assert kube.get(f"/apis/networking.istio.io/v1/namespaces/{NS}/destinationrules/cart").get("status") in (None, {})
            assert follower[2].writes == 0
            # nothing is written again that did not change
            written = leader[2].writes
            assert written >= 3
            leader[0].changed.set()
            await asyncio.sleep(1.5)
            assert leader[2].writes == written, "status rewritten with nothing changed"
            # a change of spec: observedGeneration follows
            kube.ok("PATCH", route_path, {"spec": {"rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/c"}}],
                                                              "backendRefs": [{"name": "cart", "port": 8080}]}]}},
                    content_type="application/merge-patch+json")
            await until(lambda: kube.get(route_path)["status"]["parents"][0]["conditions"][0]["observedGeneration"]
                        == kube.get(route_path)["metadata"]["generation"], "observedGeneration did not follow")
            # the leader goes: the other takes the lease over and writes from then on
            await leader[1].release()
            for t in leader[3]:
                t.cancel()
            await until(lambda: follower[1].leading, "the lease was not taken over")
        finally:
            for server, election, writer, tasks in (a, b):
                for t in tasks:
                    t.cancel()
                await server.stop()
                await server.source.stop()
                await server.source.api.client.close()
    asyncio.run(run())
