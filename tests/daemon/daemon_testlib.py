"""Helpers shared by the daemon hardening tests: a node whose searches are hard, waiting on conditions."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable

import yaml

from plugin.api import api_pb2

GPU = "nvidia.com/gpu"
NIC = "topo.dev/nic"


def hard_node_yaml(gpus: int = 64, seed: int = 9) -> str:
    """A simulated node of `gpus` GPUs on one NUMA node with irregular NVLinks.

    Why: with every GPU on one NUMA node and irregular link weights there are no
    symmetries to collapse: a search for 32 of the 64 GPUs runs to the end of its
    budget (it was not proven optimal within 90 s) instead of ending early, a
    "maximal search".
    """
    rng = random.Random(seed)
    names = [f"GPU{i}" for i in range(gpus)]
    # Overlapping NVLink cliques (a later entry wins for a pair): irregular weights in a short file.
    links = [{"devices": rng.sample(names, 4), "link": rng.choice(["NV1", "NV2", "NV4", "NV8"])}
             for _ in range(3 * gpus)]
    return yaml.safe_dump({
        "apiVersion": "topo-device-plugin/v1", "kind": "SimulatedNode",
        "metadata": {"name": f"hard-{gpus}", "description": "irregular NVLinks, one NUMA node"},
        "numa": {"nodes": [0]},
        "defaults": {"sameNuma": "NODE", "crossNuma": "SYS"},
        "gpus": [{"name": n, "numa": 0} for n in names],
        "links": links,
    }, sort_keys=False)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def until(predicate: Callable[[], bool], timeout: float, what: str, every: float = 0.05) -> None:
    """Poll `predicate` until it holds; fail naming `what` after `timeout` seconds (a generous bound)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(every)


def preferred_request(*reqs: tuple[list[str], list[str], int]) -> api_pb2.PreferredAllocationRequest:
    """A GetPreferredAllocation request: one container request per (available, must_include, size)."""
    out = api_pb2.PreferredAllocationRequest()
    for available, must, size in reqs:
        out.container_requests.add(available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size)
    return out


def allocate_request(*id_lists: list[str]) -> api_pb2.AllocateRequest:
    """An Allocate request: one container request per ID list."""
    out = api_pb2.AllocateRequest()
    for ids in id_lists:
        out.container_requests.add(devices_ids=ids)
    return out
