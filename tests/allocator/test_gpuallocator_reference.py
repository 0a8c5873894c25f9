"""Our re-implementation of go-gpuallocator's best-effort search (benchmarks/gpuallocator_reference.py).

The benchmark compares against it, so it must behave like upstream: fed
upstream's pair scores (NVLink count x 100 PLUS the PCIe level score), it
must give the answers of upstream's own test tables, and reproduce the
padded-answer bug of go-gpuallocator PR #80.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from allocator.policies import get_policy
from gpuallocator_reference import best_effort_allocate, partition_count

from alloc_testlib import PASCAL_NVLINK, PASCAL_PIX, VOLTA_NVLINK, VOLTA_PIX, graph, request

PCIE_SCORE = {"SYS": 10, "NODE": 20, "PHB": 30, "PXB": 40, "PIX": 50}


def upstream_score(nvlink: dict[tuple[int, int], str], pix: set[tuple[int, int]]) -> Callable[[int, int], int]:
    def score(a: int, b: int) -> int:
        a, b = min(a, b), max(a, b)
        pcie = "SYS" if (a < 4) != (b < 4) else ("PIX" if (a, b) in pix else "PHB")
        nv = nvlink.get((a, b))
        return PCIE_SCORE[pcie] + (100 * int(nv[2:]) if nv else 0)

    return score


VOLTA = upstream_score(VOLTA_NVLINK, VOLTA_PIX)
PASCAL = upstream_score(PASCAL_NVLINK, PASCAL_PIX)


def rtx(a: int, b: int) -> int:
    a, b = min(a, b), max(a, b)
    nv = 200 if (a, b) in {(0, 3), (1, 2)} else 0
    return nv + (20 if (a, b) in {(0, 1), (2, 3)} else 10)


def run_sequence(score: Callable[[int, int], int], n: int, sizes: list[int]) -> list[set[int]]:
    avail = list(range(n))
    out = []
    for k in sizes:
        got = best_effort_allocate(avail, [], k, score)
        out.append(set(got))
        avail = [d for d in avail if d not in got]
    return out


@pytest.mark.parametrize(
    "score,n,sizes,expected",
    [
        (VOLTA, 8, [1] * 8, [{i} for i in range(8)]),
        (VOLTA, 8, [2] * 4, [{0, 3}, {1, 2}, {4, 7}, {5, 6}]),
        (VOLTA, 8, [4, 4], [{0, 1, 2, 3}, {4, 5, 6, 7}]),
        (PASCAL, 8, [2] * 4, [{0, 2}, {1, 3}, {4, 6}, {5, 7}]),
        (PASCAL, 8, [4, 4], [{0, 1, 2, 3}, {4, 5, 6, 7}]),
        (rtx, 4, [1] * 4, [{0}, {1}, {2}, {3}]),
        (rtx, 4, [2, 2], [{0, 3}, {1, 2}]),
    ],
    ids=["volta-1", "volta-2", "volta-4", "pascal-2", "pascal-4", "rtx-1", "rtx-2"],
)
def test_upstream_allocator_sequences(score, n, sizes, expected) -> None:
    assert run_sequence(score, n, sizes) == expected


@pytest.mark.parametrize(
    "available,required,size,expected",
    [
        ([0, 2, 4, 5], [], 2, {4, 5}),
        ([0, 4, 5, 6], [], 2, {5, 6}),
        ([0, 3, 1], [], 2, {0, 3}),
        ([0, 1, 4], [], 2, {0, 4}),
        (list(range(8)), [4], 1, {4}),
        (list(range(8)), [4], 2, {4, 7}),
        (list(range(8)), [4], 4, {4, 5, 6, 7}),
        ([1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3], 4, set()),
        (list(range(8)), [0, 2, 4, 6], 4, {0, 2, 4, 6}),
        (list(range(8)), [1, 2, 3, 4, 5, 6], 4, set()),
    ],
)
def test_upstream_volta_policy_table(available: list[int], required: list[int], size: int,
                                     expected: set[int]) -> None:
    assert set(best_effort_allocate(available, required, size, VOLTA)) == expected


def test_reproduces_padded_answer_bug_and_we_do_not() -> None:
    """go-gpuallocator PR #80: 5 GPUs, size 3, one strong NVLink pair -> [a, b, None]."""
    links = {(0, 1): "NV4", (2, 3): "NV1", (2, 4): "NV1", (3, 4): "NV1"}
    g = graph(5, links)
    got = best_effort_allocate(list(range(5)), [], 3, lambda a, b: g.weights[a][b])
    assert got == [0, 1, None]
    ours = get_policy("numa-first").allocate(g, request(g, range(5), [], 3))
    assert len(ours.ids) == 3 and None not in ours.ids


def test_partition_counts_match_research_notes() -> None:
    assert [partition_count(8, k) for k in (2, 3, 4)] == [105, 280, 35]
    assert partition_count(16, 3) == 22_422_400
