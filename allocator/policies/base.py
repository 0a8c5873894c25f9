"""The request flow every policy shares: validate, fast paths, search, report.

Why one template: the spec's guarantees (bad requests rejected the same way,
exactly k valid IDs, must-include honoured, deterministic answers, exact up to
16 candidates and time-bounded above) must hold for every policy; a policy
only says which objective it maximises.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import ClassVar

from ..request import Allocation, AllocationRequest
from ..scoring import left_score_idx, score_idx, span_idx
from ..topology import DeviceGraph
from .paired_search import solve_paired
from .pairing_objectives import PairedObjective
from .pairing_problem import PairedProblem
from .problem import Objective, Problem
from .search import solve
from .subsets import TABLE_MAX_SETS, SubsetTableCache

#: Default search budget above the exact range (the spec's 20 ms).
DEFAULT_TIME_BUDGET_S = 0.020
#: Up to this many available devices the answer is always the proven optimum.
DEFAULT_EXACT_LIMIT = 16
#: The budget of a search that starts with no time left (`within(0)`): the greedy answer and nothing more.
NO_TIME_S = 1e-6


@dataclass(frozen=True)
class SearchPolicy:
    """Base for all policies. Options (all keyword, see `get_policy`):

    - `time_budget_s`: wall-clock budget of one request when more than
      `exact_limit` devices are available; None means no limit (always exact).
    - `exact_limit`: up to this many available devices no budget applies.
    - `tables`: where the subset tables of small resources are kept (`subsets`): the cache of whoever
      owns the topology (the daemon's, which its resource build fills ahead); by default the policy's own.
    """

    time_budget_s: float | None = DEFAULT_TIME_BUDGET_S
    exact_limit: int = DEFAULT_EXACT_LIMIT
    tables: SubsetTableCache = field(default_factory=SubsetTableCache, compare=False, repr=False)

    #: Set by each subclass (a plain class attribute, so `Policy.name` reads it).
    name = "base"
    #: The order (`subsets.ORDERS`) whose table scan answers this policy's requests without partners
    #: on small resources, exactly as the search would; None: always search.
    subset_order: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ValueError(f"time_budget_s must be positive or None, got {self.time_budget_s!r}")
        if self.exact_limit < 0:
            raise ValueError(f"exact_limit must be >= 0, got {self.exact_limit!r}")

    def within(self, remaining_s: float) -> SearchPolicy:
        """This policy with its budget cut to `remaining_s`: unchanged when its own is smaller; with no time
        left, no exact range either (`exact_limit` 0), so even a small request gets the greedy answer."""
        if remaining_s <= 0:
            return replace(self, time_budget_s=NO_TIME_S, exact_limit=0)
        if self.time_budget_s is None or self.time_budget_s > remaining_s:
            return replace(self, time_budget_s=remaining_s)
        return self

    def objective(self, problem: Problem) -> Objective:
        raise NotImplementedError

    def paired_objective(self, problem: PairedProblem) -> PairedObjective | None:
        """The objective with partners (see `pairing_objectives`); None: this policy ignores partners."""
        return None

    def paired_shortcut(self, problem: PairedProblem) -> tuple[int, ...] | None:
        """The optimum with partners when it is proven without a search (`pairing_shortcuts.forced_pairing`), else None."""
        return None

    def shortcut(self, problem: Problem) -> tuple[int, ...] | None:
        """The optimum without partners when it is proven without a search (e.g. `gpu.uniform_lowest`),
        else None."""
        return None

    def allocate(self, graph: DeviceGraph, request: AllocationRequest) -> Allocation:
        started = time.perf_counter()
        request.validate(graph)
        if self.subset_order is not None and not request.partners:
            scanned = self._by_table(graph, request)
            if scanned is not None:
                return scanned
        p = Problem.build(graph, request)
        pp = PairedProblem.build(p, request.partners) if request.partners else None
        paired = self.paired_objective(pp) if pp is not None else None
        if paired is None:
            pp = None
        if p.size == len(p.available):
            return self._result(p, p.available, True, 0, pp)
        if p.size == len(p.must):
            return self._result(p, p.must, True, 0, pp)
        deadline = None
        if self.time_budget_s is not None and len(p.available) > self.exact_limit:
            deadline = started + self.time_budget_s
        if pp is not None and paired is not None:
            forced = self.paired_shortcut(pp)
            if forced is not None:
                return self._result(p, forced, True, 0, pp)
            found = solve_paired(pp, paired, deadline)
        else:
            forced = self.shortcut(p)
            if forced is not None:
                return self._result(p, forced, True, 0)
            found = solve(p, self.objective(p), deadline)
        return self._result(p, found.members, found.optimal, found.explored, pp)

    def _by_table(self, graph: DeviceGraph, request: AllocationRequest) -> Allocation | None:
        """The answer by scanning every candidate set in the subset tables (`subsets`), or None when
        the resource is too large or the request has too many candidate sets (then the search answers).

        Exact like the search: every candidate is ranked by the policy's full order, ties included.
        `explored` is the number of sets scanned (0 when the answer is forced).
        """
        order = self.subset_order
        tables = self.tables.tables(graph)
        if order is None or tables is None:  # allocate() checks the order first
            return None
        bit_of = tables.bit_of
        must = sum(map(bit_of.__getitem__, request.must_include))
        # Any order: the scan ranks every candidate, and the tie rule is in the key.
        free = [b for b in map(bit_of.__getitem__, request.available) if not must & b]
        picks = request.size - len(request.must_include)
        scanned = 0
        if picks == 0:
            mask = must
        elif picks == len(free):
            mask = must + sum(free)
        else:
            scanned = math.comb(len(free), picks)
            if scanned > TABLE_MAX_SETS:
                return None
            mask = tables.best(order, must, free, picks)
        left = must + sum(free) - mask
        return Allocation(
            ids=tables.members(mask),
            span=tables.span[mask],
            score=tables.score[mask],
            left_score=tables.score[left],
            optimal=True,
            explored=scanned,
            policy=self.name,
        )

    def _result(self, p: Problem, members: tuple[int, ...], optimal: bool, explored: int,
                pp: PairedProblem | None = None) -> Allocation:
        chosen = sorted(members)
        g = p.graph
        pairs = pp.pairs(chosen) if pp is not None else ()
        return Allocation(
            ids=tuple(g.ids[i] for i in chosen),
            span=span_idx(g, chosen),
            score=score_idx(g, chosen),
            left_score=left_score_idx(g, p.available, chosen),
            optimal=optimal,
            explored=explored,
            policy=self.name,
            pairing=sum(w for _, _, w in pairs),
            pairs=pairs,
        )
