"""Every DevicePlugin RPC and every bad request, over real gRPC on the daemon's unix socket."""

from __future__ import annotations

import grpc
import pytest
from daemon_testlib import allocate_request, preferred_request

from plugin.api import api_pb2, api_pb2_grpc

GPU = "nvidia.com/gpu"


@pytest.fixture
async def stub(kubelet, start_daemon, plugin_dir):
    daemon = start_daemon(simulate="dgx-1-v100")
    await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)), timeout=10)
    endpoint = kubelet.registrations_of(GPU)[0].endpoint
    async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{endpoint}") as channel:
        yield api_pb2_grpc.DevicePluginStub(channel)
    assert daemon.proc.poll() is None, "the daemon must survive every request"


ALL = [str(i) for i in range(8)]


async def test_options(stub):
    opts = await stub.GetDevicePluginOptions(api_pb2.Empty())
    assert opts.get_preferred_allocation_available and not opts.pre_start_required


async def test_list_and_watch_sends_full_list_with_topology(stub):
    call = stub.ListAndWatch(api_pb2.Empty())
    first = await call.read()
    call.cancel()
    assert [d.ID for d in first.devices] == ALL
    assert [[n.ID for n in d.topology.nodes] for d in first.devices] == [[0]] * 4 + [[1]] * 4
    assert {d.health for d in first.devices} == {"Healthy"}


async def test_preferred_allocation_is_valid_and_per_container(stub):
    resp = await stub.GetPreferredAllocation(preferred_request((ALL, [], 2), (ALL, ["5"], 4), (["1", "6"], [], 1)))
    assert len(resp.container_responses) == 3
    a, b, c = (list(r.deviceIDs) for r in resp.container_responses)
    assert len(a) == 2 and set(a) <= set(ALL)
    assert len(b) == 4 and "5" in b and set(b) <= set(ALL)
    assert len(c) == 1 and c[0] in {"1", "6"}
    # DGX-1: a size-2 request gets an NV2 pair on one socket (the spec's objective)
    nv2_pairs = [{"0", "3"}, {"0", "4"}, {"1", "2"}, {"1", "5"}, {"2", "3"}, {"4", "7"}, {"5", "6"}, {"6", "7"}]
    assert set(a) in [p for p in nv2_pairs if len({int(x) // 4 for x in p}) == 1]


async def test_allocate_gpu_env_and_no_fake_device_nodes(stub):
    resp = await stub.Allocate(allocate_request(["0", "3"], ["5"]))
    assert len(resp.container_responses) == 2
    first, second = resp.container_responses
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == "0,3"
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == "5"
    # simulated GPUs have no /dev/nvidia* on this machine, so none are handed to the runtime
    assert list(first.devices) == [] and list(first.mounts) == []


async def test_allocate_accepts_the_same_ids_again(stub):
    # init-container reuse: the kubelet allocates the same IDs for a later container
    for _ in range(2):
        resp = await stub.Allocate(allocate_request(["2"]))
        assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "2"


async def test_pre_start_container(stub):
    assert isinstance(await stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["1"])),
                      api_pb2.PreStartContainerResponse)


BAD_PREFERRED = [
    ((ALL, [], 0), "allocation_size must be positive, got 0"),
    ((ALL, [], -1), "got -1"),
    ((["0", "1"], [], 3), "allocation_size 3 exceeds the 2 available"),
    ((ALL, ["0", "1", "2"], 2), "3 must_include_deviceIDs exceed allocation_size 2"),
    ((["0", "1"], ["7"], 2), "must_include_deviceIDs not in available_deviceIDs: 7"),
    ((["0", "1", "1"], [], 2), "repeats IDs: 1"),
    ((["0", "GPU-nope", "99"], [], 1), "GPU-nope, 99"),
]


@pytest.mark.parametrize("req,message", BAD_PREFERRED, ids=[m for _, m in BAD_PREFERRED])
async def test_bad_preferred_requests_are_invalid_argument(stub, req, message):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.GetPreferredAllocation(preferred_request((ALL, [], 1), req))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in e.value.details()
    assert "container_requests[1]" in e.value.details()
    # and the server keeps serving
    ok = await stub.GetPreferredAllocation(preferred_request((ALL, [], 1)))
    assert len(ok.container_responses[0].deviceIDs) == 1


BAD_ALLOCATE = [
    (["0", "42"], "unknown device IDs for nvidia.com/gpu: 42"),
    (["3", "3"], "repeated device IDs: 3"),
    ([], "devices_ids is empty"),
]


@pytest.mark.parametrize("ids,message", BAD_ALLOCATE, ids=[m for _, m in BAD_ALLOCATE])
async def test_bad_allocate_requests_are_invalid_argument(stub, ids, message):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Allocate(allocate_request(ids))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in e.value.details()
    ok = await stub.Allocate(allocate_request(["1"]))
    assert ok.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "1"


async def test_empty_requests_are_invalid_argument(stub):
    for call, req in ((stub.Allocate, api_pb2.AllocateRequest()),
                      (stub.GetPreferredAllocation, api_pb2.PreferredAllocationRequest())):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call(req)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "no container_requests" in e.value.details()


async def test_pre_start_unknown_id_is_invalid_argument(stub):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["0", "x"]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "x" in e.value.details()
