"""Resource fusion signals (scheduler/loop/resources.py) from fake sysfs trees with 2 and 4 NUMA
nodes and PCIe links: the seed's periods and decays, the averages they give, "absent here" for
what a host lacks, and the node a serving process is pinned to (serving/topology.py)."""
from __future__ import annotations

import asyncio
import os

import pytest

from mcp26.mesh.engine_state import EngineState, EngineStateWriter
from mcp26.scheduler.loop import resources as RS
from mcp26.serving import topology as T

TWO = {0: ("0-3", "10 21"), 1: ("4-7", "21 10")}
# four nodes: 0 and 1 near each other, 2 and 3 near each other; node 3 has no CPUs (memory only)
FOUR = {0: ("0-1", "10 12 20 22"), 1: ("2-3", "12 10 22 20"), 2: ("4-5,8", "20 22 10 12"), 3: ("", "22 20 12 10")}


def sysfs(tmp_path, nodes: dict, links: dict | None = None) -> str:
    root = tmp_path / "sys"
    for i, (cpus, dist) in nodes.items():
        d = root / "devices" / "system" / "node" / f"node{i}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
        (d / "distance").write_text(dist + "\n")
    (root / "devices" / "system" / "node" / "online").write_text("0\n")
    for dev, attrs in (links or {}).items():
        d = root / "bus" / "pci" / "devices" / dev
        d.mkdir(parents=True)
        for k, v in attrs.items():
            (d / k).write_text(v + "\n")
    return str(root)


GPU = {"current_link_speed": "16.0 GT/s PCIe", "current_link_width": "16", "max_link_speed": "16.0 GT/s PCIe",
       "max_link_width": "16", "numa_node": "3", "class": "0x030200"}
NIC = {"current_link_speed": "8.0 GT/s PCIe", "current_link_width": "8", "numa_node": "0", "class": "0x020000"}
VIRTUAL = {"numa_node": "-1", "class": "0x018000"}          # a VM's virtio device: no link


def test_two_and_four_node_trees_are_read_with_their_distance_matrix(tmp_path):
    two = T.read_numa(sysfs(tmp_path / "a", TWO))
    assert [(n.id, n.cpus) for n in two.nodes] == [(0, (0, 1, 2, 3)), (1, (4, 5, 6, 7))]
    assert two.distance == ((10, 21), (21, 10))
    four = T.read_numa(sysfs(tmp_path / "b", FOUR))
    assert [n.cpus for n in four.nodes] == [(0, 1), (2, 3), (4, 5, 8), ()]
    assert four.distance[3] == (22, 20, 12, 10)


def test_a_matrix_that_does_not_fit_the_nodes_or_no_nodes_at_all_reads_as_absent(tmp_path):
    assert T.read_numa(sysfs(tmp_path / "a", {0: ("0-1", "10 21")})) is None     # 2 distances, 1 node
    assert T.read_numa(str(tmp_path / "nothing")) is None
    assert T.read_numa(sysfs(tmp_path / "b", {0: ("0-x", "10")})) is None


def test_pcie_links_their_bandwidth_and_a_virtual_bus_without_any(tmp_path):
    root = sysfs(tmp_path, TWO, {"0000:3b:00.0": GPU, "0000:5e:00.0": NIC, "0000:00:02.0": VIRTUAL})
    links = {link.device: link for link in T.read_pcie(root)}
    assert set(links) == {"0000:3b:00.0", "0000:5e:00.0"}
    assert links["0000:3b:00.0"].gbytes_per_s == pytest.approx(16 * 16 * 128 / 130 / 8)   # ~31.5 GB/s, gen4 x16
    assert links["0000:5e:00.0"].gbytes_per_s == pytest.approx(8 * 8 * 128 / 130 / 8)
    assert T.read_pcie(sysfs(tmp_path / "vm", TWO, {"0000:00:02.0": VIRTUAL})) == ()


def test_the_process_goes_to_the_node_nearest_its_device_else_the_one_with_most_cpus(tmp_path):
    root = sysfs(tmp_path, FOUR, {"0000:3b:00.0": GPU})
    four = T.read_numa(root)
    assert T.choose_node(four, "0000:3b:00.0", root).id == 2      # the GPU's node 3 has no CPUs: 2 is nearest
    assert T.choose_node(four, None, root).id == 2                 # no device: the most CPUs
    two = T.read_numa(sysfs(tmp_path / "b", TWO, {"0000:5e:00.0": {**NIC, "numa_node": "1"}}))
    assert T.choose_node(two, "0000:5e:00.0", str(tmp_path / "b" / "sys")).id == 1
    assert T.choose_node(two, None).id == 0                        # a tie: the lowest id


def test_the_seeds_periods_and_decays():
    assert (RS.NUMA.period_s, RS.NUMA.decay) == (0.010, 0.92)
    assert (RS.PCIE.period_s, RS.PCIE.decay) == (0.005, 0.88)
    assert (RS.ENGINE.period_s, RS.ENGINE.decay) == (0.001, 0.95)


def test_each_signal_is_an_exponential_average_with_its_own_decay(tmp_path):
    root = sysfs(tmp_path, TWO, {"0000:3b:00.0": GPU})
    page = str(tmp_path / "engine")
    w = EngineStateWriter(page)
    s = RS.ResourceSampler(root, engine_pages={"10.0.0.1:8000": page})
    w.write(EngineState(sessions=1, models=1, running=8, queued=0))
    s.sample_engine()
    w.write(EngineState(sessions=1, models=1, running=0, queued=20))
    s.sample_engine()
    (e,) = s.view().engine
    assert e.endpoint == "10.0.0.1:8000"
    assert e.running == pytest.approx(0.95 * 8)                                          # 0.95*8 + 0.05*0
    assert e.queued == pytest.approx(0.05 * 20)
    s.sample_pcie()
    link = root + "/bus/pci/devices/0000:3b:00.0/current_link_width"
    with open(link, "w") as f:
        f.write("8\n")                                                                   # the link trained down
    s.sample_pcie()
    full, half = 16 * 16 * 128 / 130 / 8, 16 * 8 * 128 / 130 / 8
    assert {x.device: x.value for x in s.view().pcie_links}["0000:3b:00.0"] == pytest.approx(0.88 * full + 0.12 * half,
                                                                                            abs=1e-3)
    s.sample_numa()
    with open(root + "/devices/system/node/node0/distance", "w") as f:
        f.write("10 31\n")
    s.sample_numa()
    assert s.view().numa_distance[0][1] == pytest.approx(0.92 * 21 + 0.08 * 31, abs=1e-3)
    assert s.view().numa_source.startswith("sysfs") and s.view().engine_source.startswith("engine state")


def test_what_the_host_lacks_is_marked_absent_here(tmp_path):
    s = RS.ResourceSampler(str(tmp_path / "empty"))
    s.sample_numa()
    s.sample_pcie()
    s.sample_engine()
    v = s.view()
    assert (v.numa_source, v.pcie_source, v.engine_source) == (RS.ABSENT,) * 3
    assert v.numa_distance == () and v.pcie_links == () and v.engine == ()


def test_the_sampler_runs_each_signal_on_its_own_period(tmp_path):
    root = sysfs(tmp_path, TWO, {"0000:3b:00.0": GPU})
    page = str(tmp_path / "engine")
    EngineStateWriter(page).write(EngineState(sessions=1))
    s = RS.ResourceSampler(root, engine_pages={"e": page})

    async def run():
        s.start()
        await asyncio.sleep(0.5)
        await s.stop()
    asyncio.run(run())
    n, late = s.samples, s.late
    # 0.5 s: 50 NUMA, 100 PCIe, 500 engine samples, less those skipped when a 2-core box is busy
    assert 40 <= n["numa"] + late["numa"] <= 52 and 85 <= n["pcie"] + late["pcie"] <= 102
    assert 400 <= n["engine"] + late["engine"] <= 502 and n["engine"] >= 100


def test_pinning_keeps_only_allowed_cpus():
    allowed = os.sched_getaffinity(0)
    with pytest.raises(ValueError, match="none of CPUs"):
        T.pin_process((max(allowed) + 1000,))
