"""Proxies of several shapes translated at once share one translation of the config.

The control plane translates each new node shape in a worker thread, so the
first proxies of 20 shapes arrive together. Each used to build a
ConfigTranslation of its own and then every cluster and route in it: 20 full
translations of the same config (the 1,000-client scale run spent ~2/3 of its
CPU there) and 20 copies of every message. Shapes differing only in their
node cluster need the same messages, so after concurrent translation each
cluster, route configuration and listener is one object shared by all.
"""
import sys
import threading

from benchmarks.xds_config import write_mesh
from benchmarks.xds_load_clients import node
from mcp26.mesh.change_set import load_config
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.translate import Translator
from mcp26.xds.model.type_urls import CLUSTER, LISTENER, ROUTE

SHAPES = 6


def test_shapes_translated_at_once_share_one_translation(tmp_path):
    write_mesh(str(tmp_path), services=60, routes=4, gateway_port=18080)
    config = load_config(str(tmp_path))
    nodes = [ProxyNode.from_proto(node(i, "gw", {"istio": "ingressgateway"}, SHAPES)) for i in range(SHAPES)]
    assert len({n.cluster for n in nodes}) == SHAPES
    translator = Translator()
    start = threading.Barrier(SHAPES)
    snapshots = [None] * SHAPES

    def translate(i):
        start.wait()
        snapshots[i] = translator.translate(config, nodes[i])

    threads = [threading.Thread(target=translate, args=(i,)) for i in range(SHAPES)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)        # interleave the threads finely, as a busy server's do
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    first = snapshots[0]
    assert first[CLUSTER] and first[ROUTE] and first[LISTENER]
    for snap in snapshots[1:]:
        for type_url in (CLUSTER, ROUTE, LISTENER):
            assert snap[type_url].keys() == first[type_url].keys()
            copies = [name for name, msg in snap[type_url].items() if msg is not first[type_url][name]]
            assert not copies, f"{len(copies)} {type_url.rsplit('.', 1)[-1]} built again for another shape"
    assert len(translator._configs) == 1
