"""One DevicePlugin gRPC server (grpc.aio) for one extended resource.

Why one socket per resource: the kubelet's device manager keys an endpoint by
resource name and socket; this is what every production plugin does. The
server knows nothing of discovery or scoring: it publishes the `Resource` it
is given and asks the resource's policy for preferred allocations.

Every bad request gets INVALID_ARGUMENT naming the problem, and the server
keeps serving: a request can never take the daemon down. A request can
neither stall it: searches run on worker threads under a whole-request
deadline (`plugin.allocation.preferred`), every message names a few offending IDs and
"+N more" (never the whole request), and rejections are logged at a bounded
rate.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import grpc

from allocator import Allocation, AllocationError, Policy
from allocator.pairing import pair_label
from allocator.request import brief_ids

from ..allocation import preferred
from ..model.allocate_response import ContainerAllocation
from ..api import api_pb2, api_pb2_grpc
from ..observability.metrics import Metrics
from ..allocation.pairing_service import PairingService
from ..observability.ratelimited_log import RateLimitedLog, reason_kind
from .registration import SocketIdentity, socket_identity
from ..model.resources import Resource
from ..allocation.search_pool import SearchPool
from .socket_file import remove_if_ours, serve_at

log = logging.getLogger(__name__)

PolicyFactory = Callable[[str, dict], Policy]

#: Longest status message we send: far below the 16 KiB of status details a default gRPC
#: C-core client accepts (beyond that it reports RESOURCE_EXHAUSTED instead of our message).
MAX_MESSAGE_CHARS = 1024


@dataclass
class RequestHandling:
    """What every server of one daemon shares to keep requests bounded.

    One search pool for all resources (the searches share the GIL anyway) and
    one rate-limited log for the lines a client can trigger at will (rejected
    requests, answers not proven optimal), so its limit holds for the whole
    daemon and survives server restarts.
    """

    search: SearchPool = field(default_factory=SearchPool)
    limited_log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(log))
    #: Whole-request deadline of GetPreferredAllocation (why 1 s: `plugin.allocation.preferred`).
    deadline_s: float = preferred.DEFAULT_DEADLINE_S
    #: GPU–NIC pairing: one call-sequence tracker and one cross-resource index for all servers.
    pairing: PairingService = field(default_factory=PairingService)


def device_message(resource: Resource) -> api_pb2.ListAndWatchResponse:
    """The full device list; TopologyInfo only where the NUMA node is known (never ID -1)."""
    out = api_pb2.ListAndWatchResponse()
    for d in resource.devices:
        dev = out.devices.add(ID=d.id, health=d.health)
        if d.numa is not None:
            dev.topology.nodes.add(ID=d.numa)
    return out


def to_proto(a: ContainerAllocation) -> api_pb2.ContainerAllocateResponse:
    resp = api_pb2.ContainerAllocateResponse()
    resp.envs.update(a.envs)
    resp.annotations.update(a.annotations)
    for m in a.mounts:
        resp.mounts.add(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
    for d in a.devices:
        resp.devices.add(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
    for name in a.cdi_devices:
        resp.cdi_devices.add(name=name)
    return resp


def bounded(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return message if len(message) <= limit else message[: limit - 20] + " ...(message cut)"


def _duplicates(ids: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    dup: list[str] = []
    for i in ids:
        if i in seen and i not in dup:
            dup.append(i)
        seen.add(i)
    return dup


#: The largest request we read (gRPC's default is 4 MiB). The kubelet's biggest request, a
#: GetPreferredAllocation listing every device of a node by UUID, is a few KB (10,000 devices
#: would be about 450 KB); at 4 MiB, forty concurrent oversized requests took the daemon from
#: 54 to 119 MiB, next to the chart's limit (then 128 MiB, now 192 MiB). Larger requests get RESOURCE_EXHAUSTED.
MAX_REQUEST_BYTES = 1 << 20


def _refusing(empty: Callable[[], object]):
    """Turn a `_Rejected` raised anywhere in an RPC into INVALID_ARGUMENT and an empty answer."""
    def wrap(rpc):
        @functools.wraps(rpc)
        async def answer(self: DevicePluginService, request, context):
            try:
                return await rpc(self, request, context)
            except _Rejected as rejected:
                self._refuse(context, rejected)
                return empty()
        return answer
    return wrap


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """The RPC handlers. Holds the current `Resource`; `update()` swaps it atomically."""

    def __init__(self, resource: Resource, policy_factory: PolicyFactory, metrics: Metrics,
                 handling: RequestHandling | None = None):
        self._resource = resource
        self._policy_factory = policy_factory
        self._policy = policy_factory(resource.policy, dict(resource.policy_options))
        self._metrics = metrics
        self._handling = handling or RequestHandling()
        self._version = 0
        self._changed = asyncio.Condition()
        self._closing = False
        self._send_empty_on_close = False
        self.active_streams = 0

    @property
    def resource(self) -> Resource:
        return self._resource

    async def update(self, resource: Resource) -> None:
        """Publish a new device list; open streams get it at once (only if it differs)."""
        changed = resource.listing() != self._resource.listing()
        if resource.policy != self._resource.policy or resource.policy_options != self._resource.policy_options:
            self._policy = self._policy_factory(resource.policy, dict(resource.policy_options))
        self._resource = resource
        if changed:
            async with self._changed:
                self._version += 1
                self._changed.notify_all()

    async def close_streams(self, send_empty: bool) -> None:
        """End every ListAndWatch stream; with `send_empty`, tell the kubelet the devices are gone first."""
        async with self._changed:
            self._closing = True
            self._send_empty_on_close = send_empty
            self._changed.notify_all()

    # -- RPCs -------------------------------------------------------------
    async def GetDevicePluginOptions(self, request, context):  # noqa: N802 (gRPC names)
        self._metrics.rpc("GetDevicePluginOptions", self._resource.name)
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def _changed_since(self, seen: int) -> bool:
        """Whether ListAndWatch has something to send: closing, or devices newer than version `seen`."""
        return self._closing or self._version != seen

    async def ListAndWatch(self, request, context) -> AsyncIterator[api_pb2.ListAndWatchResponse]:  # noqa: N802 (gRPC names)
        self._metrics.rpc("ListAndWatch", self._resource.name)
        self.active_streams += 1
        log.info("ListAndWatch stream opened", extra={"resource": self._resource.name,
                                                      "streams": self.active_streams})
        try:
            seen = -1
            while True:
                async with self._changed:
                    await self._changed.wait_for(functools.partial(self._changed_since, seen))
                    if self._closing:
                        if self._send_empty_on_close:
                            yield api_pb2.ListAndWatchResponse()
                        return
                    seen = self._version
                    msg = device_message(self._resource)
                yield msg
        finally:
            self.active_streams -= 1
            log.info("ListAndWatch stream closed", extra={"resource": self._resource.name,
                                                          "streams": self.active_streams})

    @_refusing(api_pb2.PreferredAllocationResponse)
    async def GetPreferredAllocation(self, request, context):  # noqa: N802 (gRPC names)
        resource, policy = self._resource, self._policy
        self._metrics.rpc("GetPreferredAllocation", resource.name)
        try:
            # How it is answered (shape, partners, loop or pool, deadline): plugin.allocation.preferred.
            found = await preferred.answer(
                policy, resource.graph, request, len(resource.devices),
                partners=functools.partial(self._handling.pairing.partners, resource.name),
                pool=self._handling.search, deadline_s=self._handling.deadline_s,
                client_left_s=context.time_remaining)
        except AllocationError as e:
            self._reject("GetPreferredAllocation", str(e))
        return self._preferred_response(resource.name, request, found.results, found.seconds, found.where)

    def _preferred_response(self, name: str, request: api_pb2.PreferredAllocationRequest, results: list[Allocation],
                            seconds: list[float], where: str) -> api_pb2.PreferredAllocationResponse:
        """The answer to `request`, with its metrics and (rate-limited) log lines; `seconds` per result."""
        resp = api_pb2.PreferredAllocationResponse()
        for creq, result, took in zip(request.container_requests, results, seconds):
            self._metrics.preferred(name, took, result.optimal, where)
            if result.pairs and log.isEnabledFor(logging.DEBUG):
                log.debug("preferred allocation paired", extra={
                    "resource": name, "ids": ",".join(result.ids), "pairing": result.pairing,
                    "pairs": ", ".join(f"{d}~{p} {pair_label(w)}" for d, p, w in result.pairs)})
            if not result.optimal:
                self._handling.limited_log.warning(
                    ("not-optimal", name), "preferred allocation not proven optimal within the time budget",
                    {"resource": name, "size": creq.allocation_size, "available": len(creq.available_deviceIDs)})
            resp.container_responses.add(deviceIDs=result.ids)
        return resp

    @_refusing(api_pb2.AllocateResponse)
    async def Allocate(self, request, context):  # noqa: N802 (gRPC names)
        resource = self._resource
        self._metrics.rpc("Allocate", resource.name)
        table = resource.by_id()
        resp = api_pb2.AllocateResponse()
        n_requests = len(request.container_requests)
        if not n_requests:
            self._reject("Allocate", "request has no container_requests")
        if n_requests > max(1, len(table)):
            self._reject("Allocate", f"{n_requests} container_requests, more than the {len(table)} "
                         "devices of this resource (the kubelet asks for one container per call)")
        for n, creq in enumerate(request.container_requests):
            if len(creq.devices_ids) > len(table):
                self._reject("Allocate", f"container_requests[{n}]: devices_ids lists "
                             f"{len(creq.devices_ids)} IDs but {resource.name} has only {len(table)} devices")
        for n, creq in enumerate(request.container_requests):
            where = f"container_requests[{n}]"
            ids = list(creq.devices_ids)
            if not ids:
                self._reject("Allocate", f"{where}: devices_ids is empty")
            dup = _duplicates(ids)
            if dup:
                self._reject("Allocate", f"{where}: repeated device IDs: {brief_ids(dup)}")
            unknown = [i for i in ids if i not in table]
            if unknown:
                self._reject("Allocate",
                             f"{where}: unknown device IDs for {resource.name}: {brief_ids(unknown)}")
            unhealthy = [i for i in ids if not table[i].device.healthy]
            if unhealthy:
                # The kubelet only hands out healthy devices; one that turned bad in between must not be used.
                self._reject("Allocate", f"{where}: devices are unhealthy: {brief_ids(unhealthy)}")
            try:
                allocation = resource.allocate(ids)
            except AllocationError as e:  # a rule of the resource (e.g. failRequestsGreaterThanOne)
                self._reject("Allocate", f"{where}: {e}")
            resp.container_responses.append(to_proto(allocation))
            self._metrics.allocated(resource.name, len(ids))
        # Only an Allocate accepted whole joins a group (why: `plugin.allocation.pairing_service`).
        # The NCCL hint goes on the answer of the group's Allocate that first knows its GPUs and NICs.
        for creq, answer in zip(request.container_requests, resp.container_responses):
            pairs = self._handling.pairing.on_allocate(resource.name, list(creq.devices_ids))
            self._metrics.paired(resource.name, [p.link for p in pairs])
            hint = self._handling.pairing.nccl_env_for(resource.name)
            if hint:
                answer.envs.update(hint)
                log.debug("NCCL hint", extra={"resource": resource.name,
                                               "env": " ".join(f"{k}={v}" for k, v in sorted(hint.items()))})
        return resp

    @_refusing(api_pb2.PreStartContainerResponse)
    async def PreStartContainer(self, request, context):  # noqa: N802 (gRPC names)
        self._metrics.rpc("PreStartContainer", self._resource.name)
        table = self._resource.by_id()
        if len(request.devices_ids) > len(table):
            self._reject("PreStartContainer", f"devices_ids lists {len(request.devices_ids)} IDs but "
                         f"{self._resource.name} has only {len(table)} devices")
        unknown = [i for i in request.devices_ids if i not in table]
        if unknown:
            self._reject("PreStartContainer", f"unknown device IDs: {brief_ids(unknown)}")
        return api_pb2.PreStartContainerResponse()

    @staticmethod
    def _reject(method: str, message: str) -> NoReturn:
        raise _Rejected(method, bounded(message))

    def _refuse(self, context: grpc.aio.ServicerContext, rejected: _Rejected) -> None:
        """Answer INVALID_ARGUMENT with set_code/set_details rather than `context.abort`.

        Why: abort raises through grpc.aio and the request stays referenced until much later: 300
        refused 900 KB requests kept 31.5 MiB more resident with abort, 0.2-2.3 MiB with this
        (grpcio 1.85.1; tests/daemon/test_request_limits.py).
        """
        name = self._resource.name
        self._metrics.rpc_error(rejected.method, name, "INVALID_ARGUMENT")
        # A client can send bad requests at will: one line per kind of problem and minute, then a summary.
        self._handling.limited_log.warning((rejected.method, name, reason_kind(rejected.message)),
                                          "rejected request",
                                          {"method": rejected.method, "resource": name, "reason": rejected.message})
        context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
        context.set_details(rejected.message)


class _Rejected(Exception):
    """A request refused as bad input; turned into INVALID_ARGUMENT by the RPC that got it."""

    def __init__(self, method: str, message: str):
        super().__init__(message)
        self.method = method
        self.message = message


class ResourceServer:
    """A DevicePlugin service bound to `<plugin_dir>/<socket_name>`; can be stopped and served again."""

    def __init__(self, plugin_dir: str, resource: Resource, policy_factory: PolicyFactory, metrics: Metrics,
                 handling: RequestHandling | None = None):
        self.plugin_dir = plugin_dir
        self.handling = handling or RequestHandling()
        self.service = DevicePluginService(resource, policy_factory, metrics, self.handling)
        self._policy_factory = policy_factory
        self._metrics = metrics
        self._server: grpc.aio.Server | None = None
        self.identity: SocketIdentity | None = None
        #: identity of the kubelet.sock we registered through (None: not registered)
        self.registered_with: SocketIdentity | None = None

    @property
    def name(self) -> str:
        return self.service.resource.name

    @property
    def socket_path(self) -> str:
        return os.path.join(self.plugin_dir, self.service.resource.socket_name)

    @property
    def serving(self) -> bool:
        return self._server is not None

    def socket_is_ours(self) -> bool:
        """True while our socket file is the one we bound (not deleted, not replaced)."""
        return self.identity is not None and socket_identity(self.socket_path) == self.identity

    async def start(self) -> None:
        """Serve on a fresh socket (a new service object, so no old stream survives).

        The socket appears at its path with mode 0600 (only root, i.e. the
        kubelet, may talk to us) in one atomic step (`plugin.serving.socket_file`).
        Raises OSError or RuntimeError (gRPC's bind) with nothing left running.
        """
        if self._server is not None:
            raise RuntimeError("server already running")
        self.service = DevicePluginService(self.service.resource, self._policy_factory, self._metrics, self.handling)
        path = self.socket_path
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0),
                                          ("grpc.max_receive_message_length", MAX_REQUEST_BYTES)])
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server)
        self.identity = await serve_at(server, path, 0o600)
        self._server = server
        self.registered_with = None
        log.info("serving", extra={"resource": self.name, "socket": path})

    async def stop(self, send_empty: bool = False, grace: float = 0.5) -> bool:
        """Stop serving. Returns True when a stream was open (a live kubelet may still be attached)."""
        server, self._server = self._server, None
        if server is None:
            return False
        had_streams = self.service.active_streams > 0
        await self.service.close_streams(send_empty)
        if had_streams and send_empty:
            # Give the stream a moment to flush the empty list before the channel closes.
            for _ in range(50):
                if self.service.active_streams == 0:
                    break
                await asyncio.sleep(0.01)
        await server.stop(grace)
        remove_if_ours(self.socket_path, self.identity)
        self.registered_with = None
        log.info("stopped serving", extra={"resource": self.name, "had_streams": had_streams})
        return had_streams

    async def update(self, resource: Resource) -> None:
        if resource.socket_name != self.service.resource.socket_name:
            raise ValueError("a resource cannot change its socket while served")
        await self.service.update(resource)
