"""Give the C heap's free pages back to the kernel after the daemon's one-time start-up work.

Why: NVML's initialisation, its event registration and discovery allocate and free megabytes of
C memory in worker threads, each of which glibc serves from its own arena. glibc returns a free
page to the kernel only when it sits at the top of an arena, so what start-up freed stays
resident for the daemon's whole life: measured on an H200 (driver 580) at 88 MiB RSS for a
one-GPU node, 77 MiB after `malloc_trim(0)`, which releases the free pages of every arena
(docs/deployment.md, "Memory"). A DaemonSet runs on every GPU node, so this is worth one call
after each such step. Not glibc (musl, say): there is no such call, and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes = [ctypes.c_size_t]
        fn.restype = ctypes.c_int
    return fn


def release_free_heap(after: str) -> bool:
    """Return the C heap's free pages to the kernel; True when glibc released some.

    `after` names the step just done, for the debug log. Cheap (milliseconds over a heap of tens of
    MiB) and safe from any thread; call it after one-time work, never per request.
    """
    fn = _malloc_trim()
    if fn is None:
        return False
    released = bool(fn(0))
    log.debug("returned free heap pages to the kernel", extra={"after": after, "released": released})
    return released
