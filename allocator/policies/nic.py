"""NIC policies: `spread` (default for NIC pools) and `packed`.

Order of criteria (what we do after the spec's two):
1. smallest span (spec);
2. `spread`: most distinct ports (physical functions), `packed`: fewest (spec);
   a device without a port counts as a port of its own;
3. largest W(S) (closest NICs, e.g. PIX over SYS);
4. largest W(A\\S);
5. lowest positions in the graph (the fixed rule).
Must-include devices are always part of the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import SearchPolicy
from .pairing_objectives import PairedObjective, nic_paired_objective
from .pairing_problem import PairedProblem
from .pairing_shortcuts import forced_pairing
from .problem import Objective, Problem, nic_objective


@dataclass(frozen=True)
class SpreadPolicy(SearchPolicy):
    """Spread the pod over as many physical ports as its NUMA span allows (more bandwidth, fault isolation)."""

    name = "spread"
    subset_order = "spread"

    def objective(self, problem: Problem) -> Objective:
        return nic_objective(problem, spread=True)

    def paired_objective(self, problem: PairedProblem) -> PairedObjective:
        return nic_paired_objective(problem, spread=True)

    def paired_shortcut(self, problem: PairedProblem) -> tuple[int, ...] | None:
        return forced_pairing(problem)  # span(S u P), then X: nothing else ranks before X


@dataclass(frozen=True)
class PackedPolicy(SearchPolicy):
    """Pack the pod onto as few physical ports as possible (keep whole ports free for others)."""

    name = "packed"
    subset_order = "packed"

    def objective(self, problem: Problem) -> Objective:
        return nic_objective(problem, spread=False)

    def paired_objective(self, problem: PairedProblem) -> PairedObjective:
        return nic_paired_objective(problem, spread=False)

    def paired_shortcut(self, problem: PairedProblem) -> tuple[int, ...] | None:
        return forced_pairing(problem)
