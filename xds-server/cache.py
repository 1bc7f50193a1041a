"""Per-node snapshots, packed once, with content-hash versions.

A `PreparedSnapshot` is what the ADS streams serve: every resource already
packed into an `Any` (deterministic bytes) with its version, the first 16 hex
digits of the bytes' SHA-256. Content versions, not counters, so that a
restarted control plane gives an unchanged resource the same version and a
reconnecting Delta client (initial_resource_versions) is sent nothing.

`SnapshotCache` translates one snapshot per node *shape* (kind, namespace,
cluster, labels): 100 gateway Envoys of one shape cost one translation.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Iterable

from google.protobuf import any_pb2, message

from xds_server.types import CLUSTER, LISTENER, ProxyNode, Snapshot

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


class PreparedSnapshot:
    """type URL -> name -> PreparedResource, plus the config generation it came from."""

    def __init__(self, resources: dict[str, dict[str, PreparedResource]], generation: str = ""):
        self.resources = resources
        self.generation = generation

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, generation: str = "") -> "PreparedSnapshot":
        return cls({type_url: {name: prepare(name, msg) for name, msg in sorted(by_name.items())}
                    for type_url, by_name in snapshot.items()}, generation)

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


def node_shape(node: ProxyNode) -> tuple:
    """What translation may depend on: nodes with equal shapes get one snapshot."""
    return (node.kind, node.namespace, node.cluster, tuple(sorted((node.labels or {}).items())))


class SnapshotCache:
    """The current config and the snapshots translated from it, per node shape.

    `overrides` (type URL -> name -> message) are laid over every snapshot;
    only the server's test hook sets them (to inject a resource Envoy rejects).
    """

    def __init__(self, translate: TranslateFn):
        self.translate = translate
        self.config = None
        self.generation = ""
        self.overrides: dict[str, dict[str, message.Message]] = {}
        self._by_shape: dict[tuple, PreparedSnapshot] = {}
        self.translations = 0   # how many times translate() ran (tests, metrics)

    @property
    def ready(self) -> bool:
        return self.config is not None

    def build(self, config, generation: str, nodes: Iterable[ProxyNode]) -> dict[tuple, PreparedSnapshot]:
        """Translate `config` for every distinct shape among `nodes`; raises what translate raises.

        Pure: nothing in the cache changes until `install()`, so a change set
        that fails to translate for any node is rejected whole.
        """
        out: dict[tuple, PreparedSnapshot] = {}
        for node in nodes:
            shape = node_shape(node)
            if shape not in out:
                out[shape] = self._prepare(config, node, generation)
        return out

    def install(self, config, generation: str, snapshots: dict[tuple, PreparedSnapshot]) -> None:
        self.config, self.generation, self._by_shape = config, generation, dict(snapshots)

    def snapshot_for(self, node: ProxyNode) -> PreparedSnapshot | None:
        """The node's snapshot, translated now if its shape is new (None before any config)."""
        if self.config is None:
            return None
        shape = node_shape(node)
        snap = self._by_shape.get(shape)
        if snap is None:
            snap = self._by_shape[shape] = self._prepare(self.config, node, self.generation)
        return snap

    def set_overrides(self, overrides: dict[str, dict[str, message.Message]],
                      nodes: Iterable[ProxyNode]) -> None:
        self.overrides = overrides
        if self.config is not None:
            self._by_shape = self.build(self.config, self.generation, nodes)

    def _prepare(self, config, node: ProxyNode, generation: str) -> PreparedSnapshot:
        self.translations += 1
        snapshot = self.translate(config, node)
        if self.overrides:
            snapshot = {t: dict(by_name) for t, by_name in snapshot.items()}
            for t, by_name in self.overrides.items():
                snapshot.setdefault(t, {}).update(by_name)
        return PreparedSnapshot.from_snapshot(snapshot, generation)
