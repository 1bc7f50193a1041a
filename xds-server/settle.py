"""The settle rule: a change that weakens security waits until its file has been quiet.

An editor that saves in place (truncate, then write, maybe in pieces) shows the watcher
an empty or half-written file for a while. Applied as it stands, that moment removes the
file's RequestAuthentication (jwt_authn) or WasmPlugin (the FAIL_CLOSE header contract)
from every proxy, and unauthenticated, unsigned requests go through for the window.

So a change set that, compared with the config being served,
- removes a security resource (a kind of SECURITY_KINDS, by kind/namespace/name), or
- drops a field of one (a path of its spec, e.g. `spec.jwtRules[1]`: what a truncation
  does to a resource that still parses)
while the file that held it still exists and was written less than `settle` seconds ago
(its mtime) is *held*: not applied, not rejected. The server looks again when the file
has been quiet for `settle` seconds (or at the next change) and applies whatever the
directory holds then. Deleting the file is explicit and applies at once; a resource
moved to another file, one added, or a value changed in place are not weakenings and
apply at once. The hold is whole, as every change set is: the other files' changes in
it wait too (at most `settle` seconds after the last write).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from mcp26.mesh.resources import MeshConfig, Resource

# RequestAuthentication and WasmPlugin are translated today; PeerAuthentication and
# AuthorizationPolicy are listed so the rule covers them the day they are.
SECURITY_KINDS = frozenset({"RequestAuthentication", "WasmPlugin", "PeerAuthentication", "AuthorizationPolicy"})
DEFAULT_SETTLE = 5.0    # seconds; an editor's in-place save takes milliseconds, a person's edit far longer


@dataclass(frozen=True)
class Weakening:
    resource: str        # Kind/namespace/name
    file: str            # the file that held it, still present
    change: str          # "removed" or "fields removed: spec.a, spec.b"
    quiet_in: float      # seconds until the file has been quiet for `settle`

    def as_dict(self) -> dict:
        return {"resource": self.resource, "file": self.file, "change": self.change,
                "quiet_in": round(self.quiet_in, 3)}


def _security(config: MeshConfig | None) -> dict[str, Resource]:
    if not isinstance(config, MeshConfig):
        return {}      # no config yet, or a test's opaque config for its own translate function
    return {r.ref: r for r in config if r.kind in SECURITY_KINDS}


def _spec_paths(res: Resource) -> set[str]:
    return {p for p in res.lines if p == "spec" or p.startswith(("spec.", "spec["))}


def weakenings(served: MeshConfig | None, new: MeshConfig, settle: float,
               now: float | None = None) -> list[Weakening]:
    """What in `new` weakens `served`'s security resources from a file written under `settle` s ago."""
    now = time.time() if now is None else now
    old, kept = _security(served), _security(new)
    found = []
    for ref, res in old.items():
        after = kept.get(ref)
        if after is None:
            change = "removed"
        else:
            lost = _spec_paths(res) - _spec_paths(after)
            if not lost:
                continue
            change = "fields removed: " + ", ".join(sorted(lost)[:5]) + (" ..." if len(lost) > 5 else "")
        file = res.file if after is None else after.file     # where the weakening was written
        try:
            written = os.stat(file).st_mtime
        except FileNotFoundError:
            continue                    # the file was deleted: an explicit removal
        except OSError:
            written = now               # unreadable (the load would reject it anyway): hold
        # A future mtime (clock skew) holds for at most `settle`, never forever.
        quiet_in = min(settle, settle - (now - written))
        if quiet_in > 0:
            found.append(Weakening(ref, file, change, quiet_in))
    return found
