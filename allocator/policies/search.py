"""Exact branch and bound over twin classes, with an optional deadline.

The search maximises `Objective` key(S) = alpha*W(S) + sum(lin) - span_coef*span
+ port_coef*ports + offset over sets S = must + Q, |Q| = size - |must|,
span(S) <= max_span, and among equal keys returns the lexicographically
smallest sorted tuple of graph positions (the spec's fixed rule).

A greedy + local-search answer comes first (`heuristics`); then
`decompose.subspaces` splits the request into a few sub-searches (one per
NUMA node set, each searched on its smaller side); each runs the branch and
bound below, sharing the best answer found so far. A request that adds a
single device to must-include (k = 1 included) just scores every candidate.

Tree: twin classes (see `twins`) are decided one after the other; at a class
the branch is "take t of its members" (always the same t members), from the
most possible down to 0. Nothing enumerates partitions or all combinations.
Classes are ordered by their value at the root (best first), which finds good
sets early and makes the bound fall fast in the "leave it out" branches.

Bound (admissible, so pruning never loses the optimum): for the r devices
still to pick from the remaining classes R, W(P+Q) = W(P) + sum_q w(P,q) + W(Q)
and W(Q) <= 1/2 * sum_q top_{r-1}(q), the sum of the r-1 largest weights from
q to other devices of R. So each remaining device q is worth at most
    v(q) = alpha*w(P,q) + lin[q] + alpha/2 * top_{r-1}(q)
and key <= key(P) + the sum of the r largest v. Values are doubled to stay
integral. top_{r-1} is first taken over the whole pool (precomputed once);
once a search proves hard (`_TIGHTEN_AFTER` nodes) it is recomputed per depth
over the remaining classes only, which is tighter. Span terms use span(P)
(span only grows); port terms use the most ports (spread) / the fewest new
ports (packed) the remaining classes could give.

The NUMA limit (single constrained search only) is enforced while branching
and checked for feasibility in the bound: capacity of used nodes +
unknown-NUMA devices + the largest unopened nodes that still fit.

The public interface, for searches whose key has one more term that is not a
sum over devices (the pairing term X(S, P), `pairing_bound`): `BranchAndBound`
is the engine over one `Space`, and a `KeyTerm` given to it is kept up to date
as devices are taken and given back, splits the twin classes further, adds to
the classes' order and to the NUMA nodes counted as used, and tightens the
bound. `OutOfTime` is what the engine raises when its deadline passes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .decompose import Space, subspaces
from .heuristics import SetState, greedy, local_search
from .problem import Objective, Problem
from .twins import TwinClass, twin_classes


class OutOfTime(Exception):
    """The deadline passed during a search: the best answer found so far stands, not proven optimal."""


class KeyTerm(Protocol):
    """One more term of the key, not a sum over devices, that `BranchAndBound` keeps for its owner.

    The engine calls `classes` while it sets up, then `attach` once its classes are ordered (the
    term reads the engine's public state: `members`, `nc`, `cnuma`, `numa_count`, `chosen`,
    `best_key`), `took`/`gave_back` around every branch, and `bound` at every node the engine's own
    bound does not prune. The engine adds what `attach` and `took` return to the key of the partial
    set and subtracts what `gave_back` returns, so the key it compares is exact.
    """

    #: Added to each position's linear term only where the classes are ordered (best first).
    order_bonus: Sequence[int]
    #: NUMA nodes counted as used from the start (span limit and span penalty see them).
    used_numa: Sequence[int]

    def classes(self, p: Problem, pool: tuple[int, ...]) -> list[TwinClass]:
        """The twin classes to branch on: devices interchangeable for the whole key, this term included."""
        ...

    def attach(self, engine: BranchAndBound) -> int:
        """Start on `engine` (classes ordered, fixed devices chosen); the term's value for the fixed devices."""
        ...

    def took(self, c: int, t: int) -> int:
        """The first `t` members of class `c` were taken: the term's growth."""
        ...

    def gave_back(self, c: int, t: int) -> int:
        """The last `took(c, t)` is undone: what it had added."""
        ...

    def bound(self, ub: int, c: int, r: int, closed: bool) -> int:
        """`ub` (a bound of the key without this term's growth) raised by a bound of that growth, for
        picking `r` more devices from classes `c..`; `closed`: the span limit admits no new node."""
        ...


@dataclass(frozen=True)
class SearchResult:
    #: The answer: sorted graph positions.
    members: tuple[int, ...]
    key: int
    #: True when every sub-search finished, i.e. `members` is proven optimal.
    optimal: bool
    #: Branch-and-bound nodes visited.
    explored: int


#: Nodes between two clock reads when a deadline is set.
_CLOCK_EVERY = 16
#: Nodes after which the bound switches to per-depth (tighter, costlier) top sums.
_TIGHTEN_AFTER = 100


def solve(p: Problem, obj: Objective, deadline: float | None = None) -> SearchResult:
    """The best set for `obj`, proven optimal unless `deadline` (perf_counter time) passes first.

    Always returns a valid set: the greedy + local-search answer is computed
    first and only replaced by strictly better (or equal and lexicographically
    smaller) complete sets found by the sub-searches of `decompose.subspaces`.
    """
    if p.picks == 1:
        return _one_pick(p, obj)
    start = greedy(p, obj)
    local_search(start, deadline)
    best = tuple(sorted(start.members))
    best_key = start.key()
    explored = 0
    optimal = True
    for space in subspaces(p, obj):
        bb = BranchAndBound(p, space, best, best_key, deadline)
        optimal = bb.run()
        best, best_key = bb.best, bb.best_key
        explored += bb.explored
        if not optimal:
            break
    return SearchResult(best, best_key, optimal, explored)


def _one_pick(p: Problem, obj: Objective) -> SearchResult:
    """One device to add (k = 1, or k = |must| + 1): score each candidate directly.

    Candidates are tried in position order and only a strictly better key
    replaces the best, so ties go to the lowest position, which is also the
    lexicographically smallest answer.
    """
    st = SetState(p, obj, p.must)
    best = -1
    best_d = 0
    for x in p.free:
        n = p.numa[x]
        if obj.max_span is not None and n is not None and n not in st.numa_count and st.span >= obj.max_span:
            continue
        d = st.add_delta(x)
        if best < 0 or d > best_d:
            best, best_d = x, d
    return SearchResult(tuple(sorted((*p.must, best))), st.key() + best_d, True, len(p.free))


class BranchAndBound:
    """One sub-search (a `Space`), with an optional `KeyTerm`; written for CPython speed (locals, flat lists).

    `best`/`best_key` are always in answer terms (sorted positions of the
    answer and its key), whichever side the space searches. What a `KeyTerm`
    may read, in the order of the classes (best first): `members` (each
    class's members, in the order they are taken), `nc` (the number of
    classes), `cnuma` (each class's NUMA node), `numa_count` (devices per used
    node), `chosen` (the partial set) and `best_key`; it changes none of them.
    """

    def __init__(
        self,
        p: Problem,
        space: Space,
        incumbent: tuple[int, ...],
        inc_key: int,
        deadline: float | None,
        term: KeyTerm | None = None,
    ):
        self.p = p
        self.space = space
        obj = space.obj
        self.obj = obj
        self.best = incumbent
        self.best_key = inc_key
        self.deadline = deadline
        self.explored = 0
        self.complement = space.complement
        self.term = term

        w = p.graph.weights
        pool = space.pool
        fixed = space.fixed
        alpha = obj.alpha
        r_total = space.picks

        # Root value of each class, used to order the classes best first.
        classes = term.classes(p, pool) if term is not None else twin_classes(p, pool)
        order_lin = obj.lin if term is None else [v + b for v, b in zip(obj.lin, term.order_bonus)]
        root_top: dict[int, list[int]] = {}
        value: dict[int, int] = {}
        for c in classes:
            row = w[c.rep]
            ws = sorted((row[z] for z in pool if z != c.rep), reverse=True)
            acc = [0, 0]
            s = 0
            for j in range(max(0, r_total - 1)):
                s += ws[j] if j < len(ws) else 0
                acc.append(alpha * s)
            root_top[c.rep] = acc
            value[c.rep] = 2 * alpha * sum(row[m] for m in fixed) + 2 * order_lin[c.rep] + acc[r_total]
        classes.sort(key=lambda c: (-value[c.rep], c.rep))

        # A complement search leaves out the *last* members of a class, so the
        # answer keeps each class's first members (the tie rule's choice).
        self.members = [c.members[::-1] if space.complement else c.members for c in classes]
        reps = [c.rep for c in classes]
        nc = len(classes)
        self.nc = nc
        self.size = [len(c.members) for c in classes]
        self.internal = [c.internal for c in classes]
        self.cnuma = [p.numa[r] for r in reps]
        self.cport = [p.port[r] for r in reps]
        self.cown = [p.own_port[r] for r in reps]
        self.clin = [obj.lin[r] for r in reps]
        self.lin2 = [2 * v for v in self.clin]
        self.cw = [[w[a][b] for b in reps] for a in reps]
        # cap_after[c]: devices in classes c.. (for the "enough left" rule).
        cap = [0] * (nc + 1)
        for k in range(nc - 1, -1, -1):
            cap[k] = cap[k + 1] + self.size[k]
        self.cap_after = cap
        # top2[c][r] = alpha * (sum of the r-1 largest weights from a member of
        # class c to the other pool devices), for r = 0..picks.
        self.top2 = [root_top[r] for r in reps]
        self._depth_top: dict[int, list[list[int]]] = {}
        self._tight = False

        # Partial-set state (of the searched set).
        self.chosen: list[int] = list(fixed)
        self.weight = sum(w[a][b] for i, a in enumerate(fixed) for b in fixed[i + 1:])
        self.lin = sum(obj.lin[m] for m in fixed)
        self.gain = [sum(w[r][m] for m in fixed) for r in reps]
        self.numa_count: dict[int, int] = {}
        self.port_count: dict[int, int] = {}
        for m in fixed:
            n = p.numa[m]
            if n is not None:
                self.numa_count[n] = self.numa_count.get(n, 0) + 1
            self.port_count[p.port[m]] = self.port_count.get(p.port[m], 0) + 1
        if term is not None:
            for n in term.used_numa:
                self.numa_count[n] = self.numa_count.get(n, 0) + 1
        self._remaining_cache: dict[int, list[int]] = {}
        if term is not None:
            self.lin += term.attach(self)

    # -- the tie rule -------------------------------------------------------
    def _remaining_sorted(self, c: int) -> list[int]:
        s = self._remaining_cache.get(c)
        if s is None:
            s = sorted(m for ms in self.members[c:] for m in ms)
            self._remaining_cache[c] = s
        return s

    def _could_win_tie(self, c: int, r: int) -> bool:
        """Could some completion of this node give an answer lexicographically smaller than the incumbent?

        The smallest answer takes the r smallest remaining members (or, in a
        complement search, leaves out the r largest); any other completion is
        element-wise larger once sorted, so this is a true lower bound.
        """
        rest = self._remaining_sorted(c)
        if self.complement:
            low = self.space.answer(self.p, self.chosen + (rest[len(rest) - r:] if r else []))
        else:
            low = tuple(sorted(self.chosen + rest[:r]))
        return low < self.best

    # -- moves ----------------------------------------------------------------
    def _take(self, c: int, t: int) -> None:
        ms = self.members[c]
        self.chosen.extend(ms[:t])
        self.weight += t * self.gain[c] + (t * (t - 1) // 2) * self.internal[c]
        self.lin += t * self.clin[c]
        n = self.cnuma[c]
        if n is not None:
            self.numa_count[n] = self.numa_count.get(n, 0) + t
        pc = self.port_count
        if self.cown[c]:
            port = self.p.port
            for m in ms[:t]:
                pc[port[m]] = 1
        else:
            pt = self.cport[c]
            pc[pt] = pc.get(pt, 0) + t
        row = self.cw[c]
        g = self.gain
        for d in range(c + 1, self.nc):
            g[d] += t * row[d]
        if self.term is not None:
            self.lin += self.term.took(c, t)

    def _untake(self, c: int, t: int) -> None:
        if self.term is not None:
            self.lin -= self.term.gave_back(c, t)
        ms = self.members[c]
        del self.chosen[-t:]
        row = self.cw[c]
        g = self.gain
        for d in range(c + 1, self.nc):
            g[d] -= t * row[d]
        self.weight -= t * self.gain[c] + (t * (t - 1) // 2) * self.internal[c]
        self.lin -= t * self.clin[c]
        n = self.cnuma[c]
        if n is not None:
            self.numa_count[n] -= t
            if not self.numa_count[n]:
                del self.numa_count[n]
        pc = self.port_count
        if self.cown[c]:
            port = self.p.port
            for m in ms[:t]:
                del pc[port[m]]
        else:
            pt = self.cport[c]
            pc[pt] -= t
            if not pc[pt]:
                del pc[pt]

    # -- search ---------------------------------------------------------------
    def run(self) -> bool:
        """Search the space; True when it finished (`best` is then proven), False when the deadline passed."""
        try:
            self._node(0, self.space.picks)
        except OutOfTime:
            return False
        return True

    def _key(self) -> int:
        o = self.obj
        return (o.alpha * self.weight + self.lin - o.span_coef * len(self.numa_count)
                + o.port_coef * len(self.port_count) + o.offset)

    def _node(self, c: int, r: int) -> None:
        self.explored += 1
        if self.deadline is not None and self.explored % _CLOCK_EVERY == 0:
            if time.perf_counter() > self.deadline:
                raise OutOfTime
        if r == 0:
            key = self._key()
            if key >= self.best_key:
                answer = self.space.answer(self.p, self.chosen)
                if key > self.best_key or answer < self.best:
                    self.best_key = key
                    self.best = answer
            return
        if not self._promising(c, r):
            return
        # Branch on class c: take t of its members, most first.
        o = self.obj
        n = self.cnuma[c]
        t_max = min(self.size[c], r)
        if (o.max_span is not None and n is not None and n not in self.numa_count
                and len(self.numa_count) >= o.max_span):
            t_max = 0
        t_min = max(0, r - self.cap_after[c + 1])
        for t in range(t_max, t_min - 1, -1):
            if t:
                self._take(c, t)
                try:
                    self._node(c + 1, r - t)
                finally:
                    self._untake(c, t)
            else:
                self._node(c + 1, r)

    def _tops_from(self, c: int) -> list[list[int]]:
        """top2 over the classes c.. only (row d - c is class d), computed once per depth."""
        tops = self._depth_top.get(c)
        if tops is not None:
            return tops
        alpha = self.obj.alpha
        r_total = self.space.picks
        size = self.size
        nc = self.nc
        tops = []
        for d in range(c, nc):
            row = self.cw[d]
            ws: list[int] = []
            for e in range(c, nc):
                m = size[e] - 1 if e == d else size[e]
                if m > 0:
                    ws.extend([self.internal[d] if e == d else row[e]] * m)
            ws.sort(reverse=True)
            acc = [0, 0]
            s = 0
            for j in range(max(0, r_total - 1)):
                s += ws[j] if j < len(ws) else 0
                acc.append(alpha * s)
            tops.append(acc)
        self._depth_top[c] = tops
        return tops

    def _promising(self, c: int, r: int) -> bool:
        """Feasibility and bound test for picking r more devices from classes c.."""
        o = self.obj
        numa_count = self.numa_count
        span = len(numa_count)
        max_span = o.max_span
        closed = max_span is not None and span >= max_span
        a2 = 2 * o.alpha
        gain = self.gain
        lin2 = self.lin2
        size = self.size
        cnuma = self.cnuma
        if self._tight or self.explored > _TIGHTEN_AFTER:
            self._tight = True
            top2 = self._tops_from(c)
            shift = c
        else:
            top2 = self.top2
            shift = 0
        items: list[tuple[int, int]] = []
        fits = 0
        opening: dict[int, int] = {}
        for d in range(c, self.nc):
            n = cnuma[d]
            if n is not None and n not in numa_count:
                if closed:
                    continue
                if max_span is not None:
                    opening[n] = opening.get(n, 0) + size[d]
                else:
                    fits += size[d]
            else:
                fits += size[d]
            items.append((a2 * gain[d] + lin2[d] + top2[d - shift][r], size[d]))
        if fits < r:
            if not opening:
                return False
            room = max_span - span  # type: ignore[operator]  # `opening` is only filled under a span limit
            fits += sum(sorted(opening.values(), reverse=True)[:room])
            if fits < r:
                return False
        items.sort(reverse=True)
        bound2 = 0
        left = r
        for v, m in items:
            if m >= left:
                bound2 += v * left
                break
            bound2 += v * m
            left -= m
        bound2 += 2 * (o.alpha * self.weight + self.lin - o.span_coef * span
                       + o.port_coef * len(self.port_count) + o.offset)
        if o.port_coef:
            bound2 += 2 * o.port_coef * self._port_bound(c, r, closed)
        ub = bound2 // 2
        if self.term is not None:
            ub = self.term.bound(ub, c, r, closed)
        if ub < self.best_key:
            return False
        if ub == self.best_key:
            return self._could_win_tie(c, r)
        return True

    def _port_bound(self, c: int, r: int, closed: bool) -> int:
        """Spread: the most new ports r picks can add. Packed: the fewest they must add."""
        used = self.port_count
        numa_count = self.numa_count
        cnuma = self.cnuma
        new_caps: dict[int, int] = {}
        own_new = 0
        old_cap = 0
        for d in range(c, self.nc):
            n = cnuma[d]
            if closed and n is not None and n not in numa_count:
                continue
            if self.cown[d]:
                own_new += self.size[d]
            elif self.cport[d] in used:
                old_cap += self.size[d]
            else:
                pt = self.cport[d]
                new_caps[pt] = new_caps.get(pt, 0) + self.size[d]
        if self.obj.port_coef > 0:
            return min(r, own_new + len(new_caps))
        need = r - old_cap
        if need <= 0:
            return 0
        caps = sorted([*new_caps.values(), *([1] * own_new)], reverse=True)
        k = 0
        for cap in caps:
            k += 1
            need -= cap
            if need <= 0:
                break
        return k
