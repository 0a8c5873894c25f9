"""NCCL hints in device-plugin mode (`--nccl-env`): what a container's Allocate answers tell NCCL.

The real daemon discovers generated nodes (sysfs files + the NVML double) and
serves them on real unix sockets; the kubelet stand-in's device-manager walk
admits pods the way the kubelet does (per container, its resources one after
the other, GetPreferredAllocation then Allocate). The container's environment
is merged from its Allocate answers as the kubelet merges it
(devicemanager `deviceRunContainerOptions`: a variable set by two answers
keeps an arbitrary one), so every hint variable must come from exactly one
answer. The expected values come from the node's layout
(`topo_testkit.nccl_nodes.expected_hint`), not from the code under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field, replace

import pytest

from plugin.model.gpu_allocate import GpuAllocateOptions
from plugin.model.resources import ResourceOptions
from plugin.runtime.changes import ConfigReload
from plugin.runtime.daemon import Daemon, DaemonOptions
from plugin.sources.hardware import hardware_source_from_options
from plugin.sources.udev_hotplug import UdevUnavailable
from topo_testkit.device_manager import StandinDeviceManager, pod
from topo_testkit.kubelet_standin import KubeletStandin
from topo_testkit.nccl_nodes import (
    dgx_h100_ethernet_node,
    dgx_h100_node,
    expected_hint,
    gb300_cx8_dd_node,
    partner,
)
from topo_testkit.sysfs_fixture import GeneratedNode, fake_nvml, write_node

GPU, NIC = "nvidia.com/gpu", "topo.dev/nic"
NODES = {"dgx-h100": dgx_h100_node, "dgx-h100-ethernet": dgx_h100_ethernet_node, "gb300-cx8-dd": gb300_cx8_dd_node}


#: Far above any gap between one container's calls on a busy machine; pods are set apart by moving
#: the daemon's pairing clock past it (`Clock.next_pod`), as pods admitted at different times are.
WINDOW_S = 600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def next_pod(self) -> None:
        self.now += 2 * WINDOW_S


def no_udev(_subsystems):
    raise UdevUnavailable("no udev in this test")


@dataclass
class RecordingDeviceManager(StandinDeviceManager):
    """The walk, keeping each Allocate answer's environment per (pod, container)."""

    answers: dict[tuple[str, str], list[tuple[str, dict[str, str]]]] = field(default_factory=dict)
    daemon: Daemon | None = None

    async def _allocate(self, res: str, pod: str, container: str, ids: list[str]) -> None:
        resp = await self.kubelet.allocate(res, ids)
        self.answers.setdefault((pod, container), []).append((res, dict(resp.envs)))

    def nccl(self, pod: str, container: str = "c") -> dict[str, str]:
        """The container's NCCL variables; each must be set by one answer only (see the module doc)."""
        out: dict[str, str] = {}
        for res, env in self.answers[(pod, container)]:
            for k, v in env.items():
                if k.startswith("NCCL_"):
                    assert k not in out, f"{k} set by two Allocate answers ({out[k]!r}, then {v!r} by {res})"
                    out[k] = v
        return out


@pytest.fixture
def plugin_dir(short_tmp: str) -> str:
    return short_tmp  # unix socket paths must stay short (tests/conftest.py)


@contextlib.asynccontextmanager
async def serving(node: GeneratedNode, plugin_dir: str, nccl_env: bool, clock: Clock | None = None,
                  reloaded_nccl_env: bool | None = None):
    source = hardware_source_from_options(
        sysfs_root=node.sysfs_root, dev_root=node.dev_root, proc_root=node.proc_root, nvml=fake_nvml(node),
        node_name=node.spec.name, monitor_factory=no_udev)
    options = ResourceOptions(gpu_allocate=GpuAllocateOptions(dev_root=node.dev_root), dev_root=node.dev_root,
                              pairing_window_s=WINDOW_S, nccl_env=nccl_env)
    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    reloaded = replace(options, nccl_env=reloaded_nccl_env) if reloaded_nccl_env is not None else None
    daemon = Daemon(source, DaemonOptions(plugin_dir=plugin_dir), options, clock=clock or Clock(),
                    reload_resources=(lambda: reloaded) if reloaded is not None else None)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop, install_signals=False))
    try:
        await kubelet.wait_for(lambda: all(kubelet.devices(r) for r in (GPU, NIC)), timeout=20)
        yield RecordingDeviceManager(kubelet, random.Random(7), shuffle_resources=False, daemon=daemon)
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0
        await kubelet.stop()


def bdfs(node: GeneratedNode, got: dict[str, tuple[str, ...]]) -> tuple[list[str], list[str]]:
    """The PCI addresses of a container's GPUs (plugin IDs are UUIDs) and NICs (IDs are addresses)."""
    by_uuid = {g.uuid: g.pci_bus_id for g in node.topology.gpus}
    return [by_uuid[i] for i in got.get(GPU, ())], list(got.get(NIC, ()))


@pytest.mark.parametrize("first", [GPU, NIC], ids=["gpus-first", "nics-first"])
@pytest.mark.parametrize("name", list(NODES))
async def test_the_hint_names_the_containers_nics_each_gpus_own_first(name, first, plugin_dir, tmp_path):
    node = write_node(NODES[name](), str(tmp_path / "node"))
    second = NIC if first == GPU else GPU
    async with serving(node, plugin_dir, nccl_env=True) as dm:
        got = (await dm.admit(pod("job", {first: 2, second: 2}, names=("c",))))["c"]
        gpus, nics = bdfs(node, got)
        # Pairing gave each GPU its own NIC, so the order below is the GPUs' (the case under test).
        assert all(partner(node, g, nics) for g in gpus)
        want = expected_hint(node, gpus, nics)
        assert dm.nccl("job") == want
        # Only the second Allocate knows both; the first answer carries no hint.
        [(res0, env0), (res1, env1)] = dm.answers[("job", "c")]
        assert (res0, res1) == (first, second)
        assert not any(k.startswith("NCCL_") for k in env0) and set(want) <= set(env1)
    if name == "gb300-cx8-dd":
        # GPU0's NIC is the second in PCI order: a hint in NIC order would differ.
        assert want["NCCL_IB_HCA"] != "=" + ",".join(f"{node.function(n).rdma_dev}:1" for n in sorted(nics))
    if name == "dgx-h100-ethernet":
        assert "NCCL_IB_HCA" not in want and want["NCCL_SOCKET_IFNAME"].startswith("=ens")
    else:
        assert "NCCL_SOCKET_IFNAME" not in want and want["NCCL_IB_HCA"].startswith("=mlx5_")


async def test_pods_one_after_another_each_get_their_own_nics(plugin_dir, tmp_path):
    node = write_node(dgx_h100_node(), str(tmp_path / "node"))
    async with serving(node, plugin_dir, nccl_env=True) as dm:
        # Back to back, within the window: a pod's first call for a resource the last pod had starts its group.
        for i, limits in enumerate(({GPU: 1, NIC: 1}, {GPU: 3, NIC: 3}, {NIC: 2, GPU: 2})):
            got = (await dm.admit(pod(f"p{i}", limits, names=("c",))))["c"]
            assert dm.nccl(f"p{i}") == expected_hint(node, *bdfs(node, got))
    hcas = [set(dm.nccl(f"p{i}")["NCCL_IB_HCA"].removeprefix("=").split(",")) for i in range(3)]
    assert [len(h) for h in hcas] == [1, 3, 2] and not (hcas[0] & hcas[1] or hcas[1] & hcas[2] or hcas[0] & hcas[2])


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-h100-ethernet"])
async def test_off_by_default(name, plugin_dir, tmp_path):
    node = write_node(NODES[name](), str(tmp_path / "node"))
    assert ResourceOptions().nccl_env is False
    async with serving(node, plugin_dir, nccl_env=ResourceOptions().nccl_env) as dm:
        got = (await dm.admit(pod("job", {GPU: 2, NIC: 2}, names=("c",))))["c"]
    assert expected_hint(node, *bdfs(node, got))  # the hint there would have been
    assert dm.nccl("job") == {}


async def test_gpus_without_nics_and_nics_without_gpus_get_no_hint(plugin_dir, tmp_path):
    node = write_node(dgx_h100_node(), str(tmp_path / "node"))
    clock = Clock()
    async with serving(node, plugin_dir, nccl_env=True, clock=clock) as dm:
        await dm.admit(pod("gpus", {GPU: 2}, names=("c",)))
        clock.next_pod()
        await dm.admit(pod("nics", {NIC: 2}, names=("c",)))
        clock.next_pod()
        await dm.admit(pod("both", {GPU: 1, NIC: 1}, names=("c",)))
    assert dm.nccl("gpus") == dm.nccl("nics") == {}
    assert dm.nccl("both")  # the control: GPUs and NICs in one container do get it


async def test_a_config_reload_applies_the_option_to_later_containers(plugin_dir, tmp_path):
    node = write_node(dgx_h100_node(), str(tmp_path / "node"))
    async with serving(node, plugin_dir, nccl_env=False, reloaded_nccl_env=True) as dm:
        got = (await dm.admit(pod("before", {GPU: 1, NIC: 1}, names=("c",))))["c"]
        assert dm.daemon is not None
        dm.daemon.changes.submit(ConfigReload("test"))
        await asyncio.wait_for(dm.daemon.changes.idle(), 30)
        later = (await dm.admit(pod("after", {NIC: 1, GPU: 1}, names=("c",))))["c"]
    assert dm.nccl("before") == {} and expected_hint(node, *bdfs(node, got))
    assert dm.nccl("after") == expected_hint(node, *bdfs(node, later)) != {}
