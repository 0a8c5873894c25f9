"""The order in which our ResourceSlices list GPUs: by locality, so that first-fit lands well (issue 35).

Why an order matters: an unchanged pod (`nvidia.com/gpu: 2` through the
extended-resource mapping) gets a claim without constraints, and the
scheduler fills it first-fit, devices in slice order. The first g free GPUs
of our list are what it gets. Listed by index, a node whose GPU numbers do not
follow its sockets (GPU0 alone on NUMA node 1, GPU1-4 on NUMA node 0) gives
a 2-GPU pod GPU0+GPU1, two NUMA nodes, while GPU1+GPU2 shared one.

The order chosen:
- GPUs grouped by NUMA node, the nodes with the most GPUs first (a request
  larger than a small node's share then still fits within one node; ties by
  NUMA number, GPUs without a NUMA node last);
- within a NUMA node, GPUs closest to each other next to each other:
  repeatedly join the two groups with the strongest link between them (NVLink
  count, then PCIe path: `Link.weight`, then the PCIe level), ties in index
  order; the joined group lists its best-connected part first. So the first
  two free GPUs of a node tend to be an NVLink or PIX pair, the first four a
  switch or an NVLink clique.

No order is right for every free list (first-fit does not know what it
leaves for the next pod, as our allocator does): benchmarks/
dra_extended_pairing_bench.py measures how often first-fit's set is the
allocator's own answer, before and after (docs/dra.md). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from allocator.topology import Device, NodeTopology


def _strength(topology: NodeTopology, a: Device, b: Device) -> tuple[int, int]:
    link = topology.link(a.name, b.name)
    return link.weight, int(link.level)


def _cluster(topology: NodeTopology, gpus: Sequence[Device]) -> list[Device]:
    """`gpus` (one NUMA node's) with the closest ones adjacent (agglomerative, strongest link first)."""
    groups: list[list[Device]] = [[g] for g in gpus]

    def link(x: list[Device], y: list[Device]) -> tuple[int, int]:
        return max(_strength(topology, a, b) for a in x for b in y)

    def inner(x: list[Device]) -> tuple[int, int]:
        """How well a group is connected within (a single GPU: not at all)."""
        if len(x) < 2:
            return (0, 0)
        return min(max(_strength(topology, a, b) for b in x if b is not a) for a in x)

    while len(groups) > 1:
        best: tuple[tuple[int, int], int, int] | None = None
        for i in range(len(groups)):
            for j in range(i + 1, len(groups)):
                w = link(groups[i], groups[j])
                if best is None or w > best[0]:
                    best = (w, i, j)
        assert best is not None
        _, i, j = best
        a, b = groups[i], groups[j]
        # The better-connected part first (a pair before a lone GPU); ties keep index order.
        first, second = (b, a) if (inner(b), len(b)) > (inner(a), len(a)) else (a, b)
        groups[i] = first + second
        del groups[j]
    return groups[0] if groups else []


def locality_order(gpus: Sequence[Device], topology: NodeTopology) -> list[Device]:
    """`gpus` in the order our slices publish them (see the module docstring)."""
    by_numa: dict[int | None, list[Device]] = {}
    for g in sorted(gpus, key=lambda d: (d.index, d.name)):
        by_numa.setdefault(g.numa, []).append(g)
    nodes = sorted(by_numa, key=lambda n: (n is None, -len(by_numa[n]), n if n is not None else 0))
    return [g for n in nodes for g in _cluster(topology, by_numa[n])]
