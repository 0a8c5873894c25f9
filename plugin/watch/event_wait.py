"""Wait for an `asyncio.Event` with a timeout, without ever swallowing a cancellation.

Why not `asyncio.wait_for(event.wait(), timeout)`: on Python 3.11 it returns
normally when the task is cancelled in the same loop iteration in which the
event is set (CPython gh-86296), so a watcher loop that uses it can miss its
cancellation and run on forever. The daemon's file watcher did exactly that:
a node-file edit landing as SIGTERM arrived left shutdown waiting on a task
that never ended (about one stop in ten under load). `asyncio.timeout`
(3.11) hands a cancellation through in every case.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """True when `event` is set within `timeout` seconds, False when the time ran out."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True
