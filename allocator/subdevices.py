"""Devices that live on a physical GPU: time-slicing replicas and MIG devices.

Why a module of its own: both kinds are advertised as devices of their own, but
what makes a set of them good is decided by their *parent* GPUs (the spec's
"Shared GPUs: time-slicing replicas" and "MIG devices"). This module builds the
allocator's `DeviceGraph` for such a resource, with `parents`/`parent_ids`
filled in, and recovers the parent-level view the policies search over.

- A replica graph (`replica_graph`) is built from the GPU resource's graph:
  replica r of GPU g gets the ID `<g's ID>::<r>` (NVIDIA's annotated IDs), g's
  NUMA node, and g's link weight to the replicas of every *other* GPU; two
  replicas of one GPU have weight 0 (W(parents(S)) counts distinct GPUs only).
  Its weights are an `InheritedWeights` view, not a table: a replica's links
  are its GPU's, so the graph keeps one parent per replica and the GPUs'
  own table. A full replica x replica table grew with the square of the
  replica count (8 GPUs x 1,000 replicas: 490 MiB and seconds to build);
  the view is linear in replicas and reads like the table (`w[i][j]`).
- A MIG graph (`child_graph`) is built from the parents' graph and the list of
  (MIG device ID, parent ID) pairs; every pair weight is 0, because MIG devices
  never have NVLink peer access.

Positions are parent-major (all children of the first parent, then the next),
which keeps answers readable; the policies do not rely on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import overload

from .topology import DeviceGraph

#: Separator of a replica ID, as NVIDIA's device plugin writes it (`<uuid>::<n>`).
REPLICA_SEPARATOR = "::"


def replica_id(parent_id: str, replica: int) -> str:
    """The ID of replica `replica` of the GPU whose plugin ID is `parent_id`."""
    return f"{parent_id}{REPLICA_SEPARATOR}{replica}"


def split_replica_id(device_id: str) -> tuple[str, int] | None:
    """(GPU ID, replica number) of a replica ID, or None when `device_id` is not one.

    The GPU ID is everything before the *last* separator, so a GPU ID may itself
    contain `::` (it never does for UUIDs or indexes, but nothing depends on it).
    """
    head, sep, tail = device_id.rpartition(REPLICA_SEPARATOR)
    if not sep or not head or not tail.isdigit():
        return None
    return head, int(tail)


def physical_id(device_id: str) -> str:
    """The GPU ID behind a device ID: a replica's parent, or the ID itself."""
    split = split_replica_id(device_id)
    return split[0] if split else device_id


class _InheritedRow(Sequence[int]):
    """Row i of `InheritedWeights`: the links of device i, read through parents."""

    __slots__ = ("_parents", "_own", "_links")

    def __init__(self, parents: tuple[int, ...], own: int, links: tuple[int, ...]):
        self._parents = parents
        self._own = own
        self._links = links

    def __len__(self) -> int:
        return len(self._parents)

    @overload
    def __getitem__(self, j: int) -> int: ...
    @overload
    def __getitem__(self, j: slice) -> tuple[int, ...]: ...
    def __getitem__(self, j: int | slice) -> int | tuple[int, ...]:
        if isinstance(j, slice):
            return tuple(self[k] for k in range(*j.indices(len(self))))
        q = self._parents[j]
        return 0 if q == self._own else self._links[q]

    def __iter__(self) -> Iterator[int]:
        own, links = self._own, self._links
        return (0 if q == own else links[q] for q in self._parents)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # equal to tuples, so not hashable like one


class InheritedWeights(Sequence[Sequence[int]]):
    """The pair weights of devices that inherit their parent's links, without a device x device table.

    `weights[i][j]` is 0 when devices i and j share a parent (two replicas of
    one GPU add no link), else `parent_weights[parents[i]][parents[j]]`.
    Memory is one parent position per device plus the parents' table, so a
    replica graph grows linearly with the replica count. Reads like the
    tuple table it replaces (`w[i][j]`, `len`, iteration, equality), so
    scoring helpers and brute-force references work on it unchanged.
    """

    __slots__ = ("parents", "parent_weights")

    def __init__(self, parents: tuple[int, ...], parent_weights: tuple[tuple[int, ...], ...]):
        self.parents = parents
        self.parent_weights = parent_weights

    def __len__(self) -> int:
        return len(self.parents)

    @overload
    def __getitem__(self, i: int) -> Sequence[int]: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Sequence[int], ...]: ...
    def __getitem__(self, i: int | slice) -> Sequence[int] | tuple[Sequence[int], ...]:
        if isinstance(i, slice):
            return tuple(self[k] for k in range(*i.indices(len(self))))
        p = self.parents[i]
        return _InheritedRow(self.parents, p, self.parent_weights[p])

    def __iter__(self) -> Iterator[Sequence[int]]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, InheritedWeights):
            return self.parents == other.parents and self.parent_weights == other.parent_weights
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    def __hash__(self) -> int:
        return hash((self.parents, self.parent_weights))

    def __repr__(self) -> str:
        return f"InheritedWeights({len(self.parents)} devices on {len(self.parent_weights)} parents)"


def replica_graph(gpus: DeviceGraph, replicas: int | Mapping[str, int]) -> DeviceGraph:
    """The graph of a time-sliced resource built from the GPUs' graph.

    `replicas` is one count for every GPU, or a count per GPU ID (a GPU that is
    missing or has 0 is not shared and gets no replica). Raises ValueError for
    a negative count or a GPU ID the graph does not have.
    """
    if isinstance(replicas, int):
        counts = {g: replicas for g in gpus.ids}
    else:
        unknown = sorted(set(replicas) - set(gpus.ids))
        if unknown:
            raise ValueError(f"replica counts name unknown GPUs: {', '.join(unknown)}")
        counts = {g: int(replicas.get(g, 0)) for g in gpus.ids}
    bad = sorted(g for g, c in counts.items() if c < 0)
    if bad:
        raise ValueError(f"replica count must be >= 0, got {counts[bad[0]]} for {bad[0]}")
    shared = [i for i, g in enumerate(gpus.ids) if counts[g] > 0]
    ids: list[str] = []
    numa: list[int | None] = []
    owner: list[int] = []  # position in `shared` of each replica's GPU
    for p, i in enumerate(shared):
        n = counts[gpus.ids[i]]
        ids.extend(replica_id(gpus.ids[i], r) for r in range(n))
        numa.extend([gpus.numa[i]] * n)
        owner.extend([p] * n)
    w = gpus.weights
    links = tuple(tuple(0 if a == b else w[a][b] for b in shared) for a in shared)
    parents = tuple(owner)
    return DeviceGraph(
        ids=tuple(ids),
        numa=tuple(numa),
        weights=InheritedWeights(parents, links),
        parents=parents,
        parent_ids=tuple(gpus.ids[i] for i in shared),
    )


def child_graph(parents: DeviceGraph, children: Iterable[tuple[str, str]]) -> DeviceGraph:
    """The graph of a MIG resource: `children` are (device ID, parent ID) pairs.

    Each child gets its parent's NUMA node; all weights are 0 (no peer links).
    Children are ordered parent-major, in the order given within a parent.
    Raises ValueError for an unknown parent or a repeated child ID.
    """
    by_parent: dict[str, list[str]] = {}
    seen: set[str] = set()
    known = set(parents.ids)
    for child, parent in children:
        if parent not in known:
            raise ValueError(f"device {child!r} names unknown parent GPU {parent!r}")
        if child in seen:
            raise ValueError(f"device ID {child!r} is listed twice")
        seen.add(child)
        by_parent.setdefault(parent, []).append(child)
    ids: list[str] = []
    numa: list[int | None] = []
    owner: list[int] = []
    used: list[str] = []
    for i, g in enumerate(parents.ids):
        kids = by_parent.get(g)
        if not kids:
            continue
        for child in kids:
            ids.append(child)
            numa.append(parents.numa[i])
            owner.append(len(used))
        used.append(g)
    n = len(ids)
    zero = tuple(0 for _ in range(n))
    return DeviceGraph(ids=tuple(ids), numa=tuple(numa), weights=tuple(zero for _ in range(n)),
                       parents=tuple(owner), parent_ids=tuple(used))


def parent_positions(graph: DeviceGraph) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(parent position of every device, parent IDs); a graph without parents maps each device to itself."""
    if graph.parents:
        if len(graph.parents) != len(graph.ids):
            raise ValueError("DeviceGraph.parents must have one entry per device")
        return graph.parents, graph.parent_ids
    return tuple(range(len(graph.ids))), graph.ids


def parent_weights(graph: DeviceGraph, representatives: Sequence[int]) -> list[list[int]]:
    """Pair weights between parents, read through one child position per parent."""
    w = graph.weights
    if isinstance(w, InheritedWeights):  # the parents' own table: no per-device rows to build
        pw, of = w.parent_weights, [w.parents[r] for r in representatives]
        return [[0 if a == b else pw[pa][pb] for b, pb in enumerate(of)] for a, pa in enumerate(of)]
    return [[0 if a == b else w[ra][rb] for b, rb in enumerate(representatives)]
            for a, ra in enumerate(representatives)]
