"""mcp26.mesh.session: the session signature the Wasm filter writes and the backend checks."""
import hashlib
import hmac

import pytest

from mcp26.mesh import headers as H
from mcp26.mesh.session import (DEFAULT_CLOCK_SKEW_S, DEFAULT_MAX_AGE_S, SessionError, canonical, carriable,
                          check_session, sign, sign_headers, verify_session)

KEY = b"k" * 32
T0 = 1_700_000_000


def signed_request(issued_at=None, **extra):
    hdrs = {H.END_USER: "jane", H.TENANT: "acme", H.QOS_CLASS: "standard", ":path": "/x", ":method": "POST",
            "x-request-id": "rid-1"}
    hdrs.update(extra)
    hdrs[H.SESSION_SIG] = sign_headers(hdrs, KEY, issued_at=issued_at)
    return hdrs


def test_signature_is_rfc2104_hmac_sha256_over_the_v2_canonical_form():
    sig = sign([("end-user", "jane"), ("x-mcp-tenant", "acme")], KEY, method="GET", request_id="r1", issued_at=T0)
    want = hmac.new(KEY, b"mcp-session-v2\nt:1700000000\n:method:GET\nx-request-id:r1\n"
                         b"end-user:jane\nx-mcp-tenant:acme\n", hashlib.sha256).hexdigest()
    assert sig == f"v2;t={T0};h=end-user,x-mcp-tenant;s={want}"
    assert canonical([("a", "b")], issued_at=5, method="POST", request_id="") == \
        b"mcp-session-v2\nt:5\n:method:POST\nx-request-id:\na:b\n"


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
    (lambda h: h.update({H.SESSION_SIG: f"v2;t={T0};h=;s=" + "0" * 64}), "not covered"),
    (lambda h: h.update({H.SESSION_SIG: "v1;h=end-user;s=" + "0" * 64}), "malformed"),   # v1 is gone
    (lambda h: h.update({H.SESSION_SIG: h[H.SESSION_SIG].replace(";t=", ";t=0")}), "malformed"),
    (lambda h: h.update({H.SESSION_SIG: h[H.SESSION_SIG][:-1]}), "malformed"),
    (lambda h: h.pop(H.SESSION_SIG), "without"),
    # replay: the same signed header set on another request
    (lambda h: h.update({"x-request-id": "rid-2"}), "another request"),
    (lambda h: h.pop("x-request-id"), "another request"),
    (lambda h: h.update({":method": "GET"}), "another request"),
    (lambda h: h.update({H.SESSION_SIG: h[H.SESSION_SIG].replace(";t=", ";t=1")}), "do not match"),
])
def test_a_changed_session_is_rejected_with_a_reason(mutate, reason):
    hdrs = signed_request()
    mutate(hdrs)
    with pytest.raises(SessionError) as e:
        verify_session(hdrs, KEY)
    assert reason in e.value.reason
    assert check_session(hdrs, KEY) == e.value.reason


def test_a_signature_replayed_with_another_request_id_is_rejected_even_while_fresh():
    hdrs = signed_request(issued_at=T0)
    verify_session(hdrs, KEY, now=T0)
    replay = dict(hdrs, **{"x-request-id": "attacker-chosen"})
    with pytest.raises(SessionError, match="another request"):
        verify_session(replay, KEY, now=T0)


def test_two_request_ids_are_rejected():
    pairs = list(signed_request().items()) + [("x-request-id", "rid-2")]
    with pytest.raises(SessionError, match="x-request-id appears 2 times"):
        verify_session(pairs, KEY)


def test_the_method_comes_from_the_caller_when_the_headers_have_none():
    hdrs = signed_request()
    del hdrs[":method"]
    assert verify_session(hdrs, KEY, method="POST").end_user == "jane"
    with pytest.raises(SessionError, match="another request"):
        verify_session(hdrs, KEY, method="PUT")
    with pytest.raises(SessionError, match="method is unknown"):
        verify_session(hdrs, KEY)


@pytest.mark.parametrize("age, ok", [
    (0, True), (DEFAULT_MAX_AGE_S + DEFAULT_CLOCK_SKEW_S, True), (DEFAULT_MAX_AGE_S + DEFAULT_CLOCK_SKEW_S + 1, False),
    (-DEFAULT_CLOCK_SKEW_S, True), (-DEFAULT_CLOCK_SKEW_S - 1, False), (3600, False),
])
def test_freshness_window_with_clock_skew(age, ok):
    hdrs = signed_request(issued_at=T0)
    if ok:
        verify_session(hdrs, KEY, now=T0 + age)
    else:
        with pytest.raises(SessionError, match="expired|future"):
            verify_session(hdrs, KEY, now=T0 + age)


def test_the_window_is_configurable():
    hdrs = signed_request(issued_at=T0)
    with pytest.raises(SessionError, match="expired"):
        verify_session(hdrs, KEY, now=T0 + 10, max_age=2, skew=1)
    verify_session(hdrs, KEY, now=T0 + 100, max_age=120)


def test_an_old_signature_still_fails_the_mac_first_when_tampered():
    hdrs = signed_request(issued_at=T0)
    hdrs[H.END_USER] = "admin"
    with pytest.raises(SessionError, match="do not match"):
        verify_session(hdrs, KEY, now=T0 + 3600)


def test_wrong_key_is_rejected():
    assert "do not match" in check_session(signed_request(), b"x" * 32)


def test_duplicate_signed_header_is_rejected():
    hdrs = list(signed_request().items()) + [(H.END_USER, "admin")]
    with pytest.raises(SessionError, match="appears 2 times"):
        verify_session(hdrs, KEY)


def test_anonymous_request_without_session_headers_is_accepted_as_anonymous():
    assert verify_session({":path": "/"}, KEY).signed == {}


@pytest.mark.parametrize("value, ok", [
    ("jane", True), ("jane doe", True), ("a\tb", True), (" jane ", False), ("jane\t", False), ("\tjane", False),
    (" ", False), ("", False), ("ja\x01ne", False), ("jäne", False), ("x" * 1024, True), ("x" * 1025, False),
])
def test_carriable_claim_values(value, ok):
    assert carriable(value) is ok


@pytest.mark.parametrize("value", [" jane ", "jane\t"])
def test_whitespace_padded_values_are_neither_signed_nor_accepted(value):
    with pytest.raises(ValueError, match="cannot be carried"):
        sign([(H.END_USER, value)], KEY, method="GET")
    # a signature someone made over such a value by hand is still refused
    c = canonical([(H.END_USER, value)], issued_at=T0, method="GET", request_id="")
    sig = f"v2;t={T0};h={H.END_USER};s=" + hmac.new(KEY, c, hashlib.sha256).hexdigest()
    with pytest.raises(SessionError, match="no filter signs"):
        verify_session({H.END_USER: value, H.SESSION_SIG: sig}, KEY, method="GET", now=T0)
