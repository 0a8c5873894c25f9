"""Split one request into a few unconstrained sub-searches, and search the smaller side.

Why: a span limit or a span penalty couples every pick to every other; the
bound of the search is tightest when the candidate pool is fixed and the
objective is purely "alpha*W + linear". Both NUMA criteria can be removed by
fixing the set U of NUMA nodes a set may use:

- span as a hard limit s* (numa-first, NIC policies): every valid set uses
  exactly s* nodes (s* is the minimum), so the valid sets are split, without
  overlap, by their node set U (|U| = s*, U containing the nodes of
  must-include). Inside U any subset of its devices plus unknown-NUMA devices
  is valid.
- span as a penalty (link-first): max over S of (P(S) - c*span(S)) equals the
  max over node sets U of (max over S inside U of P(S)) - c*|U|, because the
  node set of S itself is one of the U and any larger U only scores lower
  (a set is under-scored in a larger U but scored exactly in its own, so the
  best key and the tie rule come out right).

When there are too many node sets (many NUMA nodes), one constrained search
is used instead; it is still exact.

Inside a sub-search without span or port terms, choosing k of a pool is the
same as choosing which |pool| - k devices to leave out:
W(M+Q) = W(M+R) - sum(deg_{M+R} over T) + W(T) for T = R \\ Q.
The bound of the search is much tighter for few picks than for many, so we
search the smaller side ("complement" search).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from .problem import Objective, Problem

#: Most sub-searches a request is split into; above it, one constrained search.
MAX_PARTS = 16


@dataclass(frozen=True)
class Space:
    """One sub-search: choose `picks` devices of `pool` (plus `fixed`) maximising `obj`."""

    pool: tuple[int, ...]
    #: Always part of the searched set (must-include, or nothing for a complement search).
    fixed: tuple[int, ...]
    picks: int
    obj: Objective
    #: The searched set is what is left out: the answer is must + pool - searched.
    complement: bool = False

    def answer(self, p: Problem, searched: list[int] | tuple[int, ...]) -> tuple[int, ...]:
        """The answer (sorted positions) that a searched set stands for."""
        if self.complement:
            out = set(searched)
            return tuple(sorted([*p.must, *(x for x in self.pool if x not in out)]))
        return tuple(sorted(searched))


def subspaces(p: Problem, obj: Objective, max_parts: int | None = None) -> list[Space]:
    """The sub-searches whose best answers, compared by key, give the optimum of `obj`.

    `max_parts` defaults to the module's MAX_PARTS (read at call time, so tests
    can lower it to exercise the single constrained search).
    """
    if max_parts is None:
        max_parts = MAX_PARTS
    numa = p.numa
    must_nodes = {must_node for m in p.must if (must_node := numa[m]) is not None}
    others = sorted({node for x in p.free if (node := numa[x]) is not None and node not in must_nodes})
    node_sets: list[tuple[set[int], Objective]] = []
    if obj.max_span is not None:
        extra = obj.max_span - len(must_nodes)
        combos = list(itertools.islice(itertools.combinations(others, extra), max_parts + 1))
        if len(combos) > max_parts:
            return [Space(p.free, p.must, p.picks, obj)]
        free_obj = replace(obj, max_span=None)
        node_sets = [(must_nodes | set(c), free_obj) for c in combos]
    elif obj.span_coef:
        if 2 ** len(others) > max_parts:
            return [Space(p.free, p.must, p.picks, obj)]
        for size in range(len(others), -1, -1):
            for c in itertools.combinations(others, size):
                u = must_nodes | set(c)
                node_sets.append((u, replace(obj, span_coef=0, offset=obj.offset - obj.span_coef * len(u))))
    else:
        return [_smaller_side(p, Space(p.free, p.must, p.picks, obj))]
    spaces = []
    for u, o in node_sets:
        pool = tuple(x for x in p.free if numa[x] is None or numa[x] in u)
        if len(pool) < p.picks:
            continue
        spaces.append(_smaller_side(p, Space(pool, p.must, p.picks, o)))
    return spaces


def _smaller_side(p: Problem, s: Space) -> Space:
    """The complement search of `s` when it has fewer picks and no span/port terms."""
    o = s.obj
    if o.port_coef and all(p.own_port[x] for x in (*p.must, *s.pool)):
        # No device has a named port, so every answer has exactly `size` ports.
        o = replace(o, port_coef=0, offset=o.offset + o.port_coef * p.size)
        s = replace(s, obj=o)
    leave = len(s.pool) - s.picks
    if o.port_coef or o.span_coef or o.max_span is not None or leave >= s.picks:
        return s
    w = p.graph.weights
    inside = (*p.must, *s.pool)
    lin = list(o.lin)
    for t in s.pool:
        row = w[t]
        lin[t] = -o.alpha * sum(row[y] for y in inside) - o.lin[t]
    whole = sum(w[a][b] for i, a in enumerate(inside) for b in inside[i + 1:])
    offset = o.alpha * whole + sum(o.lin[x] for x in inside) + o.offset
    return Space(s.pool, (), leave, Objective(alpha=o.alpha, lin=lin, offset=offset), complement=True)
