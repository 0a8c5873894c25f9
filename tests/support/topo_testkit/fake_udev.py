"""udev for tests: the monitor the product opens, and events sent into it as the kernel would.

Why here and not a hook in the product: udev is the hardware boundary, so tests replace it there,
through the seam the product already has (`HotplugWatcher(monitor_factory=...)`,
`HardwareOptions.monitor_factory`), and the product's own path runs unchanged: the monitor's
file descriptor becomes readable on the event loop, the watcher reads the queued events, filters
them by subsystem and action and debounces them into one rescan.

`FakeUdev` is the factory; `send` may be called from any thread, and before the watcher has opened
its monitor (the events then wait for it), so a test never has to guess when the watcher is up.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from plugin.sources.udev_hotplug import HotplugEvent


class FakeMonitor:
    """A udev monitor stand-in: a pipe the test writes events into (`fileno`, `read`, `close`)."""

    def __init__(self, subsystems: Sequence[str] = ()):
        self.subsystems = tuple(subsystems)
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        self.pending: list[HotplugEvent] = []
        self.lock = threading.Lock()
        self.closed = False

    def fileno(self) -> int:
        return self.r

    def send(self, ev: HotplugEvent) -> bool:
        """Queue `ev` and wake the reader; False when the monitor was closed (the event is dropped)."""
        with self.lock:
            if self.closed:
                return False
            self.pending.append(ev)
            os.write(self.w, b"x")
        return True

    def read(self) -> list[HotplugEvent]:
        with self.lock:
            try:
                os.read(self.r, 4096)
            except BlockingIOError:
                pass
            out, self.pending = self.pending, []
        return out

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                os.close(self.r)
                os.close(self.w)


class FakeUdev:
    """The monitor factory a watcher opens; `send` delivers an event to every open monitor, or keeps
    it for the next one opened."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[HotplugEvent] = []
        self.monitors: list[FakeMonitor] = []

    def __call__(self, subsystems: Sequence[str]) -> FakeMonitor:
        monitor = FakeMonitor(subsystems)
        with self._lock:
            self.monitors.append(monitor)
            waiting, self._waiting = self._waiting, []
        for ev in waiting:
            monitor.send(ev)
        return monitor

    def send(self, action: str, subsystem: str, sys_path: str = "") -> None:
        ev = HotplugEvent(action, subsystem, sys_path)
        with self._lock:
            live = [m for m in self.monitors if not m.closed]
            if not live:
                self._waiting.append(ev)
                return
        if not any([m.send(ev) for m in live]):  # every one closed meanwhile: keep it for the next
            with self._lock:
                self._waiting.append(ev)
