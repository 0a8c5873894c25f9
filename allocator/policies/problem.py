"""One validated request, turned into graph positions, and the objective a policy maximises.

Why a scalar objective: every policy here ranks sets lexicographically (span,
ports, W(S), W(A\\S)...). Folding those criteria into one integer with large
enough multipliers lets one branch-and-bound search serve all policies, and its
bound can trade the criteria off jointly instead of one by one. Python
integers never overflow, so the multipliers need no care beyond being large
enough, which `Objective` documents per policy.

The tie rule (lexicographically smallest sorted tuple of positions in
`graph.ids`) is not folded in; the search applies it explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..request import AllocationRequest
from ..scoring import min_span_idx
from ..topology import DeviceGraph


@dataclass(frozen=True)
class Problem:
    """A validated request in graph positions (all tuples sorted ascending)."""

    graph: DeviceGraph
    available: tuple[int, ...]
    must: tuple[int, ...]
    #: available minus must: what the search may choose.
    free: tuple[int, ...]
    size: int
    #: deg_A(i) for every graph position (0 for unavailable devices).
    degree: tuple[int, ...]
    #: W(A).
    total: int
    #: Integer port per graph position; a device without a port gets a port of its own.
    port: tuple[int, ...]
    #: True where the device has no port (so it is its own port and never shares one).
    own_port: tuple[bool, ...]
    #: NUMA node per graph position (None = unknown), copied for fast access.
    numa: tuple[int | None, ...]

    @classmethod
    def build(cls, graph: DeviceGraph, request: AllocationRequest) -> Problem:
        """Map a request that already passed `request.validate(graph)` to positions."""
        pos = graph.index_of()
        avail = tuple(sorted(pos[i] for i in request.available))
        must = tuple(sorted(pos[i] for i in request.must_include))
        must_set = set(must)
        free = tuple(i for i in avail if i not in must_set)
        w = graph.weights
        deg = [0] * len(graph.ids)
        for i in avail:
            row = w[i]
            deg[i] = sum(row[j] for j in avail)
        ports: list[int] = []
        own: list[bool] = []
        names: dict[str, int] = {}
        n_named = 0
        for i in range(len(graph.ids)):
            p = graph.ports[i] if graph.ports else None
            if p is None:
                ports.append(-1 - i)  # unique, never equal to a named port's number
                own.append(True)
            else:
                if p not in names:
                    names[p] = n_named
                    n_named += 1
                ports.append(names[p])
                own.append(False)
        return cls(
            graph=graph,
            available=avail,
            must=must,
            free=free,
            size=request.size,
            degree=tuple(deg),
            total=sum(deg) // 2,
            port=tuple(ports),
            own_port=tuple(own),
            numa=tuple(graph.numa),
        )

    @property
    def picks(self) -> int:
        """How many devices the search must add to `must`."""
        return self.size - len(self.must)

    def min_span(self) -> int:
        return min_span_idx(self.graph, self.available, self.must, self.size)

    def numa_nodes(self) -> int:
        """Distinct known NUMA nodes among the available devices (the largest possible span)."""
        return len({self.numa[i] for i in self.available if self.numa[i] is not None})


@dataclass(frozen=True)
class Objective:
    """key(S) = alpha*W(S) + sum(lin[s]) - span_coef*span(S) + port_coef*ports(S) + offset, maximised,
    subject to span(S) <= max_span when max_span is set.

    `lin` is indexed by graph position. Build one with the `*_objective` helpers
    below, which choose multipliers so that the scalar order equals the
    policy's lexicographic order.
    """

    alpha: int
    lin: Sequence[int]
    span_coef: int = 0
    max_span: int | None = None
    port_coef: int = 0
    #: A constant added to every key (used by sub-searches, see `decompose`).
    offset: int = 0


def _left_terms(p: Problem) -> tuple[int, list[int]]:
    """alpha and lin for "W(S), then W(A\\S)".

    With B > W(A) >= W(A\\S) >= 0, B*W(S) + W(A\\S) orders sets by W(S) first,
    then W(A\\S). Since W(A\\S) = W(A) - sum(deg over S) + W(S), dropping the
    constant gives (B+1)*W(S) - sum(deg over S). Returns (B, lin) with
    alpha = B + 1 left to the caller, which may scale B further.
    """
    big = p.total + 1
    return big, [-d for d in p.degree]


def numa_first_objective(p: Problem) -> Objective:
    """Span is a hard limit at its minimum; among those sets, W(S) then W(A\\S)."""
    big, lin = _left_terms(p)
    return Objective(alpha=big + 1, lin=lin, max_span=p.min_span())


def link_first_objective(p: Problem) -> Objective:
    """W(S) first, then span, then W(A\\S).

    key = B2*W(S) - B1*span + W(A\\S) with B1 > W(A) (so span outranks the left
    score) and B2 > B1*(max span + 1) (so W(S) outranks both). Rewritten with
    the degree identity: (B2+1)*W(S) - sum(deg) - B1*span.
    """
    b1 = p.total + 1
    b2 = b1 * (p.numa_nodes() + 1) + 1
    return Objective(alpha=b2 + 1, lin=[-d for d in p.degree], span_coef=b1)


def nic_objective(p: Problem, spread: bool) -> Objective:
    """NIC pools: minimal span (hard limit), then most (spread) or fewest (packed)
    distinct ports, then W(S), then W(A\\S).

    (B+1)*W(S) - sum(deg) lies in [-2W(A), (B+1)W(A)], so a port multiplier
    B3 larger than that width makes ports outrank both.
    """
    big, lin = _left_terms(p)
    b3 = (big + 1) * p.total + 2 * p.total + 1
    return Objective(alpha=big + 1, lin=lin, max_span=p.min_span(), port_coef=b3 if spread else -b3)
