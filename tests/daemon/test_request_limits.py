"""No request can freeze or bloat the daemon (issue 9, defects 4 and 7).

Real daemon process, real gRPC on its unix socket. Nothing here measures time:
the tests assert what is refused, what is answered, what the log holds, and in
which order things happen while a search runs.
"""

from __future__ import annotations

import asyncio
import os
import re

import grpc
import pytest
import yaml
from topo_testkit.procfs import footprint
from daemon_testlib import GPU, allocate_request, cpu_seconds, hard_node_yaml, preferred_request, until

from plugin.api import api_pb2, api_pb2_grpc

IDS = [str(i) for i in range(8)]


@pytest.fixture
async def served(kubelet, start_daemon, plugin_dir):
    """The dgx-a100 node (8 GPUs, index IDs) and a stub on its GPU socket."""
    daemon = start_daemon()
    await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)), timeout=20)
    endpoint = kubelet.registrations_of(GPU)[0].endpoint
    async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{endpoint}") as channel:
        yield daemon, api_pb2_grpc.DevicePluginStub(channel)
    assert daemon.proc.poll() is None, "the daemon must survive every request"


async def refused(call, request) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call(request)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    return e.value.details()


async def test_absurd_requests_are_refused_naming_the_problem(served):
    _, stub = served
    # 20,000 container requests: the kubelet sends one; this used to be searched, all of it, on the loop
    details = await refused(stub.GetPreferredAllocation, preferred_request(*[(IDS, [], 4)] * 20000))
    assert "20000 container_requests" in details and "8 devices" in details
    # more IDs than the resource has devices
    details = await refused(stub.GetPreferredAllocation,
                            preferred_request(([f"GPU-{i}" for i in range(20000)], [], 1)))
    assert "available_deviceIDs lists 20000 IDs" in details and "only 8 devices" in details
    details = await refused(stub.GetPreferredAllocation, preferred_request((IDS, IDS * 2, 1)))
    assert "must_include_deviceIDs lists 16 IDs" in details
    # one ID of 500 KB: named by its start and its length, never echoed
    details = await refused(stub.GetPreferredAllocation, preferred_request((["0", "x" * 500_000], [], 1)))
    assert "longer than any ID this plugin advertised" in details and "(500000 chars)" in details
    assert len(details) < 1024
    # over the 1 MiB request cap, gRPC refuses it before it is decoded, naming both sizes
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.GetPreferredAllocation(preferred_request((["0", "x" * 3_000_000], [], 1)))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in e.value.details() and "1048576" in e.value.details()
    assert "9 container_requests" in await refused(stub.Allocate, allocate_request(*[["0"]] * 9))
    assert "devices_ids lists 9 IDs" in await refused(stub.Allocate, allocate_request(IDS + ["8"]))
    assert "lists 9 IDs" in await refused(stub.PreStartContainer,
                                          api_pb2.PreStartContainerRequest(devices_ids=IDS + ["x"]))
    # and ordinary requests are still answered
    ok = await stub.GetPreferredAllocation(preferred_request((IDS, [], 2)))
    assert len(ok.container_responses[0].deviceIDs) == 2


async def test_a_huge_bad_request_gets_a_short_informative_message(served):
    _, stub = served
    # Eight unknown IDs of 2 KB each (within the device count): a few named, cut, the rest counted.
    bad = [f"GPU-{n}-" + "f" * 2000 for n in range(8)]
    details = await refused(stub.Allocate, allocate_request(bad))
    assert "unknown device IDs for nvidia.com/gpu" in details
    assert details.count("...(2006 chars)") == 5 and details.endswith("+3 more")
    assert len(details) < 1024  # was 16 KB: a default gRPC C-core client reported RESOURCE_EXHAUSTED instead
    repeats = ["0", "1", "1", "2", "2", "3", "3", "3"]
    details = await refused(stub.GetPreferredAllocation, preferred_request((repeats, [], 1)))
    assert "repeats IDs: 1, 2, 3" in details
    # control characters in IDs are escaped, never written raw into the message or the log
    details = await refused(stub.PreStartContainer,
                            api_pb2.PreStartContainerRequest(devices_ids=["0", "evil\nline"]))
    assert "evil\\nline" in details and "\n" not in details


async def test_ten_thousand_rejections_keep_the_log_bounded(kubelet, start_daemon, plugin_dir):
    daemon = start_daemon()
    await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)), timeout=20)
    endpoint = kubelet.registrations_of(GPU)[0].endpoint
    async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{endpoint}") as channel:
        await _reject_ten_thousand(daemon, api_pb2_grpc.DevicePluginStub(channel))


async def _reject_ten_thousand(daemon, stub) -> None:
    before = os.path.getsize(daemon.log_path)
    # 8 unknown IDs of 40 characters per request: 10,000 of them used to add ~17 MB of log.
    request = preferred_request(([f"GPU-{n:036d}" for n in range(8)], [], 1))
    limit = asyncio.Semaphore(16)
    codes: list[grpc.StatusCode] = []

    async def one() -> None:
        async with limit:
            try:
                await stub.GetPreferredAllocation(request)
            except grpc.aio.AioRpcError as e:
                codes.append(e.code())

    await asyncio.gather(*(one() for _ in range(10000)))
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 10000
    assert daemon.proc.poll() is None
    assert await daemon.terminate() == 0  # the shutdown writes the pending "suppressed" summary
    with open(daemon.log_path, "rb") as f:
        grown = f.read()[before:].decode(errors="replace")
    assert len(grown) < 32 * 1024, f"the log grew by {len(grown)} bytes for 10,000 rejected requests"
    logged = grown.count("rejected request")
    suppressed = sum(int(n) for n in re.findall(r"suppressed=(\d+)", grown))
    # nothing is lost: every rejection is either logged or counted in a summary
    assert logged >= 1 and logged + suppressed == 10000, (logged, suppressed)


@pytest.fixture
def hard_node(tmp_path):
    node = tmp_path / "node.yaml"
    node.write_text(hard_node_yaml())
    return node


def hard_config(tmp_path, node, budget_ms: int) -> str:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"version": "v1", "flags": {
        "simulate": str(node), "deviceIdStrategy": "index", "timeBudgetMs": budget_ms}}))
    return str(config)


HARD_IDS = [str(i) for i in range(64)]


async def test_streams_and_small_requests_go_on_during_a_maximal_search(kubelet, start_daemon, plugin_dir,
                                                                        tmp_path, hard_node):
    # A maximal request: as many container requests as devices, each a search that no budget
    # proves; with a 60 s budget the first one alone runs for a minute.
    daemon = start_daemon("--config", hard_config(tmp_path, hard_node, 60000), "--device-plugin-path", plugin_dir,
                          "--log-level", "debug", raw=True)
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 64, timeout=30)
    client = kubelet.client(GPU)
    endpoint = kubelet.registrations_of(GPU)[0].endpoint
    async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{endpoint}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        cpu = cpu_seconds(daemon.pid)
        big = asyncio.ensure_future(stub.GetPreferredAllocation(preferred_request(*[(HARD_IDS, [], 32)] * 64)))
        # the search is running once the daemon has burnt a second of CPU on it (nothing else does)
        await until(lambda: cpu_seconds(daemon.pid) > cpu + 1.0, 60, "the daemon to start searching")
        assert not big.done()

        # a small request is answered while the big one is still being searched
        small_request = preferred_request((["0", "1", "2", "3"], [], 2))
        small = await asyncio.wait_for(stub.GetPreferredAllocation(small_request), 60)
        assert len(small.container_responses[0].deviceIDs) == 2
        assert not big.done(), "the small request must not wait for the whole big one"

        # a live edit of the node reaches the kubelet's stream while the big request is still pending
        data = yaml.safe_load(hard_node.read_text())
        data["gpus"][5]["health"] = "Unhealthy"
        tmp = hard_node.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
        updates = client.updates
        os.replace(tmp, hard_node)
        await kubelet.wait_for(lambda: client.updates > updates and kubelet.devices(GPU)["5"].health == "Unhealthy",
                               timeout=60)
        assert not big.done(), "the update must arrive while the search RPC is still pending"
        assert len(kubelet.registrations_of(GPU)) == 1 and not client.stopped
        big.cancel()
    # a search still running in a worker thread does not hold up shutdown
    assert await daemon.terminate(timeout=30) == 0


async def test_whole_request_deadline_bounds_a_many_container_request(kubelet, start_daemon, plugin_dir, tmp_path,
                                                                      hard_node):
    # 64 container requests, each allowed 2 s: 128 s of searching without a whole-request deadline.
    daemon = start_daemon("--config", hard_config(tmp_path, hard_node, 2000), "--device-plugin-path", plugin_dir,
                          raw=True)
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 64, timeout=30)
    endpoint = kubelet.registrations_of(GPU)[0].endpoint
    async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{endpoint}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        must = [["7"], [], ["1", "2"]] * 21 + [[]]
        resp = await asyncio.wait_for(
            stub.GetPreferredAllocation(preferred_request(*[(HARD_IDS, m, 32) for m in must])), timeout=60)
    # every container request still gets a valid answer: 32 distinct IDs with its must-include
    assert len(resp.container_responses) == 64
    for m, r in zip(must, resp.container_responses):
        ids = list(r.deviceIDs)
        assert len(ids) == 32 == len(set(ids)) and set(ids) <= set(HARD_IDS) and set(m) <= set(ids)
    assert daemon.proc.poll() is None


async def test_refused_large_requests_leave_no_memory_behind(served):
    # Every refused request must be freed at once: a client repeating a bad request near the 1 MiB cap
    # must not ratchet the daemon towards the chart's memory limit (with `context.abort` it kept ~20 MiB).
    daemon, stub = served
    bad = allocate_request(["0", "y" * 900_000])
    for _ in range(20):  # warm-up: gRPC's buffers and the allocator's arenas reach their working size
        await refused(stub.Allocate, bad)
    before = footprint(daemon.proc.pid).rss_mib
    for _ in range(300):
        await refused(stub.Allocate, bad)
    grown = footprint(daemon.proc.pid).rss_mib - before
    assert grown < 10, f"300 refused 900 KB requests grew the daemon by {grown:.1f} MiB"


async def test_undecodable_requests_cost_a_few_log_lines_not_one_traceback_each(served, plugin_dir):
    # gRPC itself logged an ERROR with a ~0.8 KB traceback per undecodable request: a log flood at will.
    daemon, stub = served
    endpoint = next(p for p in os.listdir(plugin_dir) if p != "kubelet.sock")
    async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{endpoint}") as channel:
        raw = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")  # bytes in, bytes out
        for n in range(100):
            with pytest.raises(grpc.aio.AioRpcError):
                await raw(b"\xff\xff\xff" + bytes([n]))
    ok = await stub.GetPreferredAllocation(preferred_request((IDS, [], 2)))  # still answering
    assert len(ok.container_responses[0].deviceIDs) == 2
    log = daemon.log()
    assert "Unexpected [DecodeError]" not in log and "Traceback" not in log, log[-3000:]
    lines = [line for line in log.splitlines() if "could not decode a request" in line]
    assert 1 <= len(lines) <= 5, lines
    assert "DecodeError" in lines[0]
