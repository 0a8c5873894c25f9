"""DRAResourceHealth: the health of our DRA devices, streamed to the kubelet for the pod status.

Why: the slice taint (plugin/dra/slices/build.py) keeps new claims off a bad GPU,
but the pod already holding it is never told. With ResourceHealthStatus (beta,
on by default since 1.36) the kubelet opens `NodeWatchResources` on our DRA
socket when the registration lists a DRAResourceHealth service, and writes
what we stream into `status.containerStatuses[].allocatedResourcesStatus` of
every pod whose claim holds the device: Unhealthy when it turns bad, Healthy
again when it recovers (the GPU health monitor's quiet period, or an edit of
the simulated node).

What the kubelet expects (pkg/kubelet/cm/dra in 1.37):
- every message is the full list of the driver's devices (pool, device name);
  a device it stops hearing about turns Unknown after the report's timeout;
- a report is stale after `health_check_timeout_seconds` (default 30 s) even
  when nothing changed, so the stream repeats the list every `heartbeat_s`
  (a third of the timeout: two lost beats are tolerated);
- the stream ends when the kubelet cancels it (it re-opens one every 5 s while
  we are registered), or when the driver stops.

Health comes from the same topology the slices are built from (`update`), so
the taint and the pod status always tell one story. Devices the driver serves
but leaves out of the slice (`unhealthy: remove`) are still reported: a pod
may hold one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import grpc

from allocator.topology import HEALTHY, UNHEALTHY, NodeTopology

from ...api.drahealth.v1 import api_pb2 as health_v1
from ...api.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from ...api.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from ...api.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from ...watch.event_wait import wait_event
from ..slices.build import SliceOptions, device_table

log = logging.getLogger(__name__)

#: What the registration lists, newest first (1.37 takes v1; 1.36 only knows v1alpha1).
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
#: The kubelet's own default report timeout (pkg/kubelet/cm/dra/healthinfo.go, 1.37).
KUBELET_DEFAULT_TIMEOUT_S = 30


@dataclass(frozen=True)
class DeviceHealthReport:
    """One device's health as the kubelet gets it: identified by pool and slice device name."""

    pool: str
    device: str
    health: str  # allocator.topology HEALTHY / UNHEALTHY, anything else is reported UNKNOWN
    message: str = ""


class HealthBoard:
    """The current health of every device the driver serves, and a wake-up for each change.

    `update` runs on the event loop (the driver calls it with every new topology); each stream waits
    on `changed` and sends the full list again."""

    def __init__(self, options: SliceOptions, *, heartbeat_s: float = 10.0,
                 clock: Callable[[], float] = time.time):
        if heartbeat_s <= 0:
            raise ValueError("the DRA health heartbeat must be > 0 seconds")
        self.options = options
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self._reports: dict[str, DeviceHealthReport] = {}
        self._changed = asyncio.Event()
        self._closed = False
        #: Changes seen so far (a stream resends when this moved).
        self.version = 0

    @property
    def timeout_s(self) -> int:
        """The staleness timeout sent with each report: three heartbeats, whole seconds, at least 1."""
        return max(1, round(self.heartbeat_s * 3))

    def update(self, topology: NodeTopology) -> bool:
        """Take the health of `topology`'s DRA devices; True (and streams woken) when anything changed."""
        fresh: dict[str, DeviceHealthReport] = {}
        for name, d in device_table(topology, self.options).items():
            msg = "" if d.health == HEALTHY else (f"{d.name}: {d.health_reason}" if d.health_reason
                                                  else f"{d.name} is {d.health} (the node's health checks say so)")
            fresh[name] = DeviceHealthReport(self.options.pool, name, d.health, msg)
        if fresh == self._reports:
            return False
        for name, r in fresh.items():
            old = self._reports.get(name)
            if self._reports and (old is None or old.health != r.health):
                log.info("DRA device health changed", extra={"device": name, "health": r.health,
                                                             **({"reason": r.message} if r.message else {})})
        self._reports = fresh
        self._wake()
        return True

    def reports(self) -> list[DeviceHealthReport]:
        return [self._reports[n] for n in sorted(self._reports)]

    def close(self) -> None:
        """End every stream (the driver stops)."""
        self._closed = True
        self._wake()

    @property
    def closed(self) -> bool:
        return self._closed

    def _wake(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, seen: int) -> bool:
        """Wait until the board moves past version `seen` or a heartbeat is due; True on a change."""
        if self.version != seen:
            return True
        return await wait_event(self._changed, self.heartbeat_s)


def _to_message(pb2: ModuleType, board: HealthBoard) -> object:
    """The full list, stamped now: every send re-reads the live topology's verdict."""
    now = int(board.clock())
    status = {HEALTHY: pb2.HEALTHY, UNHEALTHY: pb2.UNHEALTHY}
    return pb2.NodeWatchResourcesResponse(devices=[
        pb2.DeviceHealth(device=pb2.DeviceIdentifier(pool_name=r.pool, device_name=r.device),
                         health=status.get(r.health, pb2.UNKNOWN), last_updated_time=now,
                         health_check_timeout_seconds=board.timeout_s, message=r.message)
        for r in board.reports()])


def _servicer(pb2: ModuleType, grpc_mod: ModuleType, version: str) -> type:
    class HealthService(grpc_mod.DRAResourceHealthServicer):  # type: ignore[name-defined]  # base from the module passed in
        def __init__(self, board: HealthBoard):
            self.board = board

        async def NodeWatchResources(self, request, context):  # noqa: N802 (gRPC names)
            board = self.board
            log.info("the kubelet watches DRA device health", extra={"api": version, "devices": len(board.reports())})
            try:
                while not board.closed:
                    seen = board.version
                    yield _to_message(pb2, board)
                    await board.changed(seen)
            except asyncio.CancelledError:  # the kubelet went away or cancelled: normal
                log.debug("DRA health stream ended by the kubelet", extra={"api": version})
                raise

    HealthService.__name__ = f"HealthService_{version}"
    return HealthService


HealthServiceV1 = _servicer(health_v1, health_v1_grpc, "v1")
HealthServiceV1alpha1 = _servicer(health_v1alpha1, health_v1alpha1_grpc, "v1alpha1")


def add_health_services(server: grpc.aio.Server, board: HealthBoard) -> None:
    health_v1_grpc.add_DRAResourceHealthServicer_to_server(HealthServiceV1(board), server)
    health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(HealthServiceV1alpha1(board), server)
