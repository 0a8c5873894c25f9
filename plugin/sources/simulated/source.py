"""The simulated node as a live `TopologySource`: edits to the SOURCE file reach the kubelet.

Why watch the directory, not the file: editors and Kubernetes ConfigMaps
replace files (write to a temp name, rename over, or swap a `..data`
symlink), which an inotify watch on the file itself would lose.
"""

from __future__ import annotations

import asyncio
import logging
import os

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from allocator.topology import NodeTopology

from ..base import Publish
from ..errors import TopologyError
from . import load_simulated, source_path

log = logging.getLogger(__name__)


class _Forward(FileSystemEventHandler):
    def __init__(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event):
        self._loop = loop
        self._event = event

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:
            pass


class SimulatedSource:
    """A built-in node (static) or a file that is re-read when it changes."""

    def __init__(self, source: str, debounce_s: float = 0.1):
        self.source = source
        self.path = source_path(source)
        self.description = f"simulated {source}"
        self.debounce_s = debounce_s

    def load(self) -> NodeTopology:
        return load_simulated(self.source)

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)  # follows ConfigMap symlinks
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    async def watch(self, current: NodeTopology, publish: Publish) -> None:
        if self.path is None:
            await asyncio.Event().wait()  # built-ins never change
            return
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()
        observer = Observer()
        observer.schedule(_Forward(loop, changed), os.path.dirname(os.path.abspath(self.path)) or ".",
                          recursive=False)
        observer.daemon = True
        observer.start()
        stamp = self._stamp()
        try:
            while True:
                try:
                    # Events are the fast path; the timeout re-checks the file in case one was lost.
                    await asyncio.wait_for(changed.wait(), timeout=5.0)
                except asyncio.TimeoutError:
                    if self._stamp() == stamp:
                        continue
                await asyncio.sleep(self.debounce_s)
                changed.clear()
                new_stamp = self._stamp()
                if new_stamp == stamp:
                    continue
                stamp = new_stamp
                try:
                    topology = await asyncio.to_thread(load_simulated, self.source)
                except TopologyError as e:
                    log.warning("simulated node edit ignored; keeping the last good topology",
                                extra={"reason": str(e)})
                    continue
                if topology != current:
                    current = topology
                    log.info("simulated node changed", extra={"source": self.source})
                    publish(topology)
        finally:
            observer.stop()
            await asyncio.to_thread(observer.join, 5)
