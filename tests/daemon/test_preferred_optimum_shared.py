"""GetPreferredAllocation over gRPC for time-slicing replicas and MIG devices is the optimum of the spec.

The daemon serves the resources; every answer is scored with the spec's criteria as
tests/allocator/sharing_testlib.py writes them from the spec's words (`replica_key`, `mig_key`), and
compared with the best score the count-vector brute force finds (`by_counts`, checked there against the
literal subset brute force). Requests look like the kubelet's: some devices already handed out (not in
available), a shuffled available list, sometimes must-include devices.
"""

from __future__ import annotations

import pathlib
import random
import sys

import grpc
import pytest

from allocator.request import AllocationRequest
from plugin.api import api_pb2, api_pb2_grpc
from plugin.config import parse_config
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated
from topo_testkit.nvidia_configs import TIME_SLICING

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "allocator"))
from sharing_testlib import by_counts, chosen_key, mig_key, replica_key


CASES = [
    # (node, extra daemon args, config replicas or None, resource, oracle key)
    ("dgx-a100", [], 10, "nvidia.com/gpu", replica_key),
    ("dgx-1-v100", [], 3, "nvidia.com/gpu", replica_key),
    ("pcie-2socket-4gpu-2nic", [], 5, "nvidia.com/gpu", replica_key),
    ("dgx-a100-mig-1g", ["--mig-strategy", "single"], None, "nvidia.com/gpu", mig_key),
    ("dgx-a100-mig", ["--mig-strategy", "mixed"], None, "nvidia.com/mig-1g.10gb", mig_key),
    ("dgx-a100-mig", ["--mig-strategy", "mixed"], None, "nvidia.com/mig-3g.40gb", mig_key),
]


@pytest.mark.parametrize("node, args, replicas, resource, key", CASES,
                         ids=[f"{c[0]}-{c[3].split('/')[1]}" for c in CASES])
async def test_answers_are_the_spec_optimum(kubelet, start_daemon, plugin_dir, tmp_path, node, args, replicas,
                                            resource, key):
    options = {"device_id_strategy": "index", "mig_strategy": args[1] if args else "none"}
    if replicas:
        config = tmp_path / "config.yaml"
        config.write_text(TIME_SLICING.replace("replicas: 10", f"replicas: {replicas}"))
        args = [*args, "--config", str(config)]
        options["time_slicing"] = parse_config(config.read_text(), str(config)).time_slicing
    start_daemon(*args, simulate=node)
    graph = next(r for r in build_resources(load_simulated(node), ResourceOptions(**options))
                 if r.name == resource).graph
    ids = list(graph.ids)
    await kubelet.wait_for(lambda: len(kubelet.devices(resource)) == len(ids), timeout=15)
    endpoint = kubelet.registrations_of(resource)[-1].endpoint
    rng = random.Random(f"{node}/{resource}")
    async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{endpoint}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        for _ in range(30):
            handed_out = rng.choice((0.0, 0.3, 0.6))
            available = [i for i in ids if rng.random() >= handed_out] or ids[:1]
            rng.shuffle(available)
            size = rng.randint(1, min(8, len(available)))
            must = rng.sample(available, min(size, rng.choice((0, 0, 1, 2))))
            req = api_pb2.PreferredAllocationRequest()
            req.container_requests.add(available_deviceIDs=available, must_include_deviceIDs=must,
                                       allocation_size=size)
            got = list((await stub.GetPreferredAllocation(req)).container_responses[0].deviceIDs)
            request = AllocationRequest.of(available, must, size)
            best, _ = by_counts(graph, request, key)
            case = f"available={available} must={must} size={size} -> {got}"
            assert len(got) == size and set(must) <= set(got) <= set(available), case
            assert chosen_key(graph, request, got, key) == best, case
