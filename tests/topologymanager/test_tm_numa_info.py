"""NUMAInfo cases ported from the kubelet's numa_info_test.go."""

from __future__ import annotations

import pytest

from allocator.topologymanager import BitMask, NUMAInfo, PolicyOptions, TopologyManagerError
from allocator.topologymanager.numa_info import NO_DISTANCES_MESSAGE

ROWS = {
    0: (10, 11, 12, 12),
    1: (11, 10, 12, 12),
    2: (12, 12, 10, 11),
    3: (12, 12, 11, 10),
}
CLOSEST = PolicyOptions(prefer_closest_numa=True)


def M(*bits: int) -> BitMask:
    return BitMask.of(*bits)


@pytest.mark.parametrize(
    "name, nodes, given, opts, expected",
    [
        ("1 node", [0], {}, PolicyOptions(), {0: None}),
        ("1 node, closest", [0], {0: ROWS[0]}, CLOSEST, {0: ROWS[0]}),
        ("2 nodes", [0, 1], {}, PolicyOptions(), {0: None, 1: None}),
        ("2 nodes, closest", [0, 1], {0: ROWS[0], 1: ROWS[1]}, CLOSEST, {0: ROWS[0], 1: ROWS[1]}),
        ("3 nodes", [0, 1, 2], {}, PolicyOptions(), {0: None, 1: None, 2: None}),
        ("3 nodes, closest", [0, 1, 2], {n: ROWS[n] for n in (0, 1, 2)}, CLOSEST, {n: ROWS[n] for n in (0, 1, 2)}),
        ("4 nodes", [0, 1, 2, 3], {}, PolicyOptions(), {n: None for n in range(4)}),
        ("4 nodes, closest", [0, 1, 2, 3], ROWS, CLOSEST, ROWS),
        ("one node with id 1", [1], {}, PolicyOptions(), {1: None}),
        ("one node with id 1, closest", [1], {1: ROWS[1]}, CLOSEST, {1: ROWS[1]}),
        # Distances given but not asked for are not kept.
        ("two nodes not sequential", [0, 2], {0: ROWS[0], 2: ROWS[2]}, PolicyOptions(), {0: None, 2: None}),
        ("two nodes not sequential, closest", [0, 2], {0: ROWS[0], 2: ROWS[2]}, CLOSEST, {0: ROWS[0], 2: ROWS[2]}),
    ],
)
def test_numa_info_build(name, nodes, given, opts, expected):
    info = NUMAInfo.build(nodes, given, opts)
    assert info.nodes == tuple(nodes)
    assert dict(info.distances) == expected


def test_numa_info_missing_distances_with_closest_is_the_kubelet_error():
    with pytest.raises(TopologyManagerError, match=f"^{NO_DISTANCES_MESSAGE}$"):
        NUMAInfo.build([9], {}, CLOSEST)


@pytest.mark.parametrize(
    "bits, rows, expected",
    [
        ((0,), {0: (10,)}, 10.0),
        ((0,), {0: (10, 11), 1: (11, 10)}, 10.0),
        ((0, 1), {0: (10, 11), 1: (11, 10)}, 10.5),
        ((0, 2), ROWS, 11.0),
        ((0, 2, 3), ROWS, 11.11111111111111),
        ((), {}, 0.0),
    ],
)
def test_average_distance(bits, rows, expected):
    info = NUMAInfo(tuple(bits), rows)
    assert info.average_distance(M(*bits)) == expected


EQUAL3 = {n: (10, 10, 10) for n in range(3)}
EQUAL4 = {n: (10, 10, 10, 10) for n in range(4)}


@pytest.mark.parametrize(
    "description, current, candidate, rows, expected",
    [
        ("lengths differ, current narrower", (0,), (0, 2), {}, "current"),
        ("same length and distance, current has lower bits", (0, 1), (0, 2), EQUAL3, "current"),
        ("same length and distance, candidate has lower bits", (0, 3), (0, 2), EQUAL4, "candidate"),
        ("same length, candidate closer", (0, 3), (0, 1), ROWS, "candidate"),
        ("same length, current closer", (2, 3), (0, 3), ROWS, "current"),
    ],
)
def test_closest(description, current, candidate, rows, expected):
    info = NUMAInfo((), rows)
    cur, cand = M(*current), M(*candidate)
    # The kubelet's test calls Closest(candidate, current).
    got = info.closest(cand, cur)
    assert got == (cur if expected == "current" else cand)


@pytest.mark.parametrize(
    "a, b, expected",
    [((0,), (0, 1), (0,)), ((1,), (0,), (0,)), ((0, 1), (0, 2), (0, 1)), ((2, 3), (1,), (1,))],
)
def test_narrowest(a, b, expected):
    assert NUMAInfo(()).narrowest(M(*a), M(*b)) == M(*expected)


def test_default_affinity_mask_covers_all_nodes():
    assert NUMAInfo((0, 2, 5)).default_affinity_mask() == M(0, 2, 5)


def test_from_topology_uses_linux_default_distances():
    from allocator.topology import NodeTopology

    topo = NodeTopology.build([], [], numa_nodes=[0, 1], numa_distances={(0, 1): 21})
    info = NUMAInfo.from_topology(topo, CLOSEST)
    assert dict(info.distances) == {0: (10, 21), 1: (21, 10)}
