"""QoS class remaps the decision loop sets over the admin API (scheduler_actions.py), with expiry.

    POST /scheduler/class-remap  {"from": CLASS, "to": CLASS, "expires_at": UNIX_S}

One remap per from-class (a later one replaces it), at most MAX_CLASS_REMAPS
(the filter's bound), none held longer than MAX_HOLD_S. Each XdsServer holds
its own table (server.class_remaps); what is in force reaches translation as
Overlay.class_remaps, which the server replaces whole after each change.
"""
from __future__ import annotations

from mcp26.mesh import qos as Q
from mcp26.mesh.header_contract import MAX_CLASS_REMAPS, ClassRemap
from mcp26.xds.expiring import ExpiringTable

MAX_HOLD_S = 3600.0      # a remap longer than an hour is a mistake, not a decision


class ClassRemaps(ExpiringTable):
    """The remaps in force, one per from-class, in priority order."""

    def __init__(self):
        super().__init__(key=lambda r: r.from_class, order=lambda r: r.from_class.priority_level,
                         limit=MAX_CLASS_REMAPS, over_limit=f"at most {MAX_CLASS_REMAPS} remaps")

    def put(self, remap: ClassRemap) -> None:
        self.put_all([remap])

    def remove(self, from_class: Q.QosClass) -> bool:
        return self.remove_where(lambda k: k == from_class) > 0


def parse_remap(body, now: float) -> ClassRemap:
    if not isinstance(body, dict):
        raise ValueError('expected {"from": CLASS, "to": CLASS, "expires_at": UNIX_SECONDS}')
    try:
        frm, to = Q.QosClass.parse(str(body.get("from", ""))), Q.QosClass.parse(str(body.get("to", "")))
    except ValueError as e:
        raise ValueError(f"from/to: {e}") from None
    exp = body.get("expires_at")
    if not isinstance(exp, (int, float)) or isinstance(exp, bool):
        raise ValueError("expires_at: expected unix seconds (a number)")
    if not now < exp <= now + MAX_HOLD_S:
        raise ValueError(f"expires_at: must be in the future and within {MAX_HOLD_S:.0f} s")
    if frm is to:
        raise ValueError("from and to are the same class")
    return ClassRemap(frm, to, float(exp))
