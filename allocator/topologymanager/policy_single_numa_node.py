"""Policy `single-numa-node`: only single-node (or don't-care) preferred hints survive.

Before merging, every provider's list is cut down to preferred hints that are
nil or have exactly one bit; a resource left with nothing makes the merge fall
back to {all nodes, not preferred}, which is rejected. A result equal to the
default (all nodes) mask is reported as the nil "don't care" hint.
`prefer-closest-numa-nodes` is ignored by this policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .hint import ProviderHints, TopologyHint
from .merge import POLICY_SINGLE_NUMA_NODE, HintMerger, filter_providers_hints
from .numa_info import NUMAInfo
from .options import PolicyOptions


def filter_single_numa_hints(all_resources_hints: Sequence[Sequence[TopologyHint]]) -> list[list[TopologyHint]]:
    """Keep the preferred hints that are nil or single-node, per resource (order kept)."""
    out: list[list[TopologyHint]] = []
    for resource_hints in all_resources_hints:
        kept = [
            h
            for h in resource_hints
            if h.preferred and (h.affinity is None or h.affinity.count() == 1)
        ]
        out.append(kept)
    return out


@dataclass(frozen=True)
class SingleNumaNodePolicy:
    numa_info: NUMAInfo
    opts: PolicyOptions = PolicyOptions()

    @property
    def name(self) -> str:
        return POLICY_SINGLE_NUMA_NODE

    def can_admit(self, hint: TopologyHint) -> bool:
        return hint.preferred

    def merge(self, providers_hints: Sequence[ProviderHints | None]) -> tuple[TopologyHint, bool]:
        filtered = filter_single_numa_hints(filter_providers_hints(providers_hints))
        best = HintMerger(self.numa_info, filtered, self.name, self.opts).merge()
        if best.affinity == self.numa_info.default_affinity_mask():
            best = TopologyHint(None, best.preferred)
        return best, self.can_admit(best)
