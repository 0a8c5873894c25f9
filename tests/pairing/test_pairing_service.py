"""`PairingService`: the partners a request gets and the pairs an Allocate completes, on a simulated DGX H100."""

from __future__ import annotations

import asyncio
import os

from topo_testkit.pod_resources_standin import PodResourcesStandin

from topo_testkit.device_manager import StandinDeviceManager, pod
from plugin.allocation.pairing_service import PairingService
from plugin.allocation.pod_resources import PodResourcesReader
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated

GPU, NIC = "nvidia.com/gpu", "topo.dev/nic"


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def service(window_s: float = 1.0, clock: Clock | None = None) -> PairingService:
    topology = load_simulated("dgx-h100")
    s = PairingService(window_s, clock or Clock())
    s.rebuild(topology, {r.name: r.devices
                         for r in build_resources(topology, ResourceOptions(device_id_strategy="index"))})
    return s


async def test_partners_are_the_groups_devices_with_their_weights():
    s = service()
    assert not await s.partners(GPU)
    s.on_allocate(GPU, ["0", "5"])
    p = await s.partners(NIC)
    assert p.ids == (f"{GPU}=0", f"{GPU}=5")
    assert p.row("mlx5_0") == (50, 10) and p.row("mlx5_5") == (10, 50)  # PIX / SYS


async def test_an_allocate_completes_pairs_with_the_best_one_to_one_matching():
    s = service()
    assert s.on_allocate(GPU, ["0", "1"]) == ()
    pairs = s.on_allocate(NIC, ["mlx5_1", "mlx5_0", "mlx5_6"])
    assert sorted((p.device, p.partner, p.link) for p in pairs) == [
        ("mlx5_0", f"{GPU}=0", "PIX"), ("mlx5_1", f"{GPU}=1", "PIX")]  # one NIC per GPU
    # The next container's first Allocate starts a new group: no pairs with the old one.
    assert s.on_allocate(GPU, ["6"]) == ()
    assert [p.link for p in s.on_allocate(NIC, ["mlx5_1"])] == ["SYS"]


async def test_window_zero_gives_no_partners_but_still_counts_pairs():
    s = service(window_s=0.0)
    s.on_allocate(GPU, ["3"])
    assert not await s.partners(NIC)
    assert [p.link for p in s.on_allocate(NIC, ["mlx5_3"])] == ["PIX"]
    s.set_window(0.5)
    assert s.enabled and s.window_s == 0.5


async def test_the_window_is_counted_from_the_last_allocate():
    clock = Clock()
    s = service(window_s=1.0, clock=clock)
    s.on_allocate(GPU, ["2"])
    clock.now = 1.0
    assert (await s.partners(NIC)).ids == (f"{GPU}=2",)
    s.on_allocate(GPU, ["4"])  # a call for GPUs: a new group, its window starts now
    clock.now = 2.5
    assert not await s.partners(NIC)



async def test_a_cancelled_request_never_cancels_the_shared_pod_resources_query(short_tmp):
    """Two paired requests of one group share one List; the first is cancelled (its deadline passed)
    while List is in flight: the second still gets the checked partners, from that same call."""
    path = os.path.join(short_tmp, "kubelet.sock")
    dm = StandinDeviceManager(kubelet=None)  # List only reads the pods below
    # Another container already holds GPU 4 and a NIC: List proves GPU 4 is no partner of a NIC request.
    dm.specs["slow"] = pod("slow", {NIC: 1, GPU: 1}, names=("c",))
    dm.pods["slow"] = {"c": {NIC: ("mlx5_0",), GPU: ("4",)}}
    lister = PodResourcesStandin(dm)
    lister.gate = asyncio.Event()
    await lister.start(path)
    s = service(window_s=600.0)
    s.pod_resources = PodResourcesReader(path, timeout_s=120.0)  # the stand-in holds List: no deadline here
    try:
        s.on_allocate(GPU, ["2", "4"])
        first = asyncio.create_task(s.partners(NIC))
        await asyncio.wait_for(lister.listing.wait(), 60)
        second = asyncio.create_task(s.partners(NIC))
        first.cancel()
        lister.gate.set()
        p = await asyncio.wait_for(second, 60)
        assert first.cancelled()
        assert p.ids == (f"{GPU}=2",)  # GPU 4 dropped: List was read, and only once
        assert lister.list_calls == 1
    finally:
        await s.close()
        await lister.stop()
