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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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
    numa, own, port = p.numa, p.own_port, p.port

    def signature(x: int) -> tuple[Any, ...]:
        # Twins have equal multisets of weights to the other available devices,
        # so this cheap signature only groups candidates; the exact test follows.
        row = w[x]
        return (numa[x], -1 if own[x] else port[x], tuple(sorted(row[z] for z in avail if z != x)))

    classes = group_twins(p, p.free if pool is None else pool, signature)
    classes.sort(key=lambda c: c.rep)
    return classes


def group_twins(p: Problem, pool: Sequence[int], signature: Callable[[int], tuple[Any, ...]]) -> list[TwinClass]:
    """`pool`'s twin classes in order of first appearance: devices with equal `signature` (which only
    groups candidates: twins must have equal signatures) and equal link weights to every other
    available device (the exact test)."""
    w = p.graph.weights
    avail = p.available
    buckets: dict[tuple[Any, ...], list[list[int]]] = {}
    order: list[list[int]] = []
    for x in pool:
        sig = signature(x)
        groups = buckets.get(sig)
        if groups is None:
            g = [x]
            buckets[sig] = [g]
            order.append(g)
            continue
        row = w[x]
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
    return [TwinClass(tuple(g), w[g[0]][g[1]] if len(g) > 1 else 0) for g in order]
