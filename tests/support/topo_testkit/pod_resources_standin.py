"""The kubelet's pod-resources `List`, answered from a `StandinDeviceManager`, on a real unix socket.

What it reproduces of the kubelet (`pkg/kubelet/apis/podresources/server_v1.go`, 1.34/1.37):
every admitted pod, the one being admitted included, with its app containers
and restartable init containers (non-restartable init containers are left
out) and each one's devices per resource, as soon as their `Allocate` has
returned. `GetAllocatableResources` and `Get` are not needed by the daemon
and answer UNIMPLEMENTED (the generated base class).
"""

from __future__ import annotations

import asyncio
import os

import grpc

from plugin.api.podresources.v1 import api_pb2, api_pb2_grpc
from topo_testkit.device_manager import StandinDeviceManager


class PodResourcesStandin(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, manager: StandinDeviceManager, namespace: str = "default"):
        self.manager = manager
        self.namespace = namespace
        self.list_calls = 0
        #: Set when a List call arrives.
        self.listing = asyncio.Event()
        #: When set to an event, List waits for it before answering (a slow kubelet, held by a test).
        self.gate: asyncio.Event | None = None
        #: Extra pods, one GPU-holding container each, to make the answer as large as a test needs.
        self.filler_pods = 0
        self._server: grpc.aio.Server | None = None

    async def List(self, request, context):  # noqa: N802 (gRPC name)
        self.list_calls += 1
        self.listing.set()
        if self.gate is not None:
            await self.gate.wait()
        out = api_pb2.ListPodResourcesResponse()
        for n in range(self.filler_pods):
            filler = out.pod_resources.add(name=f"filler-{n}", namespace="elsewhere").containers.add(name="c")
            filler.devices.add(resource_name="example.com/other", device_ids=[f"other-{n:08d}"])
        for uid, spec in self.manager.specs.items():
            got = self.manager.pods.get(uid, {})
            p = out.pod_resources.add(name=spec.name or uid, namespace=self.namespace)
            for container in (*(c for c in spec.init_containers if c.restartable), *spec.containers):
                c = p.containers.add(name=container.name)
                for res, ids in got.get(container.name, {}).items():
                    c.devices.add(resource_name=res, device_ids=list(ids))
        return out

    async def start(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
