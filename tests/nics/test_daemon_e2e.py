"""End to end on a generated node: fake NVML + generated sysfs -> the real daemon -> a kubelet stand-in.

Registered resources, device lists with NUMA nodes, Allocate responses for GPUs
and NIC pools, and hot-plug / GPU health reaching the ListAndWatch streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time

import pytest
import yaml

from plugin.runtime.daemon import Daemon, DaemonOptions
from plugin.model.gpu_allocate import GpuAllocateOptions
from plugin.health.options import GpuHealthOptions
from topo_testkit.kubelet_standin import KubeletStandin
from plugin.model.nic_pools import parse_pools
from plugin.model.resources import ResourceOptions
from plugin.sources.hardware import hardware_source_from_options
from plugin.sources.udev_hotplug import UdevUnavailable
from topo_testkit.fake_udev import FakeUdev
from topo_testkit.sysfs_fixture import example_config, fake_nvml


def no_udev(_subsystems):
    raise UdevUnavailable("no udev in this test")


@pytest.fixture
def plugin_dir(short_tmp: str) -> str:
    return short_tmp  # unix socket paths must stay short (tests/conftest.py)


@contextlib.asynccontextmanager
async def running(node, plugin_dir, nvml, udev=None):
    source = hardware_source_from_options(
        sysfs_root=node.sysfs_root, dev_root=node.dev_root, proc_root=node.proc_root, nvml=nvml,
        node_name=node.spec.name, monitor_factory=udev if udev is not None else no_udev, debounce_s=0.02,
        gpu_health=GpuHealthOptions(quiet_period_s=0.3, wait_timeout_ms=50),
    )
    raw = yaml.safe_load(example_config(node))["nics"]["resourceList"]
    options = ResourceOptions(
        nic_pools=parse_pools(raw, "config.yaml", dev_root=node.dev_root),
        gpu_allocate=GpuAllocateOptions(dev_root=node.dev_root),
    )
    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    daemon = Daemon(source, DaemonOptions(plugin_dir=plugin_dir), options)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop, install_signals=False))
    try:
        yield daemon, source, kubelet
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 10) == 0
        await kubelet.stop()


EXPECTED = {"nvidia.com/gpu", "topo.dev/sriov_vfio", "topo.dev/rdma_ib", "topo.dev/sriov_a", "topo.dev/sriov_b",
            "topo.dev/pf_mlx", "example.com/pf_other"}


async def test_daemon_serves_discovered_gpus_and_nic_pools(node, plugin_dir):
    nvml = fake_nvml(node)
    async with running(node, plugin_dir, nvml) as (_daemon, _source, kubelet):
        await kubelet.wait_for(lambda: EXPECTED <= {r for r, c in kubelet.clients.items() if c.devices})
        gpus = kubelet.devices("nvidia.com/gpu")
        t = node.topology
        assert {g.uuid: (g.numa,) for g in t.gpus} == {i: d.numa for i, d in gpus.items()}
        vfs_b = kubelet.devices("topo.dev/sriov_b")
        assert sorted(vfs_b) == node.function("ens2f0").vfs
        assert {d.numa for d in vfs_b.values()} == {(1,)}
        assert all(d.health == "Healthy" for d in vfs_b.values())
        assert node.function("eno1").bdf not in kubelet.devices("example.com/pf_other")

        # Allocate: a vfio VF, the RDMA port, a GPU.
        vf = node.function("ens1f0").vfs[3]
        group = node.function(vf).iommu_group
        r = await kubelet.allocate("topo.dev/sriov_vfio", [vf])
        assert [(d.container_path, d.host_path) for d in r.devices] == [
            ("/dev/vfio/vfio", os.path.join(node.dev_root, "vfio", "vfio")),
            (f"/dev/vfio/{group}", os.path.join(node.dev_root, "vfio", str(group)))]
        assert r.envs["PCIDEVICE_TOPO_DEV_SRIOV_VFIO"] == vf
        assert json.loads(r.envs["PCIDEVICE_TOPO_DEV_SRIOV_VFIO_INFO"])[vf]["vfio"]["dev-mount"] == f"/dev/vfio/{group}"
        ib = node.function("ibp2s0f1").bdf
        r = await kubelet.allocate("topo.dev/rdma_ib", [ib])
        assert "/dev/infiniband/uverbs0" in [d.container_path for d in r.devices]
        assert json.loads(r.envs["PCIDEVICE_TOPO_DEV_RDMA_IB_INFO"])[ib]["rdma"]["rdma_dev"] == "mlx5_0"
        g0 = t.device("GPU0").uuid
        r = await kubelet.allocate("nvidia.com/gpu", [g0])
        assert r.envs["NVIDIA_VISIBLE_DEVICES"] == g0
        assert "/dev/nvidia0" in [d.container_path for d in r.devices]

        # Preferred allocation over a NIC pool: valid and NUMA-aligned.
        avail = sorted(kubelet.devices("topo.dev/sriov_b"))
        got = await kubelet.preferred("topo.dev/sriov_b", avail, [], 2)
        assert len(got) == 2 and set(got) <= set(avail)


async def test_hotplug_and_gpu_health_reach_the_streams(node, plugin_dir):
    nvml = fake_nvml(node)
    udev = FakeUdev()
    async with running(node, plugin_dir, nvml, udev) as (_daemon, _source, kubelet):
        await kubelet.wait_for(lambda: EXPECTED <= {r for r, c in kubelet.clients.items() if c.devices})
        # A VF disappears (driver unbound): the pool shrinks without a restart.
        gone = node.function("ens2f0").vfs[1]
        os.unlink(os.path.join(node.sysfs_root, "bus", "pci", "devices", gone, "driver"))
        udev.send("unbind", "pci", f"/devices/x/{gone}")
        await kubelet.wait_for(lambda: gone not in kubelet.devices("topo.dev/sriov_b")
                               and len(kubelet.devices("topo.dev/sriov_b")) == 3)
        # A critical XID: GPU2 goes Unhealthy on the stream, then recovers.
        assert await asyncio.to_thread(nvml.wait_registered, None, 5.0)
        uuid2 = node.topology.device("GPU2").uuid
        injected = time.monotonic()
        nvml.inject_xid("GPU2", 48)  # reset GPU; the driver's recovery action reads none
        await kubelet.wait_for(lambda: kubelet.devices("nvidia.com/gpu")[uuid2].health == "Unhealthy", timeout=10)
        await kubelet.wait_for(lambda: kubelet.devices("nvidia.com/gpu")[uuid2].health == "Healthy", timeout=10)
        # ...and back only after the quiet period (0.3 s here) without new errors
        assert time.monotonic() - injected >= 0.3
        assert gone not in kubelet.devices("topo.dev/sriov_b")
