"""A process's footprint read from /proc, for tests and benchmarks that watch the daemon from outside.

Why from outside: the question is what the kernel charges the process
(resident memory, threads, open file descriptors), whatever Python thinks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Footprint:
    rss_mib: float
    threads: int
    fds: int

    def __str__(self) -> str:
        return f"{self.rss_mib:.1f} MiB, {self.threads} threads, {self.fds} fds"


def footprint(pid: int) -> Footprint:
    rss, threads = 0.0, 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return Footprint(rss, threads, len(os.listdir(f"/proc/{pid}/fd")))
