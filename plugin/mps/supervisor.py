"""Keeps MPS control daemons running: start, set the defaults, watch, restart with backoff, quit at the end.

Why one task per daemon: a daemon that will not start (no program, a GPU
gone) must not hold back the others, and each retries on its own backoff
(`plugin.backoff.Backoff`, full jitter), so daemons that died together do not
restart together.

What "ready" means, as NVIDIA's device plugin waits for it (the `.ready` file
of its PR #1946): the daemon answers AND its defaults (thread share, pinned
memory) are set. Until then, and whenever a probe finds it gone, the owner is
told `on_change(name, False)` so that it can mark every replica of the
daemon's GPUs Unhealthy (the kubelet allocates none); `True` once it is ready
again. A daemon found answering at start (ours, from before a restart of the
plugin) is kept and given its defaults again: the containers using it keep
working.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from ..backoff import Backoff
from .control import DaemonSpec, MpsControl, MpsControlError

log = logging.getLogger(__name__)

#: How often a ready daemon is asked whether it still answers.
DEFAULT_PROBE_INTERVAL_S = 5.0


class MpsSupervisor:
    """The control daemons of `specs`, kept up while `run()` runs; `stop()` quits them."""

    def __init__(self, control: MpsControl, specs: Sequence[DaemonSpec],
                 on_change: Callable[[str, bool], None] = lambda name, ready: None,
                 probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                 backoff: Callable[[], Backoff] = lambda: Backoff(1.0, 30.0)):
        self.control = control
        self.specs = {s.name: s for s in specs}
        self.on_change = on_change
        self.probe_interval_s = probe_interval_s
        self._backoff = backoff
        self._ready: dict[str, bool] = {n: False for n in self.specs}
        #: Starts of each daemon (the first one included), for logs and tests.
        self.starts: dict[str, int] = {n: 0 for n in self.specs}
        self._tasks: list[asyncio.Task] = []

    def ready(self, name: str) -> bool:
        return self._ready.get(name, False)

    def _set(self, name: str, ready: bool) -> None:
        if self._ready.get(name) != ready:
            self._ready[name] = ready
            self.on_change(name, ready)

    async def run(self) -> None:
        """Supervise every daemon until cancelled."""
        self._tasks = [asyncio.create_task(self._keep(s), name=f"mps:{s.name}") for s in self.specs.values()]
        try:
            await asyncio.gather(*self._tasks)
        finally:
            for t in self._tasks:
                t.cancel()

    async def _bring_up(self, spec: DaemonSpec) -> None:
        if not await asyncio.to_thread(self.control.probe, spec):
            self.starts[spec.name] += 1
            await asyncio.to_thread(self.control.start, spec)
        await asyncio.to_thread(self.control.configure, spec)

    async def _keep(self, spec: DaemonSpec) -> None:
        backoff = self._backoff()
        while True:
            try:
                await self._bring_up(spec)
            except (MpsControlError, OSError) as e:
                self._set(spec.name, False)
                delay = backoff.next()
                log.warning("MPS control daemon not started; its replicas stay unhealthy",
                            extra={"daemon": spec.name, "reason": str(e), "retry_s": round(delay, 2)})
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            log.info("MPS control daemon ready", extra={"daemon": spec.name, "pipe_dir": spec.pipe_dir})
            self._set(spec.name, True)
            while await asyncio.to_thread(self.control.probe, spec):
                await asyncio.sleep(self.probe_interval_s)
            log.warning("MPS control daemon stopped answering; its replicas are unhealthy until it is back",
                        extra={"daemon": spec.name})
            self._set(spec.name, False)

    async def stop(self) -> None:
        """Stop supervising, then ask every daemon to quit (each failure is logged, the others still quit)."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for spec in self.specs.values():
            try:
                await asyncio.to_thread(self.control.quit, spec)
            except (MpsControlError, OSError) as e:
                log.warning("MPS control daemon did not quit", extra={"daemon": spec.name, "reason": str(e)})
            self._set(spec.name, False)
