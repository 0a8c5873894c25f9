"""Where a GetPreferredAllocation is answered: on the event loop when provably cheap, else on the pool.

The rule (`plugin.allocation.preferred.on_loop`): at most `LOOP_MAX_DEVICES` devices in the resource and at
most `LOOP_MAX_SETS` candidate sets summed over the call's container requests; everything else
goes to the search threads. The daemon counts each search by where it ran
(`topo_dp_preferred_allocation_searches_total{where=...}`): the tests read that count from a real
daemon's /metrics and check the answers are the policy's own, whichever path gave them.
"""

from __future__ import annotations

import math
import re

import grpc
import pytest
from daemon_testlib import GPU, hard_node_yaml, preferred_request

from allocator.policies import get_policy
from allocator.request import AllocationRequest
from plugin.allocation import preferred
from plugin.api import api_pb2_grpc
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated

from test_metrics_health import free_port, get, poll_http, wait_http

IDS = [str(i) for i in range(64)]


def at_the_bound(k: int = 5) -> int:
    """The most available devices a request for `k` may list and stay within the bound of candidate sets
    (for k = 5: 14, and one more is still in the exact range of 16, so every answer here is the optimum)."""
    return max(a for a in range(k, 64) if math.comb(a, k) <= preferred.LOOP_MAX_SETS)


def test_the_bound_decides_the_path():
    k = 5
    a = at_the_bound(k)
    at_bound = preferred_request((IDS[:a], [], k))
    assert preferred.on_loop(at_bound, 64)
    # one more candidate set than the bound allows: C(a, k) grows with a one device more
    assert not preferred.on_loop(preferred_request((IDS[:a + 1], [], k)), 64)
    # must-include devices are not choices: the same request with one of them needs C(a-1, k-1) sets
    assert preferred.on_loop(preferred_request((IDS[:a + 1], IDS[:1], k + 1)), 64)
    # the sum over container requests counts, not each alone
    half = next(n for n in range(2, 64) if math.comb(n, 2) > preferred.LOOP_MAX_SETS // 2)
    assert preferred.on_loop(preferred_request((IDS[:half], [], 2)), 64)
    assert not preferred.on_loop(preferred_request((IDS[:half], [], 2), (IDS[:half], [], 2)), 64)
    # forced answers (everything, or only the must-include) are one set, at any size
    assert preferred.on_loop(preferred_request((IDS, [], 64)), 64)
    assert preferred.on_loop(preferred_request((IDS, IDS[:40], 40)), 64)
    # a resource above the device bound goes to the pool whatever it asks
    assert not preferred.on_loop(preferred_request((IDS[:2], [], 1)), preferred.LOOP_MAX_DEVICES + 1)


def searches(metrics: str, where: str) -> float:
    m = re.search(rf'topo_dp_preferred_allocation_searches_total{{resource="{re.escape(GPU)}",where="{where}"}} '
                  r'(\S+)', metrics)
    return float(m.group(1)) if m else 0.0


@pytest.fixture
def hard_node(tmp_path):
    node = tmp_path / "node.yaml"
    node.write_text(hard_node_yaml())
    return node


async def test_cheap_requests_are_answered_on_the_loop_and_the_rest_on_the_pool(kubelet, start_daemon, plugin_dir,
                                                                               hard_node):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    start_daemon("--metrics-address", f"127.0.0.1:{port}", simulate=str(hard_node))
    await wait_http(base + "/healthz")
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 64, timeout=30)
    endpoint = kubelet.registrations_of(GPU)[0].endpoint
    # The same policy in this process, on the same node: the daemon's answer whichever path it took.
    resource = build_resources(load_simulated(str(hard_node)), ResourceOptions(device_id_strategy="index"))[0]
    policy = get_policy(resource.policy, **dict(resource.policy_options))
    k = 5
    a = at_the_bound(k)
    cheap = [(IDS[10:10 + a], [], k), (IDS, [], 64), (IDS[:9], ["3"], 5)]
    # above the bound: C(a + 1, k) sets; and C(16, 8) = 12,870
    costly = [(IDS[10:11 + a], [], k), (IDS[:16], [], 8)]
    async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{endpoint}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        for n, (available, must, size) in enumerate(cheap + costly):
            resp = await stub.GetPreferredAllocation(preferred_request((available, must, size)))
            want = policy.allocate(resource.graph, AllocationRequest.of(available, must, size))
            assert list(resp.container_responses[0].deviceIDs) == list(want.ids), (available, must, size)
    _, metrics = await poll_http(base + "/metrics",
                                 lambda _, b: searches(b, "loop") + searches(b, "pool") == len(cheap + costly))
    assert searches(metrics, "loop") == len(cheap), metrics
    assert searches(metrics, "pool") == len(costly), metrics
    # a bad request on the loop path is refused with the same message as on the pool path
    async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{endpoint}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        for available in (IDS[:3], IDS[:63]):  # the loop path, then the pool path (C(64, 3) sets)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.GetPreferredAllocation(preferred_request((available + ["nope"], [], 3)))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert e.value.details().startswith("container_requests[0]: unknown device IDs"), e.value.details()
    assert (await get(base + "/healthz"))[0] == 200
