"""Policy `restricted`: like best-effort, but admit only a preferred result.

Note what "preferred" means for devices: the narrowest mask that could hold the
request counting *all installed* devices. A pod that only fits across nodes
because devices are in use is rejected with TopologyAffinityError.
"""

from __future__ import annotations

from dataclasses import dataclass

from .hint import TopologyHint
from .merge import POLICY_RESTRICTED
from .policy_best_effort import BestEffortPolicy


@dataclass(frozen=True)
class RestrictedPolicy(BestEffortPolicy):
    @property
    def name(self) -> str:
        return POLICY_RESTRICTED

    def can_admit(self, hint: TopologyHint) -> bool:
        return hint.preferred
