"""The selections and Delta diffs of one build are shared by the node shapes that share a
type's packed resources (cache.Packings.memo), and never by shapes whose resources differ."""
from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2

from mcp26.xds.model import type_urls as T
from mcp26.xds.cache import Packings, PreparedSnapshot, prepare_selections, subscription_key


def cla(name: str, port: int) -> endpoint_pb2.ClusterLoadAssignment:
    m = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
    ep = m.endpoints.add().lb_endpoints.add().endpoint.address.socket_address
    ep.address, ep.port_value = "127.0.0.1", port
    return m


CLUSTERS = {n: cluster_pb2.Cluster(name=n) for n in ("a", "b", "c")}
EDS = {n: cla(n, 8000 + i) for i, n in enumerate(("a", "b", "c"))}
NAMES = frozenset(("a", "c"))
KEY = subscription_key(False, NAMES)


def shapes(eds_of_second: dict) -> tuple[PreparedSnapshot, PreparedSnapshot, Packings]:
    """Two shapes of one build: the same cluster messages; EDS the same or not."""
    packings = Packings()
    one = PreparedSnapshot.from_snapshot({T.CLUSTER: CLUSTERS, T.ENDPOINT: EDS}, "g1", packings=packings)
    two = PreparedSnapshot.from_snapshot({T.CLUSTER: CLUSTERS, T.ENDPOINT: eds_of_second}, "g1", packings=packings)
    return one, two, packings


def test_shapes_with_the_same_resources_share_one_selection_and_diff():
    one, two, _ = shapes(EDS)
    a = one.selection(T.ENDPOINT, False, NAMES, KEY)
    b = two.selection(T.ENDPOINT, False, NAMES, KEY)
    assert a is b and [r.name for r in a.resources] == ["a", "c"]
    held = PreparedSnapshot.from_snapshot({T.ENDPOINT: {"a": cla("a", 1), "b": EDS["b"]}}, "g0").selection(
        T.ENDPOINT, False, NAMES, KEY)
    assert one.diff(held, a) is two.diff(held, b)
    changed, removed = one.diff(held, a)
    assert [r.name for r in changed] == ["a", "c"] and removed == []


def test_shapes_with_other_endpoints_get_their_own_selection():
    other = dict(EDS, c=cla("c", 9999))
    one, two, _ = shapes(other)
    a = one.selection(T.ENDPOINT, False, NAMES, KEY)
    b = two.selection(T.ENDPOINT, False, NAMES, KEY)
    assert a is not b and a.version != b.version
    assert b.items["c"] == two.of_type(T.ENDPOINT)["c"].version != a.items["c"]
    # the wildcard CDS selection is still one object: the cluster messages are the same
    assert one.selection(T.CLUSTER, True, frozenset(), ("*",)) is two.selection(T.CLUSTER, True, frozenset(), ("*",))


def test_a_shared_answer_for_another_dict_at_the_same_id_is_not_taken():
    one, _, packings = shapes(EDS)
    have = one.of_type(T.ENDPOINT)
    stale = PreparedSnapshot.from_snapshot({T.ENDPOINT: {"z": cla("z", 1)}}, "g0").selection(
        T.ENDPOINT, False, NAMES, KEY)
    # as if a freed dict of an earlier snapshot had had this id
    packings.memo[("sel", T.ENDPOINT, id(have), KEY)] = ({"z": None}, stale)
    got = one.selection(T.ENDPOINT, False, NAMES, KEY)
    assert got is not stale and sorted(got.items) == ["a", "c"]


def test_prepare_selections_fills_what_the_push_looks_up():
    one, two, _ = shapes(EDS)
    subs = [(("gw", 1), T.ENDPOINT, False, NAMES, KEY, None), (("gw", 2), T.ENDPOINT, False, NAMES, KEY, None),
            (("gone",), T.ENDPOINT, False, NAMES, KEY, None)]          # a key with no snapshot is skipped
    prepare_selections({("gw", 1): one, ("gw", 2): two}, subs)
    assert ("sel", T.ENDPOINT, KEY) in one._memo and ("sel", T.ENDPOINT, KEY) in two._memo
    assert one._memo[("sel", T.ENDPOINT, KEY)] is two._memo[("sel", T.ENDPOINT, KEY)]


def test_a_build_prepares_the_subscriptions_it_is_given():
    """SnapshotCache.build (what the server's change path calls): the selections and diffs
    of the streams' subscriptions are ready in the snapshots before they are installed."""
    from mcp26.xds.cache import SnapshotCache, translation_key
    from mcp26.xds.model.node import ProxyNode
    nodes = [ProxyNode(id=f"gw-{i}", labels={"shape": str(i)}) for i in range(2)]
    keys = [translation_key(n) for n in nodes]
    cache = SnapshotCache(lambda config, node: {T.CLUSTER: CLUSTERS, T.ENDPOINT: EDS})
    held = PreparedSnapshot.from_snapshot({T.ENDPOINT: {"a": cla("a", 1)}}, "g0").selection(
        T.ENDPOINT, False, NAMES, KEY)
    snaps = cache.build(object(), "g1", nodes, [(k, T.ENDPOINT, False, NAMES, KEY, held) for k in keys])
    first, second = (snaps[k] for k in keys)
    want = first._memo[("sel", T.ENDPOINT, KEY)]
    assert second._memo[("sel", T.ENDPOINT, KEY)] is want and sorted(want.items) == ["a", "c"]
    assert ("diff", held.version, want.version) in first._shared
    assert not any(s._memo for s in cache.build(object(), "g2", nodes).values())   # none given, none made
