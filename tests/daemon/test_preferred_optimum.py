"""GetPreferredAllocation over gRPC is the exact optimum of shared/spec/allocation.md on every shared machine.

The reference here is a brute force written straight from the spec (every
k-subset, compared on span, then W(S), then W(A\\S)); it shares no code with
the allocator's search.
"""

from __future__ import annotations

import itertools
import pathlib
import random

import grpc
import pytest
from topo_testkit import SHARED_DIR

from plugin.api import api_pb2, api_pb2_grpc
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources import builtin_names, load_topology

GPU = "nvidia.com/gpu"
TOPOLOGIES = sorted((SHARED_DIR / "topologies").glob("*.txt"))
MACHINES = [str(p) for p in TOPOLOGIES] + ["dgx-2-v100"]


def spec_key(topology, ids: list[str], chosen: tuple[str, ...], available: list[str]) -> tuple:
    """(span, -W(S), -W(A\\S)): smaller is better, exactly the spec's order of criteria 1-3."""
    dev = {str(d.index): d for d in topology.gpus}

    def w(group) -> int:
        return sum(topology.weight(dev[a].name, dev[b].name) for a, b in itertools.combinations(group, 2))

    span = len({dev[i].numa for i in chosen if dev[i].numa is not None})
    rest = [i for i in available if i not in chosen]
    return (span, -w(chosen), -w(rest))


def brute_force_best(topology, available: list[str], must: list[str], size: int) -> tuple:
    best = None
    for combo in itertools.combinations(available, size):
        if set(must) <= set(combo):
            key = spec_key(topology, [], combo, available)
            best = key if best is None or key < best else best
    return best


@pytest.mark.parametrize("machine", MACHINES, ids=[pathlib.Path(m).name for m in MACHINES])
async def test_answers_are_exact_optimum(kubelet, start_daemon, plugin_dir, machine):
    start_daemon(simulate=machine)
    await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)), timeout=10)
    topology = load_topology(machine)
    resource = build_resources(topology, ResourceOptions(device_id_strategy="index"))[0]
    ids = [d.id for d in resource.devices]
    rng = random.Random(f"{machine}-seed")
    endpoint = kubelet.registrations_of(GPU)[0].endpoint
    cases = 40 if len(ids) <= 8 else 15
    async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{endpoint}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        for _ in range(cases):
            available = sorted(rng.sample(ids, rng.randint(1, len(ids))), key=int)
            rng.shuffle(available)  # the kubelet passes a set: order must not matter
            size = rng.randint(1, len(available))
            must = rng.sample(available, rng.randint(0, min(size, 2)))
            req = api_pb2.PreferredAllocationRequest()
            req.container_requests.add(available_deviceIDs=available, must_include_deviceIDs=must,
                                       allocation_size=size)
            resp = await stub.GetPreferredAllocation(req)
            got = tuple(resp.container_responses[0].deviceIDs)
            case = f"{pathlib.Path(machine).name}: available={available} must={must} size={size} -> {got}"
            assert len(got) == size and len(set(got)) == size, case
            assert set(got) <= set(available) and set(must) <= set(got), case
            assert spec_key(topology, ids, got, available) == brute_force_best(topology, available, must, size), case


def test_machines_cover_every_shared_topology_and_sixteen_gpus():
    assert TOPOLOGIES and "dgx-2-v100" in builtin_names()
    assert len(load_topology("dgx-2-v100").gpus) == 16
