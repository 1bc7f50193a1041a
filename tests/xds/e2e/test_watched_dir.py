"""Hostile and careless things done to the watched directory, against the real control plane.

- an editor saving in place (truncate, half, rest, 1.5 s apart; authn.yaml empty
  for 2 s) must never open a window without jwt_authn or the FAIL_CLOSE header
  contract: the settle rule (xds-server/settle.py) holds the weakening;
- a symlink loop, a symlink to /dev/zero and a FIFO are rejected files with a
  clear error, the watch goes on and later changes are applied;
- /healthz turns 503 with the reason if the watch task ever stops.
"""
import asyncio
import json
import os
import threading
import time
import urllib.request

import pytest

from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.control_plane import ControlPlane, write_config
from mcp26.mesh import headers as H
from mcp26.mesh.parse import load_dir

from harness.contract_stack import WASM, ContractStack

pytestmark = [pytest.mark.e2e, pytest.mark.adversarial]


def service_entry(name):
    return (f"apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}}}\n"
            f"spec: {{hosts: [{name}.example], resolution: NONE, "
            "ports: [{number: 80, name: http, protocol: HTTP}]}\n")


class Attack(threading.Thread):
    """Spoofed `end-user` without a token, and a garbage token, over and over."""

    def __init__(self, stack):
        super().__init__(daemon=True)
        self.stack, self.running = stack, True
        self.spoofed = self.spoofed_through = self.garbage = self.garbage_through = 0
        self.other: list = []

    def run(self):
        while self.running:
            try:
                status, seen = self.stack.get({"end-user": "admin"}, timeout=2)
                self.spoofed += 1
                if status == 200 and (seen["headers"].get("end-user") or H.SESSION_SIG not in seen["headers"]):
                    self.spoofed_through += 1          # the upstream saw the claim unsigned / no contract ran
                elif status != 200:
                    self.other.append(("spoof", status))
                status, _ = self.stack.get({"authorization": "Bearer a.b.c"}, timeout=2)
                self.garbage += 1
                if status != 401:
                    self.garbage_through += status == 200
                    self.other.append(("garbage", status))
            except OSError as e:
                self.other.append(repr(e))
            time.sleep(0.005)

    def stop(self):
        self.running = False
        self.join(5)


@pytest.mark.skipif(not os.path.exists(WASM), reason="run `make wasm` first")
def test_non_atomic_saves_never_switch_the_contract_or_jwt_off():
    with ContractStack() as s:
        helds = []
        attack = Attack(s)
        attack.start()
        try:
            wasm, text = os.path.join(s.dir, "wasm.yaml"), s.texts["wasm.yaml"]
            with open(wasm, "w") as f:                 # truncated in place, then written in two halves
                f.flush()
                for part in (text[:len(text) // 2], text[len(text) // 2:], None):
                    for _ in range(15):
                        time.sleep(0.1)
                        helds.append(s.cp.configz().get("held"))
                    if part is not None:
                        f.write(part)
                        f.flush()
            authn = os.path.join(s.dir, "authn.yaml")
            with open(authn, "w") as f:                # empty for 2 s
                for _ in range(20):
                    time.sleep(0.1)
                    helds.append(s.cp.configz().get("held"))
                f.write(s.texts["authn.yaml"])
            time.sleep(1.0)
        finally:
            attack.stop()
        upstream_saw = [r for r in s.upstream.requests if r["headers"].get("end-user") == "admin"]
        held = [h for h in helds if h]
        print(f"{attack.spoofed} spoofed, {attack.garbage} garbage-token requests; held reports: {len(held)}")
        assert attack.spoofed > 50 and attack.garbage > 50
        assert attack.spoofed_through == 0 and not upstream_saw, (attack.spoofed_through, upstream_saw[:1])
        assert attack.garbage_through == 0, attack.other[:5]
        assert not attack.other, attack.other[:5]
        # The control plane said why it kept serving the old contract.
        kinds = {w["resource"] for h in held for w in h["weakenings"]}
        assert kinds == {"WasmPlugin/default/header-contract", "RequestAuthentication/default/gateway-jwt"}, (
            helds, s.cp.log_tail())
        assert s.cp.healthz()["status"] == "ok"


def test_a_removal_by_edit_is_applied_once_the_file_is_quiet_and_a_deletion_at_once(tmp_path):
    """In process (settle 0.6 s): held, then applied by itself; deleting the file applies at once."""
    from mcp26.xds.server import XdsServer
    d = str(tmp_path)
    authn = ("apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: jwt}\n"
             "spec:\n  jwtRules:\n  - issuer: https://a.test\n    jwks: '{\"keys\": []}'\n")
    write_config(d, "authn.yaml", authn)
    write_config(d, "se.yaml", service_entry("a"))

    async def body():
        server = XdsServer(d, port=free_port(), admin_port=free_port(), load=load_dir,
                           translate=lambda config, node: {}, poll=0.01, debounce=0.05, settle=0.6)
        await server.start()
        try:
            kinds = lambda: sorted(r.kind for r in server.cache.config)           # noqa: E731
            write_config(d, "authn.yaml", "# emptied on purpose\n")
            start = time.monotonic()
            while not server.status["held"]:
                assert time.monotonic() - start < 3
                await asyncio.sleep(0.02)
            assert kinds() == ["RequestAuthentication", "ServiceEntry"]       # held: still served
            while kinds() != ["ServiceEntry"]:
                assert time.monotonic() - start < 3, server.status
                await asyncio.sleep(0.02)
            assert time.monotonic() - start >= 0.5 and server.status["held"] is None
            write_config(d, "authn.yaml", authn)
            while kinds() != ["RequestAuthentication", "ServiceEntry"]:        # an addition: at once
                await asyncio.sleep(0.02)
            gen = server.status["generation"]
            start = time.monotonic()
            os.remove(os.path.join(d, "authn.yaml"))
            while server.status["generation"] == gen:
                await asyncio.sleep(0.02)
            assert kinds() == ["ServiceEntry"] and time.monotonic() - start < 0.5
        finally:
            await server.stop(0)

    asyncio.run(body())


@pytest.mark.parametrize("make, reason", [
    (lambda d: os.symlink("loop.yaml", os.path.join(d, "loop.yaml")), "Too many levels of symbolic links"),
    (lambda d: os.symlink("/dev/zero", os.path.join(d, "zero.yaml")), "not a regular file (a character device)"),
    (lambda d: os.mkfifo(os.path.join(d, "fifo.yaml")), "not a regular file (a FIFO)"),
], ids=["symlink-loop", "symlink-to-dev-zero", "fifo"])
def test_a_bad_file_is_rejected_and_the_watch_goes_on(tmp_path, make, reason):
    d = str(tmp_path)
    write_config(d, "a.yaml", service_entry("a"))
    with ControlPlane(d) as cp:
        gen = cp.configz()["generation"]
        since = time.time()
        make(d)
        rejected = cp.wait_rejected(since, timeout=10)
        [err] = rejected["errors"]
        assert reason in err["message"] and err["file"].startswith(d), err
        health = cp.get("/healthz")
        assert health[0] == 200 and json.loads(health[1])["generation"] == gen    # answered: not hung
        # Later changes are still seen: fix the directory, add a service, and it is applied.
        bad = next(n for n in os.listdir(d) if n.startswith(("loop", "zero", "fifo")))
        os.remove(os.path.join(d, bad))
        write_config(d, "b.yaml", service_entry("b"))
        status = cp.wait_generation_change(gen)
        assert status["resources"] == 2 and status["rejected"] is None
        assert cp.healthz()["status"] == "ok"


def test_healthz_turns_unhealthy_with_the_reason_when_the_watch_stops(tmp_path):
    from mcp26.xds.server import XdsServer
    write_config(str(tmp_path), "a.yaml", service_entry("a"))

    def healthz(port):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    async def body():
        server = XdsServer(str(tmp_path), port=free_port(), admin_port=free_port(), load=load_dir,
                           translate=lambda config, node: {})
        await server.start()
        try:
            assert (await asyncio.to_thread(healthz, server.admin_port))[0] == 200
            server.source._task.cancel()          # the watch task ends, by whatever cause
            await asyncio.sleep(0.05)
            return await asyncio.to_thread(healthz, server.admin_port)
        finally:
            await server.stop(0)

    status, doc = asyncio.run(body())
    assert status == 503 and doc["status"] == "unhealthy" and "watch task" in doc["reason"], doc
