"""GPU policies: `numa-first` (the spec's default objective) and `link-first`.

Both are exact branch and bound over the same scalar objective machinery
(`problem.Objective`); they differ only in which criterion comes first. On resources of at
most 16 GPUs most requests skip the search: `subsets` scans every candidate set in tables
built once per topology, with the same order and the same answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import SearchPolicy
from ..scoring import min_span_idx, score_idx
from .pairing_objectives import PairedObjective, gpu_link_first_objective, gpu_numa_first_objective
from .pairing_problem import PairedProblem
from .pairing_shortcuts import forced_pairing, uniform_links_pairing
from .problem import Objective, Problem, link_first_objective, numa_first_objective


@dataclass(frozen=True)
class NumaFirstPolicy(SearchPolicy):
    """Smallest span, then largest W(S), then largest W(A\\S), then lowest positions.

    Span is enforced as a hard limit at its minimum (computed exactly, see
    `scoring.min_span_idx`), which prunes every set that would open one NUMA
    node too many before it is scored. With k = 1 this takes the
    least-connected device, so NVLink pairs stay whole for the next pod.
    """

    name = "numa-first"
    subset_order = "numa-first"

    def objective(self, problem: Problem) -> Objective:
        return numa_first_objective(problem)

    def paired_objective(self, problem: PairedProblem) -> PairedObjective:
        return gpu_numa_first_objective(problem)

    def paired_shortcut(self, problem: PairedProblem) -> tuple[int, ...] | None:
        return _with_largest_score(problem)

    def shortcut(self, problem: Problem) -> tuple[int, ...] | None:
        return uniform_lowest(problem)


@dataclass(frozen=True)
class LinkFirstPolicy(SearchPolicy):
    """Largest W(S), then smallest span, then largest W(A\\S), then lowest positions.

    For operators who run the Topology Manager with policy `none` and want
    GPU-to-GPU bandwidth above CPU locality.
    """

    name = "link-first"
    subset_order = "link-first"

    def objective(self, problem: Problem) -> Objective:
        return link_first_objective(problem)

    def paired_objective(self, problem: PairedProblem) -> PairedObjective:
        return gpu_link_first_objective(problem)

    def paired_shortcut(self, problem: PairedProblem) -> tuple[int, ...] | None:
        return _with_largest_score(problem)

    def shortcut(self, problem: Problem) -> tuple[int, ...] | None:
        return uniform_lowest(problem)


def uniform_lowest(p: Problem) -> tuple[int, ...] | None:
    """The optimum without a search when every two available GPUs have the same link (NVSwitch
    nodes: DGX A100, DGX H100), else None.

    Why it is exact for both GPU policies: with one weight w between every two available GPUs,
    W(S) = w*k(k-1)/2 and W(A\\S) = w*(a-k)(a-k-1)/2 are the same for every set of k, so the
    objective is left with span (smallest first) and the tie rule (the lexicographically smallest
    sorted tuple of positions). Taking each free GPU, lowest position first, whenever a set of the
    smallest span can still be completed with it gives exactly that set (a sorted tuple is smallest
    when its first differing member is). Costs O(a^2) against a search's set-up and branch and bound.
    """
    avail = p.available
    w = p.graph.weights
    link = w[avail[0]][avail[1]] if len(avail) > 1 else 0
    for n, a in enumerate(avail):
        row = w[a]
        for b in avail[n + 1:]:
            if row[b] != link:
                return None
    span = p.min_span()
    chosen = list(p.must)
    free = p.free
    for n, x in enumerate(free):
        if len(chosen) == p.size:
            break
        trial = [*chosen, x]
        rest = free[n + 1:]
        if len(trial) + len(rest) >= p.size and min_span_idx(p.graph, (*trial, *rest), trial, p.size) <= span:
            chosen = trial
    return tuple(sorted(chosen))


def _with_largest_score(pp: PairedProblem) -> tuple[int, ...] | None:
    """`forced_pairing`'s set when its W(S) is the largest any set of its size can have (the sum of
    the largest k(k-1)/2 link weights among the available GPUs, reached on NVSwitch nodes): then it
    is optimal on span and W(S) too, and the only set with the best X among those. Else, on nodes whose
    available GPUs all share one link weight, `pairing_shortcuts.uniform_links_pairing`."""
    members = forced_pairing(pp)
    if members is None:
        return uniform_links_pairing(pp)
    p = pp.problem
    w = p.graph.weights
    k = len(members)
    pairs = sorted((w[a][b] for n, a in enumerate(p.available) for b in p.available[n + 1:]), reverse=True)
    return members if score_idx(p.graph, members) == sum(pairs[:k * (k - 1) // 2]) else None
