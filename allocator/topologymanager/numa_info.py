"""The machine's NUMA nodes and distances, and the two ways of comparing masks.

Why: the merge breaks ties between equally good hints with either
`Narrowest` (fewest nodes, then lowest IDs) or, with
`prefer-closest-numa-nodes`, `Closest` (fewest nodes, then the lowest average
distance, then lowest IDs). The average is computed exactly as the kubelet
does it (same float operations, same order) so ties resolve identically.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .bitmask import BitMask
from .hint import TopologyManagerError
from .options import PolicyOptions

if TYPE_CHECKING:  # pragma: no cover
    from allocator.topology import NodeTopology

#: The kubelet's message when `prefer-closest-numa-nodes` is set but cadvisor has no distances.
NO_DISTANCES_MESSAGE = "error getting NUMA distances from cadvisor"


@dataclass(frozen=True)
class NUMAInfo:
    """NUMA node IDs in machine order and, per node, its distance row.

    A distance row is indexed by node ID, as cadvisor's `Node.Distances`
    (the sysfs `distance` file) is: `distances[a][b]` is the distance from
    `a` to `b`. Rows are only kept when `prefer-closest-numa-nodes` is on,
    as in the kubelet.
    """

    nodes: tuple[int, ...]
    distances: Mapping[int, tuple[int, ...] | None] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        nodes: Iterable[int],
        distances: Mapping[int, Sequence[int] | None] | None = None,
        opts: PolicyOptions = PolicyOptions(),
    ) -> NUMAInfo:
        """The kubelet's `NewNUMAInfo` from cadvisor-like inputs.

        Raises TopologyManagerError("error getting NUMA distances from cadvisor")
        when the option needs distances a node does not have.
        """
        node_list = tuple(int(n) for n in nodes)
        rows: dict[int, tuple[int, ...] | None] = {}
        for n in node_list:
            row = None
            if opts.prefer_closest_numa:
                given = (distances or {}).get(n)
                if given is None:
                    raise TopologyManagerError(NO_DISTANCES_MESSAGE)
                row = tuple(int(d) for d in given)
            rows[n] = row
        return cls(node_list, rows)

    @classmethod
    def from_topology(cls, topology: NodeTopology, opts: PolicyOptions = PolicyOptions()) -> NUMAInfo:
        """Build from our node model: rows cover IDs 0..max, from `numa_distance(a, b)`."""
        nodes = tuple(topology.numa_nodes)
        top = max(nodes, default=-1)
        rows = {a: [topology.numa_distance(a, b) for b in range(top + 1)] for a in nodes}
        return cls.build(nodes, rows, opts)

    def default_affinity_mask(self) -> BitMask:
        return BitMask.of(*self.nodes)

    def distance(self, a: int, b: int) -> int:
        row = self.distances.get(a)
        if row is None or not 0 <= b < len(row):
            raise TopologyManagerError(f"no NUMA distance from node {a} to node {b}")
        return row[b]

    def average_distance(self, mask: BitMask) -> float:
        """Mean distance over all ordered pairs of the mask's nodes (self-pairs included)."""
        bits = mask.bits
        if not bits:
            return 0.0
        total = 0.0
        count = 0.0
        for a in bits:
            for b in bits:
                total += float(self.distance(a, b))
                count += 1
        return total / count

    def narrowest(self, m1: BitMask, m2: BitMask) -> BitMask:
        return m1 if m1.is_narrower_than(m2) else m2

    def closest(self, m1: BitMask, m2: BitMask) -> BitMask:
        if m1.count() != m2.count():
            return self.narrowest(m1, m2)
        d1 = self.average_distance(m1)
        d2 = self.average_distance(m2)
        if d1 == d2:
            return m1 if m1.is_less_than(m2) else m2
        return m1 if d1 < d2 else m2
