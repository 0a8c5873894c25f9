"""Waiting on a daemon the test started as a child process: a condition, or the child's death, whichever first.

Why one helper: the DRA tests that run `serve` as a child wait for what it publishes (slices, labels,
taints); a child that died is reported at once with the end of its log, not after the whole timeout.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["until_child"]


async def until_child(predicate: Callable[[], T], what: str, proc: subprocess.Popen, log: str,
                      timeout: float = 60.0, every: float = 0.1) -> T:
    """The first truthy `predicate()` within `timeout` seconds; AssertionError with the log's tail otherwise."""
    for _ in range(int(timeout / every)):
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            break
        await asyncio.sleep(every)
    with open(log, encoding="utf-8", errors="replace") as f:
        raise AssertionError(f"timed out waiting for {what}; daemon log:\n{f.read()[-4000:]}")
