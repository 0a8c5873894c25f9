"""Interchangeable devices ("twins"), so the search never tries two equal answers.

Two free devices x and y are twins when swapping them changes nothing the
objective sees: same NUMA node, same kind of port (the same named port, or
both without one), and w(x, z) == w(y, z) for every other available z. Then
their degrees are equal too, so every criterion of every policy is unchanged
by the swap, and the tie rule prefers the lower position. Hence an optimal
answer may always take a *prefix* (in graph order) of each twin class, and the
search branches on "how many of this class" instead of on each device.

Why it matters: on NVSwitch nodes all GPUs of a NUMA node are twins, so a
32- or 64-GPU request collapses to a handful of classes and is solved (and
proven optimal) instantly; PIX pairs in a PCIe tree are twins as well.

The relation is transitive (if x~y and y~z then w(x,y) = w(x,z) = w(y,z)), so
comparing each device with one representative per class is enough, and all
pairs inside a class share one weight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .problem import Problem


@dataclass(frozen=True)
class TwinClass:
    """Interchangeable free devices, ascending; the search takes a prefix of them."""

    members: tuple[int, ...]
    #: w between any two members (0 for a class of one).
    internal: int

    @property
    def rep(self) -> int:
        return self.members[0]


def twin_classes(p: Problem, pool: Sequence[int] | None = None) -> list[TwinClass]:
    """Partition `pool` (default `p.free`, ascending) into twin classes, ordered by first member.

    Rows are compared over all available devices, not just the pool, so the
    swap argument holds for every objective built from W and deg_A.
    """
    w = p.graph.weights
    avail = p.available
    numa = p.numa
    buckets: dict[tuple, list[list[int]]] = {}
    order: list[list[int]] = []
    for x in p.free if pool is None else pool:
        row = w[x]
        # Twins have equal multisets of weights to the other available devices,
        # so this cheap signature only groups candidates; the exact test follows.
        sig = (
            numa[x],
            -1 if p.own_port[x] else p.port[x],
            tuple(sorted(row[z] for z in avail if z != x)),
        )
        groups = buckets.setdefault(sig, [])
        for g in groups:
            r = g[0]
            rrow = w[r]
            if all(row[z] == rrow[z] for z in avail if z != x and z != r):
                g.append(x)
                break
        else:
            g = [x]
            groups.append(g)
            order.append(g)
    classes = [TwinClass(tuple(g), w[g[0]][g[1]] if len(g) > 1 else 0) for g in order]
    classes.sort(key=lambda c: c.rep)
    return classes
