"""A kubelet stand-in: the Registration service plus a device-manager client, as the kubelet behaves.

Why ship it in the package: `demo` needs a kubelet to show registration on a
laptop, and tests and benchmarks need one that behaves like the real
device manager (shared/research/kubelet-device-manager.md §2):
- `Register` validates version and resource name, dials the plugin back
  (blocking, 10 s) and calls `GetDevicePluginOptions` before it returns;
- it then holds one `ListAndWatch` stream per registration and keeps the
  latest full device list (an omitted device is gone);
- a newer registration of a resource replaces the older client, and when the
  older stream ends it disconnects whatever client is current, as 1.28–1.34
  do (kubernetes #121994), so a plugin that re-registers too early is caught;
- `restart()` ends every stream, deletes every non-directory file in the
  directory except the checkpoint, and creates `kubelet.sock` again.
It is not the real kubelet; the Go harness in tests/kubelet/ drives that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from dataclasses import dataclass, field

import grpc

from ..api import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

_RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
CHECKPOINT = "kubelet_internal_checkpoint"


@dataclass
class DeviceState:
    id: str
    health: str
    numa: tuple[int, ...]


@dataclass
class Registration:
    resource: str
    endpoint: str
    options: api_pb2.DevicePluginOptions
    at: float


@dataclass
class PluginClient:
    """The stand-in's connection to one registered plugin endpoint."""

    resource: str
    endpoint: str
    channel: grpc.aio.Channel
    stub: api_pb2_grpc.DevicePluginStub
    options: api_pb2.DevicePluginOptions
    devices: dict[str, DeviceState] = field(default_factory=dict)
    updates: int = 0
    stream_task: asyncio.Task | None = None
    stopped: bool = False


class KubeletStandin(api_pb2_grpc.RegistrationServicer):
    def __init__(self, plugin_dir: str, dial_timeout: float = 10.0):
        self.plugin_dir = plugin_dir
        self.dial_timeout = dial_timeout
        self.socket_path = os.path.join(plugin_dir, "kubelet.sock")
        self.registrations: list[Registration] = []
        self.clients: dict[str, PluginClient] = {}
        self.live_streams: dict[str, int] = {}
        self.max_live_streams: dict[str, int] = {}
        self.stream_ends: list[tuple[str, float]] = []
        #: resources whose newer client was disconnected by an older stream ending (kubernetes #121994)
        self.disconnected_newer: list[str] = []
        self.changed = asyncio.Condition()
        self._server: grpc.aio.Server | None = None
        self._handlers: set[asyncio.Task] = set()

    # -- life cycle -------------------------------------------------------
    async def start(self) -> None:
        os.makedirs(self.plugin_dir, mode=0o750, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        # A dying kubelet answers nothing more: in-flight Register calls fail at once.
        for t in list(self._handlers):
            t.cancel()
        for c in list(self.clients.values()):
            await self._drop(c)
        self.clients.clear()
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    async def restart(self, downtime: float = 0.0) -> None:
        """What a kubelet restart looks like to a plugin."""
        await self.stop()
        for name in os.listdir(self.plugin_dir):
            path = os.path.join(self.plugin_dir, name)
            if name != CHECKPOINT and not os.path.isdir(path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        if downtime:
            await asyncio.sleep(downtime)
        await self.start()

    # -- Registration service -------------------------------------------
    async def Register(self, request, context):  # noqa: N802 (gRPC name)
        task = asyncio.current_task()
        self._handlers.add(task)
        try:
            return await self._register(request, context)
        finally:
            self._handlers.discard(task)

    async def _register(self, request, context):
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.UNKNOWN,
                                f"requested API version {request.version!r} is not supported by kubelet")
        name = request.resource_name
        if not _RESOURCE_RE.match(name) or "kubernetes.io/" in name:
            await context.abort(grpc.StatusCode.UNKNOWN, f"the ResourceName {name!r} is invalid")
        path = os.path.join(self.plugin_dir, request.endpoint)
        channel = grpc.aio.insecure_channel(f"unix:{path}")
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout=self.dial_timeout)
            stub = api_pb2_grpc.DevicePluginStub(channel)
            options = await stub.GetDevicePluginOptions(api_pb2.Empty())
        except (asyncio.TimeoutError, grpc.aio.AioRpcError) as e:
            await channel.close()
            await context.abort(grpc.StatusCode.UNKNOWN, f"failed to dial device plugin: {e}")
        self.registrations.append(Registration(name, request.endpoint, options, time.monotonic()))
        client = PluginClient(name, request.endpoint, channel, stub, options)
        self.clients[name] = client  # the newest registration wins; the old client is not closed
        client.stream_task = asyncio.get_running_loop().create_task(self._run_client(client))
        async with self.changed:
            self.changed.notify_all()
        return api_pb2.Empty()

    async def _run_client(self, client: PluginClient) -> None:
        name = client.resource
        self.live_streams[name] = self.live_streams.get(name, 0) + 1
        self.max_live_streams[name] = max(self.max_live_streams.get(name, 0), self.live_streams[name])
        try:
            async for msg in client.stub.ListAndWatch(api_pb2.Empty()):
                client.devices = {
                    d.ID: DeviceState(d.ID, d.health, tuple(n.ID for n in d.topology.nodes)) for d in msg.devices
                }
                client.updates += 1
                async with self.changed:
                    self.changed.notify_all()
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            self.live_streams[name] -= 1
            self.stream_ends.append((name, time.monotonic()))
            # As the real kubelet (1.28-1.34): look the client up by name only and disconnect it.
            current = self.clients.get(name)
            if current is not None and not client.stopped:
                current.stopped = True
                for d in current.devices.values():
                    d.health = "Unhealthy"
                if current is not client:
                    self.disconnected_newer.append(name)
                    if current.stream_task:
                        current.stream_task.cancel()
            async with self.changed:
                self.changed.notify_all()

    async def _drop(self, client: PluginClient) -> None:
        client.stopped = True
        if client.stream_task:
            client.stream_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await client.stream_task
        await client.channel.close()

    # -- what tests and the demo ask --------------------------------------
    async def wait_for(self, predicate, timeout: float = 10.0) -> None:
        async def _wait() -> None:
            async with self.changed:
                await self.changed.wait_for(predicate)

        await asyncio.wait_for(_wait(), timeout)

    def devices(self, resource: str) -> dict[str, DeviceState]:
        c = self.clients.get(resource)
        return dict(c.devices) if c else {}

    def registrations_of(self, resource: str) -> list[Registration]:
        return [r for r in self.registrations if r.resource == resource]

    def client(self, resource: str) -> PluginClient:
        c = self.clients.get(resource)
        if c is None or c.stopped:
            raise KeyError(f"{resource} has no live endpoint")
        return c

    async def preferred(self, resource: str, available: list[str], must_include: list[str], size: int) -> list[str]:
        req = api_pb2.PreferredAllocationRequest()
        req.container_requests.add(available_deviceIDs=available, must_include_deviceIDs=must_include,
                                   allocation_size=size)
        resp = await self.client(resource).stub.GetPreferredAllocation(req)
        return list(resp.container_responses[0].deviceIDs)

    async def allocate(self, resource: str, ids: list[str]) -> api_pb2.ContainerAllocateResponse:
        req = api_pb2.AllocateRequest()
        req.container_requests.add(devices_ids=ids)
        resp = await self.client(resource).stub.Allocate(req)
        return resp.container_responses[0]
