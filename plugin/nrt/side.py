"""What the daemon runs with `--nrt`: the held devices polled, the object rebuilt, the writer fed.

Why a poll of pod-resources: the kubelet tells a device plugin about an
allocation (`Allocate`) but never about a pod's end, and its pod-resources
`Watch` is not implemented; `List` every `poll_s` (1 s) sees both, so a
released device shows as available within about 2 s (poll plus the writer's
coalescing). A `List` is answered from the kubelet's memory; only a change
(held devices, topology, health, resources) makes a write.

Until the first `List` succeeds nothing is written: publishing every device
as available would invite the scheduler to a node whose devices are held. A
later failed `List` keeps the last held set (the log says the state changed,
once: `plugin.allocation.pod_resources`).

The daemon's hook (`plugin.runtime.daemon`): `make_nrt_side(...)` gives an
object with `start(topology, resources)`, `update(topology, resources)` and
`stop()`; nothing else of the daemon is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from allocator.topology import NodeTopology

from ..allocation.pod_resources import Holdings, PodResourcesReader
from .build import PublishedResource, TopologyManagerSettings, build_nrt, published_resources
from .kubelet_config import read_topology_manager
from .writer import NrtWriter

if TYPE_CHECKING:
    from .api import NrtApi

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NrtOptions:
    node_name: str
    pod_resources_socket: str
    kubelet_config: str
    poll_s: float = 1.0
    min_interval_s: float = 1.0


class HeldSource:
    """(resource, device ID) of every device a container holds, from pod-resources `List`; None: unknown."""

    def __init__(self, reader: PodResourcesReader):
        self.reader = reader

    async def held(self) -> frozenset[tuple[str, str]] | None:
        holdings: Holdings | None = await self.reader.holdings()
        return None if holdings is None else frozenset(holdings.holder)

    async def close(self) -> None:
        await self.reader.close()


class NrtSide:
    def __init__(self, options: NrtOptions, connect: Callable[[], Awaitable[NrtApi]],
                 held: HeldSource | None = None, settings: TopologyManagerSettings | None = None):
        self.options = options
        self.writer = NrtWriter(options.node_name, connect, options.min_interval_s)
        self.held_source = held or HeldSource(PodResourcesReader(options.pod_resources_socket, timeout_s=1.0))
        self.settings = settings
        self.topology: NodeTopology | None = None
        self.resources: Sequence[PublishedResource] = ()
        self.held: frozenset[tuple[str, str]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()

    async def start(self, topology: NodeTopology, resources: Iterable[Any]) -> None:
        if self.settings is None:
            self.settings = await asyncio.to_thread(read_topology_manager, self.options.kubelet_config)
        log.info("NodeResourceTopology publisher on", extra={
            "node": self.options.node_name, "topology_manager_policy": self.settings.policy or "unknown",
            "topology_manager_scope": self.settings.scope or "unknown", "from": self.settings.origin})
        self.update(topology, resources)
        self._tasks = [asyncio.create_task(self.writer.run(), name="nrt-writer"),
                       asyncio.create_task(self._poll(), name="nrt-poll")]

    def update(self, topology: NodeTopology, resources: Iterable[Any]) -> None:
        """A new topology (health, hot-plug) or resource build; the loop's thread only."""
        self.topology = topology
        self.resources = published_resources(resources)
        self._rebuild()

    def _rebuild(self) -> None:
        if self.topology is None or self.held is None or self.settings is None:
            return
        self.writer.want(build_nrt(self.options.node_name, self.topology, self.resources, self.held,
                                   self.settings))

    async def _poll(self) -> None:
        while True:
            held = await self.held_source.held()
            if held is not None and held != self.held:
                self.held = held
                self._rebuild()
            await asyncio.sleep(self.options.poll_s)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self.held_source.close()
        await self.writer.stop(delete=True)


def make_nrt_side(options: NrtOptions) -> NrtSide:
    """The daemon's factory (`serve --nrt`): the real API client, connected when the writer starts."""
    from .api import connect_nrt_api  # noqa: PLC0415 (lightkube only with --nrt)

    return NrtSide(options, connect_nrt_api)
