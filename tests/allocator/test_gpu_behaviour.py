"""GPU policy behaviour the spec calls out, on small hand-made nodes."""

from __future__ import annotations

import pytest

from allocator.policies import get_policy
from allocator.request import AllocationRequest

from alloc_testlib import graph, nvswitch, request

# 8 PCIe GPUs with NVLink bridges in pairs (0,1) (2,3) on socket 0 and (4,5) (6,7) on socket 1.
BRIDGED = graph(
    8,
    {**{(a, b): "NODE" for a in range(4) for b in range(a + 1, 4)},
     **{(a, b): "NODE" for a in range(4, 8) for b in range(a + 1, 8)},
     (0, 1): "NV4", (2, 3): "NV4", (4, 5): "NV4", (6, 7): "NV4"},
    [0, 0, 0, 0, 1, 1, 1, 1],
)


@pytest.mark.parametrize("policy", ["numa-first", "link-first"])
@pytest.mark.parametrize(
    "available,expected",
    [
        ([1, 2, 3, 5, 6, 7], "GPU1"),  # the orphan of a broken pair, not a whole pair
        ([2, 3, 4, 6, 7], "GPU4"),
        ([0, 1, 2, 3, 4, 5, 6, 7], "GPU0"),  # nothing broken yet: all tie, lowest
    ],
)
def test_size_one_keeps_nvlink_pairs_whole(policy: str, available: list[int], expected: str) -> None:
    a = get_policy(policy).allocate(BRIDGED, request(BRIDGED, available, [], 1))
    assert a.ids == (expected,)


def test_singles_in_a_row_never_break_a_pair() -> None:
    """Eight size-1 pods in a row: each pair is handed out back to back (k8s-device-plugin #1193)."""
    avail = list(range(8))
    order = []
    p = get_policy("numa-first")
    for _ in range(8):
        got = p.allocate(BRIDGED, request(BRIDGED, avail, [], 1)).ids[0]
        order.append(int(got[3:]))
        avail.remove(order[-1])
    pairs = [set(order[i:i + 2]) for i in range(0, 8, 2)]
    assert all(pair in ({0, 1}, {2, 3}, {4, 5}, {6, 7}) for pair in pairs)


def test_size_one_prefers_numa_less_device_under_numa_first() -> None:
    """A device with unknown NUMA adds no span, so span 0 beats span 1 for k = 1."""
    g = graph(3, {(0, 1): "NV2"}, [0, 0, None])
    assert get_policy("numa-first").allocate(g, request(g, [0, 1, 2], [], 1)).ids == ("GPU2",)


def test_numa_first_versus_link_first() -> None:
    """Socket-local NODE pair versus a cross-socket NV2 pair."""
    g = graph(3, {(0, 1): "NODE", (0, 2): "NV2", (1, 2): "SYS"}, [0, 0, 1])
    req = request(g, [0, 1, 2], [], 2)
    assert get_policy("numa-first").allocate(g, req).ids == ("GPU0", "GPU1")
    link = get_policy("link-first").allocate(g, req)
    assert link.ids == ("GPU0", "GPU2") and link.span == 2 and link.score == 200


def test_link_first_breaks_weight_ties_by_span() -> None:
    g = graph(4, {(0, 1): "NV1", (2, 3): "NV1"}, [0, 1, 1, 1])
    assert get_policy("link-first").allocate(g, request(g, range(4), [], 2)).ids == ("GPU2", "GPU3")


def test_third_criterion_leaves_best_group_behind() -> None:
    """{0,1}, {2,3} and {3,4} are all NV2 pairs (a tie on W(S)); only {0,1} leaves the NVLink
    triangle {2,3,4} whole for the next pod (W(A\\S) 500 against 220), so criterion 3 picks it."""
    g = graph(5, {(0, 1): "NV2", (2, 3): "NV2", (3, 4): "NV2", (2, 4): "NV1"}, [0] * 5)
    a = get_policy("numa-first").allocate(g, request(g, range(5), [], 2))
    assert a.ids == ("GPU0", "GPU1")
    assert a.left_score == 500


@pytest.mark.parametrize("policy", ["numa-first", "link-first", "spread", "packed"])
def test_fast_paths(policy: str) -> None:
    g = nvswitch(8)
    everything = get_policy(policy).allocate(g, AllocationRequest.of(g.ids[::-1], [], 8))
    assert everything.ids == g.ids and everything.explored == 0 and everything.optimal
    only_must = get_policy(policy).allocate(g, AllocationRequest.of(g.ids, ["GPU6", "GPU1"], 2))
    assert only_must.ids == ("GPU1", "GPU6") and only_must.explored == 0


def test_result_fields() -> None:
    g = nvswitch(8)
    a = get_policy("numa-first").allocate(g, AllocationRequest.of(g.ids, [], 3))
    assert a.ids == ("GPU0", "GPU1", "GPU2")
    assert (a.span, a.score, a.left_score) == (1, 3 * 1800, 10 * 1800)
    assert a.optimal and a.policy == "numa-first" and a.explored >= 0


def test_pcie_tree_twins() -> None:
    """PIX pairs under PXB under NODE: a pair of 2 takes a PIX pair, a request of 4 one PXB group."""
    links = {}
    for a in range(8):
        for b in range(a + 1, 8):
            links[(a, b)] = "PIX" if a // 2 == b // 2 else ("PXB" if a // 4 == b // 4 else "SYS")
    g = graph(8, links, [0, 0, 0, 0, 1, 1, 1, 1])
    p = get_policy("numa-first")
    assert p.allocate(g, request(g, [1, 2, 3, 4, 5, 6, 7], [], 2)).ids == ("GPU2", "GPU3")
    assert p.allocate(g, request(g, [1, 2, 3, 4, 5, 6, 7], [], 4)).ids == ("GPU4", "GPU5", "GPU6", "GPU7")
