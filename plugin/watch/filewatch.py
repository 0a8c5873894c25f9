"""Watch one file for changes with inotify, the way editors and ConfigMaps change files.

Why watch the directory, not the file: editors write a temp file and rename it
over, and Kubernetes ConfigMaps swap a `..data` symlink; an inotify watch on
the file itself would be lost after the first such change. A slow re-check
(every `recheck_s`) covers a lost event; a (inode, mtime, size) stamp of the
file (symlinks followed) filters out events that changed nothing. The
handler is expected to deal with bad content itself (log it, keep the last
good state); an exception it lets through is logged and the watch goes on.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from .event_wait import wait_event

log = logging.getLogger(__name__)

Stamp = tuple[int, int, int] | None


def stamp(path: str) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


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
            pass  # loop closed during shutdown


async def watch_file(path: str, on_change: Callable[[], Awaitable[None]], debounce_s: float = 0.1,
                     recheck_s: float = 5.0) -> None:
    """Call `on_change()` after each settled change of `path`; runs until cancelled."""
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()
    observer = Observer()
    observer.schedule(_Forward(loop, changed), os.path.dirname(os.path.abspath(path)) or ".", recursive=False)
    observer.daemon = True
    observer.start()
    last = stamp(path)
    try:
        while True:
            if not await wait_event(changed, recheck_s) and stamp(path) == last:
                continue
            await asyncio.sleep(debounce_s)  # let a burst of events (write, rename) settle
            changed.clear()
            now = stamp(path)
            if now == last:
                continue
            last = now
            try:
                await on_change()
            except Exception:  # a bug in the handler must not end the watch: the next edit is handled too
                log.exception("handling a change failed (a bug); still watching", extra={"file": path})
    finally:
        observer.stop()
        await asyncio.to_thread(observer.join, 5)
