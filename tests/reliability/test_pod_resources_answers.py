"""The pod-resources check against a kubelet that answers too much or is called too often (issue 19).

A user would notice: a large `List` answer stalling the other resource's RPCs (it was decoded
on the event loop: a 13 MiB answer held every request for about half a second) and growing the
daemon's memory; a burst of paired requests sending the kubelet a burst of `List` calls (its
pod-resources rate limit is 100/s, burst 10, shared with monitoring agents).

The daemon runs in this process on real unix sockets (the device-plugin kubelet stand-in and the
pod-resources stand-in on another socket), so the stand-in can hold its answer and count calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import AsyncIterator

import pytest
from daemon_testlib import GPU, NIC
from topo_testkit.pod_resources_standin import PodResourcesStandin

from plugin.runtime.daemon import Daemon, DaemonOptions
from topo_testkit.device_manager import StandinDeviceManager
from topo_testkit.kubelet_standin import KubeletStandin
from plugin.allocation.pod_resources import MAX_ANSWER_BYTES
from plugin.model.resources import ResourceOptions
from plugin.sources.simulated.source import SimulatedSource

pytestmark = pytest.mark.timeout(300)

NICS = [f"mlx5_{i}" for i in range(8)]  # dgx-h100: GPU i has mlx5_i on its PCIe switch (PIX)
GPUS = [str(i) for i in range(8)]
#: Filler pods of the stand-in's answer: about 50 bytes each, so this is well over the cap.
OVER_CAP_PODS = MAX_ANSWER_BYTES // 40


@contextlib.asynccontextmanager
async def node(plugin_dir: str, **options: object) -> AsyncIterator[tuple[KubeletStandin, PodResourcesStandin]]:
    socket = os.path.join(plugin_dir, "pr", "kubelet.sock")  # unix socket paths: 108 bytes at most
    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    lister = PodResourcesStandin(StandinDeviceManager(kubelet, random.Random(1)))
    await lister.start(socket)
    daemon = Daemon(SimulatedSource("dgx-h100"),
                    DaemonOptions(plugin_dir=plugin_dir, pod_resources_socket=socket, **options),
                    ResourceOptions(device_id_strategy="index", pairing_window_s=600.0))
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop, install_signals=False))
    try:
        await kubelet.wait_for(lambda: all(kubelet.devices(r) for r in (GPU, NIC)), timeout=60)
        yield kubelet, lister
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 60) == 0
        await lister.stop()
        await kubelet.stop()


async def test_an_over_cap_answer_is_refused_and_the_other_resource_is_served_meanwhile(plugin_dir, caplog):
    caplog.set_level(logging.DEBUG, logger="plugin")
    # The List deadline is lifted so the stand-in can hold its answer as long as the test needs:
    # what is checked is the order of events, not how fast they happen.
    async with node(plugin_dir, pod_resources_timeout_s=120.0) as (kubelet, lister):
        lister.filler_pods = OVER_CAP_PODS
        lister.gate = asyncio.Event()
        await kubelet.allocate(GPU, ["3"])  # the container's GPU: partner of its NIC request
        paired = asyncio.create_task(kubelet.preferred(NIC, NICS, [], 1))
        await asyncio.wait_for(lister.listing.wait(), 60)  # the paired request is reading List
        # The other resource is answered while the paired request still waits for the kubelet.
        other = await asyncio.wait_for(kubelet.preferred(GPU, GPUS, [], 2), 60)
        assert len(other) == 2 and not paired.done()
        lister.gate.set()
        got = await asyncio.wait_for(paired, 60)
    # The answer was refused, so the partners were not checked: they are the call sequence's, and
    # the request is answered with them (GPU 3's own NIC), as without --pod-resources.
    assert got == ["mlx5_3"]
    refusals = [r for r in caplog.records if r.name == "plugin.allocation.pod_resources" and "refused" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelno == logging.WARNING
    message = refusals[0].getMessage()
    assert f"over the cap of {MAX_ANSWER_BYTES} bytes" in message
    size = refusals[0].size_bytes
    assert size > MAX_ANSWER_BYTES and f"{size} bytes" in message
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)


async def test_a_burst_of_paired_requests_in_one_group_makes_one_list_call(plugin_dir):
    async with node(plugin_dir) as (kubelet, lister):
        await kubelet.allocate(GPU, ["5"])
        answers = await asyncio.gather(*(kubelet.preferred(NIC, NICS, [], 1) for _ in range(16)))
        assert answers == [["mlx5_5"]] * 16  # every one paired with the group's GPU
        assert lister.list_calls == 1
        # The next container (a GPU Allocate again starts a new group): its request reads List anew.
        await kubelet.allocate(NIC, ["mlx5_5"])
        await kubelet.allocate(GPU, ["2"])
        assert await kubelet.preferred(NIC, [n for n in NICS if n != "mlx5_5"], [], 1) == ["mlx5_2"]
        assert lister.list_calls == 2
