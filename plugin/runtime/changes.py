"""The one writer of live changes: topology updates and config reloads, applied in arrival order.

Why one writer: applying a change awaits (a build in a worker thread, the CDI
specs, the pairing index), so two changes applied by two tasks can finish in
either order and leave the servers on the older one. Here every change goes
into one queue and one task applies them, one at a time, in the order they
arrived; the task is the daemon's own (cancelled at shutdown, its failures
seen), never a task per event left to run on its own.

Bursts are coalesced, without losing what any change meant:
- a topology update replaces the updates still waiting (each is a whole
  `NodeTopology`: only the latest needs building);
- a config reload waiting already covers a newer one (a reload reads the file
  when it is applied, so it reads the newest text).
A waiting reload and a waiting topology update are both applied, in the order
they arrived. The queue therefore never holds more than two changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from allocator import NodeTopology

log = logging.getLogger("plugin.runtime.daemon")  # the daemon's logger (see supervisor.py)


@dataclass(frozen=True)
class TopologyUpdate:
    """A source published a new topology."""

    topology: NodeTopology


@dataclass(frozen=True)
class ConfigReload:
    """The config file changed, or SIGHUP: read the options again and apply them."""

    cause: str


Change = TopologyUpdate | ConfigReload


class LiveChanges:
    """The queue of live changes and the task that applies them (`run`), one at a time."""

    def __init__(self, apply: Callable[[Change], Awaitable[None]]):
        self._apply = apply
        self._waiting: deque[Change] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        #: Changes submitted, and those left out because a later or waiting one covers them.
        self.submitted = 0
        self.coalesced = 0

    def submit(self, change: Change) -> None:
        """Queue `change` (on the loop; never blocks, never waits for the change to be applied)."""
        self.submitted += 1
        if isinstance(change, TopologyUpdate):
            superseded = [c for c in self._waiting if isinstance(c, TopologyUpdate)]
            for c in superseded:
                self._waiting.remove(c)
            self.coalesced += len(superseded)
            self._waiting.append(change)
        elif any(isinstance(c, ConfigReload) for c in self._waiting):
            self.coalesced += 1
            return
        else:
            self._waiting.append(change)
        self._idle.clear()
        self._wake.set()

    @property
    def waiting(self) -> tuple[Change, ...]:
        return tuple(self._waiting)

    async def idle(self) -> None:
        """Return once every submitted change has been applied (or has failed)."""
        await self._idle.wait()

    async def run(self) -> None:
        """The writer: apply the waiting changes in order, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                change = self._waiting.popleft()
                try:
                    await self._apply(change)
                except Exception:  # `apply` reports bad input itself; anything else is a bug, and the writer lives on
                    log.exception("live change failed: internal error (a bug); keeping the last good state",
                                  extra={"change": type(change).__name__})
            self._idle.set()
