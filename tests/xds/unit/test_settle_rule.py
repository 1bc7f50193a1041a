"""The settle rule (xds-server/settle.py) on its own: which change sets weaken security and are held.

No processes or sockets: parsed configs and files whose mtime the test sets.
The rule through a real control plane and Envoy is in test_watched_dir.py.
"""
import os
import time

import pytest

from mcp26.mesh.parse import load_dir
from mcp26.xds.settle import weakenings

pytestmark = pytest.mark.adversarial

AUTHN = """apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: jwt, namespace: default}
spec:
  jwtRules:
  - issuer: https://a.test
    jwks: '{"keys": []}'
  - issuer: https://b.test
    jwks: '{"keys": []}'
"""
SE = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: se, namespace: default}
spec: {hosts: [a.example]}
"""
SETTLE = 5.0


def write(d, name, text, age=0.0):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(text)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def served(tmp_path):
    d = str(tmp_path)
    write(d, "authn.yaml", AUTHN, age=60)
    write(d, "se.yaml", SE, age=60)
    return d, load_dir(d)


def test_an_emptied_file_is_held_until_it_has_been_quiet(tmp_path):
    d, before = served(tmp_path)
    write(d, "authn.yaml", "")                         # an editor's truncation, just now
    found = weakenings(before, load_dir(d), SETTLE)
    assert [(w.resource, w.change) for w in found] == [("RequestAuthentication/default/jwt", "removed")]
    assert found[0].file.endswith("authn.yaml") and 4.0 < found[0].quiet_in <= SETTLE
    write(d, "authn.yaml", "", age=SETTLE + 1)         # the same file, quiet for longer than the settle time
    assert weakenings(before, load_dir(d), SETTLE) == []


def test_a_half_written_file_that_still_parses_is_held(tmp_path):
    d, before = served(tmp_path)
    write(d, "authn.yaml", AUTHN[:AUTHN.index("  - issuer: https://b.test")])   # the second rule cut off
    found = weakenings(before, load_dir(d), SETTLE)
    assert len(found) == 1 and found[0].change.startswith("fields removed: spec.jwtRules[1]"), found


def test_deleting_the_file_is_explicit_and_applies_at_once(tmp_path):
    d, before = served(tmp_path)
    os.remove(os.path.join(d, "authn.yaml"))
    assert weakenings(before, load_dir(d), SETTLE) == []


def test_moves_additions_value_changes_and_other_kinds_are_not_held(tmp_path):
    d, before = served(tmp_path)
    os.remove(os.path.join(d, "authn.yaml"))
    write(d, "security.yaml", AUTHN.replace("https://a.test", "https://c.test"))   # moved and changed
    write(d, "se.yaml", "")                                                      # a ServiceEntry removed
    assert weakenings(before, load_dir(d), SETTLE) == []


def test_a_future_mtime_holds_for_at_most_the_settle_time(tmp_path):
    d, before = served(tmp_path)
    write(d, "authn.yaml", "", age=-3600)
    [w] = weakenings(before, load_dir(d), SETTLE)
    assert w.quiet_in == SETTLE
