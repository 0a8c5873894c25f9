"""A few worker threads for the CPU-bound preferred-allocation searches.

Why off the event loop: a search is pure Python that runs for up to its time
budget (and a request may hold many); run inline it froze every stream,
health update, registration and /healthz for as long as it ran.

Why threads and not processes: the search holds the GIL while it runs, so a
thread gives no parallel speed-up, but CPython makes a running thread hand
the GIL over every switch interval (5 ms) when another thread asks for it,
so the event loop still gets to run within milliseconds: streams and
registration stay responsive, which is what matters here. A process pool
would search in parallel, but each worker costs a Python interpreter with
the allocator loaded (tens of MiB against the chart's 192 MiB limit), every
request would pickle the device graph across, and a topology change would
have to reach every worker; no measured need justifies that.

Why our own small pool rather than `concurrent.futures.ThreadPoolExecutor`:
its workers are joined when the interpreter exits, so a search with a long
configured budget would hold SIGTERM hostage; these threads are daemons.
Two workers: a big request searches one container request at a time, so a
small request finds the other worker free and never waits for the whole big
one (at most for one search, bounded by its budget, when both are busy).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
_STOP = object()


class SearchPool:
    """Runs blocking calls on `workers` daemon threads; `await pool.run(fn, *args)` from the loop."""

    def __init__(self, workers: int = 2, name: str = "search"):
        if workers < 1:
            raise ValueError(f"a search pool needs at least one worker, got {workers}")
        self.workers = workers
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on a worker; cancelling the caller drops a job that has not started yet."""
        self._ensure_started()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._jobs.put((loop, fut, fn, args))
        return await fut

    def close(self) -> None:
        """Let the workers end after their current job (they are daemons: exit never waits for them)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._threads:
                self._jobs.put(_STOP)

    def _ensure_started(self) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("search pool is closed")
            while len(self._threads) < self.workers:
                t = threading.Thread(target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True)
                t.start()
                self._threads.append(t)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            loop, fut, fn, args = job
            if fut.cancelled():  # the RPC went away before its turn came
                continue
            try:
                result, error = fn(*args), None
            except BaseException as e:  # noqa: BLE001 (handed to the awaiting coroutine, which decides)
                result, error = None, e
            try:
                loop.call_soon_threadsafe(_settle, fut, result, error)
            except RuntimeError:
                pass  # the loop closed meanwhile (shutdown)


def _settle(fut: asyncio.Future, result: object, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
