"""A dead NVLink leaves the topology the allocator and the DRA slices use; the GPU stays Healthy; it returns.

The hardware source on a generated DGX-1 (NVLinks between GPU pairs, no NVSwitch) with NVML
answered by the double: one of the two NVLinks between GPU0 and GPU3 goes down (both ends, as on
real hardware), the driver reports XID 74, and the published topology has NV1 for that pair where
it had NV2. When NVML reports the link active again, the polling monitor sees it and the pair is
NV2 again, without another XID.
"""

from __future__ import annotations

import asyncio
import os

from topo_testkit.fake_nvml import FakeNvml, gpu_node_on_disk

from allocator.topology import HEALTHY, NodeTopology
from plugin.health.options import GpuHealthOptions
from plugin.sources.hardware import hardware_source_from_options
from plugin.sources.udev_hotplug import UdevUnavailable


def no_udev(_subsystems):
    raise UdevUnavailable("no udev in this test")


def link_between(fake: FakeNvml, a: str, b: str) -> int:
    """The first NVLink index of `a` whose remote end is `b`."""
    peer = fake.by_name[b].bdf
    return next(i for i, (remote, _t) in sorted(fake.by_name[a].links.items()) if remote == peer)


async def _until(pred, what: str, timeout: float = 30.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, what
        await asyncio.sleep(0.02)


async def test_an_nvlink_error_takes_the_dead_link_out_and_it_comes_back(tmp_path):
    fake, roots = gpu_node_on_disk(os.path.join(tmp_path, "n"), node="dgx-1-v100")
    source = hardware_source_from_options(
        sysfs_root=roots["sys"], dev_root=roots["dev"], proc_root=roots["proc"], nvml=fake, nics=False,
        monitor_factory=no_udev, debounce_s=0.02,
        gpu_health=GpuHealthOptions(quiet_period_s=0.2, wait_timeout_ms=50, probe_interval_s=0.05))
    first = await asyncio.to_thread(source.load)
    assert first.link("GPU0", "GPU3").nvlinks == 2
    published: list[NodeTopology] = []
    task = asyncio.create_task(source.watch(first, published.append))
    try:
        assert await asyncio.to_thread(fake.wait_registered, None, 10.0)
        a, b = link_between(fake, "GPU0", "GPU3"), link_between(fake, "GPU3", "GPU0")
        fake.set_link("GPU0", a, up=False)
        fake.set_link("GPU3", b, up=False)
        fake.inject_xid("GPU0", 74)
        await _until(lambda: published and published[-1].link("GPU0", "GPU3").nvlinks == 1,
                     "the dead link never left the topology")
        now = published[-1]
        assert all(g.health == HEALTHY for g in now.gpus), "an NVLink error leaves the GPU Healthy"
        assert {k: v for k, v in now.links.items() if k != ("GPU0", "GPU3")} == \
               {k: v for k, v in first.links.items() if k != ("GPU0", "GPU3")}
        fake.set_link("GPU0", a, up=True)
        fake.set_link("GPU3", b, up=True)
        await _until(lambda: published[-1].link("GPU0", "GPU3").nvlinks == 2, "the link never came back")
        assert published[-1].links == first.links
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
