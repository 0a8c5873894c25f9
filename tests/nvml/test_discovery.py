"""NVML GPU discovery, run against the fake NVML driven by every topology we ship or were given.

The real discovery code (`NvmlGpuSource`) runs unchanged; its GPU part must
equal the simulated node built from the same topology: names, NUMA nodes and
the link of every GPU pair (NVLink bridges, hybrid cube-mesh, NVSwitch).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import replace

import pynvml
import pytest
from topo_testkit import SHARED_DIR

from allocator.topology import HEALTHY, DeviceKind, Link, LinkLevel, NodeTopology
from plugin.errors import RuntimeFailure
from plugin.sources import TopologyError, builtin_names, load_simulated
from topo_testkit.fake_nvml import FakeNvml, nvml_bus_id
from plugin.sources.nvml_gpus import DiscoveryError, NvmlGpuSource, discover_gpus

TOPOLOGIES = sorted((SHARED_DIR / "topologies").glob("*.txt"))
SOURCES = [pytest.param(n, id=n) for n in builtin_names()] + [
    pytest.param(str(p), id=p.stem) for p in TOPOLOGIES
]
#: Nodes whose GPUs form one all-NV<n> clique (NVSwitch on real hardware, or GH200's all-to-all).
CLIQUES = ["dgx-a100", "dgx-h100", "dgx-2-v100"] + [str(p) for p in TOPOLOGIES if "nv12" in p.name or "nv18" in p.name]


def gpu_part(t: NodeTopology) -> tuple[list, dict]:
    gpus = t.gpus
    names = [(d.name, d.numa) for d in gpus]
    links = {(a.name, b.name): t.link(a.name, b.name) for i, a in enumerate(gpus) for b in gpus[i + 1:]}
    return names, links


def discover(topology: NodeTopology, tmp_path, **fake_kw) -> tuple[NodeTopology, FakeNvml]:
    fake = FakeNvml(topology, **fake_kw)
    root = fake.write_sysfs(str(tmp_path / "sys"))
    return NvmlGpuSource(nvml=fake, sysfs_root=root).load(), fake


def test_topology_fixtures_are_present():
    assert TOPOLOGIES, "../shared/topologies is missing"


@pytest.mark.parametrize("source", SOURCES)
def test_discovery_equals_the_simulated_node(source, tmp_path):
    sim = load_simulated(source)
    found, fake = discover(sim, tmp_path)
    assert gpu_part(found) == gpu_part(sim)
    # Every pair is present and labelled as `nvidia-smi topo -m` would.
    for (a, b), link in gpu_part(sim)[1].items():
        assert found.link(a, b).label == link.label, (a, b)
    assert len(found.links) == len(sim.gpus) * (len(sim.gpus) - 1) // 2
    # MIG devices (the dgx-a100-mig nodes) are compared field by field in test_mig_discovery.py.
    assert [d.name for d in found.of_kind(DeviceKind.MIG)] == [d.name for d in sim.of_kind(DeviceKind.MIG)]
    for d in found.gpus:
        assert d.health == HEALTHY
        g = fake.by_name[d.name]
        assert (d.uuid, d.pci_bus_id, d.minor, d.model, d.memory_mib) == (
            g.uuid, g.bdf, g.minor, g.model, g.memory_mib)
    assert found.source == "nvml"
    assert fake.init_count == 0, "discovery must shut NVML down again"


@pytest.mark.parametrize("source", CLIQUES)
@pytest.mark.parametrize("mode", ["ok", "function-not-found", "absent"])
def test_nvswitch_cliques_with_and_without_remote_device_type(source, mode, tmp_path):
    sim = load_simulated(source)
    found, fake = discover(sim, tmp_path, remote_device_type=mode)
    assert fake.switch_bdfs, "the fake must wire these through NVSwitches"
    assert all(not any(r in fake.by_name for r, _ in g.links.values()) for g in fake.gpus)
    assert gpu_part(found) == gpu_part(sim)
    n = sim.link("GPU0", "GPU1").nvlinks
    assert all(link.nvlinks == n for link in found.links.values())
    if mode == "function-not-found":
        # The driver lacks the call: asked once, then remembered.
        assert fake.calls["nvmlDeviceGetNvLinkRemoteDeviceType"] == 1


def test_nvswitch_fallback_without_sysfs_still_finds_switches(tmp_path):
    """No vendor file for the switch (e.g. the tree of another fixture): a non-GPU end is a switch."""
    sim = load_simulated("dgx-h100")
    fake = FakeNvml(sim, remote_device_type="absent")
    found = NvmlGpuSource(nvml=fake, sysfs_root=str(tmp_path / "empty")).load()
    assert all(link.label == "NV18" for link in found.links.values())
    assert all(d.numa is None for d in found.gpus)


def test_direct_nvlinks_and_switch_wiring_agree_for_gh200(tmp_path):
    sim = load_simulated(next(str(p) for p in TOPOLOGIES if "gh200" in p.name))
    direct, f1 = discover(sim, tmp_path / "a", nvswitch=False)
    switched, f2 = discover(sim, tmp_path / "b", nvswitch=True)
    assert not f1.switch_bdfs and f2.switch_bdfs
    assert gpu_part(direct) == gpu_part(switched) == gpu_part(sim)


def test_a_gpu_with_failed_switch_links_drags_only_its_own_pairs_down(tmp_path):
    sim = load_simulated("dgx-a100")
    found, _ = discover(sim, tmp_path, down_links={"GPU3": 2})
    for (a, b), link in found.links.items():
        assert link.nvlinks == (10 if "GPU3" in (a, b) else 12), (a, b)


def test_asymmetric_direct_counts_keep_the_higher_and_warn(tmp_path, caplog):
    sim = load_simulated("dgx-1-v100")
    fake = FakeNvml(sim)
    first_peer = fake.gpus[0].links[0][0]
    peer = next(g.device.name for g in fake.gpus if g.bdf == first_peer)
    fake.gpus[0].down = {0}  # GPU0 no longer sees one link the peer still reports
    root = fake.write_sysfs(str(tmp_path / "sys"))
    with caplog.at_level(logging.WARNING):
        found = NvmlGpuSource(nvml=fake, sysfs_root=root).load()
    assert found.link("GPU0", peer) == sim.link("GPU0", peer)
    assert any("asymmetric NVLink" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode", ["ok", "function-not-found", "absent"])
def test_power9_nvlinks_to_the_cpu_are_not_gpu_pairs(mode, tmp_path):
    sim = load_simulated(next(str(p) for p in TOPOLOGIES if "power9" in p.name))
    found, fake = discover(sim, tmp_path, cpu_nvlinks=3, remote_device_type=mode)
    assert fake.npu_bdfs
    assert gpu_part(found) == gpu_part(sim)
    assert found.link("GPU0", "GPU1").label == "NV3" and found.link("GPU0", "GPU2").label == "SYS"


def test_link_info_is_read_once_per_device(tmp_path):
    sim = load_simulated("dgx-h100")
    _, fake = discover(sim, tmp_path)
    n, max_links = len(sim.gpus), pynvml.NVML_NVLINK_MAX_LINKS
    active = sum(len(g.links) for g in fake.gpus)
    assert fake.calls["nvmlDeviceGetNvLinkState"] == n * max_links
    assert fake.calls["nvmlDeviceGetNvLinkRemotePciInfo"] == active
    assert fake.calls["nvmlDeviceGetNvLinkRemoteDeviceType"] == active
    assert fake.calls["nvmlDeviceGetTopologyCommonAncestor"] == n * (n - 1) // 2
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == n


def test_pcie_only_gpus_have_no_nvlink(tmp_path):
    sim = load_simulated(next(str(p) for p in TOPOLOGIES if "l40s" in p.name))
    found, fake = discover(sim, tmp_path)
    assert all(link.nvlinks == 0 for link in found.links.values())
    assert fake.calls["nvmlDeviceGetNvLinkRemotePciInfo"] == 0


def test_numa_minus_one_missing_or_garbage_is_none(tmp_path):
    sim = load_simulated("dgx-a100")
    fake = FakeNvml(sim)
    root = fake.write_sysfs(str(tmp_path / "sys"), numa={"GPU1": None}, missing=["GPU2"], raw={"GPU3": "x\n"})
    found = NvmlGpuSource(nvml=fake, sysfs_root=root).load()
    numa = {d.name: d.numa for d in found.gpus}
    assert numa["GPU0"] == 0 and numa["GPU4"] == 1
    assert numa["GPU1"] is None and numa["GPU2"] is None and numa["GPU3"] is None


def test_bus_ids_are_read_in_the_kernel_form(tmp_path):
    """NVML says `00000000:3B:00.0`; sysfs names it `0000:3b:00.0`, which is what a Device carries."""
    sim = load_simulated("pcie-2socket-4gpu-2nic")
    bdfs = ["0000:3B:00.0", "0000:5e:00.0", "0000:AF:00.0", "0000:d8:00.0"]
    gpus = [replace(d, pci_bus_id=b) for d, b in zip(sim.gpus, bdfs)]
    names = {g.name for g in gpus}
    topo = NodeTopology.build(gpus, {k: v for k, v in sim.links.items() if set(k) <= names})
    fake = FakeNvml(topo)
    assert nvml_bus_id("0000:3b:00.0") == "00000000:3B:00.0"
    root = fake.write_sysfs(str(tmp_path / "sys"))
    found = NvmlGpuSource(nvml=fake, sysfs_root=root).load()
    assert [d.pci_bus_id for d in found.gpus] == ["0000:3b:00.0", "0000:5e:00.0", "0000:af:00.0", "0000:d8:00.0"]
    assert [d.numa for d in found.gpus] == [d.numa for d in topo.gpus]


def test_init_error_is_fatal_with_a_clear_message_by_default(tmp_path):
    fake = FakeNvml(load_simulated("dgx-a100"), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(DiscoveryError) as e:
        NvmlGpuSource(nvml=fake, sysfs_root=str(tmp_path)).load()
    # A runtime failure (exit 1), not bad input (a TopologyError would exit 2).
    assert isinstance(e.value, RuntimeFailure) and not isinstance(e.value, TopologyError)
    text = str(e.value)
    assert text.startswith("nvml: cannot initialise NVML: Driver Not Loaded")
    assert "--no-fail-on-init-error" in text
    assert e.value.code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED


async def test_init_error_serves_zero_gpus_when_allowed(tmp_path):
    fake = FakeNvml(load_simulated("dgx-a100"), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    src = NvmlGpuSource(nvml=fake, sysfs_root=str(tmp_path), fail_on_init_error=False)
    t = src.load()
    assert len(t) == 0 and src.init_error is not None
    assert "NVML Shared Library Not Found" in str(src.init_error)
    # No GPUs: watch starts no health thread and just waits to be cancelled.
    task = asyncio.create_task(src.watch(t, lambda _: pytest.fail("nothing to publish")))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake.calls["nvmlEventSetCreate"] == 0


def test_real_pynvml_without_a_driver_gives_a_clear_error(tmp_path):
    """The real bindings on this machine: a GPU node discovers, anything else gets a clear DiscoveryError."""
    src = NvmlGpuSource(sysfs_root="/sys")
    try:
        t = src.load()
    except DiscoveryError as e:
        assert str(e).startswith("nvml: cannot initialise NVML:")
        assert NvmlGpuSource(fail_on_init_error=False).load().devices == ()
    else:  # pragma: no cover - only on a GPU machine
        assert t.gpus and all(d.uuid and d.pci_bus_id for d in t.gpus)


def test_missing_bindings_are_a_discovery_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(DiscoveryError, match="pip install nvidia-ml-py"):
        NvmlGpuSource().load()


def test_a_gpu_nvml_cannot_identify_is_skipped(tmp_path, caplog):
    sim = load_simulated("dgx-a100")
    fake = FakeNvml(sim)
    fake.lose("GPU2")
    root = fake.write_sysfs(str(tmp_path / "sys"))
    with caplog.at_level(logging.ERROR):
        devices, links = discover_gpus(fake, root)
    assert [d.name for d in devices] == [f"GPU{i}" for i in range(8) if i != 2]
    assert all("GPU2" not in pair for pair in links)
    assert any("GPU skipped" in r.getMessage() for r in caplog.records)
    assert fake.init_count == 0


def test_pcie_levels_fall_back_to_sysfs_when_nvml_cannot_say(tmp_path):
    """No common-ancestor answer and no PCIe tree: the NUMA nodes decide (NODE / SYS)."""
    sim = load_simulated("dgx-a100")
    found, fake = discover(sim, tmp_path, common_ancestor=False)
    assert fake.calls["nvmlDeviceGetTopologyCommonAncestor"] == 28
    for (a, b), link in found.links.items():
        same = sim.device(a).numa == sim.device(b).numa
        assert link == Link(nvlinks=12, level=LinkLevel.NODE if same else LinkLevel.SYS)


@pytest.mark.parametrize("common_ancestor", [True, False])
def test_generated_node_discovers_exactly(tmp_path, common_ancestor):
    """The NIC fixtures' 8-GPU node: devices equal field by field, and levels from its real PCIe tree."""
    from topo_testkit import sysfs_fixture as fixture
    node = fixture.write_node(fixture.default_node(), str(tmp_path / "node"))
    expected = node.topology.without(d.name for d in node.topology.nics)
    fake = FakeNvml(expected, common_ancestor=common_ancestor)
    found = NvmlGpuSource(nvml=fake, sysfs_root=node.sysfs_root).load()
    assert found.devices == expected.devices
    assert dict(found.links) == dict(expected.links)


#: Every built-in node whose GPUs the fake wires through NVSwitches (all pairs NV<n>, 3 GPUs or more).
NVSWITCH_BUILTINS = [n for n in builtin_names()
                     if len(load_simulated(n).gpus) >= 3
                     and len({link.nvlinks for (a, b), link in load_simulated(n).links.items()
                              if a.startswith("GPU") and b.startswith("GPU") and "-mig" not in a + b}) == 1
                     and load_simulated(n).link("GPU0", "GPU1").nvlinks > 0]


def test_the_nvswitch_builtins_are_the_hgx_dgx_and_nvl72_nodes():
    assert {"dgx-a100", "dgx-h100", "hgx-b200", "gb200-cx7", "gb300-cx8-dd"} <= set(NVSWITCH_BUILTINS)


@pytest.mark.parametrize("source", NVSWITCH_BUILTINS)
@pytest.mark.parametrize("mode", ["ok", "function-not-found", "absent", "unknown"])
def test_nvswitch_links_hold_when_the_switch_address_is_unknown(source, mode, tmp_path):
    """Driver 580 on GB200 reports `FFFFFFFF:FF:FF.0` for the switch end: the links must not vanish.

    Whatever the driver says of the remote type (SWITCH, no call, no binding, UNKNOWN), every GPU
    pair reads NV<n> as on the real node (NV18 on H100/B200/GB200, NV12 on A100), and the DRA
    slices carry one `nvlinkDomain` for all the GPUs.
    """
    from plugin.dra.slices.build import SliceOptions, build_resource_slices

    sim = load_simulated(source)
    found, fake = discover(sim, tmp_path, switch_address="unknown", remote_device_type=mode)
    assert not fake.switch_bdfs and fake.gpus[0].links, "the switch ends must have no address here"
    assert all(bus == "FFFFFFFF:FF:FF.0" for g in fake.gpus for bus, _ in g.links.values())
    n = len(sim.gpus)
    assert gpu_part(found) == gpu_part(sim)
    want = sim.link("GPU0", "GPU1").label
    assert want in ("NV18", "NV12", "NV6")
    labels = [found.link(a.name, b.name).label for i, a in enumerate(found.gpus) for b in found.gpus[i + 1:]]
    assert labels == [want] * (n * (n - 1) // 2)
    domains = set()
    for s in build_resource_slices(found, SliceOptions(node_name="node-a")):
        for d in s["spec"].get("devices", ()):
            if "mig" not in d["name"]:
                domains.add(next(iter(d["attributes"].get("nvlinkDomain", {None: None}).values())))
    assert len(domains) == 1 and None not in domains


def test_unknown_switch_addresses_are_the_default_for_nvl72_trays(tmp_path):
    fake = FakeNvml(load_simulated("gb200-cx7"))
    assert fake.switch_address == "unknown" and not fake.switch_bdfs
    assert FakeNvml(load_simulated("dgx-h100")).switch_address == "pci"


def test_inactive_links_answer_not_supported_and_are_skipped(tmp_path):
    sim = load_simulated("dgx-h100")
    fake = FakeNvml(sim, switch_address="unknown", down_links={"GPU5": 3})
    fake.nvmlInit()
    try:
        h = fake.nvmlDeviceGetHandleByIndex(5)
        with pytest.raises(pynvml.NVMLError) as e:
            fake.nvmlDeviceGetNvLinkRemotePciInfo_v2(h, 0)
        assert e.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    finally:
        fake.nvmlShutdown()
    found = NvmlGpuSource(nvml=fake, sysfs_root=fake.write_sysfs(str(tmp_path / "sys"))).load()
    for (a, b), link in found.links.items():
        assert link.nvlinks == (15 if "GPU5" in (a, b) else 18), (a, b)


def test_gpus_in_different_fabric_cliques_share_no_nvlink(tmp_path):
    """A fabric manager partition splits the NVSwitch domain: NVML says so by the clique ID alone."""
    sim = load_simulated("gb200-cx7")
    fake = FakeNvml(sim)
    other = replace(fake.gpus[0].fabric, clique_id=fake.gpus[0].fabric.clique_id + 1)
    for name in ("GPU2", "GPU3"):
        fake.set_fabric(name, other)
    found = NvmlGpuSource(nvml=fake, sysfs_root=fake.write_sysfs(str(tmp_path / "sys"))).load()
    assert found.link("GPU0", "GPU1").label == found.link("GPU2", "GPU3").label == "NV18"
    for a in ("GPU0", "GPU1"):
        for b in ("GPU2", "GPU3"):
            assert found.link(a, b).nvlinks == 0 and found.link(a, b).level == sim.link(a, b).level, (a, b)
