"""The exact search with partners: greedy first, then the branch and bound of `search` with X in its key.

The branch and bound is `search.BranchAndBound` (twin classes, span limit, tie rule, deadline)
given a `pairing_bound.PairingTerm`, which keeps X(S, P) exactly and bounds its growth (the proofs
are in that module). A request that adds one device scores every candidate, X's growth included.
"""

from __future__ import annotations

from .decompose import Space
from .heuristics import SetState, greedy
from .pairing_bound import PairingTerm
from .pairing_objectives import PairedObjective, paired_key
from .pairing_problem import PairedProblem
from .search import BranchAndBound, SearchResult


def solve_paired(pp: PairedProblem, obj: PairedObjective, deadline: float | None = None) -> SearchResult:
    """The best set for `obj`, proven optimal unless `deadline` (perf_counter time) passes first.

    The first answer is greedy, so a valid set exists before the search
    starts; the branch and bound only replaces it by sets with a better exact
    key. The greedy counts X by the best weight to a partner still unmatched
    (what the device surely adds), so it takes a GPU whose own NIC is free
    before its twin whose NIC is taken.
    """
    p = pp.problem
    if p.picks == 1:
        return _one_pick(pp, obj)
    m = pp.matching(p.must)
    rows, coef = pp.rows, obj.pair_coef
    free = [j for j in range(pp.cols) if m.mate[j] < 0]

    def sure_gain(x: int) -> int:
        return coef * max(map(rows[x].__getitem__, free), default=0)

    def picked(x: int) -> None:
        m.push(rows[x])
        free[:] = [j for j in range(pp.cols) if m.mate[j] < 0]

    st = greedy(p, obj.base, pp.partner_numa, sure_gain, picked)
    start = tuple(sorted(st.members))
    bb = BranchAndBound(p, Space(p.free, p.must, p.picks, obj.base), start, paired_key(pp, obj, start),
                        deadline, PairingTerm(pp, obj))
    optimal = bb.run()
    return SearchResult(bb.best, bb.best_key, optimal, bb.explored)


def _one_pick(pp: PairedProblem, obj: PairedObjective) -> SearchResult:
    """One device to add (k = 1, or k = |must| + 1): the exact key change of each candidate,
    X's growth included; ties go to the lowest position (only a strictly better key replaces)."""
    p = pp.problem
    o = obj.base
    st = SetState(p, o, p.must, pp.partner_numa)
    m = pp.matching(p.must)
    best, best_d = -1, 0
    for x in p.free:
        n = p.numa[x]
        if o.max_span is not None and n is not None and n not in st.numa_count and st.span >= o.max_span:
            continue
        d = st.add_delta(x) + obj.pair_coef * m.push(pp.rows[x])
        m.pop()
        if best < 0 or d > best_d:
            best, best_d = x, d
    members = tuple(sorted((*p.must, best)))
    return SearchResult(members, paired_key(pp, obj, members), True, len(p.free))
