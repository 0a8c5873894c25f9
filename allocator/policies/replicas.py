"""Time-slicing replicas: the spec's "Shared GPUs: time-slicing replicas" objective, exactly.

For a set S of replicas (`<GPU ID>::<r>`), parents(S) is its set of GPUs and
load(g) is the number of g's replicas that are advertised but not in A
(handed out, or unhealthy). Best first:

1. the smallest span(S);
2. the largest |parents(S)|;
3. the smallest sum of load(parent(s)) over s in S;
4. the largest W(parents(S)) (links between the distinct GPUs);
5. the fixed rule: the lexicographically smallest sorted tuple of graph
   positions (as for every other policy), so an answer never depends on the
   order of `available_deviceIDs`.

Why this is exact without looking at subsets of replicas (see `family`):
criteria 1-4 depend only on the count vector x (x_g replicas from GPU g),
and for a fixed x the tie rule takes must-include plus the lowest free
replicas of each GPU. Write P = parents(S), M_g = must-include replicas of g,
t = k - |M|, and Q_U = the GPUs inside a node set U (see `Family.node_sets`)
with a free replica and no must-include one. Then for a fixed U:

- criterion 2: |P| <= |parents(M)| + min(t, |Q_U|), reached exactly when
  P = parents(M) + min(t, |Q_U|) GPUs of Q_U (each new GPU needs one replica,
  and there are only t to give). The best U's are those with the largest bound.
- case A, t <= |Q_U|: every new GPU gets exactly one replica and each
  must-include GPU exactly its must-include ones, so the load is fixed plus
  the loads of the t new GPUs: the t least-loaded GPUs of Q_U. With lam the
  t-th smallest load, the GPUs below lam are all taken and c more come from
  the GPUs at lam; criterion 4 picks those c to maximise W(P): a max-weight
  c-subset with a fixed part, which is the GPU policies' exact branch and
  bound (`search.solve` with key W(S)) on the parent graph. Its tie rule,
  run on GPUs ordered by their lowest free replica, is the replica tie rule.
- case B, t > |Q_U|: P is all of Q_U plus parents(M) (forced, so W is fixed);
  each GPU gets its lower bound (1, or its must-include count) and the
  t - |Q_U| extra replicas go to the least-loaded free replicas; taking them
  in (load, position) order gives the least load and the smallest tuple.

The best U is then chosen on (|P|, load, W, tuple). The only search is the
case-A subset choice, over at most as many GPUs as the node has.

Time budget (`FamilyPolicy`): no deadline while at most `exact_limit` GPUs
have a free replica, so 8 x 10 and 16 x 4 are always exact; above it the best
answer found by the deadline is returned, flagged `optimal=False`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..request import AllocationRequest
from ..subdevices import parent_positions, parent_weights
from ..topology import DeviceGraph
from .family import Family, FamilyPolicy, NodeSet
from .problem import Objective, Problem
from .search import solve


def replica_criteria(graph: DeviceGraph, available: Iterable[str], chosen: Iterable[str]) -> tuple[int, int, int, int]:
    """(span, -|parents(S)|, sum of loads, -W(parents(S))) of a chosen set: smaller is better."""
    pos = graph.index_of()
    avail = [pos[i] for i in available]
    picked = [pos[i] for i in chosen]
    return _criteria_idx(graph, avail, picked)


def _criteria_idx(graph: DeviceGraph, available: Sequence[int], chosen: Sequence[int]) -> tuple[int, int, int, int]:
    parent_of, parent_ids = parent_positions(graph)
    total = [0] * len(parent_ids)
    for p in parent_of:
        total[p] += 1
    in_a = [0] * len(parent_ids)
    for i in available:
        in_a[parent_of[i]] += 1
    reps: dict[int, int] = {}
    for i in chosen:
        reps.setdefault(parent_of[i], i)
    span = len({graph.numa[i] for i in chosen if graph.numa[i] is not None})
    load = sum(total[parent_of[i]] - in_a[parent_of[i]] for i in chosen)
    r = list(reps.values())
    w = graph.weights
    links = sum(w[r[a]][r[b]] for a in range(len(r)) for b in range(a + 1, len(r)))
    return (span, -len(reps), load, -links)


@dataclass(frozen=True)
class _CaseA:
    """A node set where every new GPU gets one replica: choose `c` GPUs of `tie` next to `fixed`."""

    fixed: tuple[int, ...]
    tie: tuple[int, ...]
    c: int


@dataclass(frozen=True)
class _Answer:
    members: tuple[int, ...]
    links: int
    optimal: bool
    explored: int


@dataclass(frozen=True)
class _Context:
    load: list[int]
    #: Replicas to add to must-include, and the load must-include alone brings.
    picks: int
    must_load: int


@dataclass(frozen=True)
class ReplicaPolicy(FamilyPolicy):
    """The spec's time-slicing objective (see the module docstring); `get_policy("replicas")`."""

    name = "replicas"

    def prepare(self, f: Family) -> _Context:
        load = [f.total[p] - len(f.avail[p]) for p in range(len(f.parent_ids))]
        return _Context(load, f.picks, sum(len(f.must[p]) * load[p] for p in f.must_parents))

    # -- criteria 2 and 3 per node set ------------------------------------------------
    def plan(self, f: Family, c: _Context, u: NodeSet) -> tuple[tuple[int, int], _CaseA | tuple[int, ...]]:
        return self._case_a(f, u, c) if c.picks <= len(u.pool) else self._case_b(f, u, c)

    @staticmethod
    def _case_a(f: Family, u: NodeSet, c: _Context) -> tuple[tuple[int, int], _CaseA]:
        load, t = c.load, c.picks
        loads = sorted(load[p] for p in u.pool)
        lam = loads[t - 1]
        below = tuple(p for p in u.pool if load[p] < lam)
        tie = tuple(p for p in u.pool if load[p] == lam)
        key = (-(len(f.must_parents) + t), c.must_load + sum(loads[:t]))
        return key, _CaseA(tuple(f.must_parents) + below, tie, t - len(below))

    @staticmethod
    def _case_b(f: Family, u: NodeSet, c: _Context) -> tuple[tuple[int, int], tuple[int, ...]]:
        load = c.load
        extra = c.picks - len(u.pool)
        slack = sorted(
            [(load[p], i) for p in f.must_parents for i in f.free[p]]
            + [(load[p], i) for p in u.pool for i in f.free[p][1:]]
        )[:extra]
        members = tuple(sorted([*f.must_devices, *(f.free[p][0] for p in u.pool), *(i for _, i in slack)]))
        key = (-(len(f.must_parents) + len(u.pool)),
               c.must_load + sum(load[p] for p in u.pool) + sum(s for s, _ in slack))
        return key, members

    # -- criterion 4 and the tie rule -------------------------------------------------
    def choose(self, f: Family, c: _Context, plans: list[_CaseA | tuple[int, ...]],
               deadline: float | None) -> tuple[tuple[int, ...], bool, int]:
        best: tuple[int, tuple[int, ...]] | None = None
        optimal, explored = True, 0
        for plan in plans:
            if isinstance(plan, _CaseA):
                ans = self._resolve(f, plan, deadline)
            else:
                ans = _Answer(plan, self._links(f, plan), True, 0)
            explored += ans.explored
            optimal = optimal and ans.optimal
            cand = (-ans.links, ans.members)
            if best is None or cand < best:
                best = cand
        assert best is not None
        return best[1], optimal, explored

    def _resolve(self, f: Family, plan: _CaseA, deadline: float | None) -> _Answer:
        """Pick `plan.c` GPUs of `plan.tie` maximising W(fixed + chosen); ties: lowest free replicas."""
        tie = sorted(plan.tie, key=lambda p: f.free[p][0])
        optimal, explored = True, 0
        if plan.c == 0:
            chosen: list[int] = []
        elif plan.c == len(tie):
            chosen = tie
        else:
            order = [*plan.fixed, *tie]
            reps = [f.avail[p][0] for p in order]
            w = parent_weights(f.graph, reps)
            names = tuple(str(j) for j in range(len(order)))
            sub = DeviceGraph(ids=names, numa=(None,) * len(order), weights=tuple(tuple(r) for r in w))
            req = AllocationRequest(names, names[:len(plan.fixed)], len(plan.fixed) + plan.c)
            problem = Problem.build(sub, req)
            found = solve(problem, Objective(alpha=1, lin=[0] * len(order)), deadline)
            chosen = [order[j] for j in found.members if j >= len(plan.fixed)]
            optimal, explored = found.optimal, found.explored
        members = tuple(sorted([*f.must_devices, *(f.free[p][0] for p in plan.fixed if p not in f.must_parents),
                                *(f.free[p][0] for p in chosen)]))
        return _Answer(members, self._links(f, members), optimal, explored)

    @staticmethod
    def _links(f: Family, members: Sequence[int]) -> int:
        return -_criteria_idx(f.graph, (), members)[3]

    def criteria_idx(self, graph: DeviceGraph, available: Sequence[int], chosen: Sequence[int]) -> tuple[Any, ...]:
        return _criteria_idx(graph, available, chosen)

    def score_of(self, criteria: tuple[Any, ...]) -> int:
        return -int(criteria[3])
