"""GPU policies: `numa-first` (the spec's default objective) and `link-first`.

Both are exact branch and bound over the same scalar objective machinery
(`problem.Objective`); they differ only in which criterion comes first.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import SearchPolicy
from .paired import PairedObjective, PairedProblem, gpu_link_first_objective, gpu_numa_first_objective
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

    def objective(self, problem: Problem) -> Objective:
        return numa_first_objective(problem)

    def paired_objective(self, problem: PairedProblem) -> PairedObjective:
        return gpu_numa_first_objective(problem)


@dataclass(frozen=True)
class LinkFirstPolicy(SearchPolicy):
    """Largest W(S), then smallest span, then largest W(A\\S), then lowest positions.

    For operators who run the Topology Manager with policy `none` and want
    GPU-to-GPU bandwidth above CPU locality.
    """

    name = "link-first"

    def objective(self, problem: Problem) -> Objective:
        return link_first_objective(problem)

    def paired_objective(self, problem: PairedProblem) -> PairedObjective:
        return gpu_link_first_objective(problem)
