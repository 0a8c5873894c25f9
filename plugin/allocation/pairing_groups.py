"""Which container a call belongs to, learned from the kubelet's call sequence (pure; no gRPC).

Why: GPUDirect RDMA wants each GPU's NIC on its own PCIe switch, but the
kubelet asks each device plugin about one resource at a time and never says
which container a call is for. It does, however, walk one container's
extended resources one after another, `GetPreferredAllocation` (when it has a
choice) then `Allocate` for each, and admits pods one at a time
(devicemanager `Allocate` -> `allocateContainerResources` ->
`devicesToAllocate`). So an `Allocate` of another of our resources that came
just before a `GetPreferredAllocation` belongs, almost always, to the same
container. The spec's rule (`shared/spec/allocation.md`, "Groups",
"Partners"):

- consecutive `Allocate` calls for *different* resources form a group;
- the group ends when a `GetPreferredAllocation` or `Allocate` arrives for a
  resource already in it (that call is the next container's), or when more
  than the pairing window has passed since the group's last `Allocate`;
- the partners of a `GetPreferredAllocation` for R are the devices of the
  group's `Allocate`s if the group is still open and R is not in it, else none.

What the kubelet sequence means for this (read in `manager.go`):
- No `GetPreferredAllocation` when the kubelet has no choice (the aligned
  devices are exactly enough, or reuse covers the request): the `Allocate`
  alone still joins the group, so the next resource still gets partners.
- Init containers: their devices go to the pod's reuse pool and the next
  container gets `Allocate` for the same IDs again (no preference asked). That
  `Allocate` is for a resource already in the init container's group, so it
  starts the next container's group, as it should.
- A restarted container or a kubelet restart makes no calls at all.
- Several containers of one pod, and pods one after another, follow the same
  rule: a new container's first call for a resource the previous container
  also had ends the previous group. A container whose resources share
  nothing with the previous container's may be taken for part of it while
  within the window; that only costs a worse preference (pairing never makes
  an answer invalid), which is why the window is short.

Use: call `on_get_preferred_allocation` when a `GetPreferredAllocation` RPC
arrives and `on_allocate` for each container request of an `Allocate` RPC,
in arrival order (before any work is handed to a thread). The clock is
injectable so tests drive time by hand.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

#: The spec's default pairing window, in seconds.
DEFAULT_PAIRING_WINDOW_S = 1.0

_EMPTY: Mapping[str, tuple[str, ...]] = MappingProxyType({})


def _checked_window(window_s: float) -> float:
    if not (isinstance(window_s, (int, float)) and math.isfinite(window_s) and window_s >= 0):
        raise ValueError(f"pairing window must be a number of seconds >= 0 (0 turns pairing off), got {window_s!r}")
    return float(window_s)


class PairingGroups:
    """The current group: resource -> device IDs of its `Allocate`, and when the last one came."""

    def __init__(self, window_s: float = DEFAULT_PAIRING_WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self.window_s = _checked_window(window_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._group: dict[str, tuple[str, ...]] = {}
        self._last = 0.0

    def set_window(self, window_s: float) -> None:
        """Change the window (a live config reload); 0 turns pairing off and forgets the open group."""
        window_s = _checked_window(window_s)
        with self._lock:
            self.window_s = window_s
            if not window_s:
                self._group = {}

    @property
    def enabled(self) -> bool:
        return self.window_s > 0

    def _expire(self, now: float) -> None:
        if self._group and now - self._last > self.window_s:
            self._group = {}

    def on_get_preferred_allocation(self, resource: str) -> Mapping[str, tuple[str, ...]]:
        """A `GetPreferredAllocation` for `resource` arrived: its partners, by resource (empty: none).

        A request for a resource already in the group ends the group (it is
        the next container's) and has no partners.
        """
        if not self.enabled:
            return _EMPTY
        with self._lock:
            self._expire(self._clock())
            if resource in self._group:
                self._group = {}
            if not self._group:
                return _EMPTY
            return MappingProxyType(dict(self._group))

    def on_allocate(self, resource: str, device_ids: Iterable[str]) -> None:
        """One container's `Allocate` for `resource` with `device_ids` arrived: it joins the group
        (a new one if `resource` is already in the current group or the window has passed)."""
        if not self.enabled:
            return
        ids = tuple(device_ids)
        with self._lock:
            now = self._clock()
            self._expire(now)
            if resource in self._group:
                self._group = {}
            self._group[resource] = ids
            self._last = now

    def current(self) -> Mapping[str, tuple[str, ...]]:
        """The open group as it stands now (for logs and `explain`)."""
        with self._lock:
            self._expire(self._clock())
            return MappingProxyType(dict(self._group))
