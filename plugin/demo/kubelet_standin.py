"""A minimal kubelet for `topo-device-plugin demo`: the Registration service plus a device-manager client.

Why so little: the demo shows a new user, on a laptop, what the kubelet would
see and get from the daemon; for that it needs what the kubelet's device
manager does on the happy path (shared/research/kubelet-device-manager.md §2):
- `Register` validates version and resource name, dials the plugin back
  (blocking, 10 s) and calls `GetDevicePluginOptions` before it returns;
- it then holds one `ListAndWatch` stream per registration and keeps the
  latest full device list (an omitted device is gone); when a stream ends its
  devices turn Unhealthy;
- `preferred` and `allocate` make the kubelet's two allocation calls.
Everything tests and benchmarks need on top (kubelet restarts, a slow
`Register`, stream counters, the 1.28–1.34 disconnect of a newer client) lives
in the test kit's subclass, tests/support/topo_testkit/kubelet_standin.py,
which is not shipped. It is not the real kubelet; the Go harness in
tests/kubelet/ drives that.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from ..api import api_pb2, api_pb2_grpc

_RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class _Refused(Exception):
    """A Register the kubelet refuses: answered with this gRPC status and message."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


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
        #: Notified whenever a registration or a device list changes (`wait_for` waits on it).
        self.changed = asyncio.Condition()
        self._server: grpc.aio.Server | None = None

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
        for c in list(self.clients.values()):
            await self._drop(c)
        self.clients.clear()
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    # -- Registration service -------------------------------------------
    async def Register(self, request, context):  # noqa: N802 (gRPC name)
        try:
            await self._register(request)
        except _Refused as e:
            await context.abort(e.code, e.message)
        return api_pb2.Empty()

    async def _register(self, request) -> None:
        """One Register call's work; a subclass wraps it (the test kit's gate and counters)."""
        await self._do_register(request)

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def _do_register(self, request) -> None:
        if request.version != "v1beta1":
            raise _Refused(grpc.StatusCode.UNKNOWN,
                           f"requested API version {request.version!r} is not supported by kubelet")
        name = request.resource_name
        if not _RESOURCE_RE.match(name) or "kubernetes.io/" in name:
            raise _Refused(grpc.StatusCode.UNKNOWN, f"the ResourceName {name!r} is invalid")
        path = os.path.join(self.plugin_dir, request.endpoint)
        channel = grpc.aio.insecure_channel(f"unix:{path}")
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout=self.dial_timeout)
            stub = api_pb2_grpc.DevicePluginStub(channel)
            options = await stub.GetDevicePluginOptions(api_pb2.Empty())
        except (asyncio.TimeoutError, grpc.aio.AioRpcError) as e:
            await channel.close()
            raise _Refused(grpc.StatusCode.UNKNOWN, f"failed to dial device plugin: {e}") from None
        self.registrations.append(Registration(name, request.endpoint, options, time.monotonic()))
        client = PluginClient(name, request.endpoint, channel, stub, options)
        self.clients[name] = client  # the newest registration wins; the old client is not closed
        client.stream_task = asyncio.get_running_loop().create_task(self._run_client(client))

    async def _run_client(self, client: PluginClient) -> None:
        try:
            async for msg in client.stub.ListAndWatch(api_pb2.Empty()):
                client.devices = {
                    d.ID: DeviceState(d.ID, d.health, tuple(n.ID for n in d.topology.nodes)) for d in msg.devices
                }
                client.updates += 1
                await self._notify()
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            self._stream_ended(client)
            await self._notify()

    def _stream_ended(self, client: PluginClient) -> None:
        """A plugin's ListAndWatch stream ended: the kubelet disconnects it and its devices turn Unhealthy."""
        self._disconnect(client)

    @staticmethod
    def _disconnect(client: PluginClient) -> None:
        if client.stopped:
            return
        client.stopped = True
        for d in client.devices.values():
            d.health = "Unhealthy"

    async def _drop(self, client: PluginClient) -> None:
        client.stopped = True
        if client.stream_task:
            client.stream_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await client.stream_task
        await client.channel.close()

    # -- what the demo (and the test kit) asks ----------------------------
    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async def _wait() -> None:
            async with self.changed:
                await self.changed.wait_for(predicate)

        await asyncio.wait_for(_wait(), timeout)

    def devices(self, resource: str) -> dict[str, DeviceState]:
        c = self.clients.get(resource)
        return dict(c.devices) if c else {}

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
