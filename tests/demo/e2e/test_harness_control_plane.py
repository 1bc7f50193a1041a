"""demo.stack.control_plane.ControlPlane.apply, which the demo and the routing tests change config with:
the new generation once a change set is served, ConfigRejected (with the control
plane's report) for one it refuses, and a start that fails leaves nothing running."""
import pytest

from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.control_plane import ConfigRejected, ControlPlane
from mcp26.demo.stack.xds_scenario import base_config, virtual_service

pytestmark = pytest.mark.e2e


def test_apply_returns_the_new_generation_or_raises_the_rejection(tmp_path):
    with ControlPlane(str(tmp_path), test_hooks=False) as cp:
        texts = base_config(free_port(), {"v1": free_port(), "v2": free_port()})
        for name, text in texts.items():
            generation = cp.apply(name, text)
        assert cp.configz()["generation"] == generation
        bad = virtual_service(default=[("v1", None)]).replace("subset: v1", "subset: v1\n      weight: -5")
        with pytest.raises(ConfigRejected) as e:
            cp.apply("virtualservice.yaml", bad)
        assert "virtualservice.yaml" in str(e.value.rejected)
        assert cp.configz()["generation"] == generation       # the last good config still served
        assert cp.apply("virtualservice.yaml", virtual_service(default=[("v2", None)])) != generation


def test_a_start_that_fails_stops_the_process(tmp_path):
    cp = ControlPlane(str(tmp_path), test_hooks=False)
    with pytest.raises(TimeoutError):
        cp.start(timeout=0.01)          # not up that fast: the start times out
    assert cp.proc.poll() is not None
    cp.close()
