"""The harness's own pieces that tests, benchmarks and the demo lean on: ports, stopping
processes, the JWT issuer."""
import socket
import subprocess
import sys
import time

import jwt as pyjwt
import pytest

from mcp26.demo.stack.ports import free_port, free_port_block, port_is_free, preferred_port
from mcp26.demo.stack.processes import stop_processes
from mcp26.demo.stack.tokens import Issuer


def test_preferred_port_is_kept_when_free_else_another_free_one():
    taken: set[int] = set()
    port = free_port()
    assert preferred_port(port, taken) == port and taken == {port}
    again = preferred_port(port, taken)                     # already this run's
    assert again != port and taken == {port, again}
    with socket.socket() as held:                           # someone else's
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        other = preferred_port(busy, taken)
        assert other != busy and other not in (port, again) and port_is_free(other)
    assert preferred_port(None, taken) not in (port, again, other)


def test_free_port_block():
    base = free_port_block(8)
    assert all(port_is_free(p) for p in range(base, base + 8))


def test_stop_processes_terms_them_together_and_kills_what_ignores_it():
    obeys = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ignores = subprocess.Popen([sys.executable, "-c",
                                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                                " print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    assert ignores.stdout.readline() == b"ready\n"
    started = time.monotonic()
    stop_processes([ignores, None, obeys], grace=1.0)
    took = time.monotonic() - started
    assert obeys.returncode == -15 and ignores.returncode == -9
    assert took < 5, took                  # one grace for all, not one each
    stop_processes([obeys, ignores])       # already stopped: nothing to do
    ignores.stdout.close()


def test_issuer_tokens_verify_against_its_jwks_and_a_forger_does_not():
    issuer = Issuer("k1", "https://issuer.test", "aud-1")
    keys = pyjwt.PyJWKSet.from_json(issuer.jwks)
    (key,) = keys.keys
    assert key.key_id == "k1"
    claims = pyjwt.decode(issuer.token(sub="jane", tenant="acme"), key.key, algorithms=["RS256"], audience="aud-1")
    assert (claims["iss"], claims["sub"], claims["tenant"]) == ("https://issuer.test", "jane", "acme")
    assert pyjwt.decode(issuer.token(aud="other"), key.key, algorithms=["RS256"], audience="other")["aud"] == "other"
    with pytest.raises(pyjwt.ExpiredSignatureError):
        pyjwt.decode(issuer.token(exp_in=-120), key.key, algorithms=["RS256"], audience="aud-1")
    forged = Issuer("k1", "https://issuer.test", "aud-1").token(sub="jane")
    assert pyjwt.get_unverified_header(forged)["kid"] == "k1"
    with pytest.raises(pyjwt.InvalidSignatureError):
        pyjwt.decode(forged, key.key, algorithms=["RS256"], audience="aud-1")
