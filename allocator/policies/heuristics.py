"""A fast, always-valid first answer: greedy construction plus best-swap local search.

Why: branch and bound prunes against the best set known so far, so a strong
start makes it much faster; and above the exact range, when the time budget
runs out, this is the answer we fall back to. Both steps respect the span
limit of the objective, so whatever they return is a valid answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from .problem import Objective, Problem


class SetState:
    """A chosen set with the sums its key needs, updated in O(|A|) per change."""

    def __init__(self, p: Problem, obj: Objective, members: Iterable[int] = (), numa_seed: Iterable[int] = ()):
        self.p = p
        self.obj = obj
        self.w = p.graph.weights
        #: gain[x] = sum of w(x, s) over s in the set, for every graph position.
        self.gain = [0] * len(p.graph.ids)
        self.members: set[int] = set()
        self.weight = 0
        self.lin = 0
        #: Devices per NUMA node; `numa_seed` nodes (partners' nodes) count once more, so they are always "used".
        self.numa_count: dict[int, int] = {}
        for n in numa_seed:
            self.numa_count[n] = self.numa_count.get(n, 0) + 1
        self.port_count: dict[int, int] = {}
        for m in members:
            self.add(m)

    # -- updates -----------------------------------------------------------
    def add(self, x: int) -> None:
        self.weight += self.gain[x]
        self.lin += self.obj.lin[x]
        self.members.add(x)
        row = self.w[x]
        g = self.gain
        for z in self.p.available:
            g[z] += row[z]
        n = self.p.numa[x]
        if n is not None:
            self.numa_count[n] = self.numa_count.get(n, 0) + 1
        pt = self.p.port[x]
        self.port_count[pt] = self.port_count.get(pt, 0) + 1

    def remove(self, x: int) -> None:
        self.members.discard(x)
        row = self.w[x]
        g = self.gain
        for z in self.p.available:
            g[z] -= row[z]
        self.weight -= self.gain[x]
        self.lin -= self.obj.lin[x]
        n = self.p.numa[x]
        if n is not None:
            self.numa_count[n] -= 1
            if not self.numa_count[n]:
                del self.numa_count[n]
        pt = self.p.port[x]
        self.port_count[pt] -= 1
        if not self.port_count[pt]:
            del self.port_count[pt]

    # -- reading ------------------------------------------------------------
    @property
    def span(self) -> int:
        return len(self.numa_count)

    def key(self) -> int:
        o = self.obj
        return (o.alpha * self.weight + self.lin - o.span_coef * self.span
                + o.port_coef * len(self.port_count) + o.offset)

    def add_delta(self, x: int) -> int:
        """key(S + x) - key(S)."""
        o = self.obj
        d = o.alpha * self.gain[x] + o.lin[x]
        n = self.p.numa[x]
        if n is not None and n not in self.numa_count:
            d -= o.span_coef
        if self.p.port[x] not in self.port_count:
            d += o.port_coef
        return d

    def swap_delta(self, out: int, into: int) -> tuple[int, int]:
        """(key change, new span) of replacing `out` (a member) by `into` (not a member)."""
        o = self.obj
        p = self.p
        d = o.alpha * (self.gain[into] - self.w[out][into] - self.gain[out]) + o.lin[into] - o.lin[out]
        span = len(self.numa_count)
        no, ni = p.numa[out], p.numa[into]
        if no != ni:
            if no is not None and self.numa_count[no] == 1:
                span -= 1
            if ni is not None and ni not in self.numa_count:
                span += 1
            d -= o.span_coef * (span - len(self.numa_count))
        po, pi = p.port[out], p.port[into]
        if po != pi and o.port_coef:
            dp = 0
            if self.port_count[po] == 1:
                dp -= 1
            if pi not in self.port_count:
                dp += 1
            d += o.port_coef * dp
        return d, span


def _new_node_feasible(p: Problem, st: SetState, node: int, need: int, max_span: int) -> bool:
    """Can `need` more devices still be picked within max_span after opening NUMA node `node`?"""
    room = max_span - st.span - 1
    if room < 0:
        return False
    used = st.numa_count
    fits = 0
    others: dict[int, int] = {}
    for z in p.free:
        if z in st.members:
            continue
        n = p.numa[z]
        if n is None or n in used or n == node:
            fits += 1
        else:
            others[n] = others.get(n, 0) + 1
    fits -= 1  # the device that opens `node` is itself one of them
    if fits >= need:
        return True
    fits += sum(sorted(others.values(), reverse=True)[:room])
    return fits >= need


def greedy(p: Problem, obj: Objective, numa_seed: Iterable[int] = (),
           extra: Callable[[int], int] | None = None, on_add: Callable[[int], None] | None = None) -> SetState:
    """Add the device with the best key gain until `size` devices are chosen (ties: lowest position).

    Opening a new NUMA node is allowed only while a valid completion still
    exists, so the result always respects `obj.max_span` (counting the
    `numa_seed` nodes as used, see `SetState`). `extra(x)` is added to each
    candidate's gain and `on_add(x)` told of each pick, for a key term that
    `SetState` does not track (the pairing weight, see `pairing_bound`).
    """
    st = SetState(p, obj, p.must, numa_seed)
    need = p.picks
    ms = obj.max_span
    while need > 0:
        best = None
        best_d = 0
        checked: dict[int, bool] = {}
        for x in p.free:
            if x in st.members:
                continue
            if ms is not None:
                n = p.numa[x]
                if n is not None and n not in st.numa_count:
                    ok = checked.get(n)
                    if ok is None:
                        ok = checked[n] = _new_node_feasible(p, st, n, need - 1, ms)
                    if not ok:
                        continue
            d = st.add_delta(x)
            if extra is not None:
                d += extra(x)
            if best is None or d > best_d:
                best, best_d = x, d
        assert best is not None, "greedy found no feasible device; min_span is wrong"
        st.add(best)
        if on_add is not None:
            on_add(best)
        need -= 1
    return st


def local_search(st: SetState, deadline: float | None = None, max_passes: int = 64) -> int:
    """Best-improvement 1-swap search (must-include devices never leave). Returns passes made.

    Deterministic: a swap is taken only if it strictly improves the key, the
    first best in position order wins.
    """
    p = st.p
    ms = st.obj.max_span
    must = set(p.must)
    passes = 0
    while passes < max_passes:
        if deadline is not None and time.perf_counter() > deadline:
            break
        passes += 1
        best: tuple[int, int] | None = None
        best_d = 0
        inside = sorted(x for x in st.members if x not in must)
        outside = [x for x in p.free if x not in st.members]
        for o in inside:
            for i in outside:
                d, span = st.swap_delta(o, i)
                if d > best_d and (ms is None or span <= ms):
                    best, best_d = (o, i), d
        if best is None:
            break
        st.remove(best[0])
        st.add(best[1])
    return passes
