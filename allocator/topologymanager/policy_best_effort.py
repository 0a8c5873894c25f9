"""Policy `best-effort`: merge, store the best hint, always admit.

The stored hint still steers the device manager towards aligned devices, so a
non-preferred (cross-NUMA) result is admitted and allocated across nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .hint import ProviderHints, TopologyHint
from .merge import POLICY_BEST_EFFORT, HintMerger, filter_providers_hints
from .numa_info import NUMAInfo
from .options import PolicyOptions


@dataclass(frozen=True)
class BestEffortPolicy:
    numa_info: NUMAInfo
    opts: PolicyOptions = PolicyOptions()

    @property
    def name(self) -> str:
        return POLICY_BEST_EFFORT

    def can_admit(self, hint: TopologyHint) -> bool:
        return True

    def merge(self, providers_hints: Sequence[ProviderHints | None]) -> tuple[TopologyHint, bool]:
        filtered = filter_providers_hints(providers_hints)
        best = HintMerger(self.numa_info, filtered, self.name, self.opts).merge()
        return best, self.can_admit(best)
