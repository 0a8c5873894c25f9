"""Keeps MPS control daemons running: start, set the defaults, watch, restart with backoff, quit at the end.

One supervisor serves both sides (one piece of code, so both behave alike):
- the device plugin's `sharing.mps` resources: their daemons are known at start (`specs`), `run()`
  keeps them up and `stop()` quits them;
- DRA claims (`plugin.dra.claims.mps`): daemons come and go with the claims. `ensure()` brings one
  up at the first claim's prepare and supervises it from then on, `discard()` quits it with the
  last claim, `watch()` takes over the daemon of a claim prepared before a restart of the driver,
  and `detach()` stops supervising without quitting (the driver restarts; the claims' containers
  keep their daemon). `wanted` is asked before a dead daemon is started again: during a rolling
  update the other instance may have unprepared its last claim. The first two are called from the checkpoint's worker thread, so they block
  and are thread-safe: a per-daemon lock orders a restart by the supervisor against a quit by the
  last claim, so a daemon being let go is never started again behind the claim's back.

Why one task per daemon: a daemon that will not start (no program, a GPU gone) must not hold back
the others, and each retries on its own backoff (`plugin.backoff.Backoff`, full jitter), so
daemons that died together do not restart together. A daemon that dies is restarted after a
backoff delay too, and the backoff is reset only once it has answered for a whole probe interval:
a daemon that dies as soon as it is up is restarted ever more slowly, not in a tight loop.

What "ready" means, as NVIDIA's device plugin waits for it (the `.ready` file of its PR #1946):
the daemon answers AND its defaults (thread share, pinned memory) are set. Whenever a probe finds
it gone, and while a restart fails, the owner is told `on_change(name, False)`, so that it can mark
the daemon's devices unhealthy (the device plugin's replicas, DRA's devices); `True` once it is
ready again (for a daemon let go with `discard()` while down: it gates nothing any more). A daemon
found answering when supervision begins (ours, from before a restart) is kept and given its
defaults again: the containers using it keep working. `on_change` is always called on the event
loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence

from ..backoff import Backoff
from .control import DaemonSpec, MpsControl, MpsControlError

log = logging.getLogger(__name__)

#: How often a ready daemon is asked whether it still answers.
DEFAULT_PROBE_INTERVAL_S = 5.0


class MpsSupervisor:
    """The control daemons of `specs` (and those `ensure()`d or `watch()`ed later), kept up while supervised."""

    def __init__(self, control: MpsControl, specs: Sequence[DaemonSpec] = (),
                 on_change: Callable[[str, bool], None] = lambda name, ready: None,
                 probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                 backoff: Callable[[], Backoff] = lambda: Backoff(1.0, 30.0),
                 wanted: Callable[[DaemonSpec], bool] = lambda spec: True):
        self.control = control
        #: Asked (in a worker thread) before a daemon found dead is started again: False lets it go instead
        #: (DRA: no claim holds it any more, e.g. the other instance of a rolling update unprepared the last).
        self.wanted = wanted
        #: The daemons supervised now, by name (changed under `_guard` and the daemon's lock).
        self.specs = {s.name: s for s in specs}
        self.on_change = on_change
        self.probe_interval_s = probe_interval_s
        self._backoff = backoff
        # None: not reported yet (a DRA device is healthy until told otherwise); False for the device
        # plugin's daemons, whose replicas are unhealthy until their daemon is first ready.
        self._ready: dict[str, bool | None] = {n: False for n in self.specs}
        #: Starts of each daemon (the first one included), for logs and tests.
        self.starts: dict[str, int] = {n: 0 for n in self.specs}
        self._tasks: dict[str, asyncio.Task] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def ready(self, name: str) -> bool:
        return bool(self._ready.get(name))

    def _lock_of(self, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    def _set(self, name: str, ready: bool) -> None:
        """On the loop: report a change of a daemon still supervised."""
        if name in self.specs and self._ready.get(name) != ready:
            self._ready[name] = ready
            self.on_change(name, ready)

    # -- the loop side ------------------------------------------------------------------------------
    def start(self) -> None:
        """Begin supervising on the running loop: every daemon known now gets its task."""
        self._loop = asyncio.get_running_loop()
        for spec in list(self.specs.values()):
            self._spawn(spec, up=False)

    async def run(self) -> None:
        """Supervise every daemon until cancelled."""
        self.start()
        try:
            await asyncio.Event().wait()
        finally:
            for t in list(self._tasks.values()):
                t.cancel()

    def _spawn(self, spec: DaemonSpec, up: bool) -> None:
        old = self._tasks.get(spec.name)
        if old is not None and not old.done():
            return
        task = asyncio.get_running_loop().create_task(self._keep(spec, up), name=f"mps:{spec.name}")
        task.add_done_callback(self._ended)
        self._tasks[spec.name] = task

    @staticmethod
    def _ended(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("MPS control daemon supervision failed unexpectedly",
                      extra={"task": task.get_name(), "reason": repr(task.exception())})

    def _bring_up(self, spec: DaemonSpec) -> bool:
        """Blocking: the daemon answers with its defaults set; False when it is no longer supervised (or no
        longer `wanted`: then it is let go here)."""
        with self._lock_of(spec.name):
            if self.specs.get(spec.name) is not spec:
                return False
            if not self.control.probe(spec) and not self.wanted(spec):
                del self.specs[spec.name]
                self._call_soon(self._forget, spec.name, self._ready.pop(spec.name, None))
                log.info("MPS control daemon gone and no longer wanted: not started again",
                         extra={"daemon": spec.name})
                return False
            self._bring_up_locked(spec)
            return True

    def _bring_up_locked(self, spec: DaemonSpec) -> None:
        if not self.control.probe(spec):
            self.starts[spec.name] += 1
            self.control.start(spec)
        self.control.configure(spec)

    async def _keep(self, spec: DaemonSpec, up: bool) -> None:
        """One daemon's life: bring it up (unless `up`), probe it, restart it with backoff when it dies."""
        backoff = self._backoff()
        name = spec.name
        while True:
            if not up:
                try:
                    if not await asyncio.to_thread(self._bring_up, spec):
                        return
                except (MpsControlError, OSError) as e:
                    self._set(name, False)
                    delay = backoff.next()
                    log.warning("MPS control daemon not started; its devices stay unhealthy",
                                extra={"daemon": name, "reason": str(e), "retry_s": round(delay, 2)})
                    await asyncio.sleep(delay)
                    continue
                log.info("MPS control daemon ready", extra={"daemon": name, "pipe_dir": spec.pipe_dir})
            up = False
            self._set(name, True)
            stayed = False
            while self.specs.get(name) is spec and await asyncio.to_thread(self.control.probe, spec):
                if stayed:  # it answered over a whole interval: a later death starts the backoff afresh
                    backoff.reset()
                await asyncio.sleep(self.probe_interval_s)
                stayed = True
            if self.specs.get(name) is not spec:
                return
            delay = backoff.next()
            log.warning("MPS control daemon stopped answering; its devices are unhealthy until it is back",
                        extra={"daemon": name, "restart_in_s": round(delay, 2)})
            self._set(name, False)
            await asyncio.sleep(delay)

    def _adopted(self, name: str) -> None:
        spec = self.specs.get(name)
        if spec is not None:
            self._set(name, True)
            self._spawn(spec, up=True)

    def _forget(self, name: str, ready: bool | None) -> None:
        task = self._tasks.pop(name, None)
        if task is not None and name not in self.specs:
            task.cancel()
        if ready is False and name not in self.specs:
            self.on_change(name, True)

    def _call_soon(self, fn: Callable[..., None], *args: object) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    # -- DRA: daemons that come and go (blocking, thread-safe) --------------------------------------
    def ensure(self, spec: DaemonSpec) -> None:
        """The daemon of `spec` answers with its defaults set, and is supervised from now on.

        A daemon supervised already is only probed (and brought up again if it is down): the claims
        joining it share its defaults. Raises `MpsControlError` / `OSError` when it cannot be brought
        up; a daemon new to the supervisor is then not supervised.
        """
        with self._lock_of(spec.name):
            known = self.specs.get(spec.name)
            if known is not None:
                if not self.control.probe(known):
                    self._bring_up_locked(known)
                return
            self.specs[spec.name] = spec
            self.starts.setdefault(spec.name, 0)
            try:
                self._bring_up_locked(spec)
            except BaseException:
                del self.specs[spec.name]
                raise
            self._ready.setdefault(spec.name, None)
        self._call_soon(self._adopted, spec.name)

    def discard(self, name: str) -> None:
        """Stop supervising the daemon `name` and ask it to quit (raises what the quit raised; it is not
        supervised any more either way)."""
        with self._lock_of(name):
            spec = self.specs.pop(name, None)
            if spec is None:
                return
            ready = self._ready.pop(name, None)
            try:
                self.control.quit(spec)
            finally:
                self._call_soon(self._forget, name, ready)

    def watch(self, spec: DaemonSpec) -> None:
        """On the loop: supervise the daemon of `spec` (a claim's from before a restart): kept and given its
        defaults again if it answers, started if not, with the same backoff and reports."""
        with self._lock_of(spec.name):
            if spec.name in self.specs:
                return
            self.specs[spec.name] = spec
            self.starts.setdefault(spec.name, 0)
            self._ready.setdefault(spec.name, None)
        if self._loop is not None:
            self._spawn(spec, up=False)

    async def detach(self) -> None:
        """Stop supervising; every daemon keeps running (a restarted owner `watch()`es them again)."""
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._loop = None

    async def stop(self) -> None:
        """Stop supervising, then ask every daemon to quit (each failure is logged, the others still quit)."""
        await self.detach()
        for spec in list(self.specs.values()):
            try:
                await asyncio.to_thread(self.control.quit, spec)
            except (MpsControlError, OSError) as e:
                log.warning("MPS control daemon did not quit", extra={"daemon": spec.name, "reason": str(e)})
            self._set(spec.name, False)
