"""`--priority-mix critical=0.1,low=0.9`: which QoS class each request carries.

Names are the `X-LLM-Priority` values of mesh.qos.LLM_PRIORITY_CLASSES
(critical, high, medium, low) or the QoS class names themselves.
"""
from __future__ import annotations

from dataclasses import dataclass

from mcp26.mesh.qos import LLM_PRIORITY_CLASSES, QOS_CLASS_NAMES, QosClass


@dataclass(frozen=True)
class Priority:
    label: str          # as the user wrote it: "high"
    qos: QosClass       # what goes on the wire

    @property
    def header_value(self) -> str:
        return self.qos.header_value

    @property
    def level(self) -> int:
        return self.qos.priority_level


def parse_mix(text: str) -> list[tuple[Priority, float]]:
    """Parse `name=fraction,...`; fractions are weights, normalised to sum 1."""
    out: list[tuple[Priority, float]] = []
    seen = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep:
            raise ValueError(f"--priority-mix: {part!r} is not NAME=FRACTION")
        if name in LLM_PRIORITY_CLASSES:
            qos = LLM_PRIORITY_CLASSES[name]
        elif name in QOS_CLASS_NAMES:
            qos = QosClass.parse(name)
        else:
            names = ", ".join([*LLM_PRIORITY_CLASSES, *QOS_CLASS_NAMES])
            raise ValueError(f"--priority-mix: unknown priority {name!r}; expected one of {names}")
        if name in seen:
            raise ValueError(f"--priority-mix: {name!r} given twice")
        seen.add(name)
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"--priority-mix: {name}={value!r} is not a number") from None
        if not weight >= 0 or weight == float("inf"):
            raise ValueError(f"--priority-mix: {name}={value} must be a finite number >= 0")
        out.append((Priority(name, qos), weight))
    total = sum(w for _, w in out)
    if not out or total <= 0:
        raise ValueError(f"--priority-mix: {text!r} gives no priority a share above 0")
    return [(p, w / total) for p, w in out]


class MixSequence:
    """Deterministic interleave (smooth weighted round robin): after any k
    requests each class has had round(k * share) of them, within one, so even
    a short run carries the mix it was asked for."""

    def __init__(self, mix: list[tuple[Priority, float]]):
        self.priorities = [p for p, _ in mix]
        self.shares = [s for _, s in mix]
        self.credit = [0.0] * len(mix)

    def next(self) -> int:
        if len(self.shares) == 1:
            return 0
        credit = self.credit
        for k, share in enumerate(self.shares):
            credit[k] += share
        best = max(range(len(credit)), key=credit.__getitem__)
        credit[best] -= 1.0
        return best
