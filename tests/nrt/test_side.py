"""The publisher as the daemon runs it: pod-resources over a real unix socket, the object over real HTTP
(plugin/nrt/side.py)."""

from __future__ import annotations

import os

import grpc

from plugin.api.podresources.v1 import api_pb2, api_pb2_grpc
from plugin.model.resources import ResourceOptions, build_resources
from plugin.nrt.build import available_by_zone
from plugin.allocation.pod_resources import PodResourcesReader
from plugin.nrt.side import HeldSource, NrtOptions, NrtSide
from plugin.sources.simulated import load_simulated

from test_writer import NODE, until

GPU = "nvidia.com/gpu"


class PodResources(api_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's `List`: pod -> resource -> device IDs, as a test sets it."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, list[str]]] = {}
        self.lists = 0
        self._server: grpc.aio.Server | None = None

    async def List(self, request, context):  # noqa: N802 (gRPC name)
        self.lists += 1
        out = api_pb2.ListPodResourcesResponse()
        for name, devices in self.pods.items():
            c = out.pod_resources.add(name=name, namespace="default").containers.add(name="main")
            for res, ids in devices.items():
                c.devices.add(resource_name=res, device_ids=ids)
        return out

    async def start(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix:{path}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)


class CountingHeld(HeldSource):
    """The daemon's held-device source, each answer also recorded (to wait for polls, not for time)."""

    def __init__(self, reader: PodResourcesReader, polls: list):
        super().__init__(reader)
        self.polls = polls

    async def held(self):
        got = await super().held()
        self.polls.append(got)
        return got


def _available(server, gpu_numa: dict[str, int]) -> dict[int, int]:
    by_zone = available_by_zone(server.objects[NODE])
    return {n: by_zone.get(f"node-{n}", {}).get(GPU, 0) for n in sorted(set(gpu_numa.values()))}


async def test_available_follows_pods_taking_and_releasing_gpus_and_the_object_goes_at_stop(
        nrt_server, connect, short_tmp, tmp_path):
    socket = os.path.join(short_tmp, "pod-resources", "kubelet.sock")
    kubelet_config = tmp_path / "config.yaml"
    kubelet_config.write_text("topologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod\n")
    topology = load_simulated("dgx-h100")
    resources = build_resources(topology, ResourceOptions())
    gpus = next(r for r in resources if r.name == GPU)
    gpu_numa = {d.id: d.numa for d in gpus.devices}
    polls: list = []
    side = NrtSide(NrtOptions(NODE, socket, str(kubelet_config), poll_s=0.05, min_interval_s=0.2), connect,
                   held=CountingHeld(PodResourcesReader(socket), polls))
    kubelet = PodResources()
    await side.start(topology, resources)
    try:
        # No pod-resources yet: nothing is published (every GPU free would be a guess).
        await until(lambda: len(polls) >= 3, "three polls without pod-resources")
        assert side.writer.wanted is None and NODE not in nrt_server.objects
        await kubelet.start(socket)
        await until(lambda: NODE in nrt_server.objects, "published once pod-resources answers")
        attrs = {a["name"]: a["value"] for a in nrt_server.objects[NODE]["attributes"]}
        assert attrs["topologyManagerPolicy"] == "single-numa-node" and attrs["topologyManagerScope"] == "pod"
        free = _available(nrt_server, gpu_numa)
        first_zone = gpu_numa[gpus.devices[0].id]
        taken = [d.id for d in gpus.devices if d.numa == first_zone][:2]
        kubelet.pods["trainer"] = {GPU: taken}
        want = {**free, first_zone: free[first_zone] - 2}
        await until(lambda: _available(nrt_server, gpu_numa) == want, "the pod's GPUs are not available")
        del kubelet.pods["trainer"]
        await until(lambda: _available(nrt_server, gpu_numa) == free, "released GPUs are available again")
        # Health: an unhealthy GPU leaves allocatable and available.
        sick = topology.with_health({topology.gpus[0].name: "Unhealthy"})
        side.update(sick, build_resources(sick, ResourceOptions()))
        sick_zone = topology.gpus[0].numa
        await until(lambda: _available(nrt_server, gpu_numa)[sick_zone] == free[sick_zone] - 1, "health followed")
    finally:
        await side.stop()
        await kubelet.stop()
    assert NODE not in nrt_server.objects


async def test_a_failing_list_keeps_the_last_held_devices(nrt_server, connect, short_tmp, tmp_path):
    """A kubelet that stops answering must not make held GPUs look free."""
    socket = os.path.join(short_tmp, "pod-resources", "kubelet.sock")
    topology = load_simulated("pcie-2socket-4gpu-2nic")
    resources = build_resources(topology, ResourceOptions())
    gpus = next(r for r in resources if r.name == GPU)
    gpu_numa = {d.id: d.numa for d in gpus.devices}
    kubelet = PodResources()
    kubelet.pods["p"] = {GPU: [gpus.devices[0].id]}
    await kubelet.start(socket)
    options = NrtOptions(NODE, socket, str(tmp_path / "none.yaml"), poll_s=0.05, min_interval_s=0.2)
    polls: list = []
    side = NrtSide(options, connect, held=CountingHeld(PodResourcesReader(socket), polls))
    await side.start(topology, resources)
    try:
        await until(lambda: NODE in nrt_server.objects, "published")
        held_view = _available(nrt_server, gpu_numa)
        await kubelet.stop()
        await until(lambda: len(polls) >= 3 and polls[-1] is None and polls[-2] is None and polls[-3] is None,
                    "three polls of the stopped kubelet")
        side.update(topology, resources)  # a rebuild while pod-resources is down
        assert available_by_zone(side.writer.wanted or {}) == available_by_zone(nrt_server.objects[NODE])
        assert _available(nrt_server, gpu_numa) == held_view
    finally:
        await side.stop()
