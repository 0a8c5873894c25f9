"""Graph builders and a brute-force reference for the allocator tests.

The brute force is the spec read literally: score every valid set with
`allocator.scoring` and take the smallest `rank` (criteria, then the sorted
tuple of positions). It is the oracle the branch and bound must match.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Mapping, Sequence

from allocator.request import AllocationRequest
from allocator.scoring import objective_key, rank
from allocator.topology import DeviceGraph, Link

#: The spec's link weights.
WEIGHT_VALUES = (10, 20, 30, 40, 50, 100, 200, 300, 400, 600, 1200, 1800)


# go-gpuallocator's DGX-1 test nodes as link tables (pairs, either order), shared by the
# upstream-comparison tests. Volta mixes NV1/NV2 in a hybrid cube-mesh; Pascal is all NV1.
VOLTA_NVLINK = {
    (0, 1): "NV1", (0, 2): "NV1", (0, 3): "NV2", (0, 4): "NV2",
    (1, 2): "NV2", (1, 3): "NV1", (1, 5): "NV2",
    (2, 3): "NV2", (2, 6): "NV1",
    (3, 7): "NV1",
    (4, 5): "NV1", (4, 6): "NV1", (4, 7): "NV2",
    (5, 6): "NV2", (5, 7): "NV1",
    (6, 7): "NV2",
}
PASCAL_NVLINK = {pair: "NV1" for pair in VOLTA_NVLINK}
# PCIe: one PIX (single switch) pair per switch, PHB within a socket, SYS across.
VOLTA_PIX = {(0, 1), (2, 3), (4, 5), (6, 7)}
PASCAL_PIX = {(0, 2), (1, 3), (4, 6), (5, 7)}


def graph(
    n: int,
    links: Mapping[tuple[int, int], str | int],
    numa: Sequence[int | None] | None = None,
    default: str = "SYS",
    ports: Sequence[str | None] | None = None,
    prefix: str = "GPU",
) -> DeviceGraph:
    """A DeviceGraph of `n` devices named `<prefix><i>` from a link table.

    `links` maps an index pair (either order) to a topo token (`NV2`, `PIX`...)
    or a raw weight; missing pairs get `default`.
    """
    def weight(v: str | int) -> int:
        return v if isinstance(v, int) else Link.parse(v).weight

    w = [[0 if i == j else weight(default) for j in range(n)] for i in range(n)]
    for (a, b), v in links.items():
        w[a][b] = w[b][a] = weight(v)
    return DeviceGraph(
        ids=tuple(f"{prefix}{i}" for i in range(n)),
        numa=tuple(numa) if numa is not None else (None,) * n,
        weights=tuple(tuple(r) for r in w),
        ports=tuple(ports) if ports is not None else (),
    )


def ids(g: DeviceGraph, indices: Iterable[int]) -> tuple[str, ...]:
    return tuple(g.ids[i] for i in indices)


def request(g: DeviceGraph, available: Iterable[int], must: Iterable[int], size: int) -> AllocationRequest:
    return AllocationRequest.of(ids(g, available), ids(g, must), size)


def brute_force(g: DeviceGraph, policy: str, req: AllocationRequest) -> tuple[str, ...]:
    """The best set by exhaustive enumeration, IDs in graph order."""
    must = list(req.must_include)
    rest = [i for i in req.available if i not in set(must)]
    best = None
    best_rank = None
    for combo in itertools.combinations(rest, req.size - len(must)):
        chosen = must + list(combo)
        r = rank(g, policy, req.available, chosen)
        if best_rank is None or r < best_rank:
            best, best_rank = chosen, r
    assert best is not None
    pos = g.index_of()
    return tuple(sorted(best, key=pos.__getitem__))


def criteria(g: DeviceGraph, policy: str, req: AllocationRequest, chosen: Iterable[str]) -> tuple[int, ...]:
    """The policy's criteria (without the tie rule) of a chosen set."""
    return rank(g, policy, req.available, chosen)[:-1]


def random_graph(rng: random.Random, n: int, numa_nodes: int = 2, p_none: float = 0.15,
                 p_nvlink: float = 0.3, ports: int = 0) -> DeviceGraph:
    """Random NUMA (some unknown) and random weights from the spec's values (with ties)."""
    numa = [None if rng.random() < p_none else rng.randrange(numa_nodes) for _ in range(n)]
    links: dict[tuple[int, int], int] = {}
    for a in range(n):
        for b in range(a + 1, n):
            if rng.random() < p_nvlink:
                links[(a, b)] = 100 * rng.choice((1, 1, 2, 2, 4, 12))
            else:
                links[(a, b)] = rng.choice((10, 20, 30, 40, 50))
    port_list = None
    if ports:
        port_list = [None if rng.random() < 0.2 else f"pf{rng.randrange(ports)}" for _ in range(n)]
    return graph(n, links, numa, ports=port_list, prefix="D")


def nvswitch(n: int, numa_nodes: int = 2, nvlinks: int = 18) -> DeviceGraph:
    """HGX-style: every pair NV<nvlinks> through NVSwitch; GPUs split evenly over NUMA nodes."""
    links = {(a, b): f"NV{nvlinks}" for a in range(n) for b in range(a + 1, n)}
    per = max(1, n // numa_nodes)
    return graph(n, links, [min(i // per, numa_nodes - 1) for i in range(n)])


def objective_matches(g: DeviceGraph, policy: str, req: AllocationRequest, answer: Iterable[str]) -> bool:
    return criteria(g, policy, req, answer) == criteria(g, policy, req, brute_force(g, policy, req))


__all__ = ["brute_force", "criteria", "graph", "ids", "nvswitch", "objective_key", "random_graph", "request"]
