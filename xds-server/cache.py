"""Per-node snapshots, packed once, with content-hash versions.

A `PreparedSnapshot` is what the ADS streams serve: every resource already
packed into an `Any` (deterministic bytes) with its version, the first 16 hex
digits of the bytes' SHA-256. Content versions, not counters, so that a
restarted control plane gives an unchanged resource the same version and a
reconnecting Delta client (initial_resource_versions) is sent nothing.

`SnapshotCache` translates one snapshot per `translation_key` (kind,
namespace, cluster, labels: a node *shape*): 100 gateway Envoys of one shape
cost one translation.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Iterable

from google.protobuf import any_pb2, message

from mcp26.xds import telemetry
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.model.type_urls import CLUSTER, LISTENER, Snapshot

# Types whose empty subscription means "everything" (xDS protocol: wildcard).
WILDCARD_TYPES = frozenset({LISTENER, CLUSTER})

TranslateFn = Callable[[object, ProxyNode], Snapshot]


def content_version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


@dataclass(frozen=True)
class PreparedResource:
    name: str
    version: str
    any: any_pb2.Any
    message: message.Message

    @property
    def size(self) -> int:
        return len(self.any.value)


def prepare(name: str, msg: message.Message) -> PreparedResource:
    packed = any_pb2.Any()
    packed.Pack(msg, deterministic=True)
    return PreparedResource(name, content_version(packed.value), packed, msg)


@dataclass(frozen=True)
class Selection:
    """What one subscription gets from one snapshot: the resources, their SotW version,
    and name -> version (what a Delta client holds once it has them all). Read-only."""
    resources: tuple
    version: str
    items: dict


def subscription_key(wildcard: bool, names: set[str]) -> tuple:
    """Equal for equal subscriptions; computed once per subscription change, not per push."""
    return ("*",) if wildcard else (hashlib.sha256("\0".join(sorted(names)).encode()).hexdigest(),)


class PreparedSnapshot:
    """type URL -> name -> PreparedResource, plus the config generation it came from.

    `selection()` and `diff()` are memoized: the proxies of one shape subscribe
    to the same names, so 100 of them cost one selection and one diff per type,
    not 100 walks over 3,000 clusters. And across the shapes of one build
    (`Packings.memo`): shapes that share a type's packed dict share its
    selections, and a diff depends only on the two selections' versions, so 20
    shapes of one gateway cost one selection and one diff per type, not 20.
    """

    def __init__(self, resources: dict[str, dict[str, PreparedResource]], generation: str = "",
                 packings: "Packings | None" = None):
        self.resources = resources
        self.generation = generation
        self._memo: dict[tuple, Selection] = {}      # this snapshot's selections, by type and subscription
        self._shared: dict[tuple, object] = packings.memo if packings is not None else {}

    def selection(self, type_url: str, wildcard: bool, names: set[str], key: tuple) -> Selection:
        memo_key = ("sel", type_url, key)
        sel = self._memo.get(memo_key)
        if sel is None:
            have = self.resources.get(type_url)
            # Keyed by the dict's id, held beside the answer: an id is another dict's once freed.
            shared_key = ("sel", type_url, id(have), key)
            found = self._shared.get(shared_key)
            if found is not None and found[0] is have:
                sel = found[1]
            else:
                resources = tuple(self.select(type_url, None if wildcard else names))
                sel = Selection(resources, self.version_of(resources), {r.name: r.version for r in resources})
                self._shared[shared_key] = (have, sel)
            self._memo[memo_key] = sel
        return sel

    def diff(self, held: Selection, want: Selection) -> tuple[list, list]:
        """(resources to send, names to remove) taking a client from `held` to `want`."""
        memo_key = ("diff", held.version, want.version)     # versions: hashes of every name and version
        found = self._shared.get(memo_key)
        if found is None:
            old = held.items
            changed = [r for r in want.resources if old.get(r.name) != r.version]
            removed = sorted(n for n in old if n not in want.items)
            found = self._shared[memo_key] = (changed, removed)
        return found

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, generation: str = "",
                      previous: "PreparedSnapshot | None" = None,
                      packings: "Packings | None" = None) -> "PreparedSnapshot":
        """Pack every resource; one that is the very message object `previous`
        packed (translation reuses them: read-only) keeps its packing and version.
        `packings` shares packings between the snapshots of different node shapes,
        which translation gives the same message objects: 20 shapes of one gateway
        hold one packed copy, not 20, and a type whose every message is one another
        shape's type was packed from is that type's packed dict itself."""
        out = {}
        shared = packings if packings is not None else Packings()
        for type_url, by_name in snapshot.items():
            whole = (type_url, tuple(by_name), tuple(map(id, by_name.values())))
            packed = shared.by_type.get(whole)
            if packed is not None:
                out[type_url] = packed
                continue
            before = previous.of_type(type_url) if previous is not None else {}
            packed = out[type_url] = {}
            for name, msg in sorted(by_name.items()):
                old = before.get(name)
                if old is None or old.message is not msg:
                    old = shared.by_id.get(id(msg))
                    if old is None or old.message is not msg or old.name != name:
                        old = prepare(name, msg)
                packed[name] = old
                shared.by_id[id(msg)] = old
            shared.by_type[whole] = packed
        return cls(out, generation, shared)

    def of_type(self, type_url: str) -> dict[str, PreparedResource]:
        return self.resources.get(type_url, {})

    def select(self, type_url: str, names: Iterable[str] | None) -> list[PreparedResource]:
        """All resources of a type (names None: wildcard), or those named that exist."""
        have = self.of_type(type_url)
        if names is None:
            return list(have.values())
        return [have[n] for n in sorted(set(names)) if n in have]

    @staticmethod
    def version_of(resources: Iterable[PreparedResource]) -> str:
        """A SotW version_info: changes exactly when the set served changes."""
        h = hashlib.sha256()
        for r in sorted(resources, key=lambda r: r.name):
            h.update(r.name.encode())
            h.update(b"\0")
            h.update(r.version.encode())
            h.update(b"\n")
        return h.hexdigest()[:16]

    def type_urls(self) -> list[str]:
        return list(self.resources)


class Packings:
    """Packed resources the snapshots of one build share (from_snapshot): each message's
    packing by id(message), and each type's packed dict by (type URL, names, ids of the
    messages). Every entry keeps its messages alive, so an id is never reused while it is
    here. Read-only once packed, as the snapshots are."""
    __slots__ = ("by_id", "by_type", "memo")

    def __init__(self):
        self.by_id: dict[int, PreparedResource] = {}
        self.by_type: dict[tuple, dict[str, PreparedResource]] = {}
        self.memo: dict[tuple, object] = {}     # the snapshots' shared selections and diffs


def prepare_selections(snapshots: dict[tuple, PreparedSnapshot], subscriptions: Iterable[tuple]) -> None:
    """The selections and Delta diffs the streams will ask for (`AdsHub.subscriptions()`:
    translation key, type URL, wildcard, names, sub key, held), computed ahead in the build's
    worker thread, so the push itself (on the loop) only looks them up."""
    for key, type_url, wildcard, names, sub_key, held in subscriptions:
        snap = snapshots.get(key)
        if snap is not None:
            want = snap.selection(type_url, wildcard, names, sub_key)
            if held is not None:
                snap.diff(held, want)


def translation_key(node: ProxyNode) -> tuple:
    """What translation may depend on: nodes with equal keys get one snapshot."""
    return (node.kind, node.namespace, node.cluster, tuple(sorted((node.labels or {}).items())))


class SnapshotCache:
    """The current config and the snapshots translated from it, per translation key.

    `overrides` (type URL -> name -> message) are laid over every snapshot;
    only the server's test hook sets them (to inject a resource Envoy rejects).

    A config is installed with the function that translates it (the server's
    binds the Overlay it was built with): a node shape seen later is translated
    by that same function, and the three are replaced in one assignment, so a
    worker thread never pairs one config with another's function.
    """

    def __init__(self, translate: TranslateFn):
        self._served: tuple = (None, "", translate)     # (config, generation, translate)
        self.overrides: dict[str, dict[str, message.Message]] = {}
        self._by_key: dict[tuple, PreparedSnapshot] = {}
        # The packings of the snapshots being served and of the build under way
        # (from_snapshot); replaced by each build's own at install.
        self._packed = Packings()
        self._building: Packings | None = None
        self.translations = 0   # how many times translate() ran (tests, metrics)

    @property
    def config(self):
        return self._served[0]

    @property
    def generation(self) -> str:
        return self._served[1]

    @property
    def translate(self) -> TranslateFn:
        return self._served[2]

    @property
    def ready(self) -> bool:
        return self.config is not None

    def build(self, config, generation: str, nodes: Iterable[ProxyNode],
              subscriptions: Iterable[tuple] = (), translate: TranslateFn | None = None) -> dict[tuple, PreparedSnapshot]:
        """Translate `config` (with `translate`, else the installed function) for every
        distinct translation key among `nodes`, then prepare the selections and diffs of
        `subscriptions` (prepare_selections); raises what translate raises.

        Pure: nothing in the cache changes until `install()`, so a change set
        that fails to translate for any node is rejected whole.
        """
        out: dict[tuple, PreparedSnapshot] = {}
        translate = translate or self.translate
        self._building = Packings()
        for node in nodes:
            key = translation_key(node)
            if key not in out:
                out[key] = self._prepare(config, node, generation, translate)
        prepare_selections(out, subscriptions)
        return out

    def install(self, config, generation: str, snapshots: dict[tuple, PreparedSnapshot],
                translate: TranslateFn | None = None) -> None:
        """Serve `config` and its snapshots; `translate` (what built them) translates its later shapes."""
        self._by_key = dict(snapshots)
        self._served = (config, generation, translate or self.translate)
        self._packed, self._building = self._building or Packings(), None

    def snapshot_for(self, node: ProxyNode) -> PreparedSnapshot | None:
        """The node's snapshot, translated now if its key is new (None before any config)."""
        config, generation, translate = self._served
        if config is None:
            return None
        key = translation_key(node)
        snap = self._by_key.get(key)
        if snap is None:
            snap = self._by_key[key] = self._prepare(config, node, generation, translate)
        return snap

    def peek(self, node: ProxyNode) -> PreparedSnapshot | None:
        return self._by_key.get(translation_key(node)) if self.config is not None else None

    def prepare_current(self, node: ProxyNode) -> tuple[str, PreparedSnapshot]:
        """Translate the current config for `node` (safe in a worker thread: reads only)."""
        config, generation, translate = self._served
        return generation, self._prepare(config, node, generation, translate)

    def offer(self, node: ProxyNode, generation: str, snap: PreparedSnapshot) -> None:
        """Keep a snapshot translated off the loop, unless a newer config was installed meanwhile."""
        if generation == self.generation:
            self._by_key.setdefault(translation_key(node), snap)

    def set_overrides(self, overrides: dict[str, dict[str, message.Message]],
                      nodes: Iterable[ProxyNode]) -> None:
        self.overrides = overrides
        if self.config is not None:
            self._by_key = self.build(self.config, self.generation, nodes)
            self._packed, self._building = self._building or Packings(), None

    def _prepare(self, config, node: ProxyNode, generation: str, translate: TranslateFn) -> PreparedSnapshot:
        self.translations += 1
        with telemetry.tracer().start_as_current_span("xds.translate.shape") as span:
            span.set_attribute("xds.node", node.id)
            span.set_attribute("xds.node_kind", node.kind)
            span.set_attribute("xds.generation", generation)
            snapshot = translate(config, node)
            if self.overrides:
                snapshot = {t: dict(by_name) for t, by_name in snapshot.items()}
                for t, by_name in self.overrides.items():
                    snapshot.setdefault(t, {}).update(by_name)
            # A build packs into its own map; a shape translated between builds shares the served one's.
            packed = self._building if self._building is not None else self._packed
            prepared = PreparedSnapshot.from_snapshot(snapshot, generation, self._by_key.get(translation_key(node)),
                                                      packed)
            span.set_attribute("xds.resources", sum(len(v) for v in prepared.resources.values()))
            return prepared
