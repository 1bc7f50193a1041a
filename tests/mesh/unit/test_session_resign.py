"""mesh.session.resign: the Endpoint Picker changes one signed header (an upgraded flow's class)
only over a signature that verifies, keeping its issue time and header list."""
import time

import pytest

from mcp26.mesh import headers as H
from mcp26.mesh import session

KEY = b"0123456789abcdef0123456789abcdef"


def _signed(**over) -> dict:
    h = {H.END_USER: "jane", H.QOS_CLASS: "standard", "x-request-id": "r-1", ":method": "POST", **over}
    h[H.SESSION_SIG] = session.sign_headers(h, KEY, issued_at=int(time.time()) - 3)
    return h


def test_resigned_class_verifies_and_keeps_the_rest():
    h = _signed()
    t, names, _ = session.parse_signature(h[H.SESSION_SIG])
    h2 = {**h, H.QOS_CLASS: "latency-critical", H.SESSION_SIG: session.resign(h, KEY, H.QOS_CLASS, "latency-critical")}
    v = session.verify_session(h2, KEY)
    assert (v.end_user, v.qos_class, v.issued_at) == ("jane", "latency-critical", t)
    assert session.parse_signature(h2[H.SESSION_SIG])[1] == names
    # the old signature no longer covers the new class
    assert session.check_session({**h, H.QOS_CLASS: "latency-critical"}, KEY) is not None


def test_a_header_the_filter_did_not_sign_is_added_to_the_list():
    h = {H.END_USER: "jane", "x-request-id": "r-2", ":method": "POST"}
    h[H.SESSION_SIG] = session.sign_headers(h, KEY)
    h2 = {**h, H.QOS_CLASS: "latency-critical", H.SESSION_SIG: session.resign(h, KEY, H.QOS_CLASS, "latency-critical")}
    assert session.verify_session(h2, KEY).qos_class == "latency-critical"


def test_anonymous_request_gets_the_class_signed_alone():
    h = {"x-request-id": "r-3", ":method": "POST"}
    h2 = {**h, H.QOS_CLASS: "latency-critical", H.SESSION_SIG: session.resign(h, KEY, H.QOS_CLASS, "latency-critical")}
    v = session.verify_session(h2, KEY)
    assert v.signed == {H.QOS_CLASS: "latency-critical"}


@pytest.mark.parametrize("tamper", [
    {H.END_USER: "mallory"},                        # changed after signing
    {"x-request-id": "r-other"},                    # made for another request
    {":method": "GET"},
])
def test_a_signature_that_does_not_verify_is_never_laundered(tamper):
    h = {**_signed(), **tamper}
    with pytest.raises(session.SessionError):
        session.resign(h, KEY, H.QOS_CLASS, "latency-critical")


def test_an_expired_signature_is_not_refreshed():
    h = {H.END_USER: "jane", "x-request-id": "r-4", ":method": "POST"}
    h[H.SESSION_SIG] = session.sign_headers(h, KEY, issued_at=int(time.time()) - 600)
    with pytest.raises(session.SessionError, match="expired"):
        session.resign(h, KEY, H.QOS_CLASS, "latency-critical")


def test_key_file_must_be_private_and_long_enough(tmp_path):
    p = tmp_path / "k"
    p.write_bytes(KEY)
    p.chmod(0o644)
    with pytest.raises(ValueError, match="--session-key-file .*0644"):
        session.read_key_file(str(p))
    p.chmod(0o600)
    assert session.read_key_file(str(p)) == KEY
    p.write_bytes(b"short")
    with pytest.raises(ValueError, match="5 bytes"):
        session.read_key_file(str(p))
