"""Any topology source, with the fabric clique label kept in step with what it publishes.

Why a wrapper: the clique is a fact of the served topology (`Device.fabric`),
whichever source found it. The hardware source keeps the NFD file itself (it
also re-reads the fabric on a GPU health change); this wrapper gives the same
label to the simulated source (so `--simulate` nodes, as in the cluster tests,
carry it) and the Node-object way (`plugin.runtime.node_labels`) to both.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from allocator.topology import NodeTopology

from ..sources.fabric_labels import FabricLabelFile
from .node_labels import NodeLabeller
from ..sources.base import Publish, TopologySource

log = logging.getLogger(__name__)


def _log_failure(task: asyncio.Task) -> None:
    """The labeller only ends by cancellation; anything else is a bug, said loudly (serving goes on)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("the node label task failed (a bug); the node's clique label is no longer kept",
                  exc_info=task.exception())


class FabricLabelledSource:
    """Delegates discovery to `inner`; updates the label file and/or the Node label on every topology."""

    def __init__(self, inner: TopologySource, file: FabricLabelFile | None = None,
                 node: NodeLabeller | None = None):
        self.inner = inner
        self.file = file
        self.node = node
        self.description = inner.description

    def __getattr__(self, name: str) -> Any:  # the inner source's extras (the hardware's NIC inventory...)
        return getattr(self.inner, name)

    def _label(self, topology: NodeTopology) -> None:
        if self.file is not None:
            self.file.update(topology.gpus)
        if self.node is not None:
            self.node.update(topology.gpus)

    def load(self) -> NodeTopology:
        topology = self.inner.load()
        self._label(topology)
        return topology

    async def watch(self, current: NodeTopology, publish: Publish) -> None:
        def relay(topology: NodeTopology) -> None:
            self._label(topology)
            publish(topology)

        if self.node is None:
            await self.inner.watch(current, relay)
            return
        labeller = asyncio.create_task(self.node.run(), name="fabric-node-label")
        labeller.add_done_callback(_log_failure)
        try:
            await self.inner.watch(current, relay)
        finally:
            labeller.cancel()
            await asyncio.gather(labeller, return_exceptions=True)
