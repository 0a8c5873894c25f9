"""Device nodes for CDI specs: container path, host path, type and numbers.

Why numbers in the spec: a runtime that finds `type`, `major` and `minor` in
a device node does not stat the host; without them it stats the host path
and fails container creation when that is missing. We read the numbers from
the host's node when it exists (the truth), else take them from the fixed
assignments below (so a simulated node's spec still describes real NVIDIA
and InfiniBand nodes), and leave out a node we cannot describe at all
(dynamic majors such as nvidia-uvm, nvidia-caps, vfio and rdma_cm exist
only where the driver created them).

`dev_root` is where this process sees the host's /dev (a DaemonSet mounts it,
e.g. at /host/dev); `host_dev_root` is where the runtime finds it (/dev).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass

from .spec import DeviceNode

_Numbers = Callable[[re.Match[str]], tuple[int, int]]

#: Character devices with fixed numbers: the NVIDIA driver's major 195 (nvidiaN = N,
#: nvidia-modeset 254, nvidiactl 255) and InfiniBand's major 231 (umadN = N, issmN = 64 + N,
#: uverbsN = 192 + N; Linux Documentation/admin-guide/devices.txt).
KNOWN_NUMBERS: tuple[tuple[re.Pattern[str], _Numbers], ...] = (
    (re.compile(r"^/dev/nvidia(\d+)$"), lambda m: (195, int(m[1]))),
    (re.compile(r"^/dev/nvidia-modeset$"), lambda m: (195, 254)),
    (re.compile(r"^/dev/nvidiactl$"), lambda m: (195, 255)),
    (re.compile(r"^/dev/infiniband/umad(\d+)$"), lambda m: (231, int(m[1]))),
    (re.compile(r"^/dev/infiniband/issm(\d+)$"), lambda m: (231, 64 + int(m[1]))),
    (re.compile(r"^/dev/infiniband/uverbs(\d+)$"), lambda m: (231, 192 + int(m[1]))),
)


@dataclass(frozen=True)
class NodeResolver:
    dev_root: str = "/dev"
    host_dev_root: str = "/dev"

    def node(self, container_path: str, host_path: str | None = None,
             fallback: tuple[int, int] | None = None, host_only: bool = False) -> DeviceNode | None:
        """The node for `container_path` (and `host_path`, when the host calls it otherwise),
        or None when neither the host nor the fixed table tells its numbers. `fallback` gives
        numbers the caller knows (e.g. nvidia-caps' major read by discovery); `host_only`
        describes the node only when the host has it (optional nodes)."""
        host = host_path or container_path
        if not host.startswith("/dev/") or not container_path.startswith("/dev/"):
            raise ValueError(f"device node paths must be under /dev: {container_path!r}, {host!r}")
        rel = host[len("/dev/"):]
        spec_host = os.path.join(self.host_dev_root, rel)
        numbers = self._stat(os.path.join(self.dev_root, rel))
        if numbers is None and not host_only:
            numbers = _known(host) or (("c", *fallback) if fallback else None)
        if numbers is None:
            return None
        kind, major, minor = numbers
        return DeviceNode(path=container_path, host_path=spec_host if spec_host != container_path else None,
                          type=kind, major=major, minor=minor)

    @staticmethod
    def _stat(local: str) -> tuple[str, int, int] | None:
        try:
            st = os.stat(local)
        except OSError:
            return None
        if stat.S_ISCHR(st.st_mode):
            return "c", os.major(st.st_rdev), os.minor(st.st_rdev)
        if stat.S_ISBLK(st.st_mode):
            return "b", os.major(st.st_rdev), os.minor(st.st_rdev)
        return None  # a plain file standing in for a node (test fixtures): use the table


def _known(path: str) -> tuple[str, int, int] | None:
    for pattern, numbers in KNOWN_NUMBERS:
        m = pattern.match(path)
        if m:
            return ("c", *numbers(m))
    return None
