"""Log lines that a client can trigger at will, at a bounded rate.

Why: every rejected RPC used to log one warning with the whole offending
request in it; 10,000 bad requests grew the log by tens of megabytes, and
whoever can reach the socket controls that volume. Here each kind of line
(a key such as method + resource + reason) is logged at most `burst` times
per `window_s`; the rest are counted and summarised in one line
("suppressed N similar") when the window ends, so an operator still sees how
much happened. The number of keys is bounded too: keys beyond `max_keys`
share one overflow key, so random reasons cannot grow the table.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

_OVERFLOW = ("(other)",)


@dataclass
class _Window:
    started: float
    logged: int = 0
    suppressed: int = 0
    extra: Mapping[str, object] = field(default_factory=dict)


class RateLimitedLog:
    """At most `burst` lines per key per `window_s`; `flush()` writes the summaries of ended windows."""

    def __init__(self, logger: logging.Logger, burst: int = 5, window_s: float = 60.0, max_keys: int = 128,
                 clock: Callable[[], float] = time.monotonic):
        self.logger = logger
        self.burst = burst
        self.window_s = window_s
        self.max_keys = max_keys
        self._clock = clock
        self._windows: dict[Hashable, _Window] = {}

    def warning(self, key: Hashable, msg: str, extra: Mapping[str, object]) -> bool:
        """Log `msg` unless this key used up its burst in the current window; True when logged."""
        now = self._clock()
        self._end_windows(now)
        if key not in self._windows and len(self._windows) >= self.max_keys:
            key = _OVERFLOW
        w = self._windows.get(key)
        if w is None:
            w = self._windows[key] = _Window(now, extra=dict(extra))
        if w.logged < self.burst:
            w.logged += 1
            self.logger.warning(msg, extra=dict(extra))
            return True
        w.suppressed += 1
        return False

    def flush(self, force: bool = False) -> None:
        """Summarise windows that ended (all of them with `force`, e.g. at shutdown)."""
        self._end_windows(float("inf") if force else self._clock())

    def _end_windows(self, now: float) -> None:
        for key, w in list(self._windows.items()):
            if now - w.started < self.window_s:
                continue
            del self._windows[key]
            if w.suppressed:
                fields = dict(w.extra) if key is not _OVERFLOW else {}
                self.logger.warning("suppressed similar log lines", extra={
                    **fields, "suppressed": w.suppressed, "window_s": self.window_s})


_PREFIX = re.compile(r"^container_requests\[\d+\]: ")
_NUMBER = re.compile(r"\d+")


def reason_kind(message: str) -> str:
    """What kind of problem a rejection message names, without its IDs or numbers.

    `container_requests[3]: allocation_size 9 exceeds the 8 available devices` and
    the same with other numbers are one kind; so are two `unknown device IDs ...:`
    lists of different IDs.
    """
    text = _PREFIX.sub("", message).split(":", 1)[0]
    return _NUMBER.sub("N", text)[:100]


class UndecodableRequestLog(logging.Filter):
    """gRPC's own line for a request it cannot decode, sent through a `RateLimitedLog` instead.

    Why: grpc.aio logs "Unexpected [DecodeError] raised by servicer method" at ERROR
    with a full traceback (about 0.8 KB) for every such request, before any of our code
    runs, so whoever can reach a socket could fill the node's log at will.
    Here it becomes one structured warning per window naming the decode
    error, without the traceback; every other gRPC record (an exception in
    our own handler above all) passes untouched, traceback included.
    Attached to the `grpc._cython.cygrpc` logger for as long as the daemon runs.
    """

    LOGGER = "grpc._cython.cygrpc"

    def __init__(self, limited: RateLimitedLog):
        super().__init__()
        self.limited = limited

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, DecodeError):  # raised by gRPC's deserializer, before any handler runs
            return True
        self.limited.warning(("undecodable request",), "could not decode a request; refused by gRPC", {
            "error": f"{type(error).__name__}: {error}"[:200]})
        return False

    def __enter__(self) -> UndecodableRequestLog:
        logging.getLogger(self.LOGGER).addFilter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger(self.LOGGER).removeFilter(self)
