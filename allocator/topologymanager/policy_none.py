"""Policy `none`: no alignment; every pod is admitted.

The kubelet still calls `Allocate` on every provider (see `scope_none.py`);
the stored affinity is the empty hint, so the device manager treats every
device as "no affinity".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .hint import ProviderHints, TopologyHint
from .merge import POLICY_NONE


@dataclass(frozen=True)
class NonePolicy:
    @property
    def name(self) -> str:
        return POLICY_NONE

    def can_admit(self, hint: TopologyHint) -> bool:
        return True

    def merge(self, providers_hints: Sequence[ProviderHints | None]) -> tuple[TopologyHint, bool]:
        # The kubelet returns the zero hint: nil affinity, not preferred.
        return TopologyHint(None, False), True
