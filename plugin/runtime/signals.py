"""Signal handlers for the daemon's event loop that never lose a signal.

Why not `loop.add_signal_handler`: asyncio passes the signal number through
the loop's self-pipe (`signal.set_wakeup_fd`), the same socket that every
`call_soon_threadsafe` from a worker thread writes a byte to. When that
socket's buffer is full (a stalled loop and busy threads: a unix socket
holds only a few hundred one-byte writes), the signal's byte is dropped and
the handler never runs (CPython issue #74224). Measured here: a SIGTERM sent
while a maximal GetPreferredAllocation was being cancelled was lost about one
time in ten under load, and the daemon kept serving until it was killed.

What we do instead, as uvloop, Twisted and trio do: the signal is recorded
by a Python-level handler (it runs on the main thread, which is the loop's
thread, between two bytecodes), which schedules the real handler on the
loop; a private socketpair given to `signal.set_wakeup_fd` only wakes the
loop up from `select`, its bytes carry no meaning, so a full buffer loses
nothing (a full buffer is a readable socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable, Mapping
from types import FrameType


class LoopSignals:
    """Run `handlers[sig]()` on `loop` for each signal received; `close()` restores the previous state."""

    def __init__(self, loop: asyncio.AbstractEventLoop, handlers: Mapping[signal.Signals, Callable[[], object]]):
        self._loop = loop
        self._handlers = dict(handlers)
        self._rsock, self._wsock = socket.socketpair()
        for s in (self._rsock, self._wsock):
            s.setblocking(False)
        self._previous: dict[signal.Signals, Callable[[int, FrameType | None], object] | int | None] = {}
        loop.add_reader(self._rsock.fileno(), self._drain)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._wsock.fileno(), warn_on_full_buffer=False)
        for sig in self._handlers:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # On the main thread (the loop's) between bytecodes: schedule, never run loop code here.
        handler = self._handlers.get(signal.Signals(signum))
        if handler is not None:
            self._loop.call_soon_threadsafe(handler)

    def _drain(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while self._rsock.recv(4096):
                pass

    def close(self) -> None:
        for sig, previous in self._previous.items():
            if previous is not None:  # None: the handler was not installed from Python, nothing to put back
                signal.signal(sig, previous)
        self._previous.clear()
        signal.set_wakeup_fd(self._previous_wakeup_fd)
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._rsock.fileno())
        self._rsock.close()
        self._wsock.close()
