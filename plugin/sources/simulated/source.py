"""The simulated node as a live `TopologySource`: edits to the SOURCE file reach the kubelet.

Why: simulating failures (`health: Unhealthy`, a device removed, an XID appended
to a GPU's `driver.xids`) while the daemon runs is how users and tests see what
the kubelet would see. A broken edit is logged and ignored; the last good
topology stays in service. The GPUs' driver facts go through the health policy
(driver_health.py), which keeps faults across edits and is asked again every
probe interval while a GPU waits for its quiet period to end.
"""

from __future__ import annotations

import asyncio
import logging

from allocator.topology import NodeTopology

from ...health.options import GpuHealthOptions
from ...watch.filewatch import watch_file
from ..base import Publish
from ...errors import InputError
from . import load_simulated_with_driver, source_path
from .driver_health import NodeDriverFacts, SimulatedHealth

log = logging.getLogger(__name__)


class SimulatedSource:
    """A built-in node (static) or a file that is re-read when it changes."""

    def __init__(self, source: str, debounce_s: float = 0.1, health: GpuHealthOptions | None = None):
        self.source = source
        self.path = source_path(source)
        self.description = f"simulated {source}"
        self.debounce_s = debounce_s
        self.health = SimulatedHealth(health)
        self._stated: tuple[NodeTopology, NodeDriverFacts] | None = None

    def load(self) -> NodeTopology:
        self._stated = load_simulated_with_driver(self.source)
        return self.health.apply(*self._stated)

    async def watch(self, current: NodeTopology, publish: Publish) -> None:
        if self.path is None:
            await asyncio.Event().wait()  # built-ins never change
            return
        last = current

        def offer(topology: NodeTopology) -> None:
            nonlocal last
            if topology != last:
                last = topology
                log.info("simulated node changed", extra={"source": self.source})
                publish(topology)

        async def reload() -> None:
            try:
                stated = await asyncio.to_thread(load_simulated_with_driver, self.source)
            except InputError as e:
                log.warning("simulated node edit ignored; keeping the last good topology", extra={"reason": str(e)})
                return
            except Exception:  # a bug, not a bad file: loud, and the last good topology stays
                log.exception("simulated node edit ignored: internal error (a bug); keeping the last good topology",
                              extra={"source": self.source})
                return
            self._stated = stated
            offer(self.health.apply(*stated))

        async def probe() -> None:
            """While a GPU waits for evidence, ask the policy again (its quiet period may have ended)."""
            while True:
                await asyncio.sleep(self.health.options.probe_every_s)
                if self.health.faulted and self._stated is not None:
                    offer(self.health.apply(*self._stated))

        prober = asyncio.get_running_loop().create_task(probe(), name="simulated-gpu-health")
        try:
            await watch_file(str(self.path), reload, debounce_s=self.debounce_s)
        finally:
            prober.cancel()
