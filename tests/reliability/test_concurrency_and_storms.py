"""Many clients at once, and a storm of kubelet restarts, against a real daemon process.

A user would notice: RPCs failing or wedging while the kubelet's stream is open and other
clients are busy; after a burst of kubelet restarts (a crash-looping kubelet), a plugin left
with no registration, two live streams for one resource, or an old stream ending a newer one
(kubernetes #121994).
"""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from daemon_testlib import GPU, NIC, allocate_request, preferred_request

from plugin.api import api_pb2, api_pb2_grpc

pytestmark = pytest.mark.timeout(600)

CLIENTS = 64
CALLS_PER_CLIENT = 20
RESTARTS = 200


async def _client(path: str, ids: list[str], seed: int) -> list[str]:
    rng = random.Random(seed)
    problems = []
    async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        for _ in range(CALLS_PER_CLIENT):
            size = rng.randint(1, len(ids))
            avail = rng.sample(ids, rng.randint(size, len(ids)))
            try:
                pref = await stub.GetPreferredAllocation(preferred_request((avail, [], size)), timeout=120)
                got = list(pref.container_responses[0].deviceIDs)
                if len(got) != size or not set(got) <= set(avail):
                    problems.append(f"preferred {got} for size {size} of {avail}")
                alloc = await stub.Allocate(allocate_request(got), timeout=120)
                if len(alloc.container_responses) != 1:
                    problems.append("Allocate answered no container")
                await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=120)
            except grpc.aio.AioRpcError as e:
                problems.append(f"{e.code()}: {e.details()}")
    return problems


async def test_sixty_four_clients_at_once_while_the_kubelet_streams(kubelet, start_daemon, plugin_dir):
    daemon = start_daemon()
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8 and len(kubelet.devices(NIC)) == 8, timeout=60)
    ids = sorted(kubelet.devices(GPU))
    path = f"{plugin_dir}/{kubelet.registrations_of(GPU)[0].endpoint}"
    results = await asyncio.gather(*(_client(path, ids, seed) for seed in range(CLIENTS)))
    problems = [p for r in results for p in r]
    assert not problems, problems[:10]
    # The kubelet's stream stayed up the whole time, with its one registration.
    assert not kubelet.client(GPU).stopped and len(kubelet.registrations_of(GPU)) == 1
    assert kubelet.max_live_streams == {GPU: 1, NIC: 1}
    assert daemon.proc.poll() is None


async def test_a_storm_of_two_hundred_kubelet_restarts(kubelet, start_daemon):
    daemon = start_daemon()
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8 and len(kubelet.devices(NIC)) == 8, timeout=60)
    for _ in range(RESTARTS):  # back to back: the daemon sees a crash-looping kubelet
        await kubelet.restart()
    # After the storm the daemon is registered with the last kubelet, one stream per resource.
    await kubelet.wait_for(lambda: bool(kubelet.clients.get(GPU)) and bool(kubelet.clients.get(NIC))
                           and len(kubelet.devices(GPU)) == 8 and len(kubelet.devices(NIC)) == 8, timeout=120)
    await asyncio.sleep(1.5)  # a late duplicate registration or a second stream would show up here
    assert kubelet.max_live_streams == {GPU: 1, NIC: 1}
    assert kubelet.disconnected_newer == []
    assert not kubelet.client(GPU).stopped and not kubelet.client(NIC).stopped
    assert daemon.proc.poll() is None, daemon.log()[-3000:]
    assert await daemon.terminate(timeout=60) == 0
