"""`release_free_heap`: C memory the daemon freed after start-up leaves its resident set.

What a user sees: the DaemonSet's memory on every GPU node. Start-up work (NVML, discovery)
frees megabytes that glibc keeps resident while a live block sits above them; these tests make
exactly that shape in this process and watch the anonymous resident memory.
"""

from __future__ import annotations

import ctypes.util
import platform

import pytest

from plugin.heap import release_free_heap

GLIBC = platform.libc_ver()[0] == "glibc" and ctypes.util.find_library("c") is not None


def anon_mib() -> float:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no Anonymous line in /proc/self/smaps_rollup")


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's; this Python is not linked with glibc")
def test_freed_heap_under_a_live_block_leaves_the_resident_set():
    # 64 MiB in 32 KiB blocks (under glibc's mmap threshold: they come from the heap), then one block
    # kept alive above them, so glibc's automatic trimming (top of the heap only) cannot return them.
    blocks = [ctypes.create_string_buffer(32 * 1024) for _ in range(2048)]
    for b in blocks:
        ctypes.memset(b, 1, len(b))  # touched: resident
    pin = ctypes.create_string_buffer(32 * 1024)
    del blocks
    before = anon_mib()
    assert release_free_heap("test") is True
    after = anon_mib()
    assert before - after > 32, f"anonymous memory went from {before:.1f} to {after:.1f} MiB"
    del pin

