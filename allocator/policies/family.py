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
from collections.abc import Iterator
from dataclasses import dataclass

from ..request import Allocation, AllocationRequest
from ..scoring import min_span_idx
from ..subdevices import parent_positions
from ..topology import DeviceGraph


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
        must_nodes = {numa[p] for p in self.must_parents if numa[p] is not None}
        must_parents = set(self.must_parents)
        cands = self.candidate_parents()
        others = sorted({numa[p] for p in cands if numa[p] is not None and numa[p] not in must_nodes})
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
    criteria: tuple = ()
