"""`Backoff`: exponential delays for loops that retry (NVML event waits, NRI reconnects, claim status writes).

GPU health itself moved to `plugin/health/` (the XID catalog, the policy, the
evidence and the monitor thread); this module keeps the backoff where its users
import it from.
"""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    """Exponential delays: initial, 2x, 4x ... capped at `cap`; `reset()` after a success."""

    def __init__(self, initial: float, cap: float):
        self.initial = initial
        self.cap = cap
        self._next = initial

    def next(self) -> float:
        d = self._next
        self._next = min(self._next * 2, self.cap)
        return d

    def reset(self) -> None:
        self._next = self.initial
