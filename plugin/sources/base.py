"""The interface every discovery source implements.

Why a push interface: hot-plug, health events and simulated-file edits all
end in the same place, a new whole `NodeTopology`; the daemon diffs it
against the served one. Sources never talk to servers directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from allocator.topology import NodeTopology

Publish = Callable[[NodeTopology], None]


class TopologySource(Protocol):
    """Builds the node topology and reports changes."""

    #: One line for logs and `discover`, e.g. "simulated dgx-a100" or "nvml+sysfs".
    description: str

    def load(self) -> NodeTopology:
        """Discover once. Blocking (NVML, sysfs): the daemon calls it in a worker thread.

        Raises `TopologyError` (or `DiscoveryError`) with a message naming what is wrong.
        """
        ...

    async def watch(self, current: NodeTopology, publish: Publish) -> None:
        """Run until cancelled, calling `publish` (on the event loop) with each new topology.

        `current` is what `load` returned. Must never busy-loop and must survive
        bad intermediate states (log them, keep the last good topology).
        """
        ...
