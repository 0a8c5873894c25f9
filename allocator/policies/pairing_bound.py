"""X(S, P) as a term of the search's key, kept exactly and bounded (`search.KeyTerm`).

How the search stays exact although X is not a sum over devices: it is the
branch and bound of `search` (twin classes, span limit, tie rule, deadline)
with three changes, made by `PairingTerm` through the engine's `KeyTerm`
interface:
1. the partners' NUMA nodes are counted as used from the start, so the span
   limit and span penalty see span(S u P);
2. the key adds c_X * X(Q) exactly, with the matching kept incrementally
   (`pairing.Matching.push`/`pop`) as devices are taken and given back;
3. the bound of the search covers W, span, ports and the linear terms of
   the rest of the key (and c_X * X(Q) through the partial key); to it
   `PairingTerm.bound` adds c_X * G, G an upper bound of X(Q u T) - X(Q) for
   every completion T of r devices from those R still allowed. G is the
   smaller of two bounds, both proven here:
   - Credits. X is subadditive: X(Q u T) <= X(Q) + X(T) (split an optimal
     matching of Q u T by where its devices come from). And X(T) is at most
     the sum of each device's credit: the i-th device taken from a twin
     class (equal weight rows) is credited the i-th largest weight of its
     row, because t such devices can only be matched to t distinct partners
     (so two GPUs sharing one NIC do not both count it). Taking the r
     largest credits of R bounds every T.
   - Duality with a penalty. Lowering every pairing weight by a penalty
     p >= 0 (floored at 0) loses at most p per matched pair, so X(S) <=
     X_p(S) + p * |S|; and for an optimal dual (u, v) of X_p(A)
     (`Matching.duals`: u, v >= 0, u_i + v_j >= the lowered weight),
     X_p(S) <= u(S) + sum(v) for every S within A (weak duality). So
     X(Q u T) <= u(Q) + u(R) + sum(v) + p * k, which is linear in the devices
     still allowed and exact at the root. This bound sees what credits
     miss: partners several devices would share (many NICs whose best GPU
     is the same partner: v carries the partner's value once). The penalty,
     the smallest pairing weight when k is below the number of partners,
     lets it see that k devices pair with k partners at most.
   The classes are still ordered with c_X * bp(q) added to each device's
   value (bp: its largest pairing weight), so devices that pair well are
   tried first.
Twin classes are split further by the devices' pairing weights, so only
devices that are interchangeable for X too are merged (`PairingTerm.classes`;
NICs on separate ports can still be twins: `pairing_problem`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from ..pairing import Matching
from .pairing_objectives import PairedObjective
from .pairing_problem import PairedProblem
from .problem import Problem
from .search import BranchAndBound
from .twins import TwinClass, group_twins


class PairingTerm:
    """c_X * X(S, P) as the search's `KeyTerm`: the matching kept as devices are taken and given back,
    and a bound of its growth (the module doc). One per search: it holds that search's state."""

    def __init__(self, pp: PairedProblem, obj: PairedObjective):
        self.pp = pp
        p = pp.problem
        self.pair_coef = coef = obj.pair_coef
        self.rows = pp.rows
        #: c_X * bp(q): devices that pair well are ordered first (the bound uses the true linear terms).
        self.order_bonus: Sequence[int] = [coef * b for b in pp.bp]
        self.used_numa: Sequence[int] = pp.partner_numa
        self.matching = pp.matching(p.must)
        self._grown: list[int] = []
        self._dual_u: dict[int, int] | None = None  # the duals (below), computed when first needed
        self._dual_class: list[int] = []
        self._dual_rest = 0
        self._dual_chosen = 0
        #: (class index, used NUMA nodes when the span limit is reached) -> [prefix sums of the
        #: credits of the devices still allowed, largest first; those classes; their summed dual u
        #: once the duals exist].
        self._rest_cache: dict[tuple[int, frozenset[Any] | None], list[Any]] = {}
        # Set by `attach`: the engine's classes, in its order, and their credits.
        self._bb: BranchAndBound | None = None
        self.members: list[tuple[int, ...]] = []
        self.xvals: list[tuple[int, ...]] = []

    def classes(self, p: Problem, pool: tuple[int, ...]) -> list[TwinClass]:
        """Twin classes (`twins.twin_classes`) split by pairing weights: only devices equal for X stay
        interchangeable. One pass: the signature holds the pairing row, and twins (equal weights to
        every other available device) have equal degrees, so (NUMA, port kind, row, degree) only
        groups candidates; the exact test on the link weights decides, as in `twin_classes`."""
        numa, own, port, degree = p.numa, p.own_port, p.port, p.degree
        rows = self.rows
        # `pool` is ascending, so the classes come out by first member already.
        return group_twins(p, pool, lambda x: (numa[x], -1 if own[x] else port[x], rows[x], degree[x]))

    def attach(self, engine: BranchAndBound) -> int:
        """Read the engine's ordered classes; c_X * X(M) is the term's value for must-include."""
        self._bb = engine
        self.members = engine.members
        # What the i-th device taken from a class can add to X at most: the i-th largest weight of
        # its row (equal rows, one partner each).
        rows = self.rows
        self.xvals = [tuple(sorted(rows[ms[0]], reverse=True)[:len(ms)]) for ms in self.members]
        return self.pair_coef * self.matching.total

    def _duals(self, bb: BranchAndBound) -> None:
        """X(S) <= X'(S) + penalty * |S|, X' the pairing weight with every weight lowered by the
        penalty (a matching of S loses at most that per pair); and X'(S) <= u(S) + sum(v) for an
        optimal dual (u, v) of X'(A). So X(Q u T) <= u(Q) + u(T) + sum(v) + penalty * k: linear in
        the devices still allowed, exact for A itself. The penalty (the smallest weight, when k is
        below the number of partners) makes the bound see that k devices pair with k partners at most.

        Computed at the first node the credits alone do not prune (`bound`), since a search
        the credits settle never needs it; devices with an all-zero row are left out of the
        matching (they are never matched, so u = 0 for them and v is unchanged).
        """
        pp = self.pp
        p = pp.problem
        rows = pp.rows
        pen = 0
        if p.size < pp.cols:
            pen = min((w for x in p.available for w in rows[x] if w > 0), default=0)
        m = Matching(pp.cols)
        pushed = [x for x in p.available if pp.bp[x] > 0]
        for x in pushed:
            m.push(tuple(w - pen if w > pen else 0 for w in rows[x]) if pen else rows[x])
        u_of, v = m.duals()
        u = dict.fromkeys(p.available, 0)
        u.update(zip(pushed, u_of))
        self._dual_u = u
        self._dual_class = [sum(u[x] for x in ms) for ms in self.members]
        self._dual_rest = sum(v) + pen * p.size
        # Must-include and the devices taken so far.
        self._dual_chosen = sum(u[x] for x in bb.chosen)

    def bound(self, ub: int, c: int, r: int, closed: bool) -> int:
        """Add c_X * G, G a bound of how much X can still grow (see the module doc, point 3)."""
        bb = self._bb
        assert bb is not None  # the engine attaches the term before its first node
        key = (c, frozenset(bb.numa_count) if closed else None)
        rest = self._rest_cache.get(key)
        if rest is None:
            numa_count = bb.numa_count
            cnuma = bb.cnuma
            credits: list[int] = []
            allowed: list[int] = []
            for d in range(c, bb.nc):
                n = cnuma[d]
                if closed and n is not None and n not in numa_count:
                    continue
                credits.extend(self.xvals[d])
                allowed.append(d)
            credits.sort(reverse=True)
            rest = self._rest_cache[key] = [[0, *itertools.accumulate(credits)], allowed, None]
        tops = rest[0]
        by_credits: int = tops[min(r, len(tops) - 1)]
        if ub + self.pair_coef * by_credits < bb.best_key:
            return ub + self.pair_coef * by_credits  # pruned: the smaller bound below prunes as well
        if self._dual_u is None:
            self._duals(bb)
        dual: int | None = rest[2]
        if dual is None:
            dual = rest[2] = sum(self._dual_class[d] for d in rest[1])
        grow = min(by_credits, self._dual_chosen + dual + self._dual_rest - self.matching.total)
        return ub + self.pair_coef * max(grow, 0)

    def took(self, c: int, t: int) -> int:
        m = self.matching
        rows = self.rows
        taken = self.members[c][:t]
        grown = 0
        for x in taken:
            grown += m.push(rows[x])
        self._grown.append(grown)
        u = self._dual_u
        if u is not None:
            self._dual_chosen += sum(u[x] for x in taken)
        return self.pair_coef * grown

    def gave_back(self, c: int, t: int) -> int:
        grown = self._grown.pop()
        for _ in range(t):
            self.matching.pop()
        u = self._dual_u
        if u is not None:
            self._dual_chosen -= sum(u[x] for x in self.members[c][:t])
        return self.pair_coef * grown
