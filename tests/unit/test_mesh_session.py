"""mesh.session: the session signature the Wasm filter writes and the backend checks."""
import hashlib
import hmac

import pytest

from mesh import headers as H
from mesh.session import SessionError, canonical, check_session, sign, sign_headers, verify_session

KEY = b"k" * 32


def signed_request(**extra):
    hdrs = {H.END_USER: "jane", H.TENANT: "acme", H.QOS_CLASS: "standard", ":path": "/x"}
    hdrs.update(extra)
    hdrs[H.SESSION_SIG] = sign_headers(hdrs, KEY)
    return hdrs


def test_signature_is_rfc2104_hmac_sha256_over_the_canonical_form():
    sig = sign([("end-user", "jane"), ("x-mcp-tenant", "acme")], KEY)
    want = hmac.new(KEY, b"mcp-session-v1\nend-user:jane\nx-mcp-tenant:acme\n", hashlib.sha256).hexdigest()
    assert sig == f"v1;h=end-user,x-mcp-tenant;s={want}"
    assert canonical([("a", "b")]) == b"mcp-session-v1\na:b\n"


def test_valid_session_verifies_and_reports_what_was_signed():
    s = verify_session(signed_request(), KEY)
    assert (s.end_user, s.tenant, s.qos_class) == ("jane", "acme", "standard")


def test_grpc_metadata_pairs_and_header_case_are_accepted():
    hdrs = signed_request()
    pairs = [(k.upper() if not k.startswith(":") else k, v) for k, v in hdrs.items()]
    assert verify_session(pairs, KEY).end_user == "jane"


@pytest.mark.parametrize("mutate, reason", [
    (lambda h: h.update({H.END_USER: "admin"}), "do not match"),
    (lambda h: h.update({H.QOS_CLASS: "latency-critical"}), "do not match"),
    (lambda h: h.pop(H.TENANT), "missing"),
    (lambda h: h.update({H.SESSION_SIG: h[H.SESSION_SIG].replace("h=end-user,", "h=")}), "not covered"),
    (lambda h: h.update({H.SESSION_SIG: "v1;h=;s=" + "0" * 64}), "not covered"),
    (lambda h: h.update({H.SESSION_SIG: "v2;h=end-user;s=" + "0" * 64}), "malformed"),
    (lambda h: h.update({H.SESSION_SIG: h[H.SESSION_SIG][:-1]}), "malformed"),
    (lambda h: h.pop(H.SESSION_SIG), "without"),
])
def test_a_changed_session_is_rejected_with_a_reason(mutate, reason):
    hdrs = signed_request()
    mutate(hdrs)
    with pytest.raises(SessionError) as e:
        verify_session(hdrs, KEY)
    assert reason in e.value.reason
    assert check_session(hdrs, KEY) == e.value.reason


def test_wrong_key_is_rejected():
    assert "do not match" in check_session(signed_request(), b"x" * 32)


def test_duplicate_signed_header_is_rejected():
    hdrs = list(signed_request().items()) + [(H.END_USER, "admin")]
    with pytest.raises(SessionError, match="appears 2 times"):
        verify_session(hdrs, KEY)


def test_anonymous_request_without_session_headers_is_accepted_as_anonymous():
    assert verify_session({":path": "/"}, KEY).signed == {}
