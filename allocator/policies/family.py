"""One request over devices that live on parent GPUs, in parent terms.

Why: for time-slicing replicas and MIG devices every criterion of the spec
depends only on *how many* devices a set takes from each parent GPU (its
count vector), never on which ones: all children of one parent have the same
NUMA node and the same links, and the load/free counts belong to the parent.
So both policies search over parents (at most a few dozen), never over
subsets of the 56..80+ devices, and pick the concrete devices at the end.

This module holds what both policies share: the per-parent bookkeeping of a
request, and the NUMA node sets a minimal-span answer can live in.

Node sets: the smallest span s* is computed on the devices (as for GPUs:
`scoring.min_span_idx`). Every set of span s* has its known NUMA nodes inside
some node set U with |U| = s* that contains the nodes of must-include, and
conversely any set inside such a U (parents without NUMA are in every U) has
span <= s*, hence exactly s*. So "smallest span" becomes "one of these U",
and each policy compares its remaining criteria over the U's.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..request import Allocation, AllocationRequest
from ..scoring import min_span_idx
from ..subdevices import parent_positions
from ..topology import DeviceGraph
from .base import SearchPolicy


@dataclass(frozen=True)
class NodeSet:
    """A set U of NUMA nodes a minimal-span answer may use, and what it offers."""

    nodes: frozenset[int]
    #: Parents inside U with an available device and no must-include device, ascending.
    pool: tuple[int, ...]
    #: Available devices of all parents inside U (must-include parents included).
    capacity: int


@dataclass(frozen=True)
class Family:
    """A validated request in parent terms (parents are positions in `graph.parent_ids`)."""

    graph: DeviceGraph
    size: int
    #: Parent position of every graph position.
    parent_of: tuple[int, ...]
    parent_ids: tuple[str, ...]
    #: Devices of each parent in the graph (advertised), available ones, must-include ones,
    #: and the available ones that are not must-include; position lists ascending.
    total: tuple[int, ...]
    avail: tuple[tuple[int, ...], ...]
    must: tuple[tuple[int, ...], ...]
    free: tuple[tuple[int, ...], ...]
    #: NUMA node of each parent (that of its devices).
    numa: tuple[int | None, ...]
    available: tuple[int, ...]
    must_devices: tuple[int, ...]
    #: Parents holding a must-include device, ascending.
    must_parents: tuple[int, ...]
    #: The smallest span any valid answer has.
    min_span: int

    @classmethod
    def build(cls, graph: DeviceGraph, request: AllocationRequest) -> Family:
        """Map a request that already passed `request.validate(graph)` to parents."""
        parent_of, parent_ids = parent_positions(graph)
        n = len(parent_ids)
        pos = graph.index_of()
        available = tuple(sorted(pos[i] for i in request.available))
        must_devices = tuple(sorted(pos[i] for i in request.must_include))
        must_set = set(must_devices)
        total = [0] * n
        numa: list[int | None] = [None] * n
        for i, p in enumerate(parent_of):
            if total[p] == 0:
                numa[p] = graph.numa[i]
            total[p] += 1
        avail: list[list[int]] = [[] for _ in range(n)]
        must: list[list[int]] = [[] for _ in range(n)]
        free: list[list[int]] = [[] for _ in range(n)]
        for i in available:
            p = parent_of[i]
            avail[p].append(i)
            (must if i in must_set else free)[p].append(i)
        return cls(
            graph=graph,
            size=request.size,
            parent_of=tuple(parent_of),
            parent_ids=tuple(parent_ids),
            total=tuple(total),
            avail=tuple(tuple(a) for a in avail),
            must=tuple(tuple(m) for m in must),
            free=tuple(tuple(f) for f in free),
            numa=tuple(numa),
            available=available,
            must_devices=must_devices,
            must_parents=tuple(p for p in range(n) if must[p]),
            min_span=min_span_idx(graph, available, must_devices, request.size),
        )

    @property
    def picks(self) -> int:
        """Devices to add to must-include."""
        return self.size - len(self.must_devices)

    def candidate_parents(self) -> list[int]:
        """Parents with at least one available device."""
        return [p for p in range(len(self.parent_ids)) if self.avail[p]]

    def node_sets(self) -> Iterator[NodeSet]:
        """Every node set U of size `min_span` (containing must-include's nodes) with room for `size` devices.

        In ascending order of U's sorted nodes, so iteration is deterministic.
        """
        numa = self.numa
        must_nodes = {must_node for p in self.must_parents if (must_node := numa[p]) is not None}
        must_parents = set(self.must_parents)
        cands = self.candidate_parents()
        others = sorted({node for p in cands if (node := numa[p]) is not None and node not in must_nodes})
        extra = self.min_span - len(must_nodes)
        for combo in itertools.combinations(others, extra):
            nodes = frozenset(must_nodes.union(combo))
            inside = [p for p in cands if numa[p] is None or numa[p] in nodes]
            capacity = sum(len(self.avail[p]) for p in inside)
            if capacity < self.size:
                continue
            yield NodeSet(nodes, tuple(p for p in inside if p not in must_parents), capacity)

    def span_of(self, parents: list[int] | tuple[int, ...]) -> int:
        return len({self.numa[p] for p in parents if self.numa[p] is not None})


@dataclass(frozen=True)
class SharedAllocation(Allocation):
    """An answer of the replica or MIG policy, with the parent-level facts behind it.

    `score` is W(parents(S)) (0 for MIG devices, which have no peer links) and
    `left_score` is 0: the spec's "leave the best-connected devices together"
    criterion does not apply to these resources.
    """

    #: The distinct parent GPUs of the answer (IDs from `graph.parent_ids`), in parent order:
    #: what `Allocate` exposes once each.
    parents: tuple[str, ...] = ()
    #: The policy's criteria of the answer, smaller is better (the policy's `criteria` function).
    criteria: tuple[Any, ...] = ()


@dataclass(frozen=True)
class FamilyPolicy(SearchPolicy):
    """The request flow of the replica and MIG policies: validate, fast paths, node sets, answer.

    A subclass scores one node set (`plan`: a key, smaller is better, and what
    it needs to build the answer), turns the node sets tied on the best key
    into the answer (`choose`), and states its criteria (`criteria_idx`).

    Time budget: as for the other policies, no deadline while at most
    `exact_limit` parents have an available device; above it, node sets left
    unseen when the deadline passes make the answer `optimal=False` (it is
    still valid: every node set yields a complete answer).
    """

    def allocate(self, graph: DeviceGraph, request: AllocationRequest) -> SharedAllocation:
        started = time.perf_counter()
        request.validate(graph)
        f = Family.build(graph, request)
        if f.size == len(f.available):
            return self._family_result(f, f.available, True, 0)
        if f.size == len(f.must_devices):
            return self._family_result(f, f.must_devices, True, 0)
        deadline = None
        if self.time_budget_s is not None and len(f.candidate_parents()) > self.exact_limit:
            deadline = started + self.time_budget_s
        context = self.prepare(f)
        plans: list[tuple[Any, Any]] = []
        optimal = True
        for u in f.node_sets():
            if plans and deadline is not None and time.perf_counter() > deadline:
                optimal = False
                break
            plans.append(self.plan(f, context, u))
        best_key = min(k for k, _ in plans)
        members, proven, explored = self.choose(f, context, [p for k, p in plans if k == best_key], deadline)
        return self._family_result(f, members, optimal and proven, explored)

    # -- what a subclass says ---------------------------------------------------------
    def prepare(self, f: Family) -> Any:
        """Per-request numbers every node set needs (loads, free counts...)."""
        return None

    def plan(self, f: Family, context: Any, u: NodeSet) -> tuple[Any, Any]:
        raise NotImplementedError

    def choose(self, f: Family, context: Any, plans: list[Any],
               deadline: float | None) -> tuple[tuple[int, ...], bool, int]:
        """(answer positions, proven optimal, search nodes) from the plans tied on the best key."""
        raise NotImplementedError

    def criteria_idx(self, graph: DeviceGraph, available: Sequence[int], chosen: Sequence[int]) -> tuple[Any, ...]:
        raise NotImplementedError

    def score_of(self, criteria: tuple[Any, ...]) -> int:
        """W(parents(S)) where the objective has it; 0 otherwise."""
        return 0

    def _family_result(self, f: Family, members: Sequence[int], optimal: bool, explored: int) -> SharedAllocation:
        chosen = sorted(members)
        g = f.graph
        crit = self.criteria_idx(g, f.available, chosen)
        parents = sorted({f.parent_of[i] for i in chosen})
        return SharedAllocation(
            ids=tuple(g.ids[i] for i in chosen),
            span=crit[0],
            score=self.score_of(crit),
            left_score=0,
            optimal=optimal,
            explored=explored,
            policy=self.name,
            parents=tuple(f.parent_ids[p] for p in parents),
            criteria=crit,
        )
