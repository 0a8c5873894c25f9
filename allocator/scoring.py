"""How good a device set is, in the terms of the spec (`shared/spec/allocation.md`).

Why a module of its own: the policies, the `allocate`/`explain` commands, the
tests' brute-force reference and the benchmarks must all judge a set the same
way. Everything here is plain arithmetic over a `DeviceGraph`; nothing searches.

Two flavours of every helper:
- ID based (`score`, `span`, `left_score`, `port_count`, `evaluate`, `rank`):
  what the CLI and tests use;
- index based (`*_idx`): what the search uses, on positions in `graph.ids`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .pairing import NO_PARTNERS, Partners, pairing_weight
from .topology import DeviceGraph

#: Policies whose objective `objective_key` knows, in the order `get_policy` lists them.
OBJECTIVES = ("numa-first", "link-first", "spread", "packed")


# -- index based ----------------------------------------------------------
def score_idx(graph: DeviceGraph, indices: Sequence[int]) -> int:
    """W(S): the sum of pair weights over all unordered pairs of `indices`."""
    w = graph.weights
    total = 0
    for a in range(len(indices)):
        row = w[indices[a]]
        for b in range(a + 1, len(indices)):
            total += row[indices[b]]
    return total


def span_idx(graph: DeviceGraph, indices: Iterable[int]) -> int:
    """Distinct NUMA nodes among `indices`; a device with unknown NUMA adds nothing."""
    numa = graph.numa
    return len({numa[i] for i in indices if numa[i] is not None})


def degrees_idx(graph: DeviceGraph, within: Sequence[int]) -> dict[int, int]:
    """deg(i) = sum of w(i, j) over j in `within`, j != i, for every i in `within`.

    Why: W(A \\ S) = W(A) - sum(deg over S) + W(S), so the spec's third
    criterion is a linear term once W(S) is known.
    """
    w = graph.weights
    return {i: sum(w[i][j] for j in within) for i in within}


def left_score_idx(graph: DeviceGraph, available: Iterable[int], chosen: Iterable[int]) -> int:
    """W(A \\ S): what the devices left behind score together."""
    picked = set(chosen)
    return score_idx(graph, [i for i in available if i not in picked])


def port_key(graph: DeviceGraph, index: int) -> str:
    """The physical port of a device; a device without one is its own port (its ID)."""
    if graph.ports and graph.ports[index] is not None:
        return "port:" + str(graph.ports[index])
    return "id:" + graph.ids[index]


def port_count_idx(graph: DeviceGraph, indices: Iterable[int]) -> int:
    """Distinct physical ports (functions) among `indices`."""
    return len({port_key(graph, i) for i in indices})


def min_span_idx(graph: DeviceGraph, available: Sequence[int], must: Sequence[int], size: int,
                 forced_nodes: Iterable[int] = ()) -> int:
    """The smallest span any valid answer can have (criterion 1).

    The NUMA nodes of `must` (and `forced_nodes`: a request's partners, whose
    nodes count in span(S u P)) are unavoidable; devices of unknown NUMA are free
    of span; then whole NUMA nodes are added, fullest first, until `size`
    devices fit. Fullest-first is optimal because only the count matters.
    """
    numa = graph.numa
    forced = {numa[i] for i in must if numa[i] is not None} | set(forced_nodes)
    must_set = set(must)
    per_node: dict[int, int] = {}
    fits = len(must)
    for i in available:
        if i in must_set:
            continue
        n = numa[i]
        if n is None or n in forced:
            fits += 1
        else:
            per_node[n] = per_node.get(n, 0) + 1
    span = len(forced)
    for count in sorted(per_node.values(), reverse=True):
        if fits >= size:
            break
        fits += count
        span += 1
    return span


# -- ID based ---------------------------------------------------------------
def _indices(graph: DeviceGraph, ids: Iterable[str]) -> list[int]:
    pos = graph.index_of()
    return [pos[i] for i in ids]


def score(graph: DeviceGraph, ids: Iterable[str]) -> int:
    """W(S) of the devices named by `ids`."""
    return score_idx(graph, _indices(graph, ids))


def span(graph: DeviceGraph, ids: Iterable[str]) -> int:
    """span(S) of the devices named by `ids`."""
    return span_idx(graph, _indices(graph, ids))


def left_score(graph: DeviceGraph, available: Iterable[str], chosen: Iterable[str]) -> int:
    """W(A \\ S) for the available IDs `available` and the chosen IDs `chosen`."""
    return left_score_idx(graph, _indices(graph, available), _indices(graph, chosen))


def port_count(graph: DeviceGraph, ids: Iterable[str]) -> int:
    """Distinct ports among the devices named by `ids`."""
    return port_count_idx(graph, _indices(graph, ids))


@dataclass(frozen=True)
class Evaluation:
    """Every number the objectives look at, for one chosen set."""

    span: int
    score: int
    left_score: int
    ports: int
    #: X(S, P): the best one-to-one GPU–NIC pairing weight with the request's partners (0 without).
    pairing: int = 0


def evaluate(graph: DeviceGraph, available: Iterable[str], chosen: Iterable[str],
             partners: Partners = NO_PARTNERS) -> Evaluation:
    """The numbers of `chosen`; with partners, `span` is span(S u P) and `pairing` is X(S, P)."""
    a = _indices(graph, available)
    chosen = list(chosen)
    s = _indices(graph, chosen)
    numa = {graph.numa[i] for i in s if graph.numa[i] is not None}
    numa |= {n for n in partners.numa if n is not None}
    return Evaluation(
        span=len(numa),
        score=score_idx(graph, s),
        left_score=left_score_idx(graph, a, s),
        ports=port_count_idx(graph, s),
        pairing=pairing_weight([partners.row(i) for i in chosen], len(partners)) if partners else 0,
    )


def objective_key(policy: str, ev: Evaluation) -> tuple[int, ...]:
    """The policy's criteria as a tuple where smaller is better (the fixed tie rule excluded).

    - numa-first: span, then W(S), then W(A\\S)  (the spec's default)
    - link-first: W(S), then span, then W(A\\S)
    - spread:     span, then most ports, then W(S), then W(A\\S)
    - packed:     span, then fewest ports, then W(S), then W(A\\S)
    """
    if policy == "numa-first":
        return (ev.span, -ev.score, -ev.left_score)
    if policy == "link-first":
        return (-ev.score, ev.span, -ev.left_score)
    if policy == "spread":
        return (ev.span, -ev.ports, -ev.score, -ev.left_score)
    if policy == "packed":
        return (ev.span, ev.ports, -ev.score, -ev.left_score)
    raise ValueError(f"unknown policy {policy!r}: expected one of {', '.join(OBJECTIVES)}")


def paired_objective_key(policy: str, ev: Evaluation) -> tuple[int, ...]:
    """The criteria with partners (spec, "pairing GPUs with NICs"); `ev` from `evaluate` with partners.

    - numa-first: span(S u P), W(S), X(S, P), W(A\\S); link-first swaps the first two;
    - spread / packed: span(S u P), X(S, P), then the pool's criteria.
    """
    if policy == "numa-first":
        return (ev.span, -ev.score, -ev.pairing, -ev.left_score)
    if policy == "link-first":
        return (-ev.score, ev.span, -ev.pairing, -ev.left_score)
    if policy in ("spread", "packed"):
        plain = objective_key(policy, ev)
        return (plain[0], -ev.pairing, *plain[1:])
    raise ValueError(f"unknown policy {policy!r}: expected one of {', '.join(OBJECTIVES)}")


def rank(graph: DeviceGraph, policy: str, available: Iterable[str], chosen: Iterable[str],
         partners: Partners = NO_PARTNERS) -> tuple[Any, ...]:
    """Full preference key of a set (smaller is better), including the fixed tie rule.

    The tie rule is the lexicographically smallest tuple of positions in
    `graph.ids` (sorted): it does not depend on the order of `available`.
    With partners the key is `paired_objective_key`'s.
    """
    chosen = list(chosen)
    ev = evaluate(graph, available, chosen, partners)
    key = paired_objective_key(policy, ev) if partners else objective_key(policy, ev)
    return key + (tuple(sorted(_indices(graph, chosen))),)
