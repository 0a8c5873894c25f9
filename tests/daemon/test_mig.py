"""MIG through the real daemon over real sockets: NVIDIA's strategies on simulated nodes, and the NVML path
(fake NVML + generated sysfs/procfs/dev) with MIG device nodes in Allocate and parent health events."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from plugin.api import api_pb2, api_pb2_grpc
from plugin.runtime.daemon import Daemon, DaemonOptions
from plugin.model.gpu_allocate import GpuAllocateOptions
from plugin.health.options import GpuHealthOptions
from plugin.model.resources import ResourceOptions
from plugin.sources.hardware import hardware_source_from_options
from plugin.sources.simulated import load_simulated
from topo_testkit.fake_nvml import FakeNvml, gpu_node_on_disk

GPU = "nvidia.com/gpu"
MIG_1G = "nvidia.com/mig-1g.10gb"


def parents_numa(node: str) -> dict[str, int | None]:
    return {str(g.index): g.numa for g in load_simulated(node).gpus}


async def test_mixed_serves_one_resource_per_profile_with_the_parents_numa(kubelet, start_daemon):
    start_daemon("--mig-strategy", "mixed", simulate="dgx-a100-mig")
    want = {GPU: 1, MIG_1G: 24, "nvidia.com/mig-2g.20gb": 2, "nvidia.com/mig-3g.40gb": 4,
            "nvidia.com/mig-7g.80gb": 1}
    await kubelet.wait_for(lambda: all(len(kubelet.devices(r)) == n for r, n in want.items()), timeout=15)
    numa = parents_numa("dgx-a100-mig")
    assert list(kubelet.devices(GPU)) == ["7"]  # the GPU with MIG off stays whole
    for name in want:
        for i, d in kubelet.devices(name).items():
            assert d.numa == (numa[i.split(":")[0]],), (name, i)
    assert sorted(kubelet.devices("nvidia.com/mig-3g.40gb")) == ["0:0", "3:0", "3:1", "6:0"]
    # the MIG policy: two 1g.10gb devices on one GPU, the fullest GPU first (GPU6 has 2 free, GPU0 1)
    pick = await kubelet.preferred(MIG_1G, list(kubelet.devices(MIG_1G)), [], 2)
    assert pick == ["6:2", "6:3"]
    resp = await kubelet.allocate(MIG_1G, pick)
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "6:2,6:3"


async def test_single_serves_every_mig_device_as_the_gpu_resource(kubelet, start_daemon):
    start_daemon("--mig-strategy", "single", simulate="dgx-a100-mig-1g", strategy="uuid")
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 56 and kubelet.devices("topo.dev/nic"), timeout=15)
    assert all(i.startswith("MIG-") for i in kubelet.devices(GPU))
    assert set(kubelet.clients) == {GPU, "topo.dev/nic"}


async def test_none_serves_mig_enabled_gpus_whole_as_nvidia_does(kubelet, start_daemon):
    start_daemon(simulate="dgx-a100-mig")  # --mig-strategy none is the default
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8, timeout=15)
    assert sorted(kubelet.devices(GPU), key=int) == [str(i) for i in range(8)]
    assert not any(r.startswith("nvidia.com/mig-") for r in kubelet.clients)


@pytest.mark.parametrize("node, words", [
    ("dgx-a100-mig", "more than one MIG profile on the node (1g.10gb on GPU0, GPU1, GPU2, GPU5, GPU6; "
                     "2g.20gb on GPU0, GPU6; 3g.40gb on GPU0, GPU3, GPU6; 7g.80gb on GPU4)"),
    ("dgx-a100", None),  # no GPU in MIG mode: single falls back to whole GPUs, as NVIDIA's plugin
])
async def test_single_refuses_mixed_profiles_and_falls_back_without_mig(kubelet, start_daemon, node, words):
    daemon = start_daemon("--mig-strategy", "single", simulate=node)
    if words is None:
        await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8, timeout=15)
        return
    assert await daemon.wait(15) == 2
    assert words in daemon.log() and "use --mig-strategy mixed" in daemon.log()


# -- the NVML path: fake NVML driven by the MIG node, its sysfs, procfs and device nodes -----------------
@pytest.fixture
def nvml_node(tmp_path):
    return gpu_node_on_disk(str(tmp_path))


@contextlib.asynccontextmanager
async def nvml_daemon(fake: FakeNvml, roots: dict[str, str], kubelet) -> AsyncIterator[None]:
    """The real daemon in this loop on the NVML path (fake NVML, generated roots, no NICs), MIG mixed,
    until the 24 1g.10gb MIG devices reached the kubelet stand-in."""
    source = hardware_source_from_options(
        sysfs_root=roots["sys"], dev_root=roots["dev"], proc_root=roots["proc"], nvml=fake, nics=False,
        hotplug=False, gpu_health=GpuHealthOptions(wait_timeout_ms=200))
    options = ResourceOptions(mig_strategy="mixed", dev_root=roots["dev"],
                              gpu_allocate=GpuAllocateOptions(dev_root=roots["dev"]))
    stop = asyncio.Event()
    task = asyncio.create_task(Daemon(source, DaemonOptions(plugin_dir=kubelet.plugin_dir), options)
                               .run(stop, install_signals=False))
    try:
        await kubelet.wait_for(lambda: len(kubelet.devices(MIG_1G)) == 24, timeout=15)
        yield
    finally:
        stop.set()
        await task


async def test_nvml_mig_allocate_gets_parent_and_capability_nodes(kubelet, nvml_node):
    fake, roots = nvml_node
    async with nvml_daemon(fake, roots, kubelet):
        mig = fake.by_name["GPU1"].migs[4]
        resp = await kubelet.allocate(MIG_1G, [mig.device.uuid])
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == mig.device.uuid
        dev = roots["dev"]
        assert sorted((d.container_path, d.host_path) for d in resp.devices) == sorted(
            [(f"/dev/{p}", f"{dev}/{p}") for p in (
                f"nvidia{fake.by_name['GPU1'].minor}", f"nvidia-caps/nvidia-cap{mig.caps[0]}",
                f"nvidia-caps/nvidia-cap{mig.caps[1]}", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
                "nvidia-modeset")])


async def test_nvml_xid_on_a_parent_marks_its_mig_devices_in_one_update(kubelet, plugin_dir, nvml_node):
    fake, roots = nvml_node
    async with nvml_daemon(fake, roots, kubelet):
        assert fake.wait_registered(timeout=15)
        on_gpu1 = {m.device.uuid for m in fake.by_name["GPU1"].migs.values()}
        endpoint = kubelet.registrations_of(MIG_1G)[-1].endpoint
        async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{endpoint}") as channel:
            stream = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty())
            assert {d.health for d in (await stream.read()).devices} == {"Healthy"}
            assert fake.inject_xid("GPU1", 79) == 1
            update = await asyncio.wait_for(stream.read(), timeout=15)
            stream.cancel()
        health = {d.ID: d.health for d in update.devices}
        assert {health[u] for u in on_gpu1} == {"Unhealthy"}
        assert {h for u, h in health.items() if u not in on_gpu1} == {"Healthy"}
