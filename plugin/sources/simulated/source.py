"""The simulated node as a live `TopologySource`: edits to the SOURCE file reach the kubelet.

Why: simulating failures (`health: Unhealthy`, a device removed) while the
daemon runs is how users and tests see what the kubelet would see. A broken
edit is logged and ignored; the last good topology stays in service.
"""

from __future__ import annotations

import asyncio
import logging

from allocator.topology import NodeTopology

from ...watch.filewatch import watch_file
from ..base import Publish
from ...errors import InputError
from . import load_simulated, source_path

log = logging.getLogger(__name__)


class SimulatedSource:
    """A built-in node (static) or a file that is re-read when it changes."""

    def __init__(self, source: str, debounce_s: float = 0.1):
        self.source = source
        self.path = source_path(source)
        self.description = f"simulated {source}"
        self.debounce_s = debounce_s

    def load(self) -> NodeTopology:
        return load_simulated(self.source)

    async def watch(self, current: NodeTopology, publish: Publish) -> None:
        if self.path is None:
            await asyncio.Event().wait()  # built-ins never change
            return
        last = current

        async def reload() -> None:
            nonlocal last
            try:
                topology = await asyncio.to_thread(load_simulated, self.source)
            except InputError as e:
                log.warning("simulated node edit ignored; keeping the last good topology", extra={"reason": str(e)})
                return
            except Exception:  # a bug, not a bad file: loud, and the last good topology stays
                log.exception("simulated node edit ignored: internal error (a bug); keeping the last good topology",
                              extra={"source": self.source})
                return
            if topology != last:
                last = topology
                log.info("simulated node changed", extra={"source": self.source})
                publish(topology)

        await watch_file(str(self.path), reload, debounce_s=self.debounce_s)
