"""The composed real-hardware source on a generated node: fake NVML GPUs + sysfs NICs + every link."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace

import pytest

from allocator.topology import UNHEALTHY, DeviceKind, LinkLevel, NodeTopology
from plugin.health.options import GpuHealthOptions
from plugin.model.nic_pools import parse_pools
from plugin.model.resources import ResourceOptions, build_resources
from plugin.errors import RuntimeFailure
from plugin.sources.nvml_gpus import DiscoveryError
from plugin.sources.hardware import hardware_source_from_options, read_numa
from plugin.sources.simulated import load_simulated
from plugin.sources.udev_hotplug import UdevUnavailable
from topo_testkit.fake_udev import FakeUdev
from topo_testkit.sysfs_fixture import (
    example_config, fake_nvml, simulated_node_yaml, write_demo,
)


def no_udev(_subsystems):
    raise UdevUnavailable("no udev in this test")


def source(node, nvml=None, udev=None, **kw):
    return hardware_source_from_options(
        sysfs_root=node.sysfs_root, dev_root=node.dev_root, proc_root=node.proc_root,
        nvml=nvml if nvml is not None else fake_nvml(node), node_name=node.spec.name,
        monitor_factory=udev if udev is not None else no_udev, debounce_s=0.02, **kw,
    )


def test_discovery_equals_the_topology_the_node_was_generated_from(node):
    t = source(node).load()
    assert t == node.topology
    assert len(t.gpus) == 8 and len(t.nics) == 11
    assert t.numa_nodes == (0, 1) and t.numa_distance(0, 1) == 21


def test_gpu_nic_link_levels(node):
    t = source(node).load()
    vf0 = node.function("ens1f0").vfs[0]          # card0, behind GPU0/GPU1's switch
    vfio = node.function("ens1f0").vfs[3]
    ib = node.function("ibp2s0f1").bdf             # card1, behind GPU4/GPU5's switch
    eno2 = node.function("eno2").bdf               # own root port next to GPU2/GPU3's switches
    level = lambda a, b: t.link(a, b).level  # noqa: E731 (a one-line shorthand)
    assert level("GPU0", vf0) == LinkLevel.PIX
    assert level("GPU1", vfio) == LinkLevel.PIX
    assert level("GPU2", vf0) == LinkLevel.NODE
    assert level("GPU4", vf0) == LinkLevel.SYS
    assert level("GPU4", ib) == LinkLevel.PIX
    assert level("GPU6", ib) == LinkLevel.NODE
    assert level("GPU2", eno2) == LinkLevel.PHB
    assert level(vf0, vfio) == LinkLevel.PIX       # VFs of one PF
    assert level(vf0, node.function("ens1f1").bdf) == LinkLevel.PIX  # ports of one card
    assert level(vf0, ib) == LinkLevel.SYS
    # GPU pairs: NVLink bridges, and the PCIe level kept for display.
    assert t.link("GPU0", "GPU1").label == "NV12"
    assert t.link("GPU2", "GPU3").level == LinkLevel.PXB and t.link("GPU2", "GPU3").nvlinks == 12
    assert t.link("GPU1", "GPU2").label == "NODE"
    assert t.link("GPU0", "GPU7").label == "SYS"
    # Weights the allocator sees: the GPU's own-switch NIC scores best.
    assert t.weight("GPU0", vf0) > t.weight("GPU2", vf0) > t.weight("GPU4", vf0)


def test_gpus_and_nics_carry_what_allocate_needs(node):
    t = source(node).load()
    g0 = t.device("GPU0")
    assert g0.kind is DeviceKind.GPU and g0.numa == 0 and g0.minor == 0 and g0.uuid.startswith("GPU-")
    assert g0.pci_bus_id == node.function("GPU0").bdf
    assert g0.memory_mib == 81920 and g0.model == "NVIDIA A100 80GB PCIe"
    assert {d.numa for d in t.nics} == {0, 1}


def test_nvml_init_failure_is_fatal_by_default_and_zero_gpus_otherwise(node):
    import pynvml

    broken = fake_nvml(node, init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(DiscoveryError) as e:
        source(node, nvml=broken).load()
    assert "fail-on-init-error" in str(e.value)
    assert isinstance(e.value, RuntimeFailure)  # the environment, not the input: exit 1, not 2
    src = source(node, nvml=broken, fail_on_init_error=False)
    t = src.load()
    assert t.gpus == () and t.nics == node.topology.nics
    assert src.gpu_init_error is not None


def test_nic_only_source_never_touches_nvml(node):
    src = source(node, gpus=False)
    t = src.load()
    assert t.gpus == () and t.nics == node.topology.nics
    assert src.description.startswith("sysfs")


def test_read_numa_without_node_dirs(tmp_path):
    assert read_numa(str(tmp_path)) == ([], {})


def test_config_health_mapping_becomes_gpu_health_options(node):
    src = source(node, gpu_health={"recoveryQuietPeriodSeconds": 0.2, "ignoredXids": [13]})
    opts = src._gpu_source.health
    assert isinstance(opts, GpuHealthOptions) and opts.quiet_period_s == 0.2 and opts.ignored_xids == {13}


async def test_watch_merges_gpu_health_and_nic_hotplug(node):
    nvml = fake_nvml(node)
    udev = FakeUdev()
    src = source(node, nvml=nvml, udev=udev, gpu_health=GpuHealthOptions(quiet_period_s=0.3, wait_timeout_ms=50))
    first = await asyncio.to_thread(src.load)
    published: list[NodeTopology] = []
    task = asyncio.create_task(src.watch(first, published.append))
    assert await asyncio.to_thread(nvml.wait_registered, None, 5.0)
    nvml.inject_xid("GPU3", 48)  # reset GPU; the driver's recovery action reads none: back after the quiet period
    await _until(lambda: published and published[-1].device("GPU3").health == UNHEALTHY, timeout=10)
    # A NIC hot-plug meanwhile: the rescan must keep GPU3 unhealthy.
    eno2 = node.function("eno2").bdf
    os.unlink(os.path.join(node.sysfs_root, "bus", "pci", "devices", eno2))
    udev.send("remove", "pci", eno2)
    await _until(lambda: eno2 not in {d.name for d in published[-1].nics})
    assert published[-1].device("GPU3").health == UNHEALTHY
    # And the GPU recovers after the quiet period.
    await _until(lambda: published[-1].device("GPU3").healthy, timeout=10)
    assert eno2 not in {d.name for d in published[-1].nics}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _until(pred, timeout=3.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def test_demo_writer_gives_a_consistent_node_config_and_simulated_twin(tmp_path):
    node = write_demo(str(tmp_path / "demo"))
    for name in ("config.yaml", "node.yaml"):
        assert os.path.exists(os.path.join(node.root, name))
    twin = load_simulated(os.path.join(node.root, "node.yaml"))
    assert [(d.name, d.numa, d.pci_bus_id) for d in twin.devices] == \
           [(d.name, d.numa, d.pci_bus_id) for d in node.topology.devices]
    assert {k: v.label for k, v in twin.links.items()} == {k: v.label for k, v in node.topology.links.items()}
    # The fake NVML built from the written YAML discovers the same GPUs.
    t = source(node, nvml=fake_nvml(os.path.join(node.root, "node.yaml"))).load()
    assert t.gpus == node.topology.gpus
    assert simulated_node_yaml(node) == open(os.path.join(node.root, "node.yaml")).read()


def test_end_to_end_resources_and_allocate_on_the_generated_node(node):
    import yaml

    t = source(node).load()
    raw = yaml.safe_load(example_config(node))["nics"]["resourceList"]
    pools = parse_pools(raw, "config.yaml", dev_root=node.dev_root)
    res = {r.name: r for r in build_resources(t, ResourceOptions(nic_pools=pools))}
    assert set(res) == {"nvidia.com/gpu", "topo.dev/sriov_vfio", "topo.dev/rdma_ib", "topo.dev/sriov_a",
                        "topo.dev/sriov_b", "topo.dev/pf_mlx", "example.com/pf_other"}
    assert [d.id for d in res["topo.dev/sriov_a"].devices] == node.function("ens1f0").vfs[:3]
    assert {d.numa for d in res["topo.dev/sriov_b"].devices} == {1}
    vfio = res["topo.dev/sriov_vfio"]
    out = vfio.allocate([vfio.devices[0].id])
    assert [d.container_path for d in out.devices][0] == "/dev/vfio/vfio"
    # The allocator's graph has GPU-facing NIC ports.
    assert res["topo.dev/sriov_b"].graph.ports == tuple(node.function("ens2f0").bdf for _ in range(4))


def test_expected_topology_round_trips_through_replace(node):
    # NodeTopology equality is what the daemon uses to decide whether to push: make sure
    # an identical rediscovery compares equal (dict attributes, not identity).
    a = source(node).load()
    b = source(node).load()
    assert a == b and a is not b
    assert replace(a, source="x") != a


def test_grouped_pcie_links_equal_asking_every_pair(node):
    from plugin.sources.hardware import pcie_links
    from plugin.sources.pcie import pcie_level

    t = source(node).load()
    gpus, nics = list(t.gpus), list(t.nics)
    fast = pcie_links(node.sysfs_root, gpus, nics)
    every = {}
    for g in gpus:
        for n in nics:
            every[(g.name, n.name)] = pcie_level(node.sysfs_root, g.pci_bus_id, n.pci_bus_id, g.numa, n.numa)
    for i, a in enumerate(nics):
        for b in nics[i + 1:]:
            every[(a.name, b.name)] = pcie_level(node.sysfs_root, a.pci_bus_id, b.pci_bus_id, a.numa, b.numa)
    assert {k: v.level for k, v in fast.items()} == every
