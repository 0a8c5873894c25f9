"""Merging the hints of all providers into one best hint (the kubelet's `policy.go`).

Why the merge is spelled out step by step: the result depends on small,
surprising rules - a permutation is preferred only if every hint in it is
preferred *and* all non-nil masks are identical; among non-preferred results
the merger aims at the widest of the providers' narrowest masks
(`BestNonPreferredAffinityCount`), not simply the narrowest; the order in which
permutations are visited breaks ties. A faithful model has to keep them all.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .bitmask import BitMask
from .hint import ProviderHints, TopologyHint
from .numa_info import NUMAInfo
from .options import PolicyOptions

POLICY_NONE = "none"
POLICY_BEST_EFFORT = "best-effort"
POLICY_RESTRICTED = "restricted"
POLICY_SINGLE_NUMA_NODE = "single-numa-node"


def filter_providers_hints(providers_hints: Sequence[ProviderHints | None]) -> list[list[TopologyHint]]:
    """One hint list per (provider, resource), with the "don't care" cases made explicit.

    - a provider with no hints at all (None or an empty mapping) -> [{nil, preferred}]
    - a resource whose hints are None ("no preference")            -> [{nil, preferred}]
    - a resource whose hints are [] ("no possible affinity")        -> [{nil, not preferred}]

    Resources are taken in the mapping's order. The kubelet walks a Go map
    (random order), but the merge's result does not depend on the order of the
    permutations: `compare` keeps, in effect, the best hint under a fixed
    ranking (preferred first; among preferred the narrowest/closest; among
    non-preferred the count equal to, else just below, else above
    `BestNonPreferredAffinityCount`, then the narrowest/closest).
    """
    out: list[list[TopologyHint]] = []
    for hints in providers_hints:
        if not hints:
            out.append([TopologyHint(None, True)])
            continue
        for resource in hints:
            resource_hints = hints[resource]
            if resource_hints is None:
                out.append([TopologyHint(None, True)])
            elif len(resource_hints) == 0:
                out.append([TopologyHint(None, False)])
            else:
                out.append(list(resource_hints))
    return out


def merge_permutation(default_affinity: BitMask, permutation: Sequence[TopologyHint]) -> TopologyHint:
    """AND the masks of one permutation; preferred only if all are preferred and all
    non-nil masks are equal."""
    preferred = True
    masks: list[BitMask] = []
    for hint in permutation:
        if hint.affinity is not None:
            masks.append(hint.affinity)
            if hint.affinity != masks[0]:
                preferred = False
        if not hint.preferred:
            preferred = False
    return TopologyHint(default_affinity.and_(*masks), preferred)


def iterate_permutations(all_hints: Sequence[Sequence[TopologyHint]]) -> Iterator[tuple[TopologyHint, ...]]:
    """The cartesian product, first list outermost (the kubelet's visiting order)."""
    return itertools.product(*all_hints)


def narrowest_hint(hints: Sequence[TopologyHint]) -> TopologyHint | None:
    best: TopologyHint | None = None
    for hint in hints:
        if hint.affinity is None:
            continue
        if best is None:
            best = hint
        assert best.affinity is not None
        if hint.affinity.is_narrower_than(best.affinity):
            best = hint
    return best


def max_of_min_affinity_counts(filtered_hints: Sequence[Sequence[TopologyHint]]) -> int:
    """`BestNonPreferredAffinityCount`: the widest of the providers' narrowest masks."""
    result = 0
    for resource_hints in filtered_hints:
        narrow = narrowest_hint(resource_hints)
        if narrow is None or narrow.affinity is None:
            continue
        result = max(result, narrow.affinity.count())
    return result


@dataclass
class HintMerger:
    """Finds the best merged hint over all permutations of the providers' hints."""

    numa_info: NUMAInfo
    hints: Sequence[Sequence[TopologyHint]]
    policy_name: str = POLICY_BEST_EFFORT
    opts: PolicyOptions = PolicyOptions()
    best_non_preferred_affinity_count: int = -1

    def __post_init__(self) -> None:
        if self.best_non_preferred_affinity_count < 0:
            self.best_non_preferred_affinity_count = max_of_min_affinity_counts(self.hints)

    def compare_masks(self, current: TopologyHint, candidate: TopologyHint) -> TopologyHint:
        """Between two hints of equal standing: Narrowest, or Closest with the option
        (never for single-numa-node). Equal masks keep `current`."""
        assert current.affinity is not None and candidate.affinity is not None
        if candidate.affinity == current.affinity:
            return current
        if self.policy_name != POLICY_SINGLE_NUMA_NODE and self.opts.prefer_closest_numa:
            best = self.numa_info.closest(current.affinity, candidate.affinity)
        else:
            best = self.numa_info.narrowest(current.affinity, candidate.affinity)
        return current if best == current.affinity else candidate

    def compare(self, current: TopologyHint | None, candidate: TopologyHint) -> TopologyHint | None:
        """Which of the best-so-far and a new merged hint to keep."""
        assert candidate.affinity is not None
        if candidate.affinity.count() == 0:
            return current
        if current is None:
            return candidate
        assert current.affinity is not None
        if not current.preferred and candidate.preferred:
            return candidate
        if current.preferred and not candidate.preferred:
            return current
        if current.preferred and candidate.preferred:
            return self.compare_masks(current, candidate)

        # Both non-preferred: get as close as possible to, without exceeding,
        # best_non_preferred_affinity_count.
        target = self.best_non_preferred_affinity_count
        cur = current.affinity.count()
        cand = candidate.affinity.count()
        if cur > target:
            return self.compare_masks(current, candidate)
        if cur == target:
            if cand != target:
                return current
            return self.compare_masks(current, candidate)
        if cand > target:
            return current
        if cand == target:
            return candidate
        if cand > cur:
            return candidate
        if cand < cur:
            return current
        return self.compare_masks(current, candidate)

    def merge(self) -> TopologyHint:
        default = self.numa_info.default_affinity_mask()
        best: TopologyHint | None = None
        for permutation in iterate_permutations(self.hints):
            best = self.compare(best, merge_permutation(default, permutation))
        return best if best is not None else TopologyHint(default, False)
