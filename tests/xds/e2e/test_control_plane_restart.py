"""kill -9 of the control plane under load, then a restart, over SotW and Delta, with the Wasm contract.

tests/xds/e2e/test_xds_resilience.py does this for plain routes; here the gateway also
runs jwt_authn and the header-contract Wasm filter (ECDS), and what must hold is:
no request fails, every response was signed by the filter, and Envoy's Wasm VM is
not rebuilt by the reconnect (its `wasm.*.created` / `vm_reload*` counters, read
from Envoy's admin /stats, do not move).
"""
import os
import threading
import time

import pytest

from mcp26.mesh import headers as H

from harness.contract_stack import NODE, WASM, ContractStack

pytestmark = [pytest.mark.e2e, pytest.mark.adversarial]


class Load(threading.Thread):
    """Steady signed-in requests; each must come back 200, signed, for the token's user."""

    def __init__(self, stack):
        super().__init__(daemon=True)
        self.stack, self.running = stack, True
        self.token = {"authorization": f"Bearer {stack.issuer.token(sub='alice')}"}
        self.ok, self.failed = 0, []

    def run(self):
        while self.running:
            try:
                status, seen = self.stack.get(self.token, timeout=3)
                h = seen.get("headers", {})
                if status == 200 and h.get("end-user") == "alice" and H.SESSION_SIG in h:
                    self.ok += 1
                else:
                    self.failed.append((status, h))
            except OSError as e:
                self.failed.append(repr(e))
            time.sleep(0.002)

    def stop(self):
        self.running = False
        self.join(5)


@pytest.mark.skipif(not os.path.exists(WASM), reason="run `make wasm` first")
@pytest.mark.parametrize("protocol", ["sotw", "delta"])
def test_kill_and_restart_under_load_fails_nothing_and_keeps_the_wasm_vm(protocol):
    with ContractStack(delta=protocol == "delta") as s:
        assert s.cp.node_sync(NODE)["protocol"] == protocol
        vms = s.wasm_vm_stats()
        reloads = {k: v for k, v in s.envoy.stats("wasm").items() if "vm_reload" in k}
        assert vms and any(v > 0 for v in vms.values()), vms
        load = Load(s)
        load.start()
        try:
            time.sleep(0.3)
            s.cp.kill()
            served = load.ok
            time.sleep(1.5)
            assert load.ok > served                         # Envoy serves on without its control plane
            s.cp.start()                                    # same ports, same directory
            s.cp.wait_synced(NODE, types=("CDS", "LDS", "ECDS"))
            time.sleep(0.5)
        finally:
            load.stop()
        print(f"{protocol}: {load.ok} requests ok, {len(load.failed)} failed; VMs {vms} -> {s.wasm_vm_stats()}")
        assert not load.failed, load.failed[:3]
        assert load.ok > 100
        assert s.wasm_vm_stats() == vms                     # no Wasm VM created by the reconnect
        assert {k: v for k, v in s.envoy.stats("wasm").items() if "vm_reload" in k} == reloads
        assert s.envoy.stats("listener_manager.listener_modified").get("listener_manager.listener_modified", 0) == 0
