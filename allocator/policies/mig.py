"""MIG devices: the spec's "MIG devices" objective, exactly.

For k MIG devices of one resource (one profile under `mixed`, or `single`'s
`nvidia.com/gpu`), with free(g) = the number of g's devices of this resource
in A (what the kubelet says is free), best first:

1. the smallest span(S) (each MIG device has its parent GPU's NUMA node);
2. the fewest distinct parent GPUs;
3. "parents with the fewest free MIG devices first (best fit)". Our reading,
   in two steps, both about packing the request onto the fullest GPUs:
   a. the free counts of the chosen parents, sorted ascending, are
      lexicographically smallest: the parent with the fewest free devices
      comes first, then the next, and so on. With free counts {1, 4, 4, 6}
      and k = 7 this picks {1, 6} (both GPUs end up full) rather than {4, 4},
      which a plain sum of free(parent(s)) would prefer and which leaves
      two GPUs partly used;
   b. then the smallest sum of free(parent(s)) over s in S: among the chosen
      parents, take as many devices as possible from those with the fewest
      free (fill the fullest GPU first, leave the emptier one as whole as
      possible);
4. the fixed rule: the lexicographically smallest sorted tuple of graph
   positions (as for every other policy).
Link weights play no part (MIG devices have no peer access).

Why exact (see `family` for the node sets U and the count-vector argument):
for a fixed U and must-include parents pM, criterion 2 needs the fewest
extra parents whose free counts, added to those of pM, reach k: the largest
counts first. 3a is then a lexicographically smallest sorted multiset of e
counts with a sum of at least need, built greedily (at each step the smallest
count that can still be completed by the largest remaining ones), which is
optimal by the usual exchange argument; two parents with equal counts are
interchangeable for criteria 1-3. 3b is a fill: every chosen parent gets its
lower bound (1, or its must-include count) and the remaining devices go to
the parents with the fewest free first. The tie rule picks, per count class,
the parents whose devices come first; at the class where the fill stops it
walks the devices in position order and keeps each one while a completion
is still possible. The best U is chosen on (parents, 3a, 3b, tuple).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..subdevices import parent_positions
from ..topology import DeviceGraph
from .family import Family, FamilyPolicy, NodeSet


def mig_criteria(graph: DeviceGraph, available: Iterable[str], chosen: Iterable[str]) -> tuple[Any, ...]:
    """(span, |parents(S)|, sorted free counts of the parents, sum of free(parent(s))): smaller is better."""
    pos = graph.index_of()
    return _criteria_idx(graph, [pos[i] for i in available], [pos[i] for i in chosen])


def _criteria_idx(graph: DeviceGraph, available: Sequence[int], chosen: Sequence[int]) -> tuple[Any, ...]:
    parent_of, parent_ids = parent_positions(graph)
    free = [0] * len(parent_ids)
    for i in available:
        free[parent_of[i]] += 1
    parents = {parent_of[i] for i in chosen}
    span = len({graph.numa[i] for i in chosen if graph.numa[i] is not None})
    return (span, len(parents), tuple(sorted(free[p] for p in parents)), sum(free[parent_of[i]] for i in chosen))


def smallest_counts(values: Sequence[int], e: int, need: int) -> list[int]:
    """The lexicographically smallest ascending list of `e` of `values` (a multiset) with sum >= `need`.

    Greedy: each entry is the smallest value that the largest remaining
    values can still complete. Requires that the `e` largest values reach
    `need`.
    """
    remaining = sorted(values)
    out: list[int] = []
    left = need
    for j in range(e):
        slots = e - j - 1
        for idx, v in enumerate(remaining):
            if idx and remaining[idx - 1] == v:
                continue
            rest = remaining[:idx] + remaining[idx + 1:]
            if v + sum(rest[len(rest) - slots:] if slots else ()) >= left:
                break
        else:  # pragma: no cover - the caller guarantees feasibility
            raise AssertionError("no feasible count; the node set has too little room")
        out.append(v)
        left -= v
        del remaining[idx]
    return out


@dataclass(frozen=True)
class _Plan:
    pool: tuple[int, ...]
    #: Free counts the extra parents must have, ascending.
    counts: tuple[int, ...]


@dataclass(frozen=True)
class MigPolicy(FamilyPolicy):
    """The spec's MIG objective (see the module docstring); `get_policy("mig")`."""

    name = "mig"

    def prepare(self, f: Family) -> list[int]:
        """free(g): the devices of each parent in A."""
        return [len(a) for a in f.avail]

    def choose(self, f: Family, free: list[int], plans: list[_Plan],
               deadline: float | None) -> tuple[tuple[int, ...], bool, int]:
        return min(self._members(f, plan, free) for plan in plans), True, 0

    def criteria_idx(self, graph: DeviceGraph, available: Sequence[int], chosen: Sequence[int]) -> tuple[Any, ...]:
        return _criteria_idx(graph, available, chosen)

    # -- criteria 2 and 3 per node set -------------------------------------------------
    def plan(self, f: Family, free: list[int], u: NodeSet) -> tuple[tuple[Any, ...], _Plan]:
        need = f.size - sum(free[p] for p in f.must_parents)
        counts: tuple[int, ...] = ()
        if need > 0:
            largest = sorted((free[p] for p in u.pool), reverse=True)
            e, acc = 0, 0
            while acc < need:
                acc += largest[e]
                e += 1
            counts = tuple(smallest_counts([free[p] for p in u.pool], e, need))
        units, lower = self._units(f, free, counts)
        r = f.size - lower[1]
        fill = lower[0] + sum(cost for cost, _ in units[:r])
        key = (len(f.must_parents) + len(counts), tuple(sorted([*(free[p] for p in f.must_parents), *counts])), fill)
        return key, _Plan(u.pool, counts)

    @staticmethod
    def _units(f: Family, free: list[int], counts: Sequence[int]) -> tuple[list[tuple[int, int]], tuple[int, int]]:
        """Extra devices beyond the lower bounds as (cost, parent kind) units, cheapest first,
        and (cost, devices) of the lower bounds. Kind -1 marks a must-include parent's unit."""
        units: list[tuple[int, int]] = []
        cost = size = 0
        for p in f.must_parents:
            m = len(f.must[p])
            cost += m * free[p]
            size += m
            units += [(free[p], -1)] * (free[p] - m)
        for v in counts:
            cost += v
            size += 1
            units += [(v, v)] * (v - 1)
        units.sort()
        return units, (cost, size)

    # -- the tie rule ---------------------------------------------------------------------
    def _members(self, f: Family, plan: _Plan, free: list[int]) -> tuple[int, ...]:
        """The smallest sorted tuple among the sets that realise `plan`'s criteria."""
        units, (_, lower) = self._units(f, free, plan.counts)
        r = f.size - lower
        lam = units[r - 1][0] if r > 0 else None
        at_lam = r - sum(1 for c, _ in units[:r] if c != lam) if lam is not None else 0
        members = list(f.must_devices)
        lam_pool: list[int] = []  # devices of the class where the fill stops
        lam_must: set[int] = set()
        for p in f.must_parents:
            if lam is not None and free[p] < lam:
                members += f.free[p]
            elif free[p] == lam:
                lam_pool += f.free[p]
                lam_must.add(p)
        wanted: dict[int, int] = {}
        for v in plan.counts:
            wanted[v] = wanted.get(v, 0) + 1
        for v, c in sorted(wanted.items()):
            # Parents of this class, those whose devices come first first.
            cls = sorted((p for p in plan.pool if free[p] == v), key=lambda p: f.avail[p][0])
            if lam is not None and v < lam:
                for p in cls[:c]:
                    members += f.avail[p]
            elif lam is None or v > lam:
                members += [f.avail[p][0] for p in cls[:c]]
            else:
                lam_pool += [i for p in cls for i in f.avail[p]]
                members += self._walk(f, sorted(lam_pool), lam_must, c, c + at_lam)
                lam_pool = []
        if lam_pool:  # the fill stops on must-include parents only
            members += self._walk(f, sorted(lam_pool), lam_must, 0, at_lam)
        return tuple(sorted(members))

    @staticmethod
    def _walk(f: Family, devices: list[int], must_parents: set[int], touch: int, take: int) -> list[int]:
        """Take `take` of `devices` (ascending), touching exactly `touch` parents outside `must_parents`,
        keeping each device in order while a completion stays possible (smallest tuple)."""
        parent_of = f.parent_of
        chosen: list[int] = []
        touched: set[int] = set()

        def feasible(start: int, nsel: int, hit: set[int]) -> bool:
            left = take - nsel
            new = touch - len(hit)
            if new < 0 or left < new:
                return False
            cap = 0
            untouched: dict[int, int] = {}
            for d in devices[start:]:
                p = parent_of[d]
                if p in must_parents or p in hit:
                    cap += 1
                else:
                    untouched[p] = untouched.get(p, 0) + 1
            if len(untouched) < new:
                return False
            cap += sum(sorted(untouched.values(), reverse=True)[:new])
            return cap >= left

        for idx, d in enumerate(devices):
            if len(chosen) == take:
                break
            p = parent_of[d]
            hit = touched if p in must_parents or p in touched else touched | {p}
            if feasible(idx + 1, len(chosen) + 1, hit):
                chosen.append(d)
                touched = hit
        assert len(chosen) == take and len(touched) == touch, "the fill plan has no realisation"
        return chosen
