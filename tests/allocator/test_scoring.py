"""The scoring helpers that define "best" for policies, CLI and tests."""

from __future__ import annotations

import pytest

from allocator.scoring import (
    evaluate,
    left_score,
    min_span_idx,
    objective_key,
    port_count,
    rank,
    score,
    span,
)

from alloc_testlib import graph

#      GPU0 -NV2- GPU1 (numa 0)   GPU2 -PIX- GPU3 (numa 1)   GPU4 (numa unknown)
G = graph(
    5,
    {(0, 1): "NV2", (2, 3): "PIX", (0, 2): "NODE", (1, 4): "PHB"},
    [0, 0, 1, 1, None],
    ports=["p0", "p0", "p1", None, "p1"],
)


def test_score_is_sum_of_pair_weights() -> None:
    assert score(G, ["GPU0", "GPU1"]) == 200
    assert score(G, ["GPU0", "GPU1", "GPU2"]) == 200 + 20 + 10
    assert score(G, ["GPU3"]) == 0


def test_span_ignores_unknown_numa() -> None:
    assert span(G, ["GPU0", "GPU1"]) == 1
    assert span(G, ["GPU0", "GPU4"]) == 1
    assert span(G, ["GPU4"]) == 0
    assert span(G, ["GPU1", "GPU3", "GPU4"]) == 2


def test_left_score() -> None:
    assert left_score(G, G.ids, ["GPU0", "GPU1"]) == score(G, ["GPU2", "GPU3", "GPU4"])


def test_ports_none_is_own_port() -> None:
    assert port_count(G, ["GPU0", "GPU1"]) == 1
    assert port_count(G, ["GPU2", "GPU4"]) == 1
    assert port_count(G, ["GPU2", "GPU3"]) == 2


@pytest.mark.parametrize(
    "available,must,size,expected",
    [
        ([0, 1, 2, 3, 4], [], 2, 1),
        ([0, 1, 2, 3, 4], [], 3, 1),  # two of one node + the NUMA-less device
        ([0, 1, 2, 3, 4], [], 4, 2),
        ([4], [], 1, 0),
        ([0, 2, 4], [0, 2], 2, 2),  # must spans two nodes
        ([0, 1, 2, 3], [2], 2, 1),
    ],
)
def test_min_span(available: list[int], must: list[int], size: int, expected: int) -> None:
    assert min_span_idx(G, available, must, size) == expected


def test_objective_keys_order_criteria() -> None:
    ev = evaluate(G, G.ids, ["GPU0", "GPU1"])
    assert objective_key("numa-first", ev) == (1, -200, -ev.left_score)
    assert objective_key("link-first", ev) == (-200, 1, -ev.left_score)
    assert objective_key("spread", ev)[:2] == (1, -1)
    assert objective_key("packed", ev)[:2] == (1, 1)
    with pytest.raises(ValueError):
        objective_key("nope", ev)


def test_rank_tie_rule_uses_graph_order_not_request_order() -> None:
    assert rank(G, "numa-first", G.ids, ["GPU1", "GPU0"])[-1] == (0, 1)
    assert rank(G, "numa-first", G.ids[::-1], ["GPU1", "GPU0"]) == rank(G, "numa-first", G.ids, ["GPU0", "GPU1"])
