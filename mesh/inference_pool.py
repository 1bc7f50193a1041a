"""InferencePool (inference.networking.k8s.io/v1) and InferenceObjective
(inference.networking.x-k8s.io/v1alpha2), as the Gateway API Inference
Extension defines them: the model and its rules, shared by the validator,
the Endpoint Picker (scheduler) and the control plane.

An InferencePool selects model-server workloads by labels (here
WorkloadEntries; Pods once the Kubernetes registry lands) and serves them on
`targetPorts`; its `endpointPickerRef` names the EPP service and what the
proxy does when the EPP cannot be reached (FailOpen: route without a pick;
FailClose: 503). An endpoint is `ADDRESS:TARGETPORT`, as a Pod IP and port
are in Kubernetes: on one machine give each replica its own loopback address
(127.0.0.2, 127.0.0.3, ...) and the same port.

An InferenceObjective gives requests that name it (x-gateway-inference-objective)
a priority; a negative priority makes them sheddable under saturation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mcp26.mesh.resources import MeshConfig, Resource

POOL_API_VERSION = "inference.networking.k8s.io/v1"
POOL_KIND = "InferencePool"
OBJECTIVE_API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha2",)
OBJECTIVE_KIND = "InferenceObjective"
FAIL_OPEN, FAIL_CLOSE = "FailOpen", "FailClose"
DEFAULT_EPP_PORT = 9002


@dataclass(frozen=True)
class EndpointPickerRef:
    name: str
    port: int = DEFAULT_EPP_PORT
    failure_mode: str = FAIL_CLOSE
    kind: str = "Service"
    group: str = ""


@dataclass(frozen=True)
class InferencePool:
    namespace: str
    name: str
    selector: dict[str, str]
    target_ports: tuple[int, ...]
    picker: EndpointPickerRef | None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Endpoint:
    address: str
    port: int
    labels: dict = field(default_factory=dict, compare=False, hash=False)
    workload: str = ""              # the WorkloadEntry (ns/name) it comes from

    @property
    def key(self) -> str:
        """`ip:port`, as the protocol writes it (IPv6 in brackets)."""
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"


def pool_from(res: Resource) -> InferencePool:
    spec = res.spec or {}
    ref = spec.get("endpointPickerRef") or None
    picker = None
    if isinstance(ref, dict) and ref.get("name"):
        port = (ref.get("port") or {}).get("number", DEFAULT_EPP_PORT) if isinstance(ref.get("port"), dict) \
            else DEFAULT_EPP_PORT
        picker = EndpointPickerRef(str(ref["name"]), int(port), str(ref.get("failureMode") or FAIL_CLOSE),
                                   str(ref.get("kind") or "Service"), str(ref.get("group") or ""))
    selector = ((spec.get("selector") or {}).get("matchLabels")) or {}
    ports = tuple(int(p["number"]) for p in spec.get("targetPorts") or [] if isinstance(p, dict) and "number" in p)
    return InferencePool(res.namespace, res.name, {str(k): str(v) for k, v in selector.items()}, ports, picker)


def find_pool(config: MeshConfig, ref: str) -> InferencePool | None:
    """The pool `NS/NAME` (or NAME in `default`) of a validated config."""
    ns, _, name = ref.rpartition("/")
    for res in config.of_kind(POOL_KIND):
        if res.name == name and res.namespace == (ns or "default"):
            return pool_from(res)
    return None


def workload_entry_labels(we: Resource) -> dict[str, str]:
    """A WorkloadEntry's labels as selectors see them: metadata.labels, then spec.labels over them."""
    return {**(we.labels or {}), **{str(k): str(v) for k, v in (we.spec.get("labels") or {}).items()}}


def pool_endpoints(config: MeshConfig, pool: InferencePool) -> list[Endpoint]:
    """ADDRESS:PORT for every WorkloadEntry in the pool's namespace whose labels
    (metadata.labels and spec.labels) the selector matches, for each target port."""
    out = []
    for we in config.of_kind("WorkloadEntry"):
        if we.namespace != pool.namespace:
            continue
        labels = workload_entry_labels(we)
        if not all(labels.get(k) == v for k, v in pool.selector.items()):
            continue
        address = str(we.spec.get("address") or "")
        if not address or address.startswith("unix://"):
            continue
        for port in pool.target_ports:
            out.append(Endpoint(address, port, labels, f"{we.namespace}/{we.name}"))
    return sorted(out, key=lambda e: (e.address, e.port))


def objective_priorities(config: MeshConfig, pool: InferencePool) -> dict[str, int]:
    """InferenceObjective name -> priority, for the objectives whose poolRef is `pool`."""
    out = {}
    for res in config.of_kind(OBJECTIVE_KIND):
        ref = (res.spec or {}).get("poolRef") or {}
        if res.namespace == pool.namespace and ref.get("name") == pool.name:
            out[res.name] = int((res.spec or {}).get("priority") or 0)
    return out
