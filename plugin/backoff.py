"""The one retry backoff: capped exponential with full jitter (a leaf).

Why jitter: every node's daemon sees the API server (or the kubelet, or the
container runtime) fail at the same moment and would otherwise retry it at the
same moments too (0.5, 1, 2, 4 ... s after the failure), a thousand nodes in
lockstep against a server that is just recovering. Full jitter draws each delay
uniformly between 0 and the exponential ceiling (initial, 2x, 4x ... capped at
`cap`), so retries of nodes that failed together spread over the whole window
and stop lining up after the first one ("Exponential Backoff And Jitter",
AWS Architecture Blog, 2015). A delay may be near 0; callers that must not
spin (a call that returns at once) still wait, since the ceiling keeps growing
until a success resets it.

The random source is injectable so tests can draw reproducible sequences
(`random.Random(seed)`) or the ceilings themselves (`uniform(a, b) -> b`).
"""

from __future__ import annotations

import random
from typing import Protocol


class RandomSource(Protocol):
    """What the backoff draws its delays from (`random.Random` is one)."""

    def uniform(self, a: float, b: float) -> float: ...


class Backoff:
    """Delays for retrying after failures: `next()` after each failure, `reset()` after a success.

    The n-th delay since the last reset is drawn from [0, min(cap, initial * 2**(n-1))].
    An `initial` above `cap` is clamped to `cap`. Each instance owns its random source
    (seeded from the OS unless given), so two instances never share a sequence.
    """

    def __init__(self, initial: float, cap: float, *, rng: RandomSource | None = None):
        if not initial > 0 or not cap > 0:
            raise ValueError(f"backoff needs initial > 0 and cap > 0, got initial={initial!r} cap={cap!r}")
        self.initial = initial
        self.cap = cap
        self._rng: RandomSource = rng if rng is not None else random.Random()
        self._ceiling = min(initial, cap)

    @property
    def ceiling(self) -> float:
        """The largest delay the next `next()` may return."""
        return self._ceiling

    def next(self) -> float:
        """The delay before the next retry; the ceiling doubles (up to `cap`) for the one after."""
        ceiling = self._ceiling
        self._ceiling = min(ceiling * 2, self.cap)
        return min(max(self._rng.uniform(0.0, ceiling), 0.0), ceiling)

    def reset(self) -> None:
        """After a success: the next failure starts from `initial` again."""
        self._ceiling = min(self.initial, self.cap)
